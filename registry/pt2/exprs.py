"""A safe reader for the symbolic sizes torch.export writes, in both of its spellings.

``Add(Symbol('s27', positive=True, integer=True), Integer(1))`` (sympy's ``srepr``, in a graph
file: :func:`parse_srepr`) and ``s27 + 1`` (the printed form, in a manifest:
:func:`parse_dim_expr`) -> one expression tree we can print and bound with interval
arithmetic. Hostile input never reaches ``eval``: one small recursive-descent parser
(:class:`_Parser`) over a closed set of node names reads both.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Expr", "parse_srepr", "parse_dim_expr", "ExprError", "INF", "SYMPY_CALLS", "sympy_call_allowed",
           "tokenize"]

INF = math.inf
_MAX_LEN = 4096
_MAX_DEPTH = 32


class ExprError(ValueError):
    pass


#: sympy classes srepr prints for the expressions torch builds, and torch's sympy functions
#: (``ExportedProgramDeserializer.sympy_functions``). Calls to anything else are refused.
SYMPY_CALLS = frozenset({
    "Symbol", "Dummy", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Max", "Min", "Abs",
    "Mod", "floor", "ceiling", "sqrt", "Piecewise", "ExprCondPair",
    "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "Equality", "Unequality", "StrictLessThan",
    "StrictGreaterThan", "LessThan", "GreaterThan", "And", "Or", "Not", "Xor",
    # torch.utils._sympy.functions, as named by the deserializer
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "CleanDiv", "CeilToInt", "FloorToInt",
    "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv",
    "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt",
    "RoundDecimal", "ToFloat", "Identity", "BitwiseFn_bitwise_and", "BitwiseFn_bitwise_or",
    "OpaqueUnaryFn_sqrt", "OpaqueUnaryFn_exp", "OpaqueUnaryFn_log", "OpaqueUnaryFn_cos",
    "OpaqueUnaryFn_sin", "OpaqueUnaryFn_tan", "OpaqueUnaryFn_cosh", "OpaqueUnaryFn_sinh",
    "OpaqueUnaryFn_tanh", "OpaqueUnaryFn_asin", "OpaqueUnaryFn_acos", "OpaqueUnaryFn_atan",
    "OpaqueUnaryFn_log2",
})
#: families torch generates names in (``OpaqueUnaryFn_asinh``, ``BitwiseFn_bitwise_xor``):
#: a name sympify does not know becomes an undefined sympy function, never Python code.
_SYMPY_CALL_FAMILIES = re.compile(r"(?:OpaqueUnaryFn_[a-z0-9]+|BitwiseFn_bitwise_[a-z]+)\Z")


def sympy_call_allowed(name: str) -> bool:
    """A function name an ``expr_str`` may call: sympy classes and torch's sympy functions."""
    return name in SYMPY_CALLS or bool(_SYMPY_CALL_FAMILIES.match(name))


@dataclass(frozen=True)
class Expr:
    op: str                      # "sym" | "int" | "add" | "mul" | "floordiv" | "mod" | "max" | "min" | "pow"
    #                              or "fn:<Name>": any other sympy/torch function, kept opaque
    #                              (printed, symbols known, bounds [0, inf), never evaluated)
    value: object = None         # symbol name or int
    args: tuple[Expr, ...] = ()

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
#: functions a printed size may call (``Max(s0, 4)``)
_PRINTED_FUNCS = {"Max": "max", "Min": "min"}
_MAX_PRINTED_TOKENS = 512
_PRODUCT_OPS = {"*": "mul", "//": "floordiv", "%": "mod"}


def parse_srepr(text: str) -> Expr:
    """Parse sympy's ``srepr`` of a size (``Add(Symbol('s27', positive=True), Integer(1))``),
    as the graph file stores it; ``ExprError`` for anything outside the closed node set."""
    if not isinstance(text, str) or len(text) > _MAX_LEN:
        raise ExprError("expression too long or not a string")
    return _Parser(text, srepr=True).parse()


def parse_dim_expr(text: str) -> Expr:
    """Parse a printed size expression (``s27``, ``s27 + 1``, ``2*s3``, ``s0//2``, ``Max(s0, 4)``),
    as a manifest stores it; ``ExprError`` for anything else."""
    parser = _Parser(text or "", srepr=False)
    if not parser.tokens or len(parser.tokens) > _MAX_PRINTED_TOKENS:
        raise ExprError("empty or oversized expression")
    return parser.parse()


_SREPR_TOKEN = re.compile(r"\s*(?:(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<int>-?\d+)|(?P<str>'[^']*'|\"[^\"]*\")"
                          r"|(?P<punct>[(),=]))")
_PRINTED_TOKEN = re.compile(r"\s*(?:(?P<int>\d+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<punct>//|[-+*%(),]))")


