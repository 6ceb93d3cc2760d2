"""Write ``tests/data/gpu_exports/``: programs as ``torch.export.save`` writes them on a GPU.

    python scripts/make_gpu_fixtures.py [--out tests/data/gpu_exports] [--device cuda:0]

CI has no GPU, yet "exported on the GPU box, bundled by a CPU-only CI job" is the common path
(issue 40). So the fixtures are what an export on ``cuda:0`` writes, byte for byte, made here
without a GPU: each model is exported on the CPU and saved with torch's own writer while the
serializer records every device as ``cuda:0`` (``as_if_exported_on``: the graph's tensor
metadata, device arguments such as ``torch.arange(n, device=x.device)``, the weights' config,
and the example inputs' pickled storage locations). Those are the only places a GPU export
differs on disk: torch copies weights to host memory to write them, so their bytes are the same.
With ``--device cuda:0`` on a GPU machine the models are exported there for real instead (same
files, same names), which is how to check that claim.

Written, per model NAME: ``NAME.pt2`` (example inputs kept, as ``torch.export.save`` keeps
them), ``NAME.inputs.pt`` (the call's inputs, saved from ``cuda:0`` tensors: their storage
location says ``cuda:0``), ``NAME.expected.pt`` (the eager model's outputs on the CPU). Models:
``cnn`` (a torchvision-style residual CNN with batch norm), ``mlp_bf16`` (a bfloat16 MLP), and
``encoder`` + ``decoder`` (two programs of one model, a device baked into the encoder).
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "gpu_exports"


@contextlib.contextmanager
def as_if_exported_on(device: str = "cuda:0") -> Iterator[None]:
    """While saving: every device torch's serializer records is ``device`` (the CPU ones)."""
    import torch
    import torch.serialization as ser
    from torch._export.serde import serialize

    real_device, real_tag = serialize.Device, ser.location_tag
    dtype, _, index = device.partition(":")

    def gpu_device(**fields: Any) -> Any:  # the serializer passes type= and index=
        if fields.get("type") == "cpu":
            fields = {"type": dtype, "index": int(index) if index else None}
        return real_device(**fields)

    def gpu_tag(storage: Any) -> str:
        tag = real_tag(storage)
        return device if tag == "cpu" else tag

    serialize.Device, ser.location_tag = gpu_device, gpu_tag
    try:
        with torch.no_grad():
            yield
    finally:
        serialize.Device, ser.location_tag = real_device, real_tag


def models() -> dict[str, tuple[Any, tuple, dict]]:
    """name -> (eval model, example inputs, dynamic shapes), seeded."""
    import torch
    from torch import nn
    from torch.export import Dim

    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
            self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(x + self.bn2(self.conv2(y)))

    class CNN(nn.Module):  # resnet's shape at toy size: stem, two residual blocks, pool, fc
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8),
                                      nn.ReLU())
            self.blocks = nn.Sequential(Block(8), Block(8))
            self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(8, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 16))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.lin = nn.Embedding(64, 16), nn.Linear(16, 16)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            pos = torch.arange(tokens.shape[1], device=tokens.device)  # baked: the export's device
            return torch.tanh(self.lin(self.emb(tokens) + pos.unsqueeze(-1)))

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.out = nn.Linear(16, 64)

        def forward(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            logits = self.out(hidden)
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")

    batch = Dim("batch", min=1, max=16)
    seq = Dim("seq", min=2, max=32)
    cnn = CNN().eval()
    for m in cnn.modules():  # running statistics that are not the identity
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    mlp = MLP().eval().to(torch.bfloat16)
    enc, dec = Encoder().eval(), Decoder().eval()
    tokens = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        hidden = enc(tokens)
    return {
        "cnn": (cnn, (torch.randn(2, 3, 16, 16),), {"x": {0: batch}}),
        "mlp_bf16": (mlp, (torch.randn(4, 32, dtype=torch.bfloat16),), {"x": {0: batch}}),
        "encoder": (enc, (tokens,), {"tokens": {0: batch, 1: seq}}),
        "decoder": (dec, (hidden, torch.randint(0, 64, (2, 8))), {"hidden": {0: batch, 1: seq},
                                                                 "targets": {0: batch, 1: seq}}),
    }


def write(out: Path, device: str | None = None) -> list[Path]:
    """Export, save and write every fixture into ``out``; ``device``: export there for real
    (``cpu`` included), instead of recording ``cuda:0`` (``as_if_exported_on``)."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (model, inputs, dynamic) in models().items():
        with torch.no_grad():
            expected = model(*inputs)
        if device:  # a real export on that device (on a GPU: the same files as recorded here)
            model, inputs = model.to(device), tuple(t.to(device) for t in inputs)
        ep = torch.export.export(model, inputs, dynamic_shapes=dynamic)
        saved = contextlib.nullcontext() if device else as_if_exported_on("cuda:0")
        with saved:
            torch.export.save(ep, out / f"{name}.pt2")
            torch.save(tuple(inputs), out / f"{name}.inputs.pt")
        torch.save((expected,), out / f"{name}.expected.pt")
        written += [out / f"{name}.pt2", out / f"{name}.inputs.pt", out / f"{name}.expected.pt"]
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--device", help="export on this GPU for real (e.g. cuda:0) instead of recording it")
    a = p.parse_args(argv)
    for path in write(a.out, a.device):
        print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}  {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
