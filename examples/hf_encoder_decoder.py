"""A Hugging Face encoder/decoder (T5 architecture, tiny random weights) as two programs.

    python examples/hf_encoder_decoder.py WORK_DIR

1. builds a 1+1-layer T5 from a config in code (no download) and exports the encoder and the
   decoder (LM head included) as two programs, sharing ``Dim("batch")`` and the source length
   ``Dim("src")``; the decoder's own length is ``Dim("tgt")``;
2. bundles them as programs ``encoder`` and ``decoder`` with golden samples;
3. publishes to an embedded registry under WORK_DIR/home, pulls pinned by digest;
4. runs encoder then decoder (the encoder's ``last_hidden_state`` fed to the decoder) in a new
   process that never imports transformers; outputs keep their field names
   (``enc["last_hidden_state"]``, ``dec.logits``).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.hf_models import export_and_bundle, publish_pull_and_run  # noqa: E402

CHAIN = "encoder.last_hidden_state>decoder.encoder_hidden_states"


def build(work: Path) -> Path:
    """Export and bundle encoder + decoder; returns WORK/t5.pt2b (imports transformers)."""
    import torch
    from torch.export import Dim
    from transformers import T5Config, T5ForConditionalGeneration

    class Decoder(torch.nn.Module):
        """T5's decoder and LM head given the encoder's hidden states (one decoding pass)."""

        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, decoder_input_ids, encoder_hidden_states, attention_mask):
            return self.model(decoder_input_ids=decoder_input_ids, encoder_outputs=(encoder_hidden_states,),
                              attention_mask=attention_mask, use_cache=False)

    torch.manual_seed(0)
    config = T5Config(vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_decoder_layers=1,
                      num_heads=2, use_cache=False, decoder_start_token_id=0, pad_token_id=0)
    model = T5ForConditionalGeneration(config).eval()
    batch, src, tgt = Dim("batch", min=1, max=16), Dim("src", min=2, max=64), Dim("tgt", min=2, max=64)
    ids, mask = torch.randint(1, 100, (2, 7)), torch.ones(2, 7, dtype=torch.long)
    with torch.no_grad():
        hidden = model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    programs = {
        "encoder": (model.get_encoder(), {"input_ids": ids, "attention_mask": mask},
                    {"input_ids": {0: batch, 1: src}, "attention_mask": {0: batch, 1: src}}),
        "decoder": (Decoder(model), {"decoder_input_ids": torch.randint(1, 100, (2, 5)),
                                     "encoder_hidden_states": hidden, "attention_mask": mask},
                    {"decoder_input_ids": {0: batch, 1: tgt}, "encoder_hidden_states": {0: batch, 1: src},
                     "attention_mask": {0: batch, 1: src}}),
    }
    work.mkdir(parents=True, exist_ok=True)
    return export_and_bundle(work / "t5.pt2b", programs, metadata={"source": "examples/hf_encoder_decoder.py"})


def main(work: Path) -> dict:
    return publish_pull_and_run(work, build(work), "examples/t5", chain=CHAIN)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "hf-encoder-decoder"))
