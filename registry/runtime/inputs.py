"""Check a call's inputs against a program's signature before the graph runs.

Pure: values are tensors (anything with ``.dtype`` and ``.shape``), ``(dtype, shape)`` pairs or
plain Python scalars, and the spec is a manifest program's ``inputs`` (``TensorSpec``s). The first problem
raises ``InputValidationError`` with one line naming the input, the dimension, its ``Dim`` name
when known, what is allowed and what was given -- instead of torch's ``Guard failed:
tokens.size()[0] <= 16`` from deep inside the graph::

    >>> spec = [TensorSpec("tokens", "int64", (4, Dim(2, 16, "s27", "seq")))]
    >>> check_inputs(spec, [("int64", (4, 40))])
    Traceback (most recent call last):
    registry.errors.InputValidationError: input 'tokens' dim 1 (seq) is 40, allowed 2..16

Symbols are checked across inputs: two dims sharing ``s31`` must be equal, and a derived dim
``s27 + 1`` must equal that value plus one (solved from the derived dim when ``s27`` itself is
not an input dimension).

Call binding (below ``check_inputs``): user-given inputs (a flat tuple, or a dict by name, as
read from an inputs file or a golden sample) to the program's ``(args, kwargs)``, and the
arguments export baked in (``BakedArgument``): given with their exported value, or left out.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InputValidationError, UsageError
from ..format.manifest import ConstantInput, Dim, ProgramSpec, Size, TensorSpec
from ..pt2.exprs import Expr, ExprError, parse_dim_expr
from .device import Device, DeviceLike
from .torchrt import tree_unflatten, treespec_loads

__all__ = ["check_inputs", "value_meta", "format_range", "BakedArgument", "call_arguments", "baked_arguments",
           "check_baked", "fill_baked_call", "flat_count", "without_constants", "check_constant"]

_SCALAR_TYPES = {"int": (int,), "symint": (int,), "float": (int, float), "symfloat": (int, float),
                 "bool": (bool,), "symbool": (bool,), "str": (str,)}
_NON_TENSOR = frozenset({*_SCALAR_TYPES, "none", "torchbind", "unknown"})


def value_meta(value: Any) -> tuple[str, tuple[int, ...], str | None] | None:
    """(dtype, shape, device) of a tensor or a ``(dtype, shape)`` pair; None for other values."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
        return value[0], tuple(int(s) for s in value[1]), None
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        device = getattr(value, "device", None)
        return (str(value.dtype).removeprefix("torch."), tuple(int(s) for s in value.shape),
                str(device) if device is not None else None)
    return None


def format_range(lo: int, hi: int | None) -> str:
    return f"{lo}..{hi}" if hi is not None else f">= {lo}"


def _label(d: Size) -> str:
    return str(d) if isinstance(d, int) else d.label


def _shape_text(shape: Sequence[Size]) -> str:
    return "[" + ", ".join(_label(d) for d in shape) + "]"


def _fail(message: str, name: str, dim: int | None = None) -> InputValidationError:
    return InputValidationError(message, input_name=name, dim=dim)


