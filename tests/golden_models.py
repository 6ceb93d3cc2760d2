"""Small bundles whose digests are checked in (``tests/integration/manifest_digests.json``).

Graph stack traces record the line numbers of the models' source, so these models live in a
file of their own that nothing else edits: changing this file changes the digests (record
them again, on purpose). Between them the bundles use every part of the manifest the bundler
writes: Dim names and a derived dim, golden samples, baked-in arguments, a baked device, a
library output class, several programs in a given order, and a chunked member.

    python -m tests.golden_models OUT_DIR      # builds them, prints name, path
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.export import Dim, export


@dataclass
class Pair:
    left: torch.Tensor
    right: torch.Tensor


torch.export.register_dataclass(Pair, serialized_type_name="tests.golden_models.Pair")


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(16, 4)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.emb(tokens) * mask[:, 1:, None]


class Flagged(torch.nn.Module):
    def forward(self, x: torch.Tensor, flag: bool, k: int) -> torch.Tensor:
        pos = torch.arange(x.shape[0], device="cpu")
        return (x * k if flag else x - k) + pos


class Wide(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(640, 640, bias=False)  # 1.6 MB of weights: a chunked member

    def forward(self, x: torch.Tensor) -> Pair:
        y = self.lin(x)
        return Pair(y, y.sum(-1))


def build(out: Path) -> dict[str, Path]:
    from registry.bundler import bundle_exported_programs

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    paths = {}
    batch, seq = Dim("batch", min=1, max=8), Dim("seq", min=2, max=16)
    ds = {"tokens": {0: batch, 1: seq}, "mask": {0: batch, 1: seq + 1}}
    tokens, mask = torch.randint(0, 16, (2, 5)), torch.ones(2, 6)
    enc = export(Encoder().eval(), (tokens, mask), dynamic_shapes=ds)
    x = torch.randn(3)
    flagged = export(Flagged(), (x, True, 2))
    paths["golden/two_programs"] = out / "two_programs.pt2b"
    bundle_exported_programs(paths["golden/two_programs"], {"zenc": enc, "flagged": flagged},
                             dynamic_shapes={"zenc": ds}, samples={"zenc": [(tokens, mask)], "flagged": [(x, True, 2)]},
                             metadata={"golden": "two_programs"})
    torch.manual_seed(1)
    wide = export(Wide().eval(), (torch.randn(2, 640),))
    paths["golden/wide"] = out / "wide.pt2b"
    bundle_exported_programs(paths["golden/wide"], {"wide": wide}, metadata={"golden": "wide"})
    return paths


if __name__ == "__main__":
    for name, path in build(Path(sys.argv[1])).items():
        print(name, path)
