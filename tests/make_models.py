"""Export the tiny models the tests use, into a directory (run as a separate process).

    python -m tests.make_models OUT_DIR

Runs in its own process so the custom op it registers (``pt2reg_test::scale``) is NOT
registered in the test process: bundling must work from the file alone.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.export import Dim, export

from examples.translator import export_translator


@torch.library.custom_op("pt2reg_test::scale", mutates_args=())
def scale(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return x * alpha


@scale.register_fake
def _(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return torch.empty_like(x)


class WithCustomOp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.pt2reg_test.scale(self.lin(x), 3.0)


class Baked(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[1], device="cpu")  # the seed's baked-device bug
        return x + pos


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    export_translator(out)
    op = export(WithCustomOp().eval(), (torch.randn(3, 4),))
    torch.export.save(op, out / "custom_op.pt2")
    torch.save((torch.randn(3, 4),), out / "custom_op_inputs.pt")
    baked = export(Baked(), (torch.randn(2, 5),), dynamic_shapes={"x": {1: Dim("width", min=2, max=64)}})
    torch.export.save(baked, out / "baked.pt2")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
