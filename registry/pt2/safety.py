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

Beyond those two, the whole program is validated (issue 14; ``check_program``): it must be an
``ExportedProgram`` of torch's serde schema (``serde_schema.py``, nothing undeclared); every
name torch.fx pastes into generated Python is an identifier; attribute paths, type names,
node metadata, treespecs and ``guards_code`` (``guards.py``) are each in their grammar;
operators acting outside tensor memory are refused (``op_effects.py``); and size expressions
are bounded in terms, symbols and sympy cost before sympy sees them (``_ExprBudget``).
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from .exprs import sympy_call_allowed, tokenize

__all__ = ["GraphSafetyError", "check_srepr", "check_target", "unsafe_in_graph", "walk_dicts",
           "check_program", "check_op_effects"]

_MAX_EXPR_CHARS = 8192
_MAX_EXPR_DEPTH = 64
_MAX_INT_DIGITS = 40
_MAX_POW_EXPONENT = 64
_MAX_UNBACKED_INDEX = 10_000_000
_UNBACKED_PREFIXES = ("u", "zuf")  # torch.utils._sympy.symbol.prefix_str

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


class GraphSafetyError(ValueError):
    """A graph would make torch run code chosen by the file; the message names what."""


def check_srepr(text: Any) -> None:
    """Raise GraphSafetyError unless ``text`` is a plain sympy ``srepr`` torch could have written."""
    if not isinstance(text, str):
        raise GraphSafetyError(f"expr_str is a {type(text).__name__}, not a string")
    if len(text) > _MAX_EXPR_CHARS:
        raise GraphSafetyError(f"expression of {len(text)} characters (limit {_MAX_EXPR_CHARS})")
    _srepr_tree(text)


def _srepr_tree(text: str) -> _Tree:
    tokens = _tokenize(text)
    tree, pos = _parse(tokens, 0, 0)
    if pos != len(tokens):
        raise GraphSafetyError(f"unexpected {tokens[pos][1]!r} in expression {_clip(text)}")
    _check_powers(tree)
    return tree


def _clip(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _tokenize(text: str) -> list[tuple[str, str]]:
    return tokenize(text, _TOKEN, lambda pos: GraphSafetyError(
        f"character {text[pos:pos + 1]!r} is not allowed in expression {_clip(text)}"))


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
    """The first reason the serialized program ``model`` is unsafe to hand to torch, or None.

    First what would run code of the file's choosing wherever it appears (``expr_str``, node
    targets, operator arguments, range-constraint symbols), with the size-expression budget;
    then, for anything that claims to be a program (an object with ``graph_module``), the whole
    object against torch's serde schema with the grammar of every name, metadata value,
    treespec and guard (:func:`check_program`). An object without ``graph_module`` is refused
    later by the graph reader (``describe_program``).
    """
    try:
        budget = _ExprBudget()
        for d in walk_dicts(model):
            if "expr_str" in d:
                budget.add(d["expr_str"])
            if "target" in d and "inputs" in d:
                check_target(d["target"])
                check_op_effects(d["target"])
            if "as_operator" in d:
                check_target(d["as_operator"])
                check_op_effects(d["as_operator"])
        ranges = model.get("range_constraints") if isinstance(model, dict) else None
        for name in (ranges or {}) if isinstance(ranges, dict) else ():
            _check_range_symbol(name)
        if isinstance(model, dict) and "graph_module" in model:
            check_program(model)
    except GraphSafetyError as exc:
        return str(exc)
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, RecursionError) as exc:
        return f"malformed graph ({type(exc).__name__}: {_clip(str(exc))})"  # refused, never passed on
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


# --- size-expression budget ------------------------------------------------------------------
# torch hands every expr_str to sympy.sympify, then re-prints and caches every sub-expression
# and copies its whole cache into each sympify call; Max/Min over many symbols compare pairwise
# under assumptions. So expressions are bounded one by one and per graph before sympy sees them.

MAX_EXPR_NODES = 128          # calls, symbols and numbers in one expr_str
MAX_EXPR_SYMBOLS = 6          # distinct symbols in one expr_str
MAX_CALL_ARGS = 6             # arguments of one call
MAX_MINMAX_ARGS = 4           # arguments of one Max/Min (sympy compares them pairwise)
MAX_GRAPH_EXPR_WORK = 100_000  # sum over every expr_str occurrence of 1 + its distinct symbols
MAX_GRAPH_MINMAX_COST = 32_768  # sum over every occurrence of its Max/Min/Piecewise cost
MAX_GRAPH_EXPR_COST = 1000    # sum over distinct expr_str of their cost (_expr_stats)
MAX_GRAPH_SYMBOLS = 1024      # distinct symbols in one program
_MINMAX = frozenset({"Max", "Min", "Piecewise"})


