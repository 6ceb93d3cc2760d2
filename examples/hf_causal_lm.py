"""A Hugging Face causal LM (GPT-2 architecture, tiny random weights) through pt2-registry.

    python examples/hf_causal_lm.py WORK_DIR

1. builds a 1-layer GPT-2 from a config in code (no download) and exports it with torch.export,
   dynamic batch and sequence named by ``Dim("batch")`` / ``Dim("seq")``;
2. bundles it as program ``lm`` with a golden sample (``registry.bundle_exported_programs``
   keeps the Dim names);
3. publishes it to an embedded registry under WORK_DIR/home and pulls it back pinned by digest;
4. runs it in a new process that never imports transformers (``examples/hf_run.py``): the output
   comes back as a mapping with the model's field (``out["logits"]``, also ``out.logits``).

Needs ``pip install transformers`` on the exporting side only.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.hf_models import export_and_bundle, publish_pull_and_run  # noqa: E402


def build(work: Path) -> Path:
    """Export and bundle the causal LM; returns WORK/gpt2.pt2b (imports transformers)."""
    import torch
    from torch.export import Dim
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
                        bos_token_id=0, eos_token_id=0, use_cache=False)
    model = GPT2LMHeadModel(config)
    batch, seq = Dim("batch", min=1, max=16), Dim("seq", min=2, max=64)
    kwargs = {"input_ids": torch.randint(0, 100, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    work.mkdir(parents=True, exist_ok=True)
    return export_and_bundle(work / "gpt2.pt2b", {"lm": (model, kwargs, shapes)},
                             metadata={"source": "examples/hf_causal_lm.py"})


def main(work: Path) -> dict:
    return publish_pull_and_run(work, build(work), "examples/gpt2")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "hf-causal-lm"))
