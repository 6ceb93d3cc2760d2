"""``pt2reg target/verify/run`` per the CLI contract, on real tiny models.

In-process through CliRunner, except where a custom op must be registered: that happens in a
subprocess so the op never leaks into this test process.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from registry.format.bundle import BundleFile  # noqa: E402
from registry.runtime.target import Target  # noqa: E402
from tests.cli_inprocess import invoker, one_error_line  # noqa: E402
from tests.integration.conftest_models import baked_source_line, run_cli_subprocess  # noqa: E402

OP = "pt2reg_mylib::scale_add"
# Not imported from tests.ops_mylib: importing it would register the op in this process.
MYLIB_SCHEMA = "pt2reg_mylib::scale_add(Tensor x, float alpha) -> Tensor"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def pt2reg(home):
    return invoker(home)


# ---------------------------------------------------------------------------------- target

def test_target_json_describes_this_machine(pt2reg):
    r = pt2reg("target", "--json")
    assert r.exit_code == 0, r.output
    t = Target.from_json(json.loads(r.stdout))
    assert t.device_type == "cpu" and t.serde_schema[0] >= 8 and t.torch_version == torch.__version__
    assert t.platform and t.machine and t.custom_ops and OP not in t.custom_ops


def test_target_human_view(pt2reg):
    r = pt2reg("target")
    assert r.exit_code == 0 and "serde schema" in r.stdout
    # torch's own namespaces (quantized, c10d, ...) apart from user-registered custom ops
    user = next(line for line in r.stdout.splitlines() if line.startswith("user ops"))
    own = next(line for line in r.stdout.splitlines() if line.startswith("torch ops"))
    assert "quantized (" in own and "quantized" not in user and "c10d" not in user


# ---------------------------------------------------------------------------------- verify/run: encdec

def test_verify_encdec_is_compatible(pt2reg, encdec):
    r = pt2reg("verify", encdec.path, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["compatible"] is True and doc["findings"] == []
    assert doc["digest"] == BundleFile.open(encdec.path).digest
    assert {p: v["id"] for p, v in doc["variants"].items()} == {"encoder": "portable", "decoder": "portable"}
    human = pt2reg("verify", encdec.path)
    assert human.exit_code == 0 and "compatible: 0 error(s)" in human.stdout and "portable" in human.stdout


def test_run_samples_prints_max_errors(pt2reg, encdec):
    r = pt2reg("run", encdec.path, "--samples")
    assert r.exit_code == 0, r.output
    assert "max abs" in r.stdout and "encoder-0" in r.stdout and "decoder-0" in r.stdout
    doc = json.loads(pt2reg("run", encdec.path, "--samples", "--json").stdout)
    assert doc["ok"] is True and len(doc["samples"]) == 2
    assert all(o["max_abs"] is not None and o["ok"] for s in doc["samples"] for o in s["outputs"])


def test_samples_outside_tolerance_exit_1(pt2reg, encdec, monkeypatch):
    import registry.runtime.samples

    def drifted(actual, expected, rtol, atol, tolerance=None):
        return [{"output": 0, "ok": False, "max_abs": 0.5, "max_rel": 0.25}]

    monkeypatch.setattr(registry.runtime.samples, "compare_outputs", drifted)
    r = pt2reg("run", encdec.path, "--samples", "--program", "encoder", "--json")
    assert r.exit_code == 1
    assert one_error_line(r) == "error: 1 of 1 sample(s) failed, first encoder-0: outputs outside tolerance"
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["samples"][0]["outputs"][0]["max_abs"] == 0.5
    human = pt2reg("run", encdec.path, "--samples", "--program", "encoder")
    assert human.exit_code == 1 and "FAIL" in human.stdout and "0.5" in human.stdout


@pytest.mark.parametrize("program", ["encoder", "decoder"])
def test_run_inputs_reproduces_export_time_outputs(pt2reg, encdec, tmp_path, program):
    out = tmp_path / f"{program}_out.pt"
    r = pt2reg("run", encdec.path, "--program", program, "--inputs", encdec.input_files[program],
               "--output", out, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["program"] == program and doc["output_file"] == str(out)
    (got,) = torch.load(out, weights_only=True)
    torch.testing.assert_close(got, encdec.expected[program])
    assert doc["outputs"][0]["shape"] == list(got.shape)


@pytest.mark.parametrize("value, message", [
    ((torch.randint(0, 32, (9, 4)),), "error: input 'tokens' dim 0 (batch) is 9, allowed 1..8"),
    ((torch.randn(2, 4),), "error: input 'tokens' has dtype float32, expected int64"),
    ((torch.randint(0, 32, (2, 40)),), "error: input 'tokens' dim 1 (seq) is 40, allowed 2..16"),
    ((torch.randint(0, 32, (2, 4)), torch.randint(0, 32, (2, 4))),
     "error: program 'encoder' takes 1 input(s) (tokens), got 2"),
])
def test_bad_inputs_exit_4_with_one_line_and_no_output(pt2reg, encdec, tmp_path, value, message):
    inputs, out = tmp_path / "bad.pt", tmp_path / "out.pt"
    torch.save(value, inputs)
    r = pt2reg("run", encdec.path, "--program", "encoder", "--inputs", inputs, "--output", out)
    assert r.exit_code == 4
    assert one_error_line(r) == message
    assert not out.exists() and not list(tmp_path.glob("*.incomplete"))


@pytest.mark.parametrize("args, words", [
    ((), "nothing to run"),
    (("--inputs", "x.pt"), "pass --program NAME"),
    (("--samples", "--output", "o.pt"), "--output needs --inputs"),
    (("--samples", "--program", "nope"), "no program 'nope'"),
    (("--samples", "--device", "cuda 0"), "invalid device"),
])
def test_run_usage_errors_exit_2(pt2reg, encdec, args, words):
    r = pt2reg("run", encdec.path, *args)
    assert r.exit_code == 2 and words in one_error_line(r)


def test_missing_bundle_exits_3(pt2reg, tmp_path):
    r = pt2reg("verify", tmp_path / "nope.pt2b")
    assert r.exit_code == 3 and "no such file" in one_error_line(r)


def test_unavailable_device_exits_4(pt2reg, encdec):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = pt2reg("verify", encdec.path, "--device", "cuda:0")
    assert r.exit_code == 4 and "device cuda:0 is not available" in one_error_line(r)


def test_malformed_target_file_exits_2(pt2reg, encdec, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"torch_version": "2.13.0", "serde_schema": "8.20", "device_type": "cuda"}))
    r = pt2reg("verify", encdec.path, "--target", bad)
    assert r.exit_code == 2 and "serde_schema must be [major, minor]" in one_error_line(r)


def test_require_signature_hook(pt2reg, encdec, tmp_path):
    if importlib.util.find_spec("registry.format.signing") is None:
        r = pt2reg("verify", encdec.path, "--require-signature", "key.pub")
        assert r.exit_code == 2 and one_error_line(r) == "error: signature checking is not available yet"
        return
    from registry.format.signing import generate_keypair

    _, pub = generate_keypair(tmp_path / "k")
    for command in (("verify",), ("run", "--samples")):
        r = pt2reg(*command[:1], encdec.path, *command[1:], "--require-signature", pub)
        assert r.exit_code == 5 and "is not signed" in one_error_line(r)


def test_pickled_program_needs_trust(pt2reg, pickled, encdec):
    r = pt2reg("run", pickled.path, "--inputs", encdec.input_files["encoder"])
    assert r.exit_code == 5 and "holds pickled tensors: data/weights/weight_0" in one_error_line(r)
    r = pt2reg("run", pickled.path, "--inputs", encdec.input_files["encoder"], "--trust-pickle")
    assert r.exit_code == 0, r.output
    r = pt2reg("verify", pickled.path, "--json")
    v = json.loads(r.stdout)
    assert r.exit_code == 5 and v["compatible"] is False and [f["code"] for f in v["findings"]] == ["pickle"]
    r = pt2reg("verify", pickled.path, "--json", "--trust-pickle")
    assert r.exit_code == 0 and json.loads(r.stdout)["compatible"] is True


# ---------------------------------------------------------------------------------- targets on file

def test_other_serde_major_exits_4_naming_it(pt2reg, encdec, cuda_target):
    target = cuda_target(serde_schema=[9, 0])
    r = pt2reg("verify", encdec.path, "--target", target)
    assert r.exit_code == 4
    line = one_error_line(r)
    assert "serde schema 8." in line and "reads schema 9.x" in line
    doc = json.loads(pt2reg("verify", encdec.path, "--target", target, "--json").stdout)
    assert doc["compatible"] is False and {f["code"] for f in doc["findings"]} == {"serde-schema"}


def test_baked_cpu_device_on_cuda_target_is_moved_with_a_warning(pt2reg, baked, cuda_target):
    r = pt2reg("verify", baked.path, "--target", cuda_target(), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    (f,) = doc["findings"]
    assert (f["severity"], f["code"]) == ("warning", "baked-device")
    assert baked_source_line() in f["message"] and "will be moved to cuda" in f["message"]
    human = pt2reg("verify", baked.path, "--target", cuda_target())
    assert human.exit_code == 0 and "baked-device" in human.stdout and "conftest_models.py:" in human.stdout


# ---------------------------------------------------------------------------------- custom ops

def test_custom_op_missing_then_imported(custom_op, home, tmp_path):
    r = run_cli_subprocess("verify", str(custom_op.path), home=home)
    assert r.returncode == 4, r.stderr
    assert OP in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert f"needs custom op {OP}" in r.stdout
    r = run_cli_subprocess("verify", str(custom_op.path), "--import", "tests.ops_mylib", "--json", home=home)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["compatible"] is True
    r = run_cli_subprocess("run", str(custom_op.path), "--samples", "--import", "tests.ops_mylib", home=home)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "model-0" in r.stdout and "ok" in r.stdout
    out = tmp_path / "out.pt"
    r = run_cli_subprocess("run", str(custom_op.path), "--inputs", str(custom_op.input_files["model"]),
                           "--output", str(out), "--import", "tests.ops_mylib", home=home)
    assert r.returncode == 0, r.stderr
    torch.testing.assert_close(torch.load(out, weights_only=True), torch.load(custom_op.expected["model"]))


def test_cuda_target_whose_op_has_only_a_cpu_kernel(pt2reg, custom_op, home, tmp_path):
    r = run_cli_subprocess("target", "--import", "tests.ops_mylib", "--json", home=home)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["custom_ops"][OP] == {"schema": MYLIB_SCHEMA, "dispatch_keys": ["CPU", "Meta"]}
    cpu_box = tmp_path / "cpu_box.json"
    cpu_box.write_text(json.dumps(doc))
    assert pt2reg("verify", custom_op.path, "--target", cpu_box).exit_code == 0
    cuda_box = tmp_path / "cuda_box.json"
    cuda_box.write_text(json.dumps({**doc, "device_type": "cuda", "compute_capability": [9, 0]}))
    r = pt2reg("verify", custom_op.path, "--target", cuda_box)
    assert r.exit_code == 4
    assert f"custom op {OP} has no CUDA kernel on the target (kernels: CPU, Meta)" in one_error_line(r)


# ---------------------------------------------------------------------------------- AOTInductor

@pytest.mark.slow
def test_aoti_variant_chosen_here_portable_elsewhere(pt2reg, aoti, cuda_target, tmp_path):
    # native code runs only when allowed (tests/integration/test_trust_sandbox.py: the refusals)
    doc = json.loads(pt2reg("verify", aoti.path, "--trust-native", "--json").stdout)
    here = doc["variants"]["encoder"]
    assert here["id"].startswith("aoti-cpu-") and "matches the target" in here["reason"]
    r = pt2reg("verify", aoti.path, "--target", cuda_target(), "--json")
    assert r.exit_code == 0, r.output
    there = json.loads(r.stdout)["variants"]["encoder"]
    assert there["id"] == "portable" and "built for cpu, the target device is cuda" in there["reason"]
    human = pt2reg("verify", aoti.path, "--target", cuda_target())
    assert "built for cpu, the target device is cuda" in human.stdout
    arm = tmp_path / "arm.json"
    arm.write_text(json.dumps({**json.loads(pt2reg("target", "--json").stdout), "machine": "aarch64"}))
    assert json.loads(pt2reg("verify", aoti.path, "--target", arm, "--json").stdout)["variants"]["encoder"]["id"] \
        == "portable"
    r = pt2reg("run", aoti.path, "--samples", "--json", "--trust-native")
    assert r.exit_code == 0, r.output
    (sample,) = json.loads(r.stdout)["samples"]
    assert sample["ok"] and sample["variant"] == here["id"]
