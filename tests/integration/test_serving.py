"""Hand-off to serving (issue 21): ``pt2reg compile`` publishes N+1 with CPU AOTInductor
variants, ``export-triton`` writes a repository Triton's own protobuf schema parses and whose
files load as the backend loads them, ``materialize`` pulls a ``pt2reg://`` URI from a running
``pt2reg serve``. CPU AOTI compiles are slow (~30 s a program on 2 cores): the two-program
model is compiled once per run (``tests.shared.value_built_once``) and every test reads a copy.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")

from google.protobuf import text_format  # noqa: E402

from tests.cli_inprocess import run_in_process  # noqa: E402
from tests.shared import value_built_once  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _build(out: Path) -> dict:
    """A two-program model (weights >= 1 MiB each, so they are chunked), published as demo/m@1
    and compiled on this machine into demo/m@2."""
    from torch.export import Dim, export

    from registry.bundler import bundle_exported_programs

    torch.manual_seed(0)

    class Enc(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(512, 512)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.lin(x))

    class Dec(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.out = torch.nn.Linear(512, 640)

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return self.out(h).relu()

    batch = Dim("batch", min=1, max=64)
    x, h = torch.randn(3, 512), torch.randn(5, 512)
    ds = {"encoder": {"x": {0: batch}}, "decoder": {"h": {0: batch}}}
    eps = {"encoder": export(Enc(), (x,), dynamic_shapes=ds["encoder"]),
           "decoder": export(Dec(), (h,), dynamic_shapes=ds["decoder"])}
    bundle_exported_programs(out / "m.pt2b", eps, dynamic_shapes=ds, samples={"encoder": [(x,)], "decoder": [(h,)]})
    env = {"PT2REG_HOME": str(out / "home")}
    r = run_in_process("push", out / "m.pt2b", "--name", "demo/m", env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)
    # the sandbox on (the suite turns it off): the new variants' first load is the child's
    r = run_in_process("compile", "demo/m@1", "--json", env={**env, "PT2REG_SANDBOX": "on"})
    assert r.returncode == 0, (r.stdout + r.stderr)
    return {"dir": str(out), "result": json.loads(r.stdout)}


@pytest.fixture(scope="session")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    built = value_built_once(tmp_path_factory, "serving-compiled", _build)
    return Path(built["dir"]), built["result"]


@pytest.fixture
def home(compiled, tmp_path) -> Path:
    """A private copy of the registry home holding demo/m@1 and the compiled demo/m@2."""
    shutil.copytree(compiled[0] / "home", tmp_path / "home")
    return tmp_path / "home"


def cli(home: Path, *args, **env):
    return run_in_process(*args, env={"PT2REG_HOME": str(home), **env})


def test_compile_publishes_cpu_variants_chosen_here_portable_elsewhere(compiled, home, tmp_path):
    _, result = compiled
    assert result["ref"] == "demo/m@2" and result["parent"] == "demo/m@1"
    assert {v["program"] for v in result["variants"]} == {"encoder", "decoder"}
    assert all(v["variant"].startswith("aoti-cpu-") for v in result["variants"])
    verdicts = [json.loads(p.read_text()) for p in (home / "cache" / "vetted").glob("*.json")]
    assert sum(any(e.startswith("aoti:model:cpu") for e in v["verdicts"][torch.__version__])
               for v in verdicts) == 2, verdicts  # the child's, kept per torch
    assert len(result["samples"]) == 2 and all(s["ok"] for s in result["samples"])
    # store growth: the variants' weights are the portable programs' chunks, stored once
    growth = result["store_growth"]
    weights = (512 * 512 + 640 * 512) * 4
    assert growth["uploaded_bytes"] <= growth["variant_bytes"] - weights + 64 * 1024, growth
    doc = json.loads(cli(home, "verify", "demo/m@2", "--trust-native", "--json").stdout)
    for name in ("encoder", "decoder"):
        assert doc["variants"][name]["id"].startswith("aoti-cpu-"), doc["variants"]
        assert "matches the target" in doc["variants"][name]["reason"]
    other = json.loads(cli(home, "target", "--json").stdout)
    other.update({"device_type": "cuda", "compute_capability": [9, 0], "cuda_version": "12.8"})
    (tmp_path / "gpu.json").write_text(json.dumps(other))
    r = cli(home, "verify", "demo/m@2", "--target", tmp_path / "gpu.json", "--json")
    assert r.returncode == 0, (r.stdout + r.stderr)
    for name in ("encoder", "decoder"):
        there = json.loads(r.stdout)["variants"][name]
        assert there["id"] == "portable" and "built for cpu, the target device is cuda" in there["reason"]
    show = cli(home, "show", "demo/m@2", "--json")
    assert show.returncode == 0, (show.stdout + show.stderr)
    assert "demo/m@1" in show.stdout and "compiled.encoder." in show.stdout


def test_a_crash_loading_the_new_variants_is_one_line_and_publishes_nothing(compiled, tmp_path, monkeypatch):
    """torch 2.11's AOTInductor CUDA loader crashed (SIGSEGV) on a benign package on an H100:
    the first load of what ``compile`` just built is the sandbox child's, so such a crash is
    one line, exit 5, and nothing is published (the child's crash stands in for torch's here)."""
    from registry.runtime import sandbox as sandbox_mod

    env = {"PT2REG_HOME": str(tmp_path / "home"), "PT2REG_SANDBOX": "on"}
    assert run_in_process("push", compiled[0] / "m.pt2b", "--name", "demo/m", env=env).returncode == 0
    real, children = subprocess.run, []

    def crashing(cmd, *a, **kw):
        if "registry.runtime.sandbox" in cmd:
            children.append(cmd)
            return subprocess.CompletedProcess(cmd, -11, "", "Fatal Python error: Segmentation fault\n")
        return real(cmd, *a, **kw)

    monkeypatch.setattr(sandbox_mod.subprocess, "run", crashing)
    r = run_in_process("compile", "demo/m@1", "--program", "encoder", env=env)
    assert r.returncode == 5 and children, (r.stdout + r.stderr)
    lines = r.stderr.strip().splitlines()
    assert "crashed (SIGSEGV)" in lines[0] and "'encoder'" in lines[0], r.stderr
    assert "this torch's own loader" in r.stderr
    listed = json.loads(run_in_process("list", "demo/m", "--json", env=env).stdout)["versions"]
    assert [v["version"] for v in listed] == [1]


def test_a_second_compile_for_the_same_target_is_refused_and_variants_carry_over(home, tmp_path):
    r = cli(home, "compile", "demo/m@2")
    assert r.returncode == 6 and "already has variant aoti-cpu-" in r.stderr, (r.stdout + r.stderr)
    # what a compile on another GPU does with the variants already there: carried over, their
    # weights still chunked at the portable program's (so they stay deduplicated)
    from registry.bundler import add_variants
    from registry.client import Registry
    from registry.config import Settings

    with Registry(Settings.resolve(str(home))) as reg:
        src = reg.materialize("demo/m@2", record=None)
        again = add_variants(tmp_path / "again.pt2b", src.manifest, src.files, [])
    assert again.manifest.members == src.manifest.members and again.manifest.programs == src.manifest.programs
    assert again.digest == src.digest


def _expected(home: Path, tmp_path: Path) -> dict[str, tuple[list, list]]:
    from registry.format.bundle import BundleFile
    from registry.runtime.samples import read_sample

    pulled = tmp_path / "m2.pt2b"
    assert cli(home, "pull", "demo/m@2", "-o", pulled).returncode == 0
    out = {}
    bf = BundleFile.open(pulled)
    for s in bf.manifest.samples:
        local = bf.extract_member(s.member, tmp_path / s.member.replace("/", "_"))
        out[s.program] = read_sample(local, list(s.inputs), list(s.outputs))
    return out


def _check_repository(repo: Path, home: Path, tmp_path: Path, version: int = 2) -> None:
    expected = _expected(home, tmp_path)
    names = sorted(p.name for p in repo.iterdir())
    assert names == ["m_decoder", "m_encoder"]
    for program in ("encoder", "decoder"):
        model = repo / f"m_{program}"
        cfg = text_format.Parse((model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
        assert cfg.name == f"m_{program}" and cfg.backend == "pytorch" and cfg.platform == "torch_aoti"
        assert cfg.max_batch_size == 0
        width = {"encoder": (512, 512), "decoder": (512, 640)}[program]
        (inp,), (out,) = cfg.input, cfg.output
        assert inp.name == "INPUT__0" and inp.data_type == model_config_pb2.TYPE_FP32 and list(inp.dims) == [-1, width[0]]
        assert out.name == "OUTPUT__0" and out.data_type == model_config_pb2.TYPE_FP32 and list(out.dims) == [-1, width[1]]
        assert [g.kind for g in cfg.instance_group] == [model_config_pb2.ModelInstanceGroup.KIND_CPU]
        assert cfg.default_model_filename == "model.pt2" and dict(cfg.cc_model_filenames) == {}
        params = {k: v.string_value for k, v in cfg.parameters.items()}
        assert params["pt2reg_ref"] == f"demo/m@{version}" and params["pt2reg_digest"].startswith("sha256:")
        assert params["pt2reg_program"] == program
        assert sorted(p.name for p in (model / str(version)).iterdir()) == ["model.pt2"]
        # as the backend loads it: AOTIModelPackageLoader(path, "model") (aoti_load_package's
        # default model name is "model" too; this names it explicitly)
        from torch._inductor.package import load_package

        runner = load_package(str(model / str(version) / "model.pt2"), "model")
        inputs, golden = expected[program]
        got = runner(*inputs)
        got = got if isinstance(got, (list, tuple)) else [got]
        torch.testing.assert_close(list(got), list(golden), rtol=1e-4, atol=1e-5)


def test_export_triton_parses_with_tritons_schema_and_loads_as_the_backend(home, tmp_path):
    repo = tmp_path / "repo"
    r = cli(home, "export-triton", "demo/m@2", repo, "--trust-native", "--json")
    assert r.returncode == 0, (r.stdout + r.stderr)
    _check_repository(repo, home, tmp_path)
    # native code needs trust; the portable-only version has nothing to serve
    r = cli(home, "export-triton", "demo/m@2", tmp_path / "untrusted")
    assert r.returncode == 5 and "native code" in r.stderr and not (tmp_path / "untrusted").exists()
    r = cli(home, "export-triton", "demo/m@1", tmp_path / "none", "--trust-native")
    assert r.returncode == 4 and "no AOTInductor variant" in r.stderr, (r.stdout + r.stderr)


def test_triton_config_maps_compute_capabilities():
    from registry.format.manifest import AotiTarget, Dim, ProgramSpec, Serialization, TensorSpec, Variant
    from registry.serving.triton import cc_key, plan_models, triton_config

    def v(cc):
        return Variant(f"aoti-cuda-sm{cc}", "aoti", f"programs/p.sm{cc}.pt2", "model",
                       AotiTarget(device_key="cuda", compute_capability=cc))

    spec = ProgramSpec("p", (Variant("portable", "exported_program", "programs/p.pt2", "model"), v("90"), v("80")),
                       (TensorSpec("x", "bfloat16", (Dim("s0", 1, 8, "s0"), 4)),), (TensorSpec("y", "int64", (2,)),),
                       (), (), (), (), (), Serialization("2.13.0", (8, 20), {}))
    (model,) = plan_models({"p": spec}, "m")
    cfg = text_format.Parse(triton_config(model, parameters={"pt2reg_ref": "a/b@1"}), model_config_pb2.ModelConfig())
    assert dict(cfg.cc_model_filenames) == {"8.0": "model.sm_80.pt2", "9.0": "model.sm_90.pt2"}
    assert cfg.default_model_filename == "model.sm_90.pt2" and cc_key("120") == "12.0"
    assert cfg.input[0].data_type == model_config_pb2.TYPE_BF16 and list(cfg.input[0].dims) == [-1, 4]
    assert [g.kind for g in cfg.instance_group] == [model_config_pb2.ModelInstanceGroup.KIND_GPU]


@pytest.fixture
def server(home, tmp_path):
    from tests.services_server import make_token, registry_server

    db, store = f"sqlite:///{home / 'registry.db'}", f"file://{home / 'store'}"
    token = make_token(db, "kserve", ["model:demo/*:pull"])
    with registry_server(db, store, log_dir=tmp_path / "server") as running:
        yield running, token


def _materialize(server_url: str, token: str, *args, cwd: Path) -> subprocess.CompletedProcess:
    # only the registry's URL and the token in its environment, as in a KServe storage
    # initializer (deploy/kserve): the URI names the model and version only
    return subprocess.run([sys.executable, "-m", "registry.cli", "materialize", "pt2reg:///demo/m@2", *args],
                          cwd=ROOT, env={"PT2REG_TOKEN": token, "PT2REG_URL": server_url}, capture_output=True,
                          text=True, timeout=300)


def _materialize_here(server_url: str, token: str, *args):
    """The same in this process (no python + torch start): for the refusals; the URI names the
    configured registry's host, which is the same registry."""
    host = server_url.removeprefix("http://")
    return run_in_process("materialize", f"pt2reg://{host}/demo/m@2", *args,
                          env={"PT2REG_TOKEN": token, "PT2REG_HOME": None, "PT2REG_URL": server_url})


