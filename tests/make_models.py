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


class Masked(torch.nn.Module):
    """A causal & padding attention mask: ``aten.__and__`` (a dunder-named operator)."""

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        mask = torch.ones(t, t, dtype=torch.bool).tril()[None] & pad[:, None, :]
        return x.masked_fill(~mask, 0.0) + (x.shape[1] ** 2)


class Flat(torch.nn.Module):
    """(s, s) -> s**2 elements: a ``Pow`` in an output size."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1) * 2


class Guarded(torch.nn.Module):
    """Export records the guard ``trunc(0.5*x.size(0)) == 4``; the output is a tensor and an int."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return x[: int(x.shape[0] * 0.5)] + 1, x.shape[0] * 3


class Halves(torch.nn.Module):
    """An input of size 2*k: an odd size passes the range but not the form."""

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return y[::2] + y[1::2]


class Flagged(torch.nn.Module):
    """Python-scalar arguments: export bakes ``flag`` and ``k`` in as constant inputs."""

    def forward(self, x: torch.Tensor, flag: bool, k: int) -> torch.Tensor:
        return x * k if flag else x - k


def export_heldout_shapes(out: Path) -> None:
    """Graphs the red team found mishandled (dunder ops, Pow sizes, guards, derived forms)."""
    torch.save((torch.randn(2, 5, 5), torch.ones(2, 5, dtype=torch.bool)), out / "masked_inputs.pt")
    torch.export.save(export(Masked(), torch.load(out / "masked_inputs.pt")), out / "masked.pt2")
    s = Dim("s", min=2, max=64)
    torch.export.save(export(Flat(), (torch.randn(4, 4),), dynamic_shapes=({0: s, 1: s},)), out / "flat.pt2")
    torch.save((torch.randn(5, 5),), out / "flat_inputs.pt")
    torch.export.save(export(Guarded(), (torch.randn(9, 2),), dynamic_shapes=({0: Dim.AUTO},)), out / "guarded.pt2")
    torch.save((torch.randn(9, 2),), out / "guarded_inputs.pt")
    torch.save((torch.randn(7, 2),), out / "guarded_bad_inputs.pt")
    k = Dim("k", min=1, max=50)
    torch.export.save(export(Halves(), (torch.randn(8),), dynamic_shapes=({0: 2 * k},)), out / "halves.pt2")
    torch.save((torch.randn(13),), out / "halves_odd_inputs.pt")
    torch.export.save(export(Flagged(), (torch.randn(3), True, 2)), out / "flagged.pt2")
    torch.save((torch.randn(3), True, 2), out / "flagged_inputs.pt")
    torch.save((torch.randn(3),), out / "flagged_tensor_only.pt")
    torch.save((torch.randn(3), False, 2), out / "flagged_other_flag.pt")


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    export_translator(out)
    op = export(WithCustomOp().eval(), (torch.randn(3, 4),))
    torch.export.save(op, out / "custom_op.pt2")
    torch.save((torch.randn(3, 4),), out / "custom_op_inputs.pt")
    baked = export(Baked(), (torch.randn(2, 5),), dynamic_shapes={"x": {1: Dim("width", min=2, max=64)}})
    torch.export.save(baked, out / "baked.pt2")
    export_heldout_shapes(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
