"""Session fixtures for the loader tests: tiny real models, exported and bundled once.

A pytest plugin (``-p tests.integration.conftest_models``). Each fixture returns a ``Built``
with the bundle path, real inputs (also saved as INPUTS.pt files) and the outputs the eager
model computed at export time; each is built once per run and shared by the xdist workers
(``tests.shared.value_built_once``): tests only read them.

- ``encdec``: encoder/decoder sharing a dynamic ``batch`` (1..8), a ``seq`` Dim (2..16) and the
  derived ``seq + 1`` (decoder targets), with golden samples.
- ``custom_op``: a model calling ``pt2reg_mylib::scale_add`` (``tests/ops_mylib.py``), exported
  and bundled in a subprocess so the op is NOT registered in the test process.
- ``baked``: a program with ``device="cpu"`` baked into ``arange`` (source line recorded).
- ``aoti``: the encoder plus an AOTInductor CPU package of it as a variant (compiled once, slow).
- ``pickled``: the encoder whose first weight is a pickled tensor (``use_pickle``).
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.shared import value_built_once

ROOT = Path(__file__).resolve().parents[2]
BAKED_LINE_MARK = "pos = torch.arange(x.shape[1], device=\"cpu\")"


@dataclass
class Built:
    path: Path
    inputs: dict[str, tuple] = field(default_factory=dict)        # program -> real inputs
    expected: dict[str, Any] = field(default_factory=dict)        # program -> eager outputs
    input_files: dict[str, Path] = field(default_factory=dict)    # program -> INPUTS.pt
    seconds: float = 0.0


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_cli_subprocess(*args: str, home: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``pt2reg ARGS`` in a fresh process (for custom ops that must not leak into this one)."""
    code = "from registry.cli import main; main()"
    return subprocess.run([sys.executable, "-c", code, "--home", str(home), *args], cwd=ROOT,
                          env=subprocess_env(), capture_output=True, text=True, timeout=timeout)


