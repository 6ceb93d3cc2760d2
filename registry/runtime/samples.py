"""Golden samples: inputs and the outputs computed at bundle time, stored pickle-free.

A sample member is a safetensors file with tensors ``input.<i>`` (the program's flat user
inputs, in signature order) and ``output.<j>`` (flat outputs). Reading it never unpickles.
"""
from __future__ import annotations

import os
from typing import Any

from ..errors import IntegrityError, UsageError
from ..format.manifest import ProgramSpec
from .inputs import call_arguments
from .torchrt import flatten_outputs, torch

__all__ = ["run_program", "write_sample", "read_sample", "compare_outputs"]


def run_program(module: Any, program: ProgramSpec, value: Any) -> list[Any]:
    """Run a loaded program's module on user inputs (as ``call_arguments`` reads them)."""
    args, kwargs = call_arguments(program, value)
    with torch().no_grad():
        out = module(*args, **kwargs)
    return flatten_outputs(out)


def _plain(t: Any) -> Any:
    return t.detach().to("cpu").contiguous().clone()


def write_sample(path: str | os.PathLike, inputs: list[Any], outputs: list[Any]) -> tuple[list[str], list[str]]:
    from safetensors.torch import save_file

    t = torch()
    tensors: dict[str, Any] = {}
    for kind, values in (("input", inputs), ("output", outputs)):
        for i, v in enumerate(values):
            if kind == "output" and isinstance(v, (bool, int, float)):
                v = t.tensor(v)  # a program may return a size (an int): kept as a 0-d tensor
            if not isinstance(v, t.Tensor):
                raise UsageError(f"sample {kind} {i} is a {type(v).__name__}; samples hold tensors only")
            tensors[f"{kind}.{i}"] = _plain(v)
    save_file(tensors, os.fspath(path))
    return ([f"input.{i}" for i in range(len(inputs))], [f"output.{i}" for i in range(len(outputs))])


def read_sample(path: str | os.PathLike, input_keys: list[str], output_keys: list[str], *,
                label: str | None = None) -> tuple[list, list]:
    """Inputs and outputs of a golden sample file; ``label`` names it in errors (the user's
    bundle or ref and the member, not the cache file it was read from)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    where = label or f"sample file {path}"
    try:
        tensors = load_file(os.fspath(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise IntegrityError(f"{where} is unreadable: {exc}") from exc
    try:
        return [tensors[k] for k in input_keys], [tensors[k] for k in output_keys]
    except KeyError as exc:
        raise IntegrityError(f"{where} lacks tensor {exc.args[0]!r}") from exc


def compare_outputs(actual: list[Any], expected: list[Any], rtol: float, atol: float) -> list[dict[str, Any]]:
    """Per output: max abs / rel error and whether it is within tolerance."""
    t = torch()
    rows = []
    if len(actual) != len(expected):
        return [{"output": "count", "ok": False, "max_abs": None, "max_rel": None,
                 "detail": f"got {len(actual)} outputs, expected {len(expected)}"}]
    for i, (a, e) in enumerate(zip(actual, expected)):
        a = t.tensor(a) if isinstance(a, (bool, int, float)) else a.detach().to("cpu")
        row: dict[str, Any] = {"output": i, "shape": list(e.shape), "dtype": str(e.dtype).replace("torch.", "")}
        if a.shape != e.shape or a.dtype != e.dtype:
            row.update(ok=False, max_abs=None, max_rel=None,
                       detail=f"got {list(a.shape)} {a.dtype}, expected {list(e.shape)} {e.dtype}")
        elif a.numel() == 0:
            row.update(ok=True, max_abs=0.0, max_rel=0.0)
        elif e.is_floating_point() or e.is_complex():
            diff = (a.double() - e.double()).abs()
            rel = diff / e.double().abs().clamp_min(1e-12)
            row.update(ok=bool(t.allclose(a, e, rtol=rtol, atol=atol, equal_nan=True)),
                       max_abs=float(diff.max()), max_rel=float(rel.max()))
        else:
            same = bool(t.equal(a, e))
            row.update(ok=same, max_abs=0.0 if same else float((a.long() - e.long()).abs().max()),
                       max_rel=0.0 if same else None)
        rows.append(row)
    return rows