class _Symbols:
    """Symbol values bound so far, where each came from, and derived dims still to check."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}
        self.origin: dict[str, str] = {}
        self.names: dict[str, str] = {}     # symbol -> the user's Dim name, when known
        self.solved: set[str] = set()       # symbols known only through a derived dim
        self.pending: list[tuple[str, int, Dim, Expr, int]] = []

    def dim(self, name: str, i: int, d: Dim, size: int) -> None:
        where = f"input {name!r} dim {i}"
        try:
            expr = parse_dim_expr(d.expr)
        except ExprError:
            return  # an expression we cannot read is still range-checked, just not related
        if expr.op == "sym":
            sym = str(expr.value)
            label = f" ({d.dim})" if d.dim else ""
            if sym in self.values and self.values[sym] != size:
                if sym in self.solved:
                    raise _fail(f"{where}{label} is {size}, but {self.origin[sym]}, so "
                                f"{d.dim or self.names.get(sym, sym)} must be {self.values[sym]}", name, i)
                raise _fail(f"{where}{label} is {size}, but {self.origin[sym]} is {self.values[sym]}; "
                            f"they must be equal", name, i)
            self.values.setdefault(sym, size)
            self.origin.setdefault(sym, where)
            if d.dim:
                self.names.setdefault(sym, d.dim)
            return
        self.pending.append((name, i, d, expr, size))
        self.resolve()

    def resolve(self) -> None:
        progress = True
        while progress:
            progress = False
            for item in list(self.pending):
                name, i, d, expr, size = item
                unbound = expr.symbols() - set(self.values)
                if not unbound:
                    self.pending.remove(item)
                    self._compare(name, i, d, expr, size)
                    progress = True
                elif len(unbound) == 1 and self._solve(name, i, d, expr, size, unbound.pop()):
                    self.pending.remove(item)
                    progress = True

    def _compare(self, name: str, i: int, d: Dim, expr: Expr, size: int) -> None:
        want = expr.evaluate(self.values)
        if want is None or want == size:
            return
        label = d.dim or d.expr
        given = ", ".join(f"{self.names.get(s, s)} is {self.values[s]} (from {self.origin[s]})"
                          for s in sorted(expr.symbols()))
        raise _fail(f"input {name!r} dim {i} ({label}) is {size}, expected {want} because {given}", name, i)

    def _solve(self, name: str, i: int, d: Dim, expr: Expr, size: int, sym: str) -> bool:
        f0 = expr.evaluate({**self.values, sym: 0})
        f1 = expr.evaluate({**self.values, sym: 1})
        if f0 is None or f1 is None or f1 == f0:
            return False
        cand, rem = divmod(size - f0, f1 - f0)
        if rem or expr.evaluate({**self.values, sym: cand}) != size:
            return False  # not linear, or no integer solution: leave it to the range check
        self.values[sym] = cand
        self.solved.add(sym)
        self.origin[sym] = f"input {name!r} dim {i} ({d.dim or d.expr}) is {size}"
        return True


def check_inputs(spec: Sequence[TensorSpec], values: Sequence[Any], *,
                 device: DeviceLike | None = None) -> dict[str, int]:
    """Validate flat inputs (in signature order) against ``spec``; returns the symbol values.

    ``device`` (e.g. ``Device("cuda", 0)`` or ``"cuda:0"``), when given, is where every tensor
    input must live.
    """
    device = Device.parse_optional(device)
    if len(values) != len(spec):
        names = ", ".join(s.name for s in spec)
        raise InputValidationError(f"the program takes {len(spec)} input(s) ({names}), got {len(values)}")
    symbols = _Symbols()
    for s, value in zip(spec, values):
        _check_one(s, value, symbols, device)
    return dict(symbols.values)


def _check_one(s: TensorSpec, value: Any, symbols: _Symbols, device: Device | None) -> None:
    name, dtype, shape = s.name, s.dtype, s.shape
    meta = value_meta(value)
    if shape is None and dtype in _NON_TENSOR:  # tensors always have a shape list (even 0-d)
        _check_scalar(s, value, meta)
        return
    if meta is None:
        raise _fail(f"input {name!r} must be a {dtype} tensor of shape {_shape_text(shape or [])}, "
                    f"got {type(value).__name__}", name)
    got_dtype, got_shape, got_device = meta
    if got_dtype != dtype:
        raise _fail(f"input {name!r} has dtype {got_dtype}, expected {dtype}", name)
    if device and got_device and not device.same_as(got_device):
        raise _fail(f"input {name!r} is on {got_device}, the program runs on {device}", name)
    if shape is None:
        return
    if len(got_shape) != len(shape):
        raise _fail(f"input {name!r} has {len(got_shape)} dims {list(got_shape)}, expected "
                    f"{len(shape)} {_shape_text(shape)}", name)
    for i, (d, size) in enumerate(zip(shape, got_shape)):
        if isinstance(d, int):
            if size != d:
                raise _fail(f"input {name!r} dim {i} is {size}, expected {d}", name, i)
            continue
        lo, hi = d.min, d.max
        if size < lo or (hi is not None and size > hi):
            label = f" ({d.dim})" if d.dim else ""
            raise _fail(f"input {name!r} dim {i}{label} is {size}, allowed {format_range(lo, hi)}", name, i)
        symbols.dim(name, i, d, size)


def _check_scalar(s: TensorSpec, value: Any, meta: Any) -> None:
    name, dtype = s.name, s.dtype
    if dtype == "none":
        if value is not None:
            raise _fail(f"input {name!r} must be None, got {type(value).__name__}", name)
        return
    types = _SCALAR_TYPES.get(dtype)
    if types is None:
        return  # TorchBind objects and unknown kinds: torch checks them
    if meta is not None or not isinstance(value, types) or (dtype in ("int", "symint", "float", "symfloat")
                                                            and isinstance(value, bool)):
        raise _fail(f"input {name!r} must be a {dtype}, got {type(value).__name__}", name)
    if s.has_value and value != s.value:
        raise _fail(f"input {name!r} is {value!r}, but the program was exported with the constant "
                    f"{s.value!r} (non-tensor inputs are fixed at export)", name)


# ------------------------------------------------------------------------------ call binding

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


@dataclass(frozen=True)
class BakedArgument:
    """An argument export baked in, as a call sees it: one per ``forward()`` argument (a tuple
    argument made only of constants is one), or one constant inside an argument that also
    holds tensors (``whole`` False, named as export named it)."""

    name: str
    value: Any
    path: str                    # ``args[1]``, ``kwargs['flag']``
    kind: str                    # "positional" | "keyword"
    position: int | None         # the positional index (None for a keyword argument)
    keyword: str | None          # the keyword (None for a positional argument)
    leaves: tuple[int, ...]      # the argument's leaves in the input treespec
    rests: tuple[str, ...]       # each leaf's path below the argument (``[0]``, ``['a'][1]``)
    whole: bool


def _constants(program: ProgramSpec) -> list[ConstantInput]:
    return sorted(program.constant_inputs, key=lambda c: c.leaf)


def baked_arguments(program: ProgramSpec) -> list[BakedArgument]:
    """The arguments export baked in, one ``BakedArgument`` per ``forward()`` argument."""
    constants = _constants(program)
    if not constants:
        return []
    names = list(program.forward_arg_names)
    with_tensors = {top[:2] for i in program.inputs if (top := _top(i.path))}
    groups: dict[Any, list[tuple[ConstantInput, str]]] = {}
    for c in constants:
        top = _top(c.path)
        key = top[:2] if top and top[:2] not in with_tensors else ("leaf", c.leaf)
        groups.setdefault(key, []).append((c, top[2] if top else ""))
    out = []
    for key, members in groups.items():
        cs = [c for c, _ in members]
        if key[0] == "leaf":
            c = cs[0]
            out.append(BakedArgument(c.name, c.value, c.path or c.name, c.kind or "positional", None, None,
                                     (c.leaf,), ("",), False))
            continue
        where, ident = key
        if where == "args":
            name = names[ident] if ident < len(names) else cs[0].name
            path = f"args[{ident}]"
        else:
            name, path = ident, f"kwargs['{ident}']"
        rests = tuple(r for _, r in members)
        out.append(BakedArgument(name, _rebuild(list(rests), [c.value for c in cs]), path,
                                 "positional" if where == "args" else "keyword",
                                 ident if where == "args" else None, None if where == "args" else ident,
                                 tuple(c.leaf for c in cs), rests, True))
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


def check_baked(arg: BakedArgument, value: Any) -> None:
    """A baked-in argument must be given with the value it had at export (or left out)."""
    if not _same(value, arg.value):
        raise InputValidationError(
            f"input {arg.name!r} was fixed to {arg.value!r} when the program was exported; "
            f"got {_show(value)} (export the model again to vary it)", input_name=arg.name)


def _expand(values: Any) -> list[Any]:
    """A flat file's values with nested tuples/lists opened (``(x, True, (3, 4))`` -> 4 leaves)."""
    out: list[Any] = []
    for v in values:
        if isinstance(v, (tuple, list)):
            out.extend(_expand(v))
        else:
            out.append(v)
    return out


