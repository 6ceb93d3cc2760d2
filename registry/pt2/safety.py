"""What in a serialized graph would make torch run code of the file's choosing, refused up front.

``torch.export.load`` trusts its graph JSON in two places beyond pickle:

* every ``expr_str`` (a sympy ``srepr`` of a symbolic size) goes to ``sympy.sympify``, which is
  ``eval``: ``"__import__('os').system(...)"`` runs at load;
* every node ``target`` is resolved by ``getattr`` chains from ``torch``, ``_operator`` or
  ``math`` and the result is *called* when the program runs, so ``torch.ops.load_library`` or
  ``torch.os.system`` would be called with arguments from the graph.

So before torch sees a graph, each ``expr_str`` must be a plain ``srepr`` over sympy classes and
torch's own sympy functions (no strings but symbol names and decimal literals, no attribute
access), and each node target must be an operator (``torch.ops.ns.op.overload``), a higher-order
op, a symbolic-shape helper or one of the few pre-dispatch wrappers torch itself writes.
Everything else is refused with the program and the offending text. Pure functions over parsed
JSON; no torch, no sympy.
"""
from __future__ import annotations

import re
from typing import Any, Iterator

__all__ = ["GraphSafetyError", "check_graph", "check_srepr", "check_target", "unsafe_in_graph", "walk_dicts", "sympy_call_allowed"]

_MAX_EXPR_CHARS = 8192
_MAX_EXPR_DEPTH = 64
_MAX_INT_DIGITS = 40
_MAX_POW_EXPONENT = 64
_MAX_UNBACKED_INDEX = 10_000_000
_UNBACKED_PREFIXES = ("u", "zuf")  # torch.utils._sympy.symbol.prefix_str

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
_POW_CALLS = frozenset({"Pow", "PowByNatural", "FloatPow", "LShift", "RShift"})
#: names srepr prints bare (singletons).
SYMPY_ATOMS = frozenset({"oo", "zoo", "nan", "true", "false", "pi", "E", "I", "int_oo"})
_KW_VALUES = frozenset({"True", "False"})
_STRING_ARG_CALLS = frozenset({"Symbol", "Dummy", "Float"})
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_DECIMAL = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\Z|-?inf\Z|nan\Z")
_TOKEN = re.compile(r"\s*(?:(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<int>\d+)|'(?P<str>[^'\\]*)'"
                    r"|(?P<punct>[(),=\-]))")

#: ``operator`` functions torch serializes as ``_operator.<name>`` (its ``_SYM_OPS`` and getitem).
OPERATOR_FUNCS = frozenset({
    "getitem", "add", "sub", "mul", "floordiv", "truediv", "mod", "pow", "neg", "pos", "abs",
    "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "xor", "not_", "invert", "lshift",
    "rshift", "truth",
})
#: aten operators whose names are dunders (``a & b`` is ``aten.__and__.Tensor``); any other
#: name with ``__`` in a target is refused (``__call__``, ``__class__`` ...).
ATEN_DUNDER_OPS = frozenset({
    "__and__", "__or__", "__xor__", "__lshift__", "__rshift__", "__iand__", "__ior__", "__ixor__",
    "__ilshift__", "__irshift__", "__not__", "__contains__", "__getitem__", "__is__", "__isnot__",
    "__derive_index", "__range_length", "__round_to_zero_floordiv", "__interpolate", "__upsample",
    "__upsample_bilinear", "__upsample_nearest",
})
#: attributes of ``torch.ops`` that are not operator namespaces.
_OPS_ATTRIBUTES = frozenset({"load_library", "import_module", "loaded_libraries", "_dir"})
#: plain functions torch writes as call targets of pre-dispatch graphs.
PREDISPATCH_TARGETS = frozenset({
    "torch._C._set_grad_enabled",
    "torch.amp.autocast_mode._enter_autocast",
    "torch.amp.autocast_mode._exit_autocast",
    "torch._functorch.vmap.lazy_load_decompositions",
})
_SAFE_TARGET = re.compile(
    r"torch\.ops\.(?P<ns>[A-Za-z_][A-Za-z0-9_]*)\.(?P<op>[A-Za-z_][A-Za-z0-9_]*)"
    r"\.(?P<ov>[A-Za-z_][A-Za-z0-9_]*)\Z"
    r"|torch\.ops\.higher_order\.[A-Za-z_][A-Za-z0-9_]*\Z"
    r"|_operator\.(?P<opfn>[a-z_]+)\Z"
    r"|math\.[a-z][a-z0-9_]*\Z"
    r"|torch\._?sym_[a-z_]+\Z"
    r"|torch\._functorch\.predispatch\.(?:_[a-z_]+|lazy_load_decompositions)\Z"
    r"|torch\._C\._functorch\._[a-z_]+\Z"
    r"|\#[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*\Z"
)