class _ExprBudget:
    """Counts a program's size expressions against the limits above.

    Measured with torch 2.13 on the 2-core CI machine, sympy's cost of one new expression grows
    with the square of its distinct symbols (a product of 6 symbols ~55 ms, of 8 ~250 ms) and
    far faster for Max/Min (Max over 16 symbols ~0.8 s, and each repeat of a Max over four sums
    ~20 ms). So each distinct expression costs ``symbols**2 + 16 * sum(args**2 over Max/Min)``,
    a program may spend at most MAX_GRAPH_EXPR_COST on distinct expressions and
    MAX_GRAPH_MINMAX_COST on the Max/Min part of every occurrence, and MAX_GRAPH_EXPR_WORK on
    occurrences (each costs torch a few ms per symbol, as for any real graph). A real 12-layer
    transformer with dynamic batch and length spends 153, 832 and ~3,000."""

    def __init__(self) -> None:
        self.count = 0
        self.work = 0
        self.minmax_cost = 0
        self.cost = 0
        self.seen: dict[str, tuple[int, int]] = {}
        self.symbols: set[str] = set()

    def add(self, text: Any) -> None:
        self.count += 1
        if not isinstance(text, str):
            raise GraphSafetyError(f"expr_str is a {type(text).__name__}, not a string")
        known = self.seen.get(text)
        if known is None:
            tree = _srepr_tree(text)
            cost, symbols, minmax = _expr_stats(tree, text)
            known = self.seen[text] = (minmax, len(symbols))
            self.cost += cost
            self.symbols |= symbols
            if self.cost > MAX_GRAPH_EXPR_COST:
                raise GraphSafetyError(f"the size expressions of this program are too costly for sympy (over "
                                       f"{MAX_GRAPH_EXPR_COST} units, at {_clip(text)})")
            if len(self.symbols) > MAX_GRAPH_SYMBOLS:
                raise GraphSafetyError(f"more than {MAX_GRAPH_SYMBOLS} distinct symbols in one program's sizes")
        minmax, nsyms = known
        self.work += 1 + nsyms
        if self.work > MAX_GRAPH_EXPR_WORK:  # torch captures a traceback per symbol occurrence
            raise GraphSafetyError(f"too many size expressions in one program (over {MAX_GRAPH_EXPR_WORK} "
                                   f"symbol uses)")
        if minmax:
            self.minmax_cost += minmax
            if self.minmax_cost > MAX_GRAPH_MINMAX_COST:
                raise GraphSafetyError(f"the Max/Min size expressions of this program are too costly for sympy "
                                       f"(over {MAX_GRAPH_MINMAX_COST} units, at {_clip(text)})")


def _expr_stats(tree: _Tree, text: str) -> tuple[int, set[str], int]:
    """(cost, symbols, Max/Min/Piecewise cost) of one parsed expression, or GraphSafetyError."""
    nodes = 0
    minmax_cost = 0
    symbols: set[str] = set()
    stack = [tree]
    while stack:
        t = stack.pop()
        nodes += 1
        if t[0] != "call":
            continue
        name, args = t[1], [a for a in t[2] if a[0] != "kw"]
        if name in ("Symbol", "Dummy") and args and args[0][0] == "str":
            symbols.add(args[0][1])
            continue
        limit = MAX_MINMAX_ARGS if name in _MINMAX else MAX_CALL_ARGS
        if len(args) > limit:
            raise GraphSafetyError(f"{name}() with {len(args)} arguments (limit {limit}) in expression {_clip(text)}")
        if name in _MINMAX:
            minmax_cost += 16 * len(args) ** 2
        stack.extend(args)
    if nodes > MAX_EXPR_NODES:
        raise GraphSafetyError(f"expression of {nodes} terms (limit {MAX_EXPR_NODES}): {_clip(text)}")
    if len(symbols) > MAX_EXPR_SYMBOLS:
        raise GraphSafetyError(f"expression over {len(symbols)} symbols (limit {MAX_EXPR_SYMBOLS}): {_clip(text)}")
    return max(1, len(symbols)) ** 2 + minmax_cost, symbols, minmax_cost


# --- operators with effects outside tensor memory -------------------------------------------

_OP_TARGET = re.compile(r"torch\.ops\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)\Z")