def _models():
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(32, 8)
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.lin(self.emb(tokens)))

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(32, 8)
            self.out = torch.nn.Linear(8, 32)

        def forward(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return self.out(hidden + self.emb(targets[:, 1:]))

    class Baked(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            pos = torch.arange(x.shape[1], device="cpu")
            return x + pos

    return Encoder, Decoder, Baked


def _encoder_export():
    import torch
    from torch.export import Dim, export

    Encoder, _, _ = _models()
    torch.manual_seed(0)
    enc = Encoder().eval()
    batch, seq = Dim("batch", min=1, max=8), Dim("seq", min=2, max=16)
    ds = {"tokens": {0: batch, 1: seq}}
    ep = export(enc, (torch.randint(0, 32, (2, 5)),), dynamic_shapes=ds)
    return enc, ep, ds


@pytest.fixture(scope="session")
def encdec(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return value_built_once(tmp_path_factory, "encdec", _build_encdec)


def _build_encdec(out: Path) -> Built:
    import torch
    from torch.export import Dim, export

    from registry.bundler import bundle_exported_programs

    _, Decoder, _ = _models()
    enc, ep_enc, ds_enc = _encoder_export()
    torch.manual_seed(1)
    dec = Decoder().eval()
    batch, seq = Dim("batch", min=1, max=8), Dim("seq", min=2, max=16)
    ds_dec = {"hidden": {0: batch, 1: seq}, "targets": {0: batch, 1: seq + 1}}
    tok = torch.randint(0, 32, (2, 5))
    with torch.no_grad():
        hid = enc(tok)
    tgt = torch.randint(0, 32, (2, 6))
    ep_dec = export(dec, (hid, tgt), dynamic_shapes=ds_dec)
    # Real inputs of another size than the export examples: dynamic shapes must hold.
    real_tok = torch.randint(0, 32, (3, 7))
    with torch.no_grad():
        real_hid = enc(real_tok)
        real_tgt = torch.randint(0, 32, (3, 8))
        expected = {"encoder": enc(real_tok), "decoder": dec(real_hid, real_tgt)}
    path = out / "encdec.pt2b"
    bundle_exported_programs(path, {"encoder": ep_enc, "decoder": ep_dec},
                             dynamic_shapes={"encoder": ds_enc, "decoder": ds_dec},
                             samples={"encoder": [(tok,)], "decoder": [(hid, tgt)]})
    built = Built(path, {"encoder": (real_tok,), "decoder": (real_hid, real_tgt)}, expected)
    for name, value in built.inputs.items():
        built.input_files[name] = out / f"{name}_inputs.pt"
        torch.save(value, built.input_files[name])
    return built


_CUSTOM_OP_SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    import torch
    import tests.ops_mylib  # registers pt2reg_mylib::scale_add in this process only
    from registry.bundler import bundle_exported_programs

    class WithOp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return torch.ops.pt2reg_mylib.scale_add(self.lin(x), 2.0)

    out = Path(sys.argv[1])
    torch.manual_seed(0)
    m = WithOp().eval()
    x = torch.randn(3, 4)
    ep = torch.export.export(m, (x,))
    bundle_exported_programs(out / "custom_op.pt2b", {"model": ep}, samples={"model": [(x,)]})
    with torch.no_grad():
        torch.save((x,), out / "model_inputs.pt")
        torch.save((m(x),), out / "model_expected.pt")
""")


@pytest.fixture(scope="session")
def custom_op(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return value_built_once(tmp_path_factory, "custom_op", _build_custom_op)


def _build_custom_op(out: Path) -> Built:
    r = subprocess.run([sys.executable, "-c", _CUSTOM_OP_SCRIPT, str(out)], cwd=ROOT, env=subprocess_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return Built(out / "custom_op.pt2b", input_files={"model": out / "model_inputs.pt"},
                 expected={"model": out / "model_expected.pt"})


@pytest.fixture(scope="session")
def baked(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return value_built_once(tmp_path_factory, "baked", _build_baked)


def _build_baked(out: Path) -> Built:
    import torch
    from torch.export import Dim, export

    from registry.bundler import bundle_exported_programs

    _, _, Baked = _models()
    ds = {"x": {1: Dim("width", min=2, max=64)}}
    x = torch.randn(2, 5, generator=torch.Generator().manual_seed(2))  # the same bytes whatever ran before
    ep = export(Baked(), (x,), dynamic_shapes=ds)
    path = out / "baked.pt2b"
    bundle_exported_programs(path, {"model": ep}, dynamic_shapes={"model": ds}, samples={"model": [(x,)]})
    return Built(path, {"model": (x,)}, {"model": Baked()(x)})


def baked_source_line() -> str:
    """``file:line`` of the baked ``arange`` in this file, as the manifest records it (the file
    name only: normalization removes the exporting machine's directories)."""
    lines = Path(__file__).read_text().splitlines()
    return f"{Path(__file__).name}:{lines.index('            ' + BAKED_LINE_MARK) + 1}"


@pytest.fixture(scope="session")
def aoti(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """Compiled once per run (~20 s), shared by the xdist workers."""
    return value_built_once(tmp_path_factory, "aoti", _build_aoti)


def _build_aoti(out: Path) -> Built:
    import torch

    from registry.bundler import ProgramInput, SampleInput, build_bundle
    from registry.runtime.torchrt import dim_names_of, save_exported_program

    enc, ep, ds = _encoder_export()
    names = dim_names_of(ep, ds)
    save_exported_program(ep, out / "encoder.pt2")
    started = time.monotonic()
    torch._inductor.aoti_compile_and_package(ep, package_path=str(out / "encoder_aoti.pt2"))
    seconds = time.monotonic() - started
    tok = torch.randint(0, 32, (2, 5))
    real = torch.randint(0, 32, (4, 9))
    with torch.no_grad():
        expected = enc(real)
    path = out / "aoti.pt2b"
    build_bundle(path, [ProgramInput("encoder", out / "encoder.pt2", names),
                        ProgramInput("encoder", out / "encoder_aoti.pt2")],
                 samples=[SampleInput("encoder", (tok,))])
    return Built(path, {"encoder": (real,)}, {"encoder": expected}, seconds=seconds)


@pytest.fixture(scope="session")
def pickled(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return value_built_once(tmp_path_factory, "pickled", _build_pickled)


def _build_pickled(out: Path) -> Built:
    from registry.bundler import ProgramInput, build_bundle
    from registry.runtime.torchrt import save_exported_program

    _, ep, _ = _encoder_export()
    pt2 = out / "encoder.pt2"
    save_exported_program(ep, pt2)
    # a pickled tensor (what torch writes for a tensor subclass weight): harmless here, but only
    # --trust-pickle may load it
    import torch

    from tests.hostile import read_json_member, rewrite_pt2

    cfg = read_json_member(pt2, "data/weights/model_weights_config.json")
    fqn, first = next(iter(cfg["config"].items()))
    first["use_pickle"] = True
    buf = io.BytesIO()
    torch.save(torch.nn.Parameter(ep.state_dict[fqn].detach().clone()), buf)
    pickled_pt2 = rewrite_pt2(pt2, out / "pickled.pt2", {
        "data/weights/model_weights_config.json": json.dumps(cfg).encode(),
        f"data/weights/{first['path_name']}": buf.getvalue()})
    path = out / "pickled.pt2b"
    build_bundle(path, [ProgramInput("encoder", pickled_pt2)])
    return Built(path)


@pytest.fixture
def cuda_target(tmp_path: Path):
    """Write a target JSON for a CUDA machine (this one's facts, device switched)."""
    import json

    from registry.runtime.probe import probe

    def make(cc: tuple[int, int] = (9, 0), **changes: Any) -> Path:
        doc = probe("cpu", cpu_isa=False).to_json()
        doc.update({"device_type": "cuda", "compute_capability": list(cc), "cuda_version": "12.8"})
        doc.update(changes)
        path = tmp_path / f"target-{len(list(tmp_path.glob('target-*')))}.json"
        path.write_text(json.dumps(doc))
        return path

    return make
