"""A tiny encoder/decoder "translator", exported with torch.export (used by the quickstart).

    python examples/translator.py OUT_DIR

writes encoder.pt2, decoder.pt2 and sample inputs encoder_inputs.pt / decoder_inputs.pt. The two
programs share a dynamic batch; the encoder's mask has a derived dim (seq + 1).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.export import Dim, export


class Encoder(torch.nn.Module):
    def __init__(self, vocab: int = 100, width: int = 8) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, width)
        self.lin = torch.nn.Linear(width, width)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> dict:
        h = torch.tanh(self.lin(self.emb(tokens)))
        keep = mask[:, 1:].unsqueeze(-1).to(h.dtype)
        return {"hidden": h * keep, "lengths": [mask.sum(-1)]}


class Decoder(torch.nn.Module):
    def __init__(self, vocab: int = 100, width: int = 8) -> None:
        super().__init__()
        self.out = torch.nn.Linear(width, vocab)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.out(hidden).log_softmax(-1)


def export_translator(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    batch, seq = Dim("batch", min=1, max=32), Dim("seq", min=2, max=16)
    tokens = torch.randint(0, 100, (2, 8))
    mask = torch.ones(2, 9, dtype=torch.bool)
    enc = export(Encoder().eval(), (tokens, mask),
                 dynamic_shapes={"tokens": {0: batch, 1: seq}, "mask": {0: batch, 1: seq + 1}})
    torch.export.save(enc, out / "encoder.pt2")
    hidden = torch.randn(2, 8, 8)
    dec = export(Decoder().eval(), (hidden,), dynamic_shapes={"hidden": {0: batch, 1: seq}})
    torch.export.save(dec, out / "decoder.pt2")
    torch.save((tokens, mask), out / "encoder_inputs.pt")
    torch.save((hidden,), out / "decoder_inputs.pt")


if __name__ == "__main__":
    export_translator(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
