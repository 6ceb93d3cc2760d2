"""Golden samples: inputs and the outputs computed at bundle time, stored pickle-free.

A sample member is a safetensors file with tensors ``input.<i>`` (the program's flat user
inputs, in signature order) and ``output.<j>`` (flat outputs). Reading it never unpickles.
"""
from __future__ import annotations

import os
from typing import Any

from .errors import IntegrityError, UsageError
from .torchrt import flatten_outputs, torch

__all__ = ["call_arguments", "without_constants", "check_constant", "run_program", "write_sample",
           "read_sample", "compare_outputs"]


def call_arguments(program: dict[str, Any], value: Any) -> tuple[tuple, dict]:
    """Turn user-given inputs (a flat tuple or a dict by name) into the program's (args, kwargs)."""
    from torch.utils._pytree import tree_unflatten, treespec_loads

    inputs = program["inputs"]
    if isinstance(value, dict):
        by_name = {i["name"]: i for i in inputs}
        unknown = sorted(set(value) - set(by_name) - set(program.get("forward_arg_names") or []))
        if unknown:
            raise UsageError(f"unknown input {unknown[0]!r}; the program takes "
                             f"{', '.join(i['name'] for i in inputs)}")
        flat = [value.get(i["name"]) for i in inputs]
        missing = [i["name"] for i, v in zip(inputs, flat) if v is None]
        if missing:
            raise UsageError(f"missing input {missing[0]!r}")
    else:
        flat = list(value)
    constants = sorted(program.get("constant_inputs") or [], key=lambda c: c["leaf"])
    if constants and len(flat) == len(inputs) + len(constants):  # given in full (a flat tuple)
        for c in constants:
            check_constant(c, flat[c["leaf"]])
        flat = without_constants(flat, constants)
    if len(flat) != len(inputs):
        raise UsageError(f"the program takes {len(inputs)} inputs "
                         f"({', '.join(i['name'] for i in inputs)}), got {len(flat)}")
    spec = program.get("in_spec")
    if not spec:
        return tuple(flat), {}
    for c in constants:  # baked-in arguments go back in place
        flat.insert(c["leaf"], c["value"])
    args, kwargs = tree_unflatten(flat, treespec_loads(spec))
    return tuple(args), dict(kwargs)


def without_constants(flat: list[Any], constants: list[dict[str, Any]]) -> list[Any]:
    """``flat`` (every leaf of a program's input treespec) without the leaves export baked in."""
    baked = {c["leaf"] for c in constants}
    return [v for i, v in enumerate(flat) if i not in baked]


def check_constant(constant: dict[str, Any], value: Any) -> None:
    """An argument export baked in must be passed with the value it had at export."""
    from .errors import InputValidationError

    if type(value) is not type(constant["value"]) or value != constant["value"]:
        raise InputValidationError(
            f"input {constant['name']!r} was fixed to {constant['value']!r} when the program was "
            f"exported; got {value!r} (export the model again to vary it)", input_name=constant["name"])


def run_program(module: Any, program: dict[str, Any], value: Any) -> list[Any]:
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


def read_sample(path: str | os.PathLike, input_keys: list[str], output_keys: list[str]) -> tuple[list, list]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(os.fspath(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise IntegrityError(f"sample file {path} is unreadable: {exc}") from exc
    try:
        return [tensors[k] for k in input_keys], [tensors[k] for k in output_keys]
    except KeyError as exc:
        raise IntegrityError(f"sample file {path} lacks tensor {exc.args[0]!r}") from exc


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
