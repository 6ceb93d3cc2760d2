"""Builds the registry the web UI test browses (run as a script in its own process, so the
custom op ``pt2reg_mylib::scale_add`` registers there and not in the test process).

    python -m tests.integration._web_registry HOME

HOME/registry.db + HOME/store: ``team/enc`` 1 and 2 (encoder: ``tokens`` batch 1..8 x seq
2..16, then seq 2..32; decoder with the derived ``seq + 1``; ``post`` calling the custom op),
``prod`` on 2, an attestation of 1; a three-generation lineage ``team/base@1 -> team/ft@1 -> team/distil@1`` where
``team/ft`` also derives from ``other/x@1``.
"""
from __future__ import annotations

import sys
from pathlib import Path


def _bundle(out: Path, seq_max: int, models: list[str]) -> list[Path]:
    import importlib

    import torch
    from torch.export import Dim, export

    from registry.bundler import bundle_exported_programs
    from tests.integration.conftest_models import _models

    Encoder, Decoder, _ = _models()  # the loader tests' encoder/decoder

    class Post(torch.nn.Module):
        def forward(self, logits: torch.Tensor) -> torch.Tensor:
            return torch.ops.pt2reg_mylib.scale_add(logits, 2.0)

    importlib.import_module("tests.ops_mylib")  # registers pt2reg_mylib::scale_add, here only
    torch.manual_seed(0)
    enc, dec = Encoder().eval(), Decoder().eval()
    batch, seq = Dim("batch", min=1, max=8), Dim("seq", min=2, max=seq_max)
    tok = torch.randint(0, 32, (2, 5))
    ds_enc = {"tokens": {0: batch, 1: seq}}
    ds_dec = {"hidden": {0: batch, 1: seq}, "targets": {0: batch, 1: seq + 1}}
    with torch.no_grad():
        hid = enc(tok)
    tgt = torch.randint(0, 32, (2, 6))
    programs = {"encoder": export(enc, (tok,), dynamic_shapes=ds_enc),
                "decoder": export(dec, (hid, tgt), dynamic_shapes=ds_dec),
                "post": export(Post(), (torch.randn(2, 4),))}
    paths = []
    for model in models:  # one bundle per model (its own digest), from the same exports
        paths.append(out / f"{model.replace('/', '_')}_{seq_max}.pt2b")
        bundle_exported_programs(paths[-1], programs, dynamic_shapes={"encoder": ds_enc, "decoder": ds_dec},
                                 samples={"encoder": [(tok,)]},
                                 metadata={"task": "translate", "team": "nlp", "model": model})
    return paths


def build(home: Path) -> None:
    from registry.client.api import Registry
    from registry.config import Settings

    home.mkdir(parents=True, exist_ok=True)
    x, enc1, base = _bundle(home, 16, ["other/x", "team/enc", "team/base"])
    enc2, ft, distil = _bundle(home, 32, ["team/enc", "team/ft", "team/distil"])
    with Registry(Settings.resolve(home=str(home), env={})) as reg:
        reg.push(x, "other/x", detect_git=False)
        reg.push(enc1, "team/enc", detect_git=False)
        reg.push(enc2, "team/enc", aliases=["prod"], detect_git=False)
        reg.push(base, "team/base", datasets=["s3://data/train"], run_id="run-7", detect_git=False)
        reg.push(ft, "team/ft", parents=["team/base@1", "other/x@1"], detect_git=False)
        reg.push(distil, "team/distil", parents=["team/ft@1"], git_commit="0" * 40, detect_git=False)
        reg.meta.record_attestation("team/enc", 1, label="cpu-ci", passed=True, device="cpu",
                                    target={"device": "cpu", "torch": "2.13.0"}, results=[],
                                    actor="ci", host="ci-runner")


if __name__ == "__main__":
    build(Path(sys.argv[1]))
