"""Hand-off to serving, attacked with a model unlike test_serving.py's (reviewer R3): two inputs
of different dtypes (float32, int64), a dynamic batch dim with a min and a max, two outputs as
a tuple. Compiled once per run (~20 s of CPU AOTInductor). Also: what Triton cannot serve,
hostile ``materialize`` URIs and destinations, and a tampered blob (nothing left in DEST).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")

from google.protobuf import text_format  # noqa: E402

from tests.cli_inprocess import run_in_process  # noqa: E402
from tests.shared import value_built_once  # noqa: E402


def _build(out: Path) -> dict:
    from torch.export import Dim, export

    from registry.bundler import bundle_exported_programs

    torch.manual_seed(1)

    class Pair(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = self.lin(x) + idx.unsqueeze(1).to(x.dtype)
            return y, idx * 2 + y.argmax(dim=1)

    batch = Dim("batch", min=2, max=32)
    x, idx = torch.randn(4, 8), torch.tensor([3, -1, 7, 2], dtype=torch.int64)
    ds = {"x": {0: batch}, "idx": {0: batch}}
    ep = export(Pair(), (x, idx), dynamic_shapes=ds)
    bundle_exported_programs(out / "p.pt2b", {"model": ep}, dynamic_shapes={"model": ds},
                             samples={"model": [(x, idx)]})
    env = {"PT2REG_HOME": str(out / "home")}
    r = run_in_process("push", out / "p.pt2b", "--name", "held/pair", env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)
    r = run_in_process("compile", "held/pair@1", env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)
    return {"dir": str(out)}


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(value_built_once(tmp_path_factory, "serving-heldout", _build)["dir"])


@pytest.fixture
def home(built, tmp_path) -> Path:
    shutil.copytree(built / "home", tmp_path / "home")
    return tmp_path / "home"


def cli(home: Path, *args, **env):
    return run_in_process(*args, env={"PT2REG_HOME": str(home), "PT2REG_TOKEN": None, "PT2REG_URL": None, **env})


def _golden(home: Path, tmp_path: Path) -> tuple[list, list]:
    from registry.format.bundle import BundleFile
    from registry.runtime.samples import read_sample

    pulled = tmp_path / "p2.pt2b"
    assert cli(home, "pull", "held/pair@2", "-o", pulled).returncode == 0
    bf = BundleFile.open(pulled)
    (s,) = bf.manifest.samples
    local = bf.extract_member(s.member, tmp_path / s.member.replace("/", "_"))
    return read_sample(local, list(s.inputs), list(s.outputs))


def _config(path: Path):
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def test_two_dtypes_tuple_outputs_dynamic_batch(home, tmp_path):
    repo = tmp_path / "repo"
    r = cli(home, "export-triton", "held/pair@2", repo, "--trust-native")
    assert r.returncode == 0, (r.stdout + r.stderr)
    assert [p.name for p in repo.iterdir()] == ["pair"]
    cfg = _config(repo / "pair" / "config.pbtxt")
    assert (cfg.name, cfg.backend, cfg.platform, cfg.max_batch_size) == ("pair", "pytorch", "torch_aoti", 0)
    assert [(t.name, t.data_type, list(t.dims)) for t in cfg.input] == [
        ("INPUT__0", model_config_pb2.TYPE_FP32, [-1, 8]), ("INPUT__1", model_config_pb2.TYPE_INT64, [-1])]
    assert [(t.name, t.data_type, list(t.dims)) for t in cfg.output] == [
        ("OUTPUT__0", model_config_pb2.TYPE_FP32, [-1, 8]), ("OUTPUT__1", model_config_pb2.TYPE_INT64, [-1])]
    assert cfg.parameters["pt2reg_ref"].string_value == "held/pair@2"
    runner = torch._inductor.aoti_load_package(str(repo / "pair" / "2" / "model.pt2"))
    inputs, golden = _golden(home, tmp_path)
    got = runner(*inputs)
    torch.testing.assert_close(list(got), list(golden), rtol=1e-4, atol=1e-5)

    # batched: this model's batch Dim is 2..32, and Triton sends batches of 1 (and up to the max)
    for mbs, words in (("16", "at least 2"), ("64", "at least 2")):
        r = cli(home, "export-triton", "held/pair@2", tmp_path / "c", "--trust-native", "--max-batch-size", mbs)
        assert r.returncode == 2 and words in r.stderr, (r.stdout + r.stderr)
        assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())
    for bad in ("../escape", "a/b", ".hidden", "x y"):
        r = cli(home, "export-triton", "held/pair@2", tmp_path / "d", "--trust-native", "--model-name", bad)
        assert r.returncode == 2 and "model name" in r.stderr, (bad, r.stdout + r.stderr)
    assert not (tmp_path / "escape").exists()
    # the portable-only version: exit 4, one clear line
    r = cli(home, "export-triton", "held/pair@1", tmp_path / "e", "--trust-native")
    assert r.returncode == 4 and "no AOTInductor variant" in r.stderr


def test_batched_config_reshapes_batch_only_tensors_and_respects_the_range():
    from registry.errors import UsageError
    from registry.format.manifest import AotiTarget, Dim, ProgramSpec, Serialization, TensorSpec, Variant
    from registry.serving.triton import plan_models, triton_config

    aoti = Variant("aoti-cpu", "aoti", "programs/p.cpu.pt2", "model", AotiTarget(device_key="cpu"))
    b = Dim(1, 32, "s0", "batch")
    spec = ProgramSpec("p", (aoti,), (TensorSpec("x", "float32", (b, 8)), TensorSpec("i", "int64", (b,))),
                       (TensorSpec("y", "float32", (b, 8)), TensorSpec("j", "int64", (b,))), (b,), (), (), (), (),
                       Serialization("2.13.0", (8, 20), {}))
    (model,) = plan_models({"p": spec}, "pair")
    cfg = text_format.Parse(triton_config(model, max_batch_size=16), model_config_pb2.ModelConfig())
    assert cfg.max_batch_size == 16
    assert [list(t.dims) for t in cfg.input] == [[8], [1]] and [list(t.dims) for t in cfg.output] == [[8], [1]]
    assert cfg.input[1].HasField("reshape") and list(cfg.input[1].reshape.shape) == []
    assert not cfg.input[0].HasField("reshape")
    with pytest.raises(UsageError, match="at most 32"):
        triton_config(model, max_batch_size=64)
    with pytest.raises(UsageError, match="invalid Triton model name"):
        plan_models({"p": spec}, "../x")


def test_programs_triton_cannot_serve_are_refused():
    from registry.errors import IncompatibleError
    from registry.format.manifest import AotiTarget, Dim, ProgramSpec, RequiredOp, Serialization, TensorSpec, Variant
    from registry.serving.triton import plan_models

    aoti = Variant("aoti-cpu", "aoti", "programs/p.cpu.pt2", "model", AotiTarget(device_key="cpu"))
    base = dict(variants=(Variant("portable", "exported_program", "programs/p.pt2", "model"), aoti),
                outputs=(TensorSpec("y", "float32", (2,)),))

    def spec(inputs, ops=()):
        return ProgramSpec("p", base["variants"], inputs, base["outputs"], (), ops, (), (), (),
                           Serialization("2.13.0", (8, 20), {}))

    x = TensorSpec("x", "float32", (Dim(1, 8, "s0"), 2))
    cases = [(spec((x, TensorSpec("n", "int", None))), "not a tensor"),
             (spec((TensorSpec("z", "complex64", (2,)),)), "no type for"),
             (spec((x,), ops=(RequiredOp("my::op", "default", "torch.ops.my.op.default", None),)), "custom op")]
    for prog, words in cases:
        with pytest.raises(IncompatibleError, match=words):
            plan_models({"p": prog}, "m")


@pytest.mark.parametrize("uri", ["pt2reg://host/../x@1", "pt2reg://host/held/pair@1?x=1", "pt2reg://u:p@host/held/pair@1",
                                 "pt2reg://host/held/pair@1#f", "http://host/held/pair@1", "pt2reg:///held/pair",
                                 "pt2reg://host:99999/held/pair@1", "pt2reg://host/held/pair", "pt2reg://host/",
                                 "pt2reg://host/held%2Fpair@1", "pt2reg://host/held/pair@1/../../x"])
def test_hostile_uris_refused_before_anything(uri, tmp_path):
    dest = tmp_path / "dest"
    r = run_in_process("materialize", uri, dest, "--trust-native",
                       env={"PT2REG_TOKEN": "pt2r_x", "PT2REG_HOME": str(tmp_path / "h"), "PT2REG_URL": None})
    assert r.returncode == 2, (uri, r.returncode, r.stdout + r.stderr)
    assert len(r.stderr.strip().splitlines()) <= 2 and "Traceback" not in r.stderr
    assert not dest.exists()


def test_materialize_destinations_and_tampering(home, tmp_path):
    # a non-empty DEST holding a clashing name: refused, DEST untouched
    dest = tmp_path / "full"
    (dest / "pair").mkdir(parents=True)
    (dest / "pair" / "keep").write_text("mine")
    r = cli(home, "materialize", "held/pair@2", dest, "--trust-native")
    assert r.returncode != 0 and "already exists" in r.stderr
    assert sorted(p.name for p in dest.rglob("*")) == ["keep", "pair"]
    # DEST a symlink (to a directory elsewhere): refused, nothing written through it
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "link"
    link.symlink_to(elsewhere)
    r = cli(home, "materialize", "held/pair@2", link, "--trust-native")
    assert r.returncode == 2 and "symlink" in r.stderr, r.stderr
    assert not any(elsewhere.iterdir())
    # a tampered blob in the store (no verified copy cached): exit 5, nothing in DEST
    shutil.rmtree(home / "cache", ignore_errors=True)
    blobs = sorted((p for p in (home / "store").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    victim = blobs[-1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.chmod(0o644)
    victim.write_bytes(bytes(data))
    out = tmp_path / "mnt" / "models"
    r = cli(home, "materialize", "held/pair@2", out, "--trust-native")
    assert r.returncode == 5, r.stderr
    assert not out.exists() or not any(out.iterdir())
    assert not (tmp_path / "mnt").exists() or [p.name for p in (tmp_path / "mnt").iterdir()] in ([], ["models"])


def test_materialize_against_a_server_needs_a_token_that_may_pull(home, tmp_path):
    from tests.services_server import make_token, registry_server

    db, store = f"sqlite:///{home / 'registry.db'}", f"file://{home / 'store'}"
    good = make_token(db, "kserve", ["model:held/*:pull"])
    wrong = make_token(db, "nosy", ["model:other/*:pull"])
    with registry_server(db, store, log_dir=tmp_path / "server") as running:
        uri = f"pt2reg://{running.url.removeprefix('http://')}/held/pair@2"

        def run(token, dest, *args):
            return run_in_process("materialize", uri, dest, "--trust-native", *args,
                                  env={"PT2REG_TOKEN": token, "PT2REG_HOME": None, "PT2REG_URL": running.url})

        for token, code in ((None, 7), (wrong, 3), ("pt2r_" + "x" * 43, 7)):
            dest = tmp_path / f"d{code}{bool(token)}"
            r = run(token, dest)
            assert r.returncode in (code, 3, 7) and len(r.stderr.strip().splitlines()) == 1, (token, r.returncode, r.stderr)
            assert not dest.exists() or not any(dest.iterdir())
        r = run(good, tmp_path / "ok", "--layout", "files")
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "ok" / "manifest.json").is_file()
