"""Programs exported on a GPU, bundled, verified and run on a machine without one (issue 40).

The fixtures in ``tests/data/gpu_exports`` are what ``torch.export.save`` writes on ``cuda:0``
(``scripts/make_gpu_fixtures.py``: devices ``cuda:0`` in the graph, the weights' config and the
example inputs' storage). On a CPU-only machine a bundle of them computes its golden samples
on the CPU, ``verify`` and ``run`` agree, and the outputs equal the eager model's. The tests
marked ``gpu`` run where CUDA is (``pytest -m gpu`` on a GPU machine; reported as skipped
elsewhere).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.cli_inprocess import refused

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu_exports"
SINGLE = ["cnn", "mlp_bf16"]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on a GPU machine)")


def _json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _bundle(pt2reg, out: Path, names: list[str], samples: bool = True) -> Path:
    args = [f"{n}={DATA / n}.pt2" for n in names]
    if samples:
        args += [a for n in names for a in ("--sample", f"{n}={DATA / n}.inputs.pt")]
    r = pt2reg("bundle", *args, "-o", out)
    assert r.exit_code == 0, r.output
    return out


def test_the_fixtures_are_gpu_exports():
    """What the tests below rely on: every device the files record is cuda:0."""
    import zipfile

    for name in [*SINGLE, "encoder", "decoder"]:
        with zipfile.ZipFile(DATA / f"{name}.pt2") as z:
            texts = [z.read(n).decode() for n in z.namelist() if n.endswith(".json")]
            pickled = [z.read(n) for n in z.namelist() if n.endswith("data.pkl") or "sample_inputs" in n]
        devices = {json.dumps(d) for t in texts for d in _devices(json.loads(t))}
        assert devices == {'{"type": "cuda", "index": 0}'}, (name, devices)
        assert all(b"cuda:0" in p for p in pickled if p)
        with zipfile.ZipFile(DATA / f"{name}.inputs.pt") as z:
            assert b"cuda:0" in z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))


def _devices(value):
    if isinstance(value, dict):
        if set(value) == {"type", "index"}:
            yield value
        for v in value.values():
            yield from _devices(v)
    elif isinstance(value, list):
        for v in value:
            yield from _devices(v)


@pytest.mark.parametrize("name", SINGLE)
def test_a_gpu_export_bundles_with_samples_verifies_and_runs_on_the_cpu(pt2reg, tmp_path, name):
    bundle = _bundle(pt2reg, tmp_path / f"{name}.pt2b", [name])
    doc = _json(pt2reg("inspect", bundle, "--json"))
    assert [s["device"] for s in doc["samples"]] == ["cpu"]  # computed here, on the CPU
    assert {b["device"] for b in doc["programs"][name]["baked_devices"]} == {"cuda:0"}
    report = _json(pt2reg("verify", bundle, "--json"))
    assert report["compatible"] and report["device"] == "cpu"
    assert {f["code"] for f in report["findings"]} == {"baked-device"}
    ran = _json(pt2reg("run", bundle, "--samples", "--json"))
    assert ran["ok"] and ran["device"] == "cpu"
    assert all(o["ok"] and o["max_abs"] == 0 for s in ran["samples"] for o in s["outputs"])
    out = tmp_path / "out.pt"
    _json(pt2reg("run", bundle, "--inputs", DATA / f"{name}.inputs.pt", "--output", out, "--json"))
    (got,), (expected,) = torch.load(out), torch.load(DATA / f"{name}.expected.pt")
    assert got.dtype == expected.dtype and got.device.type == "cpu"
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)  # the eager model's outputs


def test_two_programs_exported_on_the_gpu_run_their_samples_and_inputs(pt2reg, tmp_path):
    bundle = _bundle(pt2reg, tmp_path / "ed.pt2b", ["encoder", "decoder"])
    doc = _json(pt2reg("inspect", bundle, "--json"))
    baked = [b for b in doc["programs"]["encoder"]["baked_devices"] if b["op"] != "weight"]
    assert baked and baked[0]["device"] == "cuda:0" and "arange" in baked[0]["op"]
    assert _json(pt2reg("run", bundle, "--samples", "--json"))["ok"]
    for name in ("encoder", "decoder"):
        out = tmp_path / f"{name}.out.pt"
        _json(pt2reg("run", bundle, "--program", name, "--inputs", DATA / f"{name}.inputs.pt", "--output", out, "--json"))
        torch.testing.assert_close(torch.load(out)[0], torch.load(DATA / f"{name}.expected.pt")[0])


@pytest.mark.parametrize("name", SINGLE)
def test_verify_and_run_agree_on_a_bundle_without_samples(pt2reg, tmp_path, name):
    bundle = _bundle(pt2reg, tmp_path / f"{name}.pt2b", [name], samples=False)
    assert _json(pt2reg("verify", bundle, "--json"))["compatible"]
    _json(pt2reg("run", bundle, "--inputs", DATA / f"{name}.inputs.pt", "--json"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="about a machine without CUDA")
@pytest.mark.parametrize("command", [("verify",), ("run", "--samples")])
def test_a_device_this_machine_lacks_is_exit_4_for_verify_and_run_alike(pt2reg, tmp_path, command):
    bundle = _bundle(pt2reg, tmp_path / "cnn.pt2b", ["cnn"])
    refused(pt2reg(*command, bundle, "--device", "cuda:0"), "cuda:0 is not available on this machine", code=4)


def test_a_pushed_gpu_export_runs_by_ref_cold_and_in_the_sandbox(pt2reg, tmp_path):
    """By ref, cold (weights fetched while torch deserializes) and with the first-load sandbox
    on: its child deserializes the GPU export on the CPU, never reaching for CUDA."""
    bundle = _bundle(pt2reg, tmp_path / "cnn.pt2b", ["cnn"])
    assert pt2reg("push", bundle, "--name", "team/cnn").exit_code == 0
    from click.testing import CliRunner

    from registry.cli import cli

    r = CliRunner().invoke(cli, ["--home", str(pt2reg.home), "run", "team/cnn@1", "--samples", "--json"],
                           env={"PT2REG_SANDBOX": "on"}, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["ok"]
    vetted = list((pt2reg.home / "cache" / "vetted").glob("*.json"))
    assert vetted and all(json.loads(p.read_text())["verdicts"][torch.__version__] == ["exported_program:model"]
                          for p in vetted)


def test_the_python_api_loads_a_gpu_export_where_it_runs(tmp_path, monkeypatch, pt2reg):
    import registry
    from registry.errors import InputValidationError

    monkeypatch.setenv("PT2REG_HOME", str(tmp_path / "api-home"))
    bundle = _bundle(pt2reg, tmp_path / "cnn.pt2b", ["cnn"])
    loaded = registry.load(bundle)  # the default device: cuda:0 on a GPU machine, else cpu
    expected_device = "cuda:0" if torch.cuda.is_available() else "cpu"
    assert loaded.device == expected_device and loaded["cnn"].device == expected_device
    (x,) = torch.load(DATA / "cnn.inputs.pt", map_location="cpu")  # saved from cuda:0
    out = loaded(x.to(expected_device))  # one program: the bundle is callable
    torch.testing.assert_close(out.cpu(), torch.load(DATA / "cnn.expected.pt")[0], rtol=5e-3, atol=5e-3)
    with pytest.raises(InputValidationError, match="input 'x' is on meta, the program runs on"):
        loaded(x.to("meta"))


@pytest.mark.gpu
@needs_cuda
def test_a_real_gpu_export_samples_on_the_gpu_and_checks_on_both(pt2reg, tmp_path):
    """On a GPU machine: samples of a program exported on cuda:0 are computed there (recorded
    as such), pass on the GPU, and pass on the CPU within the cross-device tolerance."""
    import subprocess
    import sys

    out = tmp_path / "real"
    subprocess.run([sys.executable, str(Path(__file__).resolve().parents[2] / "scripts" / "make_gpu_fixtures.py"),
                    "--out", str(out), "--device", "cuda:0"], check=True)
    r = pt2reg("bundle", f"cnn={out / 'cnn.pt2'}", "--sample", f"cnn={out / 'cnn.inputs.pt'}", "-o", tmp_path / "c.pt2b")
    assert r.exit_code == 0, r.output
    assert [s["device"] for s in _json(pt2reg("inspect", tmp_path / "c.pt2b", "--json"))["samples"]] == ["cuda"]
    for device in ("cuda:0", "cpu"):
        ran = _json(pt2reg("run", tmp_path / "c.pt2b", "--samples", "--device", device, "--json"))
        assert ran["ok"] and ran["device"] == device, ran