def check_op_effects(target: Any) -> None:
    """Raise GraphSafetyError when ``target`` is an operator that reaches outside tensor memory
    (files, processes, network, profiler, process-wide state): the rule over torch's schemas in
    ``registry/pt2/op_effects.py``, frozen in ``side_effect_ops.json``."""
    from .op_effects import refused

    m = _OP_TARGET.match(target) if isinstance(target, str) else None
    if m:
        reason = refused(*m.groups())
        if reason:
            raise GraphSafetyError(f"node target {_clip(target)}: {reason}")


# --- names, metadata and the whole program against torch's serde schema ----------------------

import json as _json  # noqa: E402
import keyword as _keyword  # noqa: E402

MAX_NAME = 256
_FQN = re.compile(r"[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*\Z")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_<>][A-Za-z0-9_<>]*)*\Z")
#: names the code torch.fx generates relies on; a placeholder of that name would shadow them
RESERVED_NAMES = frozenset({"self", "torch", "fx_pytree", "pytree", "device", "inf", "nan", "NoneType"})
_DEVICE_TYPE = re.compile(r"[a-z][a-z0-9_]{0,31}\Z")
_TORCH_VERSION = re.compile(r"[0-9A-Za-z.+_<=-]{1,64}\Z")
_RANGE_KEY = re.compile(r"[A-Za-z0-9_ +\-*/()%.,]{1,1024}\Z")
#: node metadata keys torch's serializer writes (serialize_metadata); no others are accepted
NODE_METADATA_KEYS = frozenset({"stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn", "custom",
                                "from_node"})
GRAPH_MODULE_METADATA_KEYS = frozenset({"custom"})
MAX_STACK_TRACE = 64 * 1024
MAX_META_JSON = 256 * 1024
_NN_STACK_ITEM = re.compile(r"([A-Za-z0-9_.]{1,512}(?:@[0-9]{1,9})?),([A-Za-z0-9_.\[\]'\"()]{0,1024}),([A-Za-z0-9_.<>]{1,512})\Z")
_SOURCE_FN_ITEM = re.compile(r"([A-Za-z0-9_]{1,512}),([A-Za-z0-9_.<>]{1,512})\Z")
_TORCH_FN = re.compile(r"[A-Za-z0-9_.<>-]{1,512};[A-Za-z0-9_.<>-]{1,512}\Z")
_FROM_NODE_KEYS = frozenset({"pass_name", "action", "name", "target", "graph_id", "from_node"})


def _ident_reason(value: Any, *, reserved: bool = True) -> str | None:
    if not isinstance(value, str) or not _IDENT.match(value) or len(value) > MAX_NAME:
        return f"name {_clip(str(value))} is not an identifier ([A-Za-z_][A-Za-z0-9_]*, at most {MAX_NAME})"
    if _keyword.iskeyword(value):
        return f"name {value!r} is a Python keyword"
    if reserved and value in RESERVED_NAMES:
        return f"name {value!r} would shadow a name torch's generated code uses"
    return None


def _value_name(value: Any) -> str | None:
    return _ident_reason(value)


def _arg_name(value: Any) -> str | None:
    return _ident_reason(value, reserved=False)


def _fqn(value: Any) -> str | None:
    if not isinstance(value, str) or not _FQN.match(value) or len(value) > 4 * MAX_NAME:
        return f"attribute path {_clip(str(value))} is not dot-separated identifiers"
    return None


def _fqn_or_root(value: Any) -> str | None:
    return None if value == "" else _fqn(value)


def _dotted(value: Any) -> str | None:
    if not isinstance(value, str) or not _DOTTED.match(value) or len(value) > 4 * MAX_NAME:
        return f"type name {_clip(str(value))} is not a dotted name"
    return None


def _target(value: Any) -> str | None:
    try:
        check_target(value)
        check_op_effects(value)
    except GraphSafetyError as exc:
        return str(exc)
    return None


def _device_type(value: Any) -> str | None:
    return None if _DEVICE_TYPE.match(value) else f"device type {_clip(value)} is not a device name"


def _torch_version(value: Any) -> str | None:
    return None if _TORCH_VERSION.match(value) else f"torch_version {_clip(value)} is not a version"


def _range_key(value: Any) -> str | None:
    return None if _RANGE_KEY.match(value) else f"range constraint {_clip(value)} is not a size expression"


def _guard(value: Any) -> str | None:
    from .guards import GuardError, parse_guard

    try:
        parse_guard(value)
    except GuardError as exc:
        return str(exc)
    return None