def sympy_call_allowed(name: str) -> bool:
    """A function name an ``expr_str`` may call: sympy classes and torch's sympy functions."""
    return name in SYMPY_CALLS or bool(_SYMPY_CALL_FAMILIES.match(name))


class GraphSafetyError(ValueError):
    """A graph would make torch run code chosen by the file; the message names what."""


def check_srepr(text: Any) -> None:
    """Raise GraphSafetyError unless ``text`` is a plain sympy ``srepr`` torch could have written."""
    if not isinstance(text, str):
        raise GraphSafetyError(f"expr_str is a {type(text).__name__}, not a string")
    if len(text) > _MAX_EXPR_CHARS:
        raise GraphSafetyError(f"expression of {len(text)} characters (limit {_MAX_EXPR_CHARS})")
    tokens = _tokenize(text)
    tree, pos = _parse(tokens, 0, 0)
    if pos != len(tokens):
        raise GraphSafetyError(f"unexpected {tokens[pos][1]!r} in expression {_clip(text)}")
    _check_powers(tree)


def _clip(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _tokenize(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    end = len(text.rstrip())
    while pos < end:
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise GraphSafetyError(f"character {text[pos:pos + 1]!r} is not allowed in expression {_clip(text)}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def _peek(tokens: list[tuple[str, str]], pos: int) -> tuple[str, str]:
    return tokens[pos] if pos < len(tokens) else ("end", "")


def _int(value: str) -> int:
    if len(value) > _MAX_INT_DIGITS:
        raise GraphSafetyError(f"integer literal of {len(value)} digits (limit {_MAX_INT_DIGITS})")
    return int(value)


# A parsed expression: ("int", n) | ("atom", name) | ("str", text) | ("call", name, [args]).
_Tree = tuple


def _parse(tokens: list[tuple[str, str]], pos: int, depth: int) -> tuple[_Tree, int]:
    if depth > _MAX_EXPR_DEPTH:
        raise GraphSafetyError(f"expression nested deeper than {_MAX_EXPR_DEPTH}")
    kind, value = _peek(tokens, pos)
    if (kind, value) == ("punct", "-"):
        inner, pos = _parse(tokens, pos + 1, depth + 1)
        return (("int", -inner[1]) if inner[0] == "int" else inner), pos
    if kind == "int":
        return ("int", _int(value)), pos + 1
    if kind != "name":
        raise GraphSafetyError(f"unexpected {value or 'end'!r} in expression")
    if _peek(tokens, pos + 1) != ("punct", "("):
        if value not in SYMPY_ATOMS:
            raise GraphSafetyError(f"name {value!r} is not allowed in an expression")
        return ("atom", value), pos + 1
    if not sympy_call_allowed(value):
        raise GraphSafetyError(f"call to {value!r} is not allowed in an expression")
    pos += 2
    args: list[_Tree] = []
    while _peek(tokens, pos) != ("punct", ")"):
        if args:
            if _peek(tokens, pos) != ("punct", ","):
                raise GraphSafetyError(f"expected ',' in expression, found {_peek(tokens, pos)[1]!r}")
            pos += 1
        arg, pos = _argument(tokens, pos, depth, value, len(args))
        args.append(arg)
    if value == "Integer" and (len(args) != 1 or args[0][0] != "int"):
        raise GraphSafetyError("Integer() takes one integer literal")
    if value == "Integer":
        return args[0], pos + 1
    return ("call", value, args), pos + 1


def _argument(tokens: list[tuple[str, str]], pos: int, depth: int, call: str, index: int
              ) -> tuple[_Tree, int]:
    kind, text = _peek(tokens, pos)
    if kind == "str":
        if index != 0 or call not in _STRING_ARG_CALLS:
            raise GraphSafetyError(f"a string argument to {call}() is not allowed")
        if call == "Float":
            if not _DECIMAL.match(text) or len(text) > 64:
                raise GraphSafetyError(f"Float({text!r}) is not a decimal number")
        elif not _IDENT.match(text) or text.startswith("__") or len(text) > 64:
            raise GraphSafetyError(f"symbol name {text!r} is not a plain identifier")
        return ("str", text), pos + 1
    if kind == "name" and _peek(tokens, pos + 1) == ("punct", "="):
        k2, v2 = _peek(tokens, pos + 2)
        if k2 == "int":
            _int(v2)
            return ("kw", text), pos + 3
        if (k2, v2) == ("punct", "-") and _peek(tokens, pos + 3)[0] == "int":
            _int(_peek(tokens, pos + 3)[1])
            return ("kw", text), pos + 4
        if k2 == "name" and v2 in _KW_VALUES:
            return ("kw", text), pos + 3
        raise GraphSafetyError(f"keyword {text}= must be True, False or an integer")
    return _parse(tokens, pos, depth + 1)


def _magnitude(tree: _Tree) -> float:
    """An upper bound on |value| of an exponent, counting each symbol as 1 (sizes are small
    in exponents torch writes); a power inside an exponent counts as unbounded."""
    if tree[0] == "int":
        return abs(tree[1])
    if tree[0] != "call":
        return 1
    name, args = tree[1], [a for a in tree[2] if a[0] != "kw"]
    if name in _POW_CALLS:
        return float("inf")
    if name in ("Symbol", "Dummy", "Float"):
        return 1
    parts = [_magnitude(a) for a in args]
    if name == "Mul":
        out = 1.0
        for p in parts:
            out *= max(p, 1)
        return out
    return sum(parts) if name == "Add" else max(parts, default=1)


def _check_powers(tree: _Tree) -> None:
    # sympy evaluates Pow(Integer(10), Integer(10**12)) eagerly: a small string, an endless load.
    stack = [tree]
    while stack:
        t = stack.pop()
        if t[0] != "call":
            continue
        if t[1] in _POW_CALLS:
            exps = [a for a in t[2] if a[0] != "kw"][1:2]
            if exps and _magnitude(exps[0]) > _MAX_POW_EXPONENT:
                raise GraphSafetyError(f"{t[1]}() with an exponent that may exceed {_MAX_POW_EXPONENT}")
        stack.extend(t[2])


def check_target(target: Any) -> None:
    """Raise GraphSafetyError unless a node target is one torch resolves to an operator."""
    if not isinstance(target, str):
        raise GraphSafetyError(f"node target is a {type(target).__name__}, not a string")
    if target in PREDISPATCH_TARGETS:
        return
    m = _SAFE_TARGET.match(target)
    dunder_op = bool(m and m.group("ns") == "aten" and m.group("op") in ATEN_DUNDER_OPS)
    rest = target.replace(f".{m.group('op')}.", "..", 1) if dunder_op and m else target
    bad = m is None or "__" in rest
    if m and m.group("ns") and (m.group("ns") in _OPS_ATTRIBUTES or m.group("ns") == "higher_order"):
        bad = True
    if m and m.group("opfn") and m.group("opfn") not in OPERATOR_FUNCS:
        bad = True
    if bad:
        raise GraphSafetyError(f"node target {_clip(target)} is not an operator torch.export writes")


def walk_dicts(value: Any) -> Iterator[dict[str, Any]]:
    """Every dict in a parsed JSON value, however deeply nested."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            yield v
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def unsafe_in_graph(model: Any) -> str | None:
    """The first reason the serialized program ``model`` is unsafe to hand to torch, or None."""
    try:
        for d in walk_dicts(model):
            if "expr_str" in d:
                check_srepr(d["expr_str"])
            if "target" in d and "inputs" in d:
                check_target(d["target"])
        ranges = model.get("range_constraints") if isinstance(model, dict) else None
        for name in (ranges or {}) if isinstance(ranges, dict) else ():
            _check_range_symbol(name)
    except GraphSafetyError as exc:
        return str(exc)
    return None


def _check_range_symbol(name: Any) -> None:
    # torch bumps its unbacked-symbol counter once per index of "u<N>"/"zuf<N>": "u99999999999"
    # would spin for hours. Other keys (symbols, derived expressions) are only looked up.
    if not isinstance(name, str):
        raise GraphSafetyError("a range constraint key is not a string")
    for prefix in _UNBACKED_PREFIXES:
        if name.startswith(prefix):
            try:
                index = int(name[len(prefix):])
            except ValueError:
                continue
            if index > _MAX_UNBACKED_INDEX:
                raise GraphSafetyError(f"range constraint on unbacked symbol {_clip(name)} with an "
                                       f"implausible index")


def check_graph(model: Any) -> None:
    """Raise GraphSafetyError with the first unsafe thing in ``model``."""
    reason = unsafe_in_graph(model)
    if reason:
        raise GraphSafetyError(reason)
