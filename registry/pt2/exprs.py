"""A safe reader for the sympy ``srepr`` strings that torch.export stores for symbolic sizes.

``Add(Symbol('s27', positive=True, integer=True), Integer(1))`` -> an expression tree we can
print (``s27 + 1``) and bound with interval arithmetic. Hostile input never reaches ``eval``:
this is a small recursive-descent parser over a closed set of node names.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .safety import sympy_call_allowed

__all__ = ["Expr", "parse_srepr", "ExprError", "INF"]

INF = math.inf
_TOKEN = re.compile(r"\s*(?:(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<int>-?\d+)|(?P<str>'[^']*'|\"[^\"]*\")|(?P<punct>[(),=]))")
_MAX_LEN = 4096
_MAX_DEPTH = 32


class ExprError(ValueError):
    pass


@dataclass(frozen=True)
class Expr:
    op: str                      # "sym" | "int" | "add" | "mul" | "floordiv" | "mod" | "max" | "min" | "pow"
    #                              or "fn:<Name>": any other sympy/torch function, kept opaque
    #                              (printed, symbols known, bounds [0, inf), never evaluated)
    value: object = None         # symbol name or int
    args: tuple["Expr", ...] = ()

    def symbols(self) -> set[str]:
        if self.op == "sym":
            return {str(self.value)}
        out: set[str] = set()
        for a in self.args:
            out |= a.symbols()
        return out

    def render(self, names: dict[str, str] | None = None) -> str:
        """Print like sympy does for the shapes torch produces (``s27 + 1``, ``2*s3``)."""
        names = names or {}
        if self.op == "sym":
            return names.get(str(self.value), str(self.value))
        if self.op in ("int", "atom"):
            return str(self.value)
        if self.op == "add":
            terms = sorted(self.args, key=lambda a: a.op == "int")
            text = terms[0].render(names)
            for t in terms[1:]:
                if t.op == "int" and int(t.value) < 0:  # type: ignore[arg-type]
                    text += f" - {-int(t.value)}"  # type: ignore[arg-type]
                else:
                    text += f" + {t.render(names)}"
            return text
        if self.op == "mul":
            return "*".join(_paren(a, names) for a in sorted(self.args, key=lambda a: a.op != "int"))
        if self.op in ("floordiv", "mod"):
            sym = "//" if self.op == "floordiv" else "%"
            return f"{_paren(self.args[0], names)}{sym}{_paren(self.args[1], names)}"
        if self.op == "pow":
            return f"{_paren(self.args[0], names)}**{_paren(self.args[1], names)}"
        name = self.op[3:] if self.op.startswith("fn:") else self.op
        return f"{name}({', '.join(a.render(names) for a in self.args)})"

    def bounds(self, ranges: dict[str, tuple[float, float]]) -> tuple[float, float]:
        """Interval of the expression given each symbol's [min, max] (max may be INF)."""
        if self.op == "sym":
            return ranges.get(str(self.value), (0, INF))
        if self.op == "int":
            v = int(self.value)  # type: ignore[arg-type]
            return v, v
        parts = [a.bounds(ranges) for a in self.args]
        if self.op == "add":
            return sum(p[0] for p in parts), sum(p[1] for p in parts)
        if self.op == "mul":
            lo, hi = parts[0]
            for plo, phi in parts[1:]:
                cands = [_mul(lo, plo), _mul(lo, phi), _mul(hi, plo), _mul(hi, phi)]
                lo, hi = min(cands), max(cands)
            return lo, hi
        if self.op == "floordiv" and parts[1][0] > 0:
            (alo, ahi), (blo, bhi) = parts
            return (alo // bhi if bhi != INF else 0), (ahi // blo if ahi != INF else INF)
        if self.op == "max":
            return max(p[0] for p in parts), max(p[1] for p in parts)
        if self.op == "min":
            return min(p[0] for p in parts), min(p[1] for p in parts)
        if self.op == "pow" and self.args[1].op == "int" and 0 <= int(self.args[1].value) <= 64 \
                and parts[0][0] >= 0:  # type: ignore[arg-type]
            e = int(self.args[1].value)  # type: ignore[arg-type]
            return parts[0][0] ** e, (INF if parts[0][1] == INF else parts[0][1] ** e)
        return 0, INF

    def evaluate(self, values: dict[str, int]) -> int | None:
        """Concrete value given symbol values, or None when a symbol is unknown."""
        if self.op == "sym":
            return values.get(str(self.value))
        if self.op == "int":
            return int(self.value)  # type: ignore[arg-type]
        vals = [a.evaluate(values) for a in self.args]
        if any(v is None for v in vals):
            return None
        if self.op == "add":
            return sum(vals)  # type: ignore[arg-type]
        if self.op == "mul":
            return math.prod(vals)  # type: ignore[arg-type]
        if self.op == "floordiv":
            return vals[0] // vals[1] if vals[1] else None  # type: ignore[operator]
        if self.op == "mod":
            return vals[0] % vals[1] if vals[1] else None  # type: ignore[operator]
        if self.op == "max":
            return max(vals)  # type: ignore[type-var]
        if self.op == "min":
            return min(vals)  # type: ignore[type-var]
        if self.op == "pow" and 0 <= vals[1] <= 64:  # type: ignore[operator]
            return vals[0] ** vals[1]  # type: ignore[operator]
        return None


def _mul(a: float, b: float) -> float:
    if a == 0 or b == 0:
        return 0
    return a * b


def _paren(e: Expr, names: dict[str, str]) -> str:
    text = e.render(names)
    return f"({text})" if e.op == "add" else text


_OPS = {"Add": "add", "Mul": "mul", "FloorDiv": "floordiv", "Mod": "mod", "PythonMod": "mod",
        "Max": "max", "Min": "min", "Pow": "pow", "PowByNatural": "pow"}
_ATOMS = frozenset({"true", "false", "oo", "zoo", "nan", "int_oo"})


def parse_srepr(text: str) -> Expr:
    if not isinstance(text, str) or len(text) > _MAX_LEN:
        raise ExprError("expression too long or not a string")
    tokens = _tokenize(text)
    expr, pos = _parse(tokens, 0, 0)
    if pos != len(tokens):
        raise ExprError(f"trailing input in {text!r}")
    return expr


def _tokenize(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ExprError(f"unexpected character at {pos} in {text!r}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


def _parse(tokens: list[tuple[str, str]], pos: int, depth: int) -> tuple[Expr, int]:
    if depth > _MAX_DEPTH:
        raise ExprError("expression nested too deeply")
    if pos >= len(tokens):
        raise ExprError("unexpected end of expression")
    kind, val = tokens[pos]
    if kind == "int":
        return Expr("int", int(val)), pos + 1
    if kind != "name":
        raise ExprError(f"unexpected token {val!r}")
    if pos + 1 >= len(tokens) or tokens[pos + 1][1] != "(":
        if val in _ATOMS:
            return Expr("atom", val), pos + 1
        return Expr("sym", val), pos + 1  # bare identifier (printed form)
    args, pos = _parse_args(tokens, pos + 2, depth)
    if val == "Symbol":
        if not args or not isinstance(args[0], str):
            raise ExprError("Symbol() needs a name")
        return Expr("sym", args[0]), pos
    if val == "Integer":
        if len(args) != 1 or not isinstance(args[0], Expr) or args[0].op != "int":
            raise ExprError("Integer() needs one integer")
        return args[0], pos
    if val in _OPS:
        exprs = tuple(a for a in args if isinstance(a, Expr))
        if not exprs:
            raise ExprError(f"{val}() needs arguments")
        if _OPS[val] == "pow" and len(exprs) != 2:
            raise ExprError(f"{val}() needs two arguments")
        return Expr(_OPS[val], None, exprs), pos
    if sympy_call_allowed(val):  # Piecewise, CeilToInt, Float, ...: described, not computed
        return Expr(f"fn:{val}", None, tuple(a for a in args if isinstance(a, Expr))), pos
    raise ExprError(f"unsupported expression node {val!r}")


def _parse_args(tokens: list[tuple[str, str]], pos: int, depth: int) -> tuple[list[object], int]:
    args: list[object] = []
    while True:
        if pos >= len(tokens):
            raise ExprError("unclosed parenthesis")
        kind, val = tokens[pos]
        if val == ")":
            return args, pos + 1
        if kind == "str":
            args.append(val[1:-1])
            pos += 1
        elif kind == "name" and pos + 1 < len(tokens) and tokens[pos + 1][1] == "=":
            pos += 3  # keyword assumption like positive=True: skip name, '=', value
        else:
            expr, pos = _parse(tokens, pos, depth + 1)
            args.append(expr)
        if pos < len(tokens) and tokens[pos][1] == ",":
            pos += 1
