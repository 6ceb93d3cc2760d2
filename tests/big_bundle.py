"""Large, valid bundles built quickly, for crash-safety and transfer tests.

One ``torch.export`` of a stack of bias-free ``Linear`` layers is made per process: an input
layer ``WIDTH -> hidden``, one large ``hidden x hidden`` layer, ``small`` layers of
``WIDTH x WIDTH`` and an output layer ``hidden -> WIDTH``. With the defaults that is ~107 MiB
(112 MB) of float32 weights, stored by the registry as 5 weight chunks (one of 66 MiB, above
the S3 multipart threshold of 64 MiB, so S3 uploads it in 5 parts) plus glue chunks and the
manifest.

Each *variant* refills every weight from its own seed, saves the program and bundles it, so
every chunk of every variant is content the store has never seen (a kill test needs a real
upload each time, not a dedup skip)::

    factory = BigBundles(tmp_dir)
    path = factory.make(3)          # ~107 MiB .pt2b, deterministic for variant 3
    factory.discard(path)           # free the disk when done

From the command line (a separate process, as a user would)::

    python -m tests.big_bundle OUT.pt2b [--hidden 4160] [--small 2] [--variant 0]
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import pytest

__all__ = ["BigBundles", "big_bundles"]

WIDTH = 1024
HIDDEN = 4160           # HIDDEN * HIDDEN * 4 bytes = 66 MiB: one weight above the multipart threshold
SMALL = 2               # WIDTH * WIDTH * 4 bytes = 4 MiB each
MiB = 1024 * 1024


class BigBundles:
    """Builds variant ``k`` of a large single-program bundle under ``workdir``."""

    def __init__(self, workdir: str | os.PathLike, *, hidden: int = HIDDEN, small: int = SMALL) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.hidden, self.small = hidden, small
        self.weight_bytes = 4 * (2 * WIDTH * hidden + hidden * hidden + small * WIDTH * WIDTH)
        self._ep = None

    def _program(self):
        if self._ep is None:
            import torch

            class Stack(torch.nn.Module):
                def __init__(self, hidden: int, small: int) -> None:
                    super().__init__()
                    self.small = torch.nn.ModuleList(
                        torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(small))
                    self.up = torch.nn.Linear(WIDTH, hidden, bias=False)
                    self.big = torch.nn.Linear(hidden, hidden, bias=False)
                    self.down = torch.nn.Linear(hidden, WIDTH, bias=False)

                def forward(self, x: torch.Tensor) -> torch.Tensor:
                    for layer in self.small:
                        x = torch.tanh(layer(x))
                    return self.down(torch.tanh(self.big(torch.tanh(self.up(x)))))

            with torch.device("meta"):
                model = Stack(self.hidden, self.small)
            model = model.to_empty(device="cpu").eval()
            self._ep = torch.export.export(model, (torch.zeros(2, WIDTH),))
        return self._ep

    def make(self, variant: int, out: str | os.PathLike | None = None) -> Path:
        """Write variant ``variant`` and return its path (deterministic bytes for a variant)."""
        import torch

        from registry.bundler import ProgramInput, build_bundle

        ep = self._program()
        gen = torch.Generator().manual_seed(1_000_003 * (variant + 1))
        with torch.no_grad():
            for tensor in ep.state_dict.values():
                tensor.uniform_(-0.02, 0.02, generator=gen)
        out = Path(out) if out is not None else self.workdir / f"big-{variant}.pt2b"
        scratch = Path(tempfile.mkdtemp(prefix="big-", dir=self.workdir))
        try:
            pt2 = scratch / "model.pt2"
            torch.export.save(ep, pt2)
            build_bundle(out, [ProgramInput("model", pt2)],
                         metadata={"variant": str(variant), "purpose": "crash-safety tests"},
                         build_info={"created_by": "tests.big_bundle"})
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return out

    @staticmethod
    def discard(path: str | os.PathLike) -> None:
        Path(path).unlink(missing_ok=True)


@pytest.fixture(scope="session")
def big_bundles(tmp_path_factory: pytest.TempPathFactory) -> BigBundles:
    """A session-wide factory of ~107 MiB bundles (``PT2REG_TEST_BIG_HIDDEN`` overrides the
    size of the large layer, e.g. 2048 for a quick local run)."""
    return BigBundles(tmp_path_factory.mktemp("big"),
                      hidden=int(os.environ.get("PT2REG_TEST_BIG_HIDDEN", str(HIDDEN))))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--hidden", type=int, default=HIDDEN)
    parser.add_argument("--small", type=int, default=SMALL)
    parser.add_argument("--variant", type=int, default=0)
    args = parser.parse_args(argv)
    out = Path(args.out).absolute()
    factory = BigBundles(tempfile.mkdtemp(prefix="pt2reg-big-"), hidden=args.hidden,
                         small=args.small)
    try:
        print(factory.make(args.variant, out))
    finally:
        shutil.rmtree(factory.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
