"""Run a pulled Hugging Face bundle where transformers is never imported (the inference side).

    python examples/hf_run.py --home HOME [--chain A.field>B.arg] REF INPUTS.pt EXPECTED.pt [REF ...]

Loads ``REF`` (a pinned ``name@sha256:...``) with ``registry.load``, calls each program with its
keyword inputs and compares every output field with the eager result. Outputs come back as
mappings with the model's field names (``out["logits"]``, ``out.logits``): the registry stands
in for ``transformers.modeling_outputs`` classes. ``--chain encoder.last_hidden_state>decoder.
encoder_hidden_states`` feeds one program's output into the next (where a bundle has both).
Several ``REF INPUTS EXPECTED`` triples run in the one process. Prints one JSON report by ref.
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hf_run.py")
    p.add_argument("--home", required=True)
    p.add_argument("cases", nargs="+", metavar="REF INPUTS EXPECTED")
    p.add_argument("--chain", default=None)
    p.add_argument("--atol", type=float, default=1e-4)
    a = p.parse_args(argv)
    if len(a.cases) % 3:
        p.error("give REF INPUTS EXPECTED triples")
    os.environ["PT2REG_HOME"] = a.home

    import registry

    report: dict = {"refs": {}}
    for i in range(0, len(a.cases), 3):
        ref, inputs, expected = a.cases[i:i + 3]
        report["refs"][ref] = run_one(registry.load(ref), inputs, expected, a.chain, a.atol)
    report["transformers_imported"] = any(m == "transformers" or m.startswith("transformers.")
                                          for m in sys.modules)
    print(json.dumps(report))
    ok = all(r["ok"] for progs in report["refs"].values() for r in progs.values())
    return 0 if ok and not report["transformers_imported"] else 1


def run_one(bundle, inputs_file: str, expected_file: str, chain: str | None, atol: float) -> dict:
    """Call each program of a loaded bundle on its example inputs; compare with eager, by field."""
    import torch

    inputs = torch.load(inputs_file, weights_only=True)
    expected = torch.load(expected_file, weights_only=True)
    src, dst = chain.split(">") if chain else ("", "")
    src_prog, _, src_field = src.partition(".")
    dst_prog, _, dst_arg = dst.partition(".")
    report, outputs = {}, {}
    for name in inputs:  # the encoder before the decoder
        kwargs = dict(inputs[name])
        if name == dst_prog and src_prog in outputs:
            kwargs[dst_arg] = outputs[src_prog][src_field]
        out = outputs[name] = bundle[name](**kwargs)
        fields = list(out.keys())
        errors = {k: float((out[k] - expected[name][k]).abs().max()) for k in fields}
        report[name] = {
            "type": getattr(type(out), "serialized_type_name", "") or f"{type(out).__module__}.{type(out).__name__}",
            "fields": fields,
            "attributes_ok": all(getattr(out, k) is out[k] for k in fields),
            "max_abs_error": errors,
            "shapes": {k: list(out[k].shape) for k in fields},
            "ok": set(fields) == set(expected[name]) and all(e <= atol for e in errors.values()),
        }
    return report


if __name__ == "__main__":
    sys.exit(main())
