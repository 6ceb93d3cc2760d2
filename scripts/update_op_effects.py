"""Regenerate ``registry/pt2/side_effect_ops.json`` from the installed torch.

    python scripts/update_op_effects.py

The rule is ``registry.pt2.op_effects`` (pure); the schemas of every registered operator come
from the torch adapter (``registry.runtime.torchrt.all_op_schemas``). Run it in a fresh process:
custom ops registered by anything else imported would count too.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from registry.pt2.op_effects import FROZEN_PATH, compute, write_frozen  # noqa: E402
from registry.runtime import torchrt  # noqa: E402


def main() -> None:
    doc = compute(torchrt.all_op_schemas(), str(torchrt.torch().__version__))
    write_frozen(doc)
    print(f"{FROZEN_PATH}: {len(doc['ops'])} operators, namespaces {', '.join(doc['namespaces'])}")


if __name__ == "__main__":
    main()
