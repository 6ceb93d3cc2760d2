"""Golden samples: inputs and the outputs computed at bundle time, stored pickle-free.

A sample member is a safetensors file with tensors ``input.<i>`` (the program's flat user
inputs, in signature order) and ``output.<j>`` (flat outputs). Reading it never unpickles.
"""
from __future__ import annotations

import os
import re
from typing import Any

from ..errors import IntegrityError, UsageError
from .torchrt import flatten_outputs, torch

__all__ = ["call_arguments", "baked_arguments", "check_baked", "fill_baked_call", "flat_count", "without_constants", "check_constant", "run_program", "write_sample",
           "read_sample", "compare_outputs"]


_MISSING = object()
_TOP = re.compile(r"(args)\[(\d+)\]|(kwargs)\['((?:[^'\\]|\\.)*)'\]")


def _top(path: str | None) -> tuple[str, str | int, str] | None:
    """(``args``, index, rest) or (``kwargs``, name, rest) of a manifest input path."""
    m = _TOP.match(path or "")
    if not m:
        return None
    if m.group(1):
        return "args", int(m.group(2)), path[m.end():]  # type: ignore[index]
    return "kwargs", m.group(4), path[m.end():]  # type: ignore[index]


def _rebuild(rests: list[str], values: list[Any]) -> Any:
    """A nested value from its leaves' paths below the argument (``[0]``, ``['a'][1]``)."""
    if len(rests) == 1 and not rests[0]:
        return values[0]
    root: dict[Any, Any] = {}
    for rest, value in zip(rests, values):
        keys = [int(k) if k.isdigit() else k.strip("'") for k in re.findall(r"\[([^\]]*)\]", rest)]
        node = root
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1] if keys else 0] = value

    def build(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        if all(isinstance(k, int) for k in node):
            return tuple(build(node[k]) for k in sorted(node))
        return {k: build(v) for k, v in node.items()}
    return build(root)


def baked_arguments(program: dict[str, Any]) -> list[dict[str, Any]]:
    """The arguments export baked in, one per ``forward()`` argument (a tuple argument made only
    of constants is one entry): ``{name, value, path, kind, position, leaves, rests}``.

    ``position`` is the positional index (None for a keyword argument); ``leaves`` are the
    argument's leaves in the input treespec. A constant inside an argument that also holds
    tensors is an entry of its own, named as export named it.
    """
    constants = sorted(program.get("constant_inputs") or [], key=lambda c: c["leaf"])
    if not constants:
        return []
    names = list(program.get("forward_arg_names") or [])
    with_tensors = {top[:2] for i in program.get("inputs") or [] if (top := _top(i.get("path")))}
    groups: dict[Any, list[tuple[dict[str, Any], str]]] = {}
    for c in constants:
        top = _top(c.get("path"))
        key = top[:2] if top and top[:2] not in with_tensors else ("leaf", c["leaf"])
        groups.setdefault(key, []).append((c, top[2] if top else ""))
    out = []
    for key, members in groups.items():
        cs = [c for c, _ in members]
        if key[0] == "leaf":
            c = cs[0]
            top = _top(c.get("path"))
            out.append({"name": c["name"], "value": c["value"], "path": c.get("path") or c["name"],
                        "kind": c.get("kind", "positional"), "position": None, "keyword": None,
                        "leaves": [c["leaf"]], "rests": [""], "whole": False})
            continue
        where, ident = key
        if where == "args":
            name = names[ident] if ident < len(names) else cs[0]["name"]
            path = f"args[{ident}]"
        else:
            name, path = ident, f"kwargs['{ident}']"
        rests = [r for _, r in members]
        out.append({"name": name, "value": _rebuild(rests, [c["value"] for c in cs]), "path": path,
                    "kind": "positional" if where == "args" else "keyword",
                    "position": ident if where == "args" else None, "keyword": None if where == "args" else ident,
                    "leaves": [c["leaf"] for c in cs], "rests": rests, "whole": True})
    return out


def _same(given: Any, fixed: Any) -> bool:
    if isinstance(fixed, tuple):
        return (isinstance(given, (tuple, list)) and len(given) == len(fixed)
                and all(_same(g, f) for g, f in zip(given, fixed)))
    if isinstance(fixed, dict):
        return (isinstance(given, dict) and list(given) == list(fixed)
                and all(_same(given[k], f) for k, f in fixed.items()))
    if type(given) is not type(fixed):
        return False
    return given == fixed or (isinstance(fixed, float) and fixed != fixed and given != given)


def _show(value: Any) -> str:
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}"
    if isinstance(value, (tuple, list)) and any(hasattr(v, "shape") for v in value):
        return "(" + ", ".join(_show(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_baked(arg: dict[str, Any], value: Any) -> None:
    """A baked-in argument must be given with the value it had at export (or left out)."""
    from ..errors import InputValidationError

    if not _same(value, arg["value"]):
        raise InputValidationError(
            f"input {arg['name']!r} was fixed to {arg['value']!r} when the program was exported; "
            f"got {_show(value)} (export the model again to vary it)", input_name=arg["name"])


def _expand(values: Any) -> list[Any]:
    """A flat file's values with nested tuples/lists opened (``(x, True, (3, 4))`` -> 4 leaves)."""
    out: list[Any] = []
    for v in values:
        if isinstance(v, (tuple, list)):
            out.extend(_expand(v))
        else:
            out.append(v)
    return out


def flat_count(program: dict[str, Any], value: Any) -> int | None:
    """How many values a flat-tuple input file gives (nested tuples opened when the program has
    baked-in arguments, a tuple one among them); None for a dict."""
    if not isinstance(value, (tuple, list)):
        return None
    return len(_expand(value)) if program.get("constant_inputs") else len(value)


def call_arguments(program: dict[str, Any], value: Any) -> tuple[tuple, dict]:
    """Turn user-given inputs (a flat tuple or a dict by name) into the program's (args, kwargs).

    Arguments export baked in may be given (by position in a full flat tuple, or in a dict by
    argument or constant name) with their exported value, or left out; another value raises
    InputValidationError naming the argument, the exported value and what was given.
    """
    from torch.utils._pytree import tree_unflatten, treespec_loads

    inputs = program["inputs"]
    constants = sorted(program.get("constant_inputs") or [], key=lambda c: c["leaf"])
    baked = baked_arguments(program)
    total = len(inputs) + len(constants)
    const_leaves = {c["leaf"] for c in constants}
    user_leaves = [i for i in range(total) if i not in const_leaves]
    leaves: list[Any] = [_MISSING] * total
    if isinstance(value, dict):
        by_input = {i["name"]: n for n, i in zip(user_leaves, inputs)}
        by_const = {c["name"]: c for c in constants}
        by_arg = {a["name"]: a for a in baked if a["whole"]}
        unknown = sorted(k for k in value if k not in by_input and k not in by_const and k not in by_arg
                         and k not in (program.get("forward_arg_names") or []))
        if unknown:
            raise UsageError(f"unknown input {unknown[0]!r}; the program takes "
                             f"{', '.join(i['name'] for i in inputs)}")
        for key, v in value.items():
            if key in by_input:
                leaves[by_input[key]] = v
            elif key in by_arg:
                check_baked(by_arg[key], v)
            elif key in by_const:
                check_constant(by_const[key], v)
            else:  # an argument holding tensors and baked-in items, e.g. (mask, 3): by its leaves
                _assign_mixed(program, key, v, leaves, user_leaves, constants)
        missing = [i["name"] for n, i in zip(user_leaves, inputs) if leaves[n] is _MISSING or leaves[n] is None]
        if missing:
            raise UsageError(f"missing input {missing[0]!r}")
    else:
        flat = _expand(value) if constants else list(value)
        if constants and len(flat) == total:  # given in full: baked-in values in their places
            by_leaf = {c["leaf"]: c for c in constants}
            for a in baked:
                given = [flat[n] for n in a["leaves"]]
                if not a["whole"]:
                    check_constant(by_leaf[a["leaves"][0]], given[0])
                elif not all(_same(g, by_leaf[n]["value"]) for g, n in zip(given, a["leaves"])):
                    check_baked(a, _rebuild(a["rests"], given))
            flat = without_constants(flat, constants)
        if len(flat) != len(inputs):
            raise UsageError(f"the program takes {len(inputs)} inputs "
                             f"({', '.join(i['name'] for i in inputs)}), got {len(flat)}")
        for n, v in zip(user_leaves, flat):
            leaves[n] = v
    for c in constants:  # baked-in arguments go back in place, with their exported values
        leaves[c["leaf"]] = c["value"]
    spec = program.get("in_spec")
    if not spec:
        return tuple(leaves[n] for n in user_leaves), {}
    args, kwargs = tree_unflatten(leaves, treespec_loads(spec))
    return tuple(args), dict(kwargs)


def _assign_mixed(program: dict[str, Any], key: str, value: Any, leaves: list[Any], user_leaves: list[int],
                  constants: list[dict[str, Any]]) -> None:
    from ..errors import InputValidationError

    names = list(program.get("forward_arg_names") or [])
    slots: list[tuple[int, dict[str, Any] | None]] = []
    for top in [("kwargs", key)] + ([("args", names.index(key))] if key in names else []):
        slots = sorted([(n, None) for n, i in zip(user_leaves, program["inputs"])
                        if (_top(i.get("path")) or ())[:2] == top]
                       + [(c["leaf"], c) for c in constants if (_top(c.get("path")) or ())[:2] == top],
                       key=lambda s: s[0])
        if slots:
            break
    if not slots:
        return
    given = _expand([value])
    if len(given) != len(slots):
        raise InputValidationError(f"input {key!r} holds {len(slots)} value(s) in the exported program, "
                                   f"got {len(given)}", input_name=key)
    for (n, const), v in zip(slots, given):
        if const is not None:
            check_constant(const, v)
        else:
            leaves[n] = v


def fill_baked_call(program: dict[str, Any], args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A Python call with its baked-in arguments checked and the omitted ones put in.

    ``model(x)``, ``model(x, True, 3)`` and ``model(x, use_cache=True)`` all work on a program
    exported with ``(x, True, 3)``; another value raises InputValidationError naming it.
    """
    baked = [a for a in baked_arguments(program) if a["whole"]]
    if not baked:
        return args, kwargs
    names = list(program.get("forward_arg_names") or [])
    by_pos = {a["position"]: a for a in baked if a["position"] is not None}
    args, kwargs = list(args), dict(kwargs)
    n_pos = _positional_count(program)
    for pos in range(len(args), n_pos):  # missing positionals: by keyword, else the baked value
        pname = names[pos] if pos < len(names) else None
        if pname is not None and pname in kwargs:
            args.append(kwargs.pop(pname))
        elif pos in by_pos:
            args.append(_fixed_value(program, by_pos[pos]))
        else:
            break
    for a in baked:
        if a["position"] is not None and a["position"] < len(args):
            check_baked(a, args[a["position"]])
            args[a["position"]] = _fixed_value(program, a)
        elif a["keyword"] is not None:
            if a["keyword"] in kwargs:
                check_baked(a, kwargs[a["keyword"]])
            kwargs[a["keyword"]] = _fixed_value(program, a)
    return tuple(args), kwargs


def _positional_count(program: dict[str, Any]) -> int:
    from torch.utils._pytree import treespec_loads

    spec = program.get("in_spec")
    return treespec_loads(spec).child(0).num_children if spec else 0


def _fixed_value(program: dict[str, Any], arg: dict[str, Any]) -> Any:
    """The exported value of a baked-in argument, in the containers torch's treespec records."""
    from torch.utils._pytree import tree_unflatten, treespec_loads

    spec = program.get("in_spec")
    if not spec or (len(arg["rests"]) == 1 and not arg["rests"][0]):
        return arg["value"]
    root = treespec_loads(spec)
    if arg["position"] is not None:
        child = root.child(0).child(arg["position"])
    else:
        child = root.child(1).child(list(root.child(1).context).index(arg["keyword"]))
    values = {c["leaf"]: c["value"] for c in program.get("constant_inputs") or []}
    return tree_unflatten([values[n] for n in arg["leaves"]], child)


def without_constants(flat: list[Any], constants: list[dict[str, Any]]) -> list[Any]:
    """``flat`` (every leaf of a program's input treespec) without the leaves export baked in."""
    baked = {c["leaf"] for c in constants}
    return [v for i, v in enumerate(flat) if i not in baked]


def check_constant(constant: dict[str, Any], value: Any) -> None:
    """An argument export baked in must be passed with the value it had at export."""
    from ..errors import InputValidationError

    if not _same(value, constant["value"]):
        top = _top(constant.get("path"))
        where = f" ({constant['path']})" if top and top[2] else ""  # an item of a tuple argument
        raise InputValidationError(
            f"input {constant['name']!r}{where} was fixed to {constant['value']!r} when the program was "
            f"exported; got {_show(value)} (export the model again to vary it)", input_name=constant["name"])


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