def flat_count(program: ProgramSpec, value: Any) -> int | None:
    """How many values a flat-tuple input file gives (nested tuples opened when the program has
    baked-in arguments, a tuple one among them); None for a dict."""
    if not isinstance(value, (tuple, list)):
        return None
    return len(_expand(value)) if program.constant_inputs else len(value)


def call_arguments(program: ProgramSpec, value: Any) -> tuple[tuple, dict]:
    """Turn user-given inputs (a flat tuple or a dict by name) into the program's (args, kwargs).

    Arguments export baked in may be given (by position in a full flat tuple, or in a dict by
    argument or constant name) with their exported value, or left out; another value raises
    InputValidationError naming the argument, the exported value and what was given.
    """
    inputs = program.inputs
    constants = _constants(program)
    baked = baked_arguments(program)
    total = len(inputs) + len(constants)
    const_leaves = {c.leaf for c in constants}
    user_leaves = [i for i in range(total) if i not in const_leaves]
    leaves: list[Any] = [_MISSING] * total
    if isinstance(value, dict):
        by_input = {i.name: n for n, i in zip(user_leaves, inputs)}
        by_const = {c.name: c for c in constants}
        by_arg = {a.name: a for a in baked if a.whole}
        unknown = sorted(k for k in value if k not in by_input and k not in by_const and k not in by_arg
                         and k not in program.forward_arg_names)
        if unknown:
            raise UsageError(f"unknown input {unknown[0]!r}; the program takes "
                             f"{', '.join(i.name for i in inputs)}")
        for key, v in value.items():
            if key in by_input:
                leaves[by_input[key]] = v
            elif key in by_arg:
                check_baked(by_arg[key], v)
            elif key in by_const:
                check_constant(by_const[key], v)
            else:  # an argument holding tensors and baked-in items, e.g. (mask, 3): by its leaves
                _assign_mixed(program, key, v, leaves, user_leaves, constants)
        missing = [i.name for n, i in zip(user_leaves, inputs) if leaves[n] is _MISSING or leaves[n] is None]
        if missing:
            raise UsageError(f"missing input {missing[0]!r}")
    else:
        flat = _expand(value) if constants else list(value)
        if constants and len(flat) == total:  # given in full: baked-in values in their places
            by_leaf = {c.leaf: c for c in constants}
            for a in baked:
                given = [flat[n] for n in a.leaves]
                if not a.whole:
                    check_constant(by_leaf[a.leaves[0]], given[0])
                elif not all(_same(g, by_leaf[n].value) for g, n in zip(given, a.leaves)):
                    check_baked(a, _rebuild(list(a.rests), given))
            flat = without_constants(flat, constants)
        if len(flat) != len(inputs):
            raise UsageError(f"the program takes {len(inputs)} inputs "
                             f"({', '.join(i.name for i in inputs)}), got {len(flat)}")
        for n, v in zip(user_leaves, flat):
            leaves[n] = v
    for c in constants:  # baked-in arguments go back in place, with their exported values
        leaves[c.leaf] = c.value
    spec = program.in_spec
    if not spec:
        return tuple(leaves[n] for n in user_leaves), {}
    args, kwargs = tree_unflatten(leaves, treespec_loads(spec))
    return tuple(args), dict(kwargs)