class _Parser:
    """The one recursive-descent parser for the two spellings of a size torch writes.

    ``srepr=True``: sympy's constructor form, nested calls only (``Add(Symbol('s0'), Integer(1))``):
    string arguments, ``keyword=value`` assumptions (skipped), signed integers, and any node of
    ``_OPS``, ``Symbol``/``Integer`` or a sympy function :func:`sympy_call_allowed` lets through.
    ``srepr=False``: the printed form (``2*s0 + 1``): ``+ - * // %``, unary minus, parentheses,
    unsigned integers and ``Max``/``Min``. Both build the same :class:`Expr` tree; neither ever
    evaluates the text.
    """

    def __init__(self, text: str, *, srepr: bool) -> None:
        self.text, self.srepr = text, srepr
        stripped = text.strip()
        self.tokens = tokenize(stripped, _SREPR_TOKEN if srepr else _PRINTED_TOKEN, lambda pos: ExprError(
            f"unexpected character at {pos} in {stripped!r}"))
        self.pos = 0

    def parse(self) -> Expr:
        expr = self.expr(0)
        if self.pos != len(self.tokens):
            raise ExprError(f"trailing input in {self.text.strip()!r}")
        return expr

    def peek(self, ahead: int = 0) -> str | None:
        i = self.pos + ahead
        return self.tokens[i][1] if i < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        if self.pos >= len(self.tokens):
            raise ExprError("unexpected end of expression")
        self.pos += 1
        return self.tokens[self.pos - 1]

    def expect_close(self) -> None:
        if self.take()[1] != ")":
            raise ExprError("expected ')'")

    # -- grammar: expr := term (('+'|'-') term)*  (printed only; srepr: expr := primary) ----

    def expr(self, depth: int) -> Expr:
        if depth > _MAX_DEPTH:
            raise ExprError("expression nested too deeply")
        if self.srepr:
            return self.primary(depth)
        terms = [self.term(depth)]
        while self.peek() in ("+", "-"):
            sign = self.take()[1]
            t = self.term(depth)
            terms.append(t if sign == "+" else _negated(t))
        return terms[0] if len(terms) == 1 else Expr("add", None, tuple(terms))

    def term(self, depth: int) -> Expr:
        left = self.unary(depth)
        while self.peek() in _PRODUCT_OPS:
            op = _PRODUCT_OPS[self.take()[1]]
            left = Expr(op, None, (left, self.unary(depth)))
        return left

    def unary(self, depth: int) -> Expr:
        if self.peek() == "-":
            self.take()
            return _negated(self.unary(depth + 1))
        return self.primary(depth)

    def primary(self, depth: int) -> Expr:
        """An integer, a name, a call ``Name(...)``, or (printed) a parenthesized expression."""
        kind, val = self.take()
        if kind == "int":
            return Expr("int", int(val))
        if val == "(" and not self.srepr:
            inner = self.expr(depth + 1)
            self.expect_close()
            return inner
        if kind != "name":
            raise ExprError(f"unexpected token {val!r}")
        if self.peek() != "(":
            if self.srepr and val in _ATOMS:
                return Expr("atom", val)
            return Expr("sym", val)  # a bare identifier: a symbol's printed form
        if self.srepr:
            self.take()
            return _srepr_node(val, self.srepr_args(depth))
        if val not in _PRINTED_FUNCS:
            raise ExprError(f"unsupported function {val}()")
        self.take()
        args = [self.expr(depth + 1)]
        while self.peek() == ",":
            self.take()
            args.append(self.expr(depth + 1))
        self.expect_close()
        return Expr(_PRINTED_FUNCS[val], None, tuple(args))

    def srepr_args(self, depth: int) -> list[object]:
        """The arguments of an srepr call up to its ``)``: nodes, strings; assumptions skipped."""
        args: list[object] = []
        while True:
            if self.pos >= len(self.tokens):
                raise ExprError("unclosed parenthesis")
            kind, val = self.tokens[self.pos]
            if val == ")":
                self.pos += 1
                return args
            if kind == "str":
                args.append(val[1:-1])
                self.pos += 1
            elif kind == "name" and self.peek(1) == "=":
                self.pos += 3  # keyword assumption like positive=True: skip name, '=', value
            else:
                args.append(self.expr(depth + 1))
            if self.peek() == ",":
                self.pos += 1


def _negated(e: Expr) -> Expr:
    return Expr("mul", None, (Expr("int", -1), e))


def _srepr_node(name: str, args: list[object]) -> Expr:
    if name == "Symbol":
        if not args or not isinstance(args[0], str):
            raise ExprError("Symbol() needs a name")
        return Expr("sym", args[0])
    if name == "Integer":
        if len(args) != 1 or not isinstance(args[0], Expr) or args[0].op != "int":
            raise ExprError("Integer() needs one integer")
        return args[0]
    exprs = tuple(a for a in args if isinstance(a, Expr))
    if name in _OPS:
        if not exprs:
            raise ExprError(f"{name}() needs arguments")
        if _OPS[name] == "pow" and len(exprs) != 2:
            raise ExprError(f"{name}() needs two arguments")
        return Expr(_OPS[name], None, exprs)
    if sympy_call_allowed(name):  # Piecewise, CeilToInt, Float, ...: described, not computed
        return Expr(f"fn:{name}", None, exprs)
    raise ExprError(f"unsupported expression node {name!r}")


def tokenize(text: str, pattern: re.Pattern[str], error: Callable[[int], Exception]
             ) -> list[tuple[str, str]]:
    """(kind, text) tokens of ``text``: the named group of ``pattern`` (which skips leading
    whitespace) matched at each position; ``error(pos)`` is raised at the first position no
    token starts at. Shared by both spellings here and by the graph checker's strict ``srepr``
    grammar (``registry.pt2.safety``)."""
    out, pos, end = [], 0, len(text.rstrip())
    while pos < end:
        m = pattern.match(text, pos)
        if not m or m.end() == pos:
            raise error(pos)
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out