def _guards_list(value: Any) -> str | None:
    from .guards import MAX_GUARDS

    gc = value.get("guards_code") if isinstance(value, dict) else None
    if isinstance(gc, list) and len(gc) > MAX_GUARDS:
        return f"{len(gc)} guards_code entries (limit {MAX_GUARDS})"
    return None


def _printable(text: str, *, newlines: bool) -> bool:
    if text.isprintable():
        return True
    text = text.replace("\t", "")
    return (text.replace("\n", "") if newlines else text).isprintable()


def _json_value(text: str, what: str, limit: int) -> tuple[Any, str | None]:
    if len(text) > limit:
        return None, f"{what} of {len(text)} characters (limit {limit})"
    try:
        value = _json.loads(text)
    except (ValueError, RecursionError):
        return None, f"{what} is not JSON"
    stack = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if d > 64:
            return None, f"{what} is nested too deeply"
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
        elif isinstance(v, str) and not _printable(v, newlines=True):
            return None, f"{what} holds control characters"
    return value, None


def _node_metadata(node: Any) -> str | None:
    meta = node.get("metadata") if isinstance(node, dict) else None
    if not isinstance(meta, dict):
        return None
    for key, value in meta.items():
        if key not in NODE_METADATA_KEYS:
            return f"node metadata key {_clip(key)} is not one torch writes ({', '.join(sorted(NODE_METADATA_KEYS))})"
        if not isinstance(value, str):
            continue  # the schema walk refuses it with its path
        reason = _metadata_value(key, value)
        if reason:
            return f"metadata[{key!r}]: {reason}"
    return None


def _metadata_value(key: str, value: str) -> str | None:
    if key == "stack_trace":
        if len(value) > MAX_STACK_TRACE or not _printable(value, newlines=True):
            return f"a stack trace of printable text and newlines, at most {MAX_STACK_TRACE} characters, expected"
        return None
    if key == "nn_module_stack":
        for item in value.split(";"):
            if not _NN_STACK_ITEM.match(item):
                return f"module stack entry {_clip(item)} is not 'key,path,type'"
        return None
    if key == "source_fn_stack":
        for item in value.split(";"):
            m = _SOURCE_FN_ITEM.match(item)
            if not m:
                return f"source function entry {_clip(item)} is not 'name,function'"
            fn = m.group(2)  # torch resolves torch.*/_operator.*/math.* by getattr chains
            if fn.startswith(("torch", "_operator", "math")) and any(p.startswith("__") for p in fn.split(".")):
                return f"source function {_clip(fn)} names a dunder attribute"
        return None
    if key == "torch_fn":
        return None if _TORCH_FN.match(value) else f"torch_fn {_clip(value)} is not 'name;type.method'"
    if key == "custom":
        _, reason = _json_value(value, "custom metadata", MAX_META_JSON)
        return reason
    if key == "from_node":
        parsed, reason = _json_value(value, "from_node", MAX_META_JSON)
        if reason:
            return reason
        stack = [parsed]
        while stack:
            v = stack.pop()
            if v is None:
                continue
            if not isinstance(v, list):
                return "from_node is not a list of node sources"
            for item in v:
                if not isinstance(item, dict) or not set(item) <= _FROM_NODE_KEYS:
                    return "from_node entry holds keys torch does not write"
                stack.append(item.get("from_node"))
        return None
    return None


def _graph_module(gm: Any) -> str | None:
    meta = gm.get("metadata") if isinstance(gm, dict) else None
    for key, value in (meta or {}).items() if isinstance(meta, dict) else ():
        if key not in GRAPH_MODULE_METADATA_KEYS:
            return f"graph module metadata key {_clip(key)} is not one torch writes"
        if not isinstance(value, str):
            continue  # the schema walk refuses it with its path
        _, reason = _json_value(value, f"graph module metadata[{key!r}]", MAX_META_JSON)
        if reason:
            return reason
    return None