def _assign_mixed(program: ProgramSpec, key: str, value: Any, leaves: list[Any], user_leaves: list[int],
                  constants: list[ConstantInput]) -> None:
    names = list(program.forward_arg_names)
    slots: list[tuple[int, ConstantInput | None]] = []
    for top in [("kwargs", key)] + ([("args", names.index(key))] if key in names else []):
        slots = sorted([(n, None) for n, i in zip(user_leaves, program.inputs)
                        if (_top(i.path) or ())[:2] == top]
                       + [(c.leaf, c) for c in constants if (_top(c.path) or ())[:2] == top],
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


def fill_baked_call(program: ProgramSpec, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A Python call with its baked-in arguments checked and the omitted ones put in.

    ``model(x)``, ``model(x, True, 3)`` and ``model(x, use_cache=True)`` all work on a program
    exported with ``(x, True, 3)``; another value raises InputValidationError naming it.
    """
    baked = [a for a in baked_arguments(program) if a.whole]
    if not baked:
        return args, kwargs
    names = list(program.forward_arg_names)
    by_pos = {a.position: a for a in baked if a.position is not None}
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
        if a.position is not None and a.position < len(args):
            check_baked(a, args[a.position])
            args[a.position] = _fixed_value(program, a)
        elif a.keyword is not None:
            if a.keyword in kwargs:
                check_baked(a, kwargs[a.keyword])
            kwargs[a.keyword] = _fixed_value(program, a)
    return tuple(args), kwargs


def _positional_count(program: ProgramSpec) -> int:
    spec = program.in_spec
    return treespec_loads(spec).child(0).num_children if spec else 0


def _fixed_value(program: ProgramSpec, arg: BakedArgument) -> Any:
    """The exported value of a baked-in argument, in the containers torch's treespec records."""
    spec = program.in_spec
    if not spec or (len(arg.rests) == 1 and not arg.rests[0]):
        return arg.value
    root = treespec_loads(spec)
    if arg.position is not None:
        child = root.child(0).child(arg.position)
    else:
        child = root.child(1).child(list(root.child(1).context).index(arg.keyword))
    values = {c.leaf: c.value for c in program.constant_inputs}
    return tree_unflatten([values[n] for n in arg.leaves], child)


def without_constants(flat: list[Any], constants: Sequence[ConstantInput]) -> list[Any]:
    """``flat`` (every leaf of a program's input treespec) without the leaves export baked in."""
    baked = {c.leaf for c in constants}
    return [v for i, v in enumerate(flat) if i not in baked]


def check_constant(constant: ConstantInput, value: Any) -> None:
    """An argument export baked in must be passed with the value it had at export."""
    if not _same(value, constant.value):
        top = _top(constant.path)
        where = f" ({constant.path})" if top and top[2] else ""  # an item of a tuple argument
        raise InputValidationError(
            f"input {constant.name!r}{where} was fixed to {constant.value!r} when the program was "
            f"exported; got {_show(value)} (export the model again to vary it)", input_name=constant.name)