def test_materialize_from_a_running_server(server, home, tmp_path):
    (running, token) = server
    dest = tmp_path / "mnt" / "models"
    r = _materialize(running.url, token, dest, "--trust-native", cwd=ROOT)
    assert r.returncode == 0, r.stderr
    _check_repository(dest, home, tmp_path)
    # a required signature it does not carry: exit 5, nothing written
    from registry.format.signing import generate_keypair

    (tmp_path / "keys").mkdir()
    _, pub = generate_keypair(tmp_path / "keys" / "k")
    dest2 = tmp_path / "mnt2"
    r = _materialize_here(running.url, token, dest2, "--trust-native", "--require-signature", pub)
    assert r.returncode == 5 and "signature" in r.stderr, r.stderr
    assert not dest2.exists() or not any(dest2.iterdir())
    # a tampered blob in the server's store: exit 5, nothing written
    blobs = sorted((home / "store").rglob("*"), key=lambda p: p.stat().st_size if p.is_file() else 0)
    victim = blobs[-1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.chmod(0o644)
    victim.write_bytes(bytes(data))
    dest3 = tmp_path / "mnt3"
    r = _materialize_here(running.url, token, dest3, "--trust-native")
    assert r.returncode == 5 and "is corrupt in the store" in r.stderr, r.stderr
    assert not dest3.exists() or not any(dest3.iterdir())