def _treespec(text: Any, *, kwargs_names: bool) -> str | None:
    """A treespec (``in_spec``/``out_spec``): JSON of nodes with dotted type names and contexts;
    the keyword names of the input spec are pasted into Python by torch.fx, so identifiers."""
    value, reason = _json_value(text, "treespec", MAX_META_JSON)
    if reason:
        return reason
    if not (isinstance(value, list) and len(value) == 2 and type(value[0]) is int):
        return "treespec is not [version, spec]"
    stack = [(value[1], 0)]
    root = value[1]
    while stack:
        node, depth = stack.pop()
        if depth > 64:
            return "treespec nested too deeply"
        if not isinstance(node, dict) or set(node) != {"type", "context", "children_spec"}:
            return "treespec node is not {type, context, children_spec}"
        if node["type"] is not None and _dotted(node["type"]):
            return f"treespec type {_clip(str(node['type']))} is not a dotted name"
        if node["context"] is not None and not isinstance(node["context"], str):
            return "treespec context is not a string"
        if not isinstance(node["children_spec"], list):
            return "treespec children are not a list"
        stack.extend((c, depth + 1) for c in node["children_spec"])
    if kwargs_names and isinstance(root, dict) and root.get("type") == "builtins.tuple":
        kids = root.get("children_spec") or []
        if len(kids) == 2 and isinstance(kids[1], dict) and kids[1].get("type") == "builtins.dict":
            keys, reason = _json_value(kids[1].get("context") or "[]", "treespec context", MAX_META_JSON)
            if reason:
                return reason
            for k in keys if isinstance(keys, list) else [keys]:
                r = _arg_name(k)
                if r:
                    return f"keyword input {r}"
    return None


def _in_spec(text: Any) -> str | None:
    return _treespec(text, kwargs_names=True)


def _out_spec(text: Any) -> str | None:
    return _treespec(text, kwargs_names=False)


def _printable_line(value: Any) -> str | None:
    return None if _printable(value, newlines=False) else f"string {_clip(value)} holds control characters"


#: where each string of a program may be pasted, resolved or parsed, by schema location
#: (``Struct.field``, ``Struct.field#key`` for the keys of a dict field, ``Struct`` for the object).
FIELD_CHECKS: dict[str, Any] = {
    # value names: torch.fx pastes placeholder names into ``def forward(self, <names>)``
    **{k: _value_name for k in (
        "TensorArgument.name", "TokenArgument.name", "SymIntArgument.as_name", "SymFloatArgument.as_name",
        "SymBoolArgument.as_name", "CustomObjArgument.name", "GraphArgument.name", "Node.name",
        "InputToConstantInputSpec.name", "UserInputMutationSpec.user_input_name",
        "GradientToUserInputSpec.user_input_name", "Graph.tensor_values#key", "Graph.sym_int_values#key",
        "Graph.sym_bool_values#key", "Graph.sym_float_values#key", "Graph.custom_obj_values#key",
        "ModuleCallSignature.forward_arg_names")},
    # keyword names of operator calls (``aten.add(self=..., other=...)``) and namedtuple fields
    "NamedArgument.name": lambda v: None if v == "" else _arg_name(v),  # "" for positional HOP args
    "NamedTupleDef.field_names": _arg_name,
    # attribute paths: torch.fx writes ``self.<a>.<b>`` / ``getattr(self, "<a>")``
    **{k: _fqn for k in (
        "InputToParameterSpec.parameter_name", "InputToBufferSpec.buffer_name",
        "InputToTensorConstantSpec.tensor_constant_name", "InputToCustomObjSpec.custom_obj_name",
        "BufferMutationSpec.buffer_name", "ParameterMutationSpec.parameter_name",
        "GradientToParameterSpec.parameter_name")},
    "ModuleCallEntry.fqn": _fqn_or_root,
    # strings resolved to Python objects by getattr chains
    "Node.target": _target, "Argument.as_operator": _target,
    "CustomObjArgument.class_fqn": _dotted, "GraphModule.treespec_namedtuple_fields#key": _dotted,
    "ExportedProgram.verifiers": _arg_name, "ExportedProgram.opset_version#key": _arg_name,
    # parsed by torch
    "ModuleCallSignature.in_spec": _in_spec, "ModuleCallSignature.out_spec": _out_spec,
    "ExportedProgram.guards_code": _guard, "ExportedProgram.range_constraints#key": _range_key,
    "ExportedProgram.torch_version": _torch_version, "Device.type": _device_type,
    "Argument.as_string": _printable_line, "ConstantValue.as_string": _printable_line,
    # whole objects
    "Node": _node_metadata, "GraphModule": _graph_module, "ExportedProgram": _guards_list,
}


def check_program(model: Any) -> None:
    """Raise GraphSafetyError unless ``model`` is a torch serde ``ExportedProgram`` (nothing
    undeclared, every type right) whose every name, target, metadata value, treespec and guard
    is in its grammar. The message names the field path."""
    from .serde_schema import SchemaError, validate

    try:
        validate(model, FIELD_CHECKS)
    except SchemaError as exc:
        raise GraphSafetyError(f"field {exc}") from None
