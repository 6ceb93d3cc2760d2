"""A yes-or-no check of a JSON value against a JSON Schema (2020-12), compiled into closures
once: the fast path of manifest validation (``format.manifest``).

``jsonschema`` says *what* is wrong, and every problem; importing it costs ~40 ms of every
``pt2reg push`` and ``pull`` (issue 45: a tiny pull or push was 2.05-2.08x ``import
sqlalchemy``). A manifest is nearly always valid, so this check answers first and
``jsonschema`` is imported only to describe a manifest this check refused. It must therefore
never accept what ``jsonschema`` (with the manifest's strict integers) refuses:
``tests/unit/test_schema_check.py`` holds the two to the same verdict on every fixture and on
thousands of mutations of them.

Only the keywords the manifest schema uses are compiled, with ``jsonschema``'s semantics
(each applies only to instances of its type; ``enum``, ``const`` and ``uniqueItems`` tell
``true`` from ``1``; ``integer`` is a Python ``int`` that is not a ``bool``, never ``1.0``);
a schema with any other keyword is refused at compile time (``Unsupported``), and the caller
uses ``jsonschema`` alone.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = ["Unsupported", "compile_schema"]

Check = Callable[[Any], bool]

#: keywords that only annotate: no effect on validity
_ANNOTATIONS = frozenset({"$schema", "$id", "title", "description", "$comment", "examples", "default"})


class Unsupported(ValueError):
    """The schema uses a keyword (or a form of one) this checker does not compile."""


def _is_number(v: Any) -> bool:
    return (type(v) is int or type(v) is float) and not isinstance(v, bool)


_TYPES: dict[str, Check] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: type(v) is int,             # the manifest's strict integers: not 1.0, not true
    "number": _is_number,
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def _equal(a: Any, b: Any) -> bool:
    """JSON equality as ``jsonschema`` has it: ``true`` is not ``1``; ``1`` is ``1.0``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, dict)) or isinstance(b, (list, dict)):
        return False
    return bool(a == b)


def compile_schema(schema: dict[str, Any]) -> Check:
    """A function telling whether a value is valid against ``schema`` (``Unsupported`` if the
    schema uses a keyword this module does not compile). ``$ref`` may point into the schema
    (``#/$defs/NAME``, ``#/...``) only."""
    compiled: dict[int, Check] = {}

    def ref(pointer: str) -> Check:
        if not pointer.startswith("#"):
            raise Unsupported(f"$ref {pointer!r} outside the schema")
        node: Any = schema
        for part in filter(None, pointer[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise Unsupported(f"$ref {pointer!r} does not resolve")
            node = node[part]
        target = node

        def check(v: Any) -> bool:   # resolved on first use: a recursive definition is fine
            return compiled[id(target)](v)

        build(target)
        return check

    def build(node: Any) -> Check:
        if node is True:
            return lambda v: True
        if node is False:
            return lambda v: False
        if not isinstance(node, dict):
            raise Unsupported(f"schema {node!r} is not an object")
        if id(node) in compiled:
            return compiled[id(node)]
        compiled[id(node)] = lambda v: checks_of_node(v)   # for a $ref back into this node
        checks = _keywords(node, build, ref)

        def checks_of_node(v: Any) -> bool:
            return all(c(v) for c in checks)

        compiled[id(node)] = checks_of_node
        return checks_of_node

    return build(schema)


def _keywords(node: dict[str, Any], build: Callable[[Any], Check], ref: Callable[[str], Check]) -> list[Check]:
    checks: list[Check] = []
    add: Callable[[Any], None] = checks.append   # (lambdas binding their arguments as defaults)
    for key, arg in node.items():
        if key in _ANNOTATIONS or key == "$defs":
            continue
        if key == "type":
            kinds = [arg] if isinstance(arg, str) else list(arg)
            try:
                tests = [_TYPES[k] for k in kinds]
            except KeyError as exc:
                raise Unsupported(f"type {exc.args[0]!r}") from exc
            add(lambda v, tests=tests: any(t(v) for t in tests))
        elif key == "$ref":
            add(ref(arg))
        elif key == "properties":
            props = {name: build(sub) for name, sub in arg.items()}
            add(lambda v, props=props: not isinstance(v, dict)
                or all(check(v[name]) for name, check in props.items() if name in v))
        elif key == "additionalProperties":
            known = frozenset(node.get("properties", {}))
            if "patternProperties" in node:
                raise Unsupported("patternProperties")
            extra = build(arg)
            add(lambda v, known=known, extra=extra: not isinstance(v, dict)
                or all(extra(v[k]) for k in v if k not in known))
        elif key == "propertyNames":
            names = build(arg)
            add(lambda v, names=names: not isinstance(v, dict) or all(names(k) for k in v))
        elif key == "required":
            need = tuple(arg)
            add(lambda v, need=need: not isinstance(v, dict) or all(k in v for k in need))
        elif key in ("minProperties", "maxProperties"):
            n, low = int(arg), key == "minProperties"
            add(lambda v, n=n, low=low: not isinstance(v, dict) or (len(v) >= n if low else len(v) <= n))
        elif key == "items":
            each = build(arg)
            if "prefixItems" in node:
                raise Unsupported("prefixItems")
            add(lambda v, each=each: not isinstance(v, list) or all(each(x) for x in v))
        elif key in ("minItems", "maxItems"):
            n, low = int(arg), key == "minItems"
            add(lambda v, n=n, low=low: not isinstance(v, list) or (len(v) >= n if low else len(v) <= n))
        elif key == "uniqueItems":
            if arg:
                add(lambda v: not isinstance(v, list)
                    or not any(_equal(v[i], v[j]) for i in range(len(v)) for j in range(i + 1, len(v))))
        elif key in ("minLength", "maxLength"):
            n, low = int(arg), key == "minLength"
            add(lambda v, n=n, low=low: not isinstance(v, str) or (len(v) >= n if low else len(v) <= n))
        elif key == "pattern":
            search = re.compile(arg).search
            add(lambda v, search=search: not isinstance(v, str) or search(v) is not None)
        elif key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if not _is_number(arg):
                raise Unsupported(f"{key} {arg!r}")
            op = {"minimum": lambda x, a: x >= a, "maximum": lambda x, a: x <= a,
                  "exclusiveMinimum": lambda x, a: x > a, "exclusiveMaximum": lambda x, a: x < a}[key]
            add(lambda v, op=op, a=arg: not _is_number(v) or op(v, a))
        elif key == "enum":
            allowed = list(arg)
            add(lambda v, allowed=allowed: any(_equal(v, a) for a in allowed))
        elif key == "const":
            add(lambda v, c=arg: _equal(v, c))
        elif key in ("anyOf", "oneOf", "allOf"):
            subs = [build(s) for s in arg]
            if key == "anyOf":
                add(lambda v, subs=subs: any(s(v) for s in subs))
            elif key == "oneOf":
                add(lambda v, subs=subs: sum(1 for s in subs if s(v)) == 1)
            else:
                add(lambda v, subs=subs: all(s(v) for s in subs))
        elif key == "not":
            sub = build(arg)
            add(lambda v, sub=sub: not sub(v))
        else:
            raise Unsupported(f"keyword {key!r}")
    return checks
