"""Check a call's inputs against a program's signature before the graph runs.

Pure: values are tensors (anything with ``.dtype`` and ``.shape``), ``(dtype, shape)`` pairs or
plain Python scalars, and the spec is a manifest program's ``inputs`` list. The first problem
raises ``InputValidationError`` with one line naming the input, the dimension, its ``Dim`` name
when known, what is allowed and what was given -- instead of torch's ``Guard failed:
tokens.size()[0] <= 16`` from deep inside the graph::

    >>> spec = [{"name": "tokens", "dtype": "int64",
    ...          "shape": [4, {"min": 2, "max": 16, "expr": "s27", "dim": "seq"}]}]
    >>> check_inputs(spec, [("int64", (4, 40))])
    Traceback (most recent call last):
    registry.errors.InputValidationError: input 'tokens' dim 1 (seq) is 40, allowed 2..16

Symbols are checked across inputs: two dims sharing ``s31`` must be equal, and a derived dim
``s27 + 1`` must equal that value plus one (solved from the derived dim when ``s27`` itself is
not an input dimension).
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from ..errors import InputValidationError
from ..pt2.exprs import Expr, ExprError

__all__ = ["check_inputs", "value_meta", "parse_dim_expr", "format_range"]

_TOKEN = re.compile(r"\s*(?:(?P<int>\d+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>//|[-+*%(),]))")
_FUNCS = {"Max": "max", "Min": "min"}
_SCALAR_TYPES = {"int": (int,), "symint": (int,), "float": (int, float), "symfloat": (int, float),
                 "bool": (bool,), "symbool": (bool,), "str": (str,)}
_NON_TENSOR = frozenset({*_SCALAR_TYPES, "none", "torchbind", "unknown"})


def parse_dim_expr(text: str) -> Expr:
    """Parse a printed size expression (``s27``, ``s27 + 1``, ``2*s3``, ``s0//2``, ``Max(s0, 4)``)."""
    tokens: list[str] = []
    pos, text = 0, (text or "").strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ExprError(f"unexpected character at {pos} in {text!r}")
        tokens.append(m.group(m.lastgroup or ""))
        pos = m.end()
    if not tokens or len(tokens) > 512:
        raise ExprError("empty or oversized expression")
    parser = _Parser(tokens)
    expr = parser.expr(0)
    if parser.pos != len(tokens):
        raise ExprError(f"trailing input in {text!r}")
    return expr


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.pos = tokens, 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ExprError("unexpected end of expression")
        self.pos += 1
        return tok

    def expr(self, depth: int) -> Expr:
        if depth > 32:
            raise ExprError("expression nested too deeply")
        terms = [self.term(depth)]
        while self.peek() in ("+", "-"):
            sign = self.take()
            t = self.term(depth)
            terms.append(t if sign == "+" else Expr("mul", None, (Expr("int", -1), t)))
        return terms[0] if len(terms) == 1 else Expr("add", None, tuple(terms))

    def term(self, depth: int) -> Expr:
        left = self.unary(depth)
        while self.peek() in ("*", "//", "%"):
            op = {"*": "mul", "//": "floordiv", "%": "mod"}[self.take()]
            left = Expr(op, None, (left, self.unary(depth)))
        return left

    def unary(self, depth: int) -> Expr:
        if self.peek() == "-":
            self.take()
            return Expr("mul", None, (Expr("int", -1), self.unary(depth + 1)))
        return self.atom(depth)

    def atom(self, depth: int) -> Expr:
        tok = self.take()
        if tok.isdigit():
            return Expr("int", int(tok))
        if tok == "(":
            inner = self.expr(depth + 1)
            if self.take() != ")":
                raise ExprError("expected ')'")
            return inner
        if not (tok[0].isalpha() or tok[0] == "_"):
            raise ExprError(f"unexpected token {tok!r}")
        if self.peek() != "(":
            return Expr("sym", tok)
        if tok not in _FUNCS:
            raise ExprError(f"unsupported function {tok}()")
        self.take()
        args = [self.expr(depth + 1)]
        while self.peek() == ",":
            self.take()
            args.append(self.expr(depth + 1))
        if self.take() != ")":
            raise ExprError("expected ')'")
        return Expr(_FUNCS[tok], None, tuple(args))


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


def _label(d: Any) -> str:
    if isinstance(d, int):
        return str(d)
    return d.get("dim") or d.get("expr") or "?"


def _shape_text(shape: Sequence[Any]) -> str:
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
        self.pending: list[tuple[str, int, dict, Expr, int]] = []

    def dim(self, name: str, i: int, d: dict, size: int) -> None:
        where = f"input {name!r} dim {i}"
        try:
            expr = parse_dim_expr(d.get("expr", ""))
        except ExprError:
            return  # an expression we cannot read is still range-checked, just not related
        if expr.op == "sym":
            sym = str(expr.value)
            label = f" ({d['dim']})" if d.get("dim") else ""
            if sym in self.values and self.values[sym] != size:
                if sym in self.solved:
                    raise _fail(f"{where}{label} is {size}, but {self.origin[sym]}, so "
                                f"{d.get('dim') or self.names.get(sym, sym)} must be {self.values[sym]}", name, i)
                raise _fail(f"{where}{label} is {size}, but {self.origin[sym]} is {self.values[sym]}; "
                            f"they must be equal", name, i)
            self.values.setdefault(sym, size)
            self.origin.setdefault(sym, where)
            if d.get("dim"):
                self.names.setdefault(sym, d["dim"])
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

    def _compare(self, name: str, i: int, d: dict, expr: Expr, size: int) -> None:
        want = expr.evaluate(self.values)
        if want is None or want == size:
            return
        label = d.get("dim") or d.get("expr")
        given = ", ".join(f"{self.names.get(s, s)} is {self.values[s]} (from {self.origin[s]})"
                          for s in sorted(expr.symbols()))
        raise _fail(f"input {name!r} dim {i} ({label}) is {size}, expected {want} because {given}", name, i)

    def _solve(self, name: str, i: int, d: dict, expr: Expr, size: int, sym: str) -> bool:
        f0 = expr.evaluate({**self.values, sym: 0})
        f1 = expr.evaluate({**self.values, sym: 1})
        if f0 is None or f1 is None or f1 == f0:
            return False
        cand, rem = divmod(size - f0, f1 - f0)
        if rem or expr.evaluate({**self.values, sym: cand}) != size:
            return False  # not linear, or no integer solution: leave it to the range check
        self.values[sym] = cand
        self.solved.add(sym)
        self.origin[sym] = f"input {name!r} dim {i} ({d.get('dim') or d.get('expr')}) is {size}"
        return True


def check_inputs(spec: Sequence[Mapping[str, Any]], values: Sequence[Any], *,
                 device: str | None = None) -> dict[str, int]:
    """Validate flat inputs (in signature order) against ``spec``; returns the symbol values.

    ``device`` (e.g. ``"cuda:0"``), when given, is where every tensor input must live.
    """
    if len(values) != len(spec):
        names = ", ".join(s["name"] for s in spec)
        raise InputValidationError(f"the program takes {len(spec)} input(s) ({names}), got {len(values)}")
    symbols = _Symbols()
    for s, value in zip(spec, values):
        _check_one(s, value, symbols, device)
    return dict(symbols.values)


def _check_one(s: Mapping[str, Any], value: Any, symbols: _Symbols, device: str | None) -> None:
    name, dtype, shape = s["name"], s["dtype"], s.get("shape")
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
    if device and got_device and not _same_device(got_device, device):
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
        lo, hi = d.get("min", 0), d.get("max")
        if size < lo or (hi is not None and size > hi):
            label = f" ({d['dim']})" if d.get("dim") else ""
            raise _fail(f"input {name!r} dim {i}{label} is {size}, allowed {format_range(lo, hi)}", name, i)
        symbols.dim(name, i, d, size)


def _check_scalar(s: Mapping[str, Any], value: Any, meta: Any) -> None:
    name, dtype = s["name"], s["dtype"]
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
    if "value" in s and value != s["value"]:
        raise _fail(f"input {name!r} is {value!r}, but the program was exported with the constant "
                    f"{s['value']!r} (non-tensor inputs are fixed at export)", name)


def _same_device(a: str, b: str) -> bool:
    atype, _, aidx = a.partition(":")
    btype, _, bidx = b.partition(":")
    return atype == btype and (not aidx or not bidx or aidx == bidx)
