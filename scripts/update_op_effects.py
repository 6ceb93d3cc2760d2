"""Regenerate ``registry/pt2/side_effect_ops.json``: the union over the torches CI tests.

    python scripts/update_op_effects.py                    # every venv of the torch matrix
    python scripts/update_op_effects.py --python PY ...    # these interpreters instead

The torch matrix is ``.venv`` (constraints-dev.txt: torch 2.13.0 CPU) and ``.venv-<tier>`` for
each ``constraints-<tier>.txt`` (``constraints-torch2.14.txt``: torch 2.14.1, a CUDA build, which
registers operators a CPU build lacks); ``bash scripts/setup-venv.sh <tier>`` creates one. Each
interpreter computes its torch's document in a fresh process (custom ops registered by anything
else imported would count too), and the file is their union, naming the torches it was made
from. The rule is ``registry.pt2.op_effects`` (pure); the schemas of every registered operator
come from the torch adapter (``registry.runtime.torchrt.all_op_schemas``).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from registry.pt2.op_effects import FROZEN_PATH, union, write_frozen  # noqa: E402

_COMPUTE = ("import json; from registry.pt2.op_effects import compute; from registry.runtime import torchrt; "
            "print(json.dumps(compute(torchrt.all_op_schemas(), str(torchrt.torch().__version__))))")


def matrix_pythons() -> list[Path]:
    """The interpreter of each venv of the torch matrix (present or not)."""
    tiers = sorted(p.name[len("constraints-"):-len(".txt")] for p in ROOT.glob("constraints-*.txt")
                   if p.name != "constraints-dev.txt")
    return [ROOT / ".venv" / "bin" / "python"] + [ROOT / f".venv-{t}" / "bin" / "python" for t in tiers]


def document_of(python: Path | str) -> dict:
    """What ``python``'s torch refuses (run in a fresh process in the repository root)."""
    out = subprocess.run([str(python), "-c", _COMPUTE], capture_output=True, text=True, cwd=ROOT, check=True,
                         timeout=600)
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", action="append", help="an interpreter with torch (repeatable); default: the matrix")
    args = ap.parse_args(argv)
    pythons = args.python or matrix_pythons()
    absent = [str(p) for p in pythons if not Path(p).exists()]
    if absent:
        print(f"missing: {', '.join(absent)} (bash scripts/setup-venv.sh <tier> creates .venv-<tier>); "
              "a list made without them would drop their torch's operators", file=sys.stderr)
        return 2
    docs = [document_of(p) for p in pythons]
    doc = union(docs)
    write_frozen(doc)
    for p, d in zip(pythons, docs):
        print(f"{p}: torch {', '.join(d['torch_versions'])}: {len(d['ops'])} operators")
    print(f"{FROZEN_PATH}: {len(doc['ops'])} operators, namespaces {', '.join(doc['namespaces'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
