"""Writes ``mlp.pt2b``: a bundle in format 1 (whole-member sha256 beside the chunk list), kept
to prove that bundles written before format 2 still read, push and pull.

It was produced once by the code of commit 5d23abf (the last to write format 1)::

    git worktree add /tmp/f1 5d23abf && cd /tmp/f1 && python tests/data/format1/make_format1.py OUT_DIR

(the script is not run by the suite; the bundle it wrote is committed beside it).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from registry.bundler import ProgramInput, SampleInput, build_bundle


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(512, 512)
        self.b = torch.nn.Linear(512, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def main(out: Path) -> None:
    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(4, 512)
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: batch},))
    out.mkdir(parents=True, exist_ok=True)
    torch.export.save(ep, out / "mlp.pt2")
    build_bundle(out / "mlp.pt2b", [ProgramInput("mlp", out / "mlp.pt2")],
                 samples=[SampleInput("mlp", (x,))], metadata={"made_by": "5d23abf"})
    (out / "mlp.pt2").unlink()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
