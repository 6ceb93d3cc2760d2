"""Export guards (``guards_code``) checked by the registry, never handed to torch as code.

torch.export records conditions its trace relied on as Python source strings, e.g.
``math.trunc(0.5*torch.sym_float(L['x'].size()[0])) == 4``, and ``ExportedProgram.module()``
pastes them into a function it ``exec()``s when the program carries example inputs. A graph
file is untrusted, so those strings are code of the file's choosing. Here they are parsed with
``ast.parse(mode="eval")`` (never compiled or executed), accepted only when every node is in a
closed grammar (comparisons, boolean and arithmetic operators, a conditional expression, a few
math/``torch.sym_*`` functions torch's guard printer writes, constants, and input sources
``L['name'][...]`` with ``.size()[i]``, ``.stride()[i]``, ``.storage_offset()``, ``.dim()``,
``.numel()``) and evaluated by the small interpreter below over the call's inputs.

Pure Python: no torch import. A tensor is recognised by its methods (``size``/``stride``).
"""
from __future__ import annotations

import ast
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["GuardError", "GuardFailure", "Guard", "parse_guard", "compile_guards", "check_guards",
           "MAX_GUARD_CHARS", "MAX_GUARD_NODES", "MAX_GUARDS"]

MAX_GUARD_CHARS = 4096
MAX_GUARD_NODES = 512
MAX_GUARDS = 4096
_MAX_INT_BITS = 512          # any intermediate integer larger than this fails the guard
_MAX_EXPONENT = 64
_MAX_STR = 256

#: ``math.<name>`` functions and constants torch's PythonPrinter writes.
MATH_FUNCS = {
    "trunc": math.trunc, "floor": math.floor, "ceil": math.ceil, "sqrt": math.sqrt,
    "isnan": math.isnan, "log2": math.log2, "exp": math.exp, "log": math.log, "cos": math.cos,
    "sin": math.sin, "tan": math.tan, "cosh": math.cosh, "sinh": math.sinh, "tanh": math.tanh,
    "acos": math.acos, "asin": math.asin, "atan": math.atan,
}
MATH_CONSTANTS = {"inf": math.inf, "nan": math.nan, "pi": math.pi, "e": math.e}
#: ``torch.<name>`` functions the printer writes (symbolic-shape helpers), as plain Python.
TORCH_FUNCS = {
    "sym_float": float, "sym_int": int, "_sym_sqrt": math.sqrt, "sym_max": max, "sym_min": min,
    "sym_not": lambda x: not x, "sym_sqrt": math.sqrt,
}
BUILTIN_FUNCS = {"abs": abs, "max": max, "min": min, "round": round, "int": int, "float": float}
#: names usable bare
CONSTANT_NAMES = {"inf": math.inf, "nan": math.nan}
#: methods of an input tensor a guard may read
TENSOR_METHODS = frozenset({"size", "stride", "storage_offset", "dim", "numel"})

_BINOPS = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
    ast.BitAnd: lambda a, b: a & b, ast.BitOr: lambda a, b: a | b, ast.BitXor: lambda a, b: a ^ b,
    ast.Pow: None, ast.LShift: None, ast.RShift: None,
}
_CMPOPS = {
    ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
}
_SOURCE_NAME = re.compile(r"L\[(['\"])([A-Za-z_][A-Za-z0-9_]*)\1\]")


class GuardError(ValueError):
    """A guard string outside the grammar (refused when the program is read)."""


class GuardFailure(ValueError):
    """Inputs that do not satisfy a guard, or a guard that cannot be evaluated on them."""


@dataclass(frozen=True)
class Guard:
    text: str
    tree: ast.expr

    @property
    def display(self) -> str:
        """The guard as torch words it for users: ``x.size()[0] <= 16``."""
        return _SOURCE_NAME.sub(r"\2", self.text).replace("\n", " ")


def _clip(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


def parse_guard(text: Any) -> Guard:
    """Parse one ``guards_code`` entry; GuardError unless it is inside the grammar."""
    if not isinstance(text, str):
        raise GuardError(f"guards_code entry is a {type(text).__name__}, not a string")
    if len(text) > MAX_GUARD_CHARS:
        raise GuardError(f"guards_code entry of {len(text)} characters (limit {MAX_GUARD_CHARS})")
    if not text.isascii() or any(c in text for c in "\r\n\x00\\;") or not text.strip():
        raise GuardError(f"guards_code entry {_clip(text)} holds characters a guard never has")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise GuardError(f"guards_code entry {_clip(text)} is not one expression ({type(exc).__name__})") from None
    count = 0
    for _node in ast.walk(tree):
        count += 1
        if count > MAX_GUARD_NODES:
            raise GuardError(f"guards_code entry {_clip(text)} has more than {MAX_GUARD_NODES} parts")
    _check(tree.body, text, 0)
    return Guard(text, tree.body)


def _bad(text: str, what: str) -> GuardError:
    return GuardError(f"guards_code entry {_clip(text)}: {what} is not allowed in a guard")


def _check(node: ast.AST, text: str, depth: int) -> None:
    if depth > 100:
        raise _bad(text, "nesting this deep")
    d = depth + 1
    if isinstance(node, ast.BoolOp):
        for v in node.values:
            _check(v, text, d)
    elif isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, (ast.Not, ast.USub, ast.UAdd, ast.Invert)):
            raise _bad(text, type(node.op).__name__)
        _check(node.operand, text, d)
    elif isinstance(node, ast.BinOp):
        if type(node.op) not in _BINOPS:
            raise _bad(text, f"operator {type(node.op).__name__}")
        _check(node.left, text, d)
        _check(node.right, text, d)
    elif isinstance(node, ast.Compare):
        if not all(type(op) in _CMPOPS for op in node.ops):
            raise _bad(text, "a comparison other than ==, !=, <, <=, >, >=")
        _check(node.left, text, d)
        for c in node.comparators:
            _check(c, text, d)
    elif isinstance(node, ast.IfExp):
        for part in (node.test, node.body, node.orelse):
            _check(part, text, d)
    elif isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool) or isinstance(v, float):
            return
        if isinstance(v, int):
            if v.bit_length() > _MAX_INT_BITS:
                raise _bad(text, "an integer this large")
            return
        if isinstance(v, str) and len(v) <= _MAX_STR:
            return
        raise _bad(text, f"a {type(v).__name__} constant")
    elif isinstance(node, ast.Name):
        if node.id not in CONSTANT_NAMES:
            raise _bad(text, f"name {node.id!r}")
    elif isinstance(node, ast.Attribute):
        if not (isinstance(node.value, ast.Name) and node.value.id == "math" and node.attr in MATH_CONSTANTS):
            raise _bad(text, f"attribute {node.attr!r}")
    elif isinstance(node, ast.Subscript):
        _check_subscript(node, text, d)
    elif isinstance(node, ast.Call):
        _check_call(node, text, d)
    else:
        raise _bad(text, type(node).__name__)


def _check_source(node: ast.AST, text: str, depth: int) -> None:
    """``L['x']``, ``L['x'][0]``, ``L['kwargs']['mask']``: an input, by path."""
    if depth > 32:
        raise _bad(text, "an input path this deep")
    if isinstance(node, ast.Name) and node.id == "L":
        return
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
            and isinstance(node.slice.value, (str, int)) and not isinstance(node.slice.value, bool):
        if isinstance(node.slice.value, str) and len(node.slice.value) > _MAX_STR:
            raise _bad(text, "an input key this long")
        _check_source(node.value, text, depth + 1)
        return
    raise _bad(text, "this input path")


def _check_subscript(node: ast.Subscript, text: str, depth: int) -> None:
    # <source>.size()[i] / .stride()[i]: a call result indexed by an integer
    if isinstance(node.value, ast.Call) and isinstance(node.slice, ast.Constant) \
            and type(node.slice.value) is int:
        call = node.value
        if isinstance(call.func, ast.Attribute) and call.func.attr in ("size", "stride"):
            _check_call(call, text, depth)
            return
        raise _bad(text, "indexing this call")
    _check_source(node, text, depth)


def _check_call(node: ast.Call, text: str, depth: int) -> None:
    if node.keywords or any(isinstance(a, ast.Starred) for a in node.args) or len(node.args) > 16:
        raise _bad(text, "this call form")
    f = node.func
    if isinstance(f, ast.Name) and f.id in BUILTIN_FUNCS:
        pass
    elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "math" \
            and f.attr in MATH_FUNCS:
        pass
    elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "torch" \
            and f.attr in TORCH_FUNCS:
        pass
    elif isinstance(f, ast.Attribute) and f.attr in TENSOR_METHODS:
        if node.args:
            raise _bad(text, f".{f.attr}() with arguments")
        _check_source(f.value, text, depth)
        return
    else:
        raise _bad(text, f"calling {ast.unparse(f)[:40]!r}")
    for a in node.args:
        _check(a, text, depth)


def compile_guards(texts: Sequence[Any]) -> tuple[Guard, ...]:
    """Parse every guard of a program (GuardError on the first outside the grammar)."""
    if len(texts) > MAX_GUARDS:
        raise GuardError(f"{len(texts)} guards_code entries (limit {MAX_GUARDS})")
    return tuple(parse_guard(t) for t in texts)


# --- evaluation ---------------------------------------------------------------------------

def _is_tensor(v: Any) -> bool:
    return callable(getattr(v, "size", None)) and callable(getattr(v, "stride", None)) \
        and type(v).__module__.split(".")[0] == "torch"


def _num(v: Any, guard: Guard) -> Any:
    if isinstance(v, bool) or isinstance(v, float):
        return v
    if isinstance(v, int):
        if v.bit_length() > _MAX_INT_BITS:
            raise GuardFailure(f"guard {guard.display!r} computes an integer too large to check")
        return v
    return v


def _eval(node: ast.AST, env: Mapping[str, Any], g: Guard) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id == "L":
            return env
        return CONSTANT_NAMES[node.id]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "math":
        return MATH_CONSTANTS[node.attr]
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            result: Any = True
            for v in node.values:
                result = _eval(v, env, g)
                if not result:
                    return result
            return result
        result = False
        for v in node.values:
            result = _eval(v, env, g)
            if result:
                return result
        return result
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env, g)
        if isinstance(node.op, ast.Not):
            return not v
        if isinstance(node.op, ast.USub):
            return -v
        if isinstance(node.op, ast.UAdd):
            return +v
        return ~v
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, env, g), _eval(node.right, env, g)
        op = type(node.op)
        if op is ast.Pow:
            if abs(b) > _MAX_EXPONENT or (isinstance(a, int) and isinstance(b, int)
                                          and a.bit_length() * max(b, 0) > _MAX_INT_BITS):
                raise GuardFailure(f"guard {g.display!r} raises to a power too large to check")
            return _num(a ** b, g)
        if op in (ast.LShift, ast.RShift):
            if not isinstance(b, int) or not 0 <= b <= _MAX_EXPONENT:
                raise GuardFailure(f"guard {g.display!r} shifts by an amount too large to check")
            return _num(a << b if op is ast.LShift else a >> b, g)
        return _num(_BINOPS[op](a, b), g)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env, g)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, env, g)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body, env, g) if _eval(node.test, env, g) else _eval(node.orelse, env, g)
    if isinstance(node, ast.Subscript):
        base = _eval(node.value, env, g)
        key = node.slice.value  # type: ignore[attr-defined]
        if isinstance(base, Mapping):
            if key not in base:
                raise GuardFailure(f"guard {g.display!r} reads input {key!r}, which this call does not have")
            return base[key]
        if isinstance(base, (list, tuple)) and isinstance(key, int) and -len(base) <= key < len(base):
            return base[key]
        raise GuardFailure(f"guard {g.display!r} reads [{key!r}] of a {type(base).__name__}")
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in TENSOR_METHODS \
                and not (isinstance(f.value, ast.Name) and f.value.id in ("math", "torch")):
            obj = _eval(f.value, env, g)
            if not _is_tensor(obj):
                raise GuardFailure(f"guard {g.display!r} reads .{f.attr}() of a {type(obj).__name__}")
            if f.attr in ("size", "stride"):
                return tuple(int(d) for d in getattr(obj, f.attr)())
            return int(getattr(obj, f.attr)())
        args = [_eval(a, env, g) for a in node.args]
        if isinstance(f, ast.Name):
            fn = BUILTIN_FUNCS[f.id]
        elif isinstance(f, ast.Attribute) and f.value.id == "math":  # type: ignore[attr-defined]
            fn = MATH_FUNCS[f.attr]
        else:
            fn = TORCH_FUNCS[f.attr]  # type: ignore[attr-defined]
        return _num(fn(*args), g)
    raise GuardFailure(f"guard {g.display!r} cannot be evaluated")  # unreachable after parse_guard


def check_guards(guards: Sequence[Guard], inputs: Mapping[str, Any]) -> None:
    """Raise GuardFailure (naming the guard as torch words it) unless every guard holds for
    ``inputs``: the call's arguments by name (``L['x']``), plus ``flat_args``."""
    for g in guards:
        try:
            ok = _eval(g.tree, inputs, g)
        except GuardFailure:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the inputs make of a guard, it did not hold
            raise GuardFailure(f"Guard failed: {g.display} ({type(exc).__name__} evaluating it)") from None
        if not ok:
            raise GuardFailure(f"Guard failed: {g.display}")
