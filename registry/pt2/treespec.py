"""Pytree specs as torch serializes them (``treespec_dumps``), read without torch.

We only need the leaf paths: which flat input is ``args[0]`` or ``kwargs['mask']``, and which
flat output is ``['h']`` or ``['extra'][1]``. Unknown container types are kept as opaque
positional containers.
"""
from __future__ import annotations

import json
from typing import Any

__all__ = ["leaf_paths", "input_label", "TreeSpecError", "pytree_classes", "class_fields", "BUILTIN_TYPES"]

#: node types torch itself registers (``import torch``): never listed as pytree classes
BUILTIN_TYPES = frozenset({
    "builtins.dict", "builtins.list", "builtins.tuple", "collections.OrderedDict",
    "collections.defaultdict", "collections.deque", "collections.namedtuple", "torch.Size",
    "torch.fx.immutable_collections.immutable_dict", "torch.fx.immutable_collections.immutable_list",
})

_MAX_DEPTH = 64
_MAX_LEAVES = 100_000


class TreeSpecError(ValueError):
    pass


def _children_keys(node: dict[str, Any]) -> list[str]:
    typ = node.get("type")
    ctx = node.get("context")
    children = node.get("children_spec") or []
    if typ in ("builtins.dict", "collections.OrderedDict", "collections.defaultdict"):
        try:
            keys = json.loads(ctx) if isinstance(ctx, str) else ctx
            if typ == "collections.defaultdict" and isinstance(keys, dict):
                keys = keys.get("keys_context", [])
        except (ValueError, TypeError):
            keys = None
        if isinstance(keys, list) and len(keys) == len(children):
            return [f"[{json.dumps(k)}]" if not isinstance(k, str) else f"['{k}']" for k in keys]
    elif isinstance(typ, str) and typ not in BUILTIN_TYPES:
        fields = class_fields(ctx)
        if fields is not None and len(fields[0]) == len(children):
            return [f"['{k}']" for k in fields[0]]
    return [f"[{i}]" for i in range(len(children))]


def class_fields(context: Any) -> tuple[list[str], list[str], str] | None:
    """(fields holding leaves, fields that were None, style) of a library pytree class's
    serialized context, or None when it is not one of the two forms we can stand in for:
    a JSON list of field names (Hugging Face ``ModelOutput``: ``["logits"]``, style "keys") or
    ``[[names...], [none names...]]`` (``torch.export.register_dataclass``, style "dataclass")."""
    try:
        ctx = json.loads(context) if isinstance(context, str) else context
    except (ValueError, TypeError):
        return None
    if isinstance(ctx, list) and all(isinstance(k, str) for k in ctx):
        return list(ctx), [], "keys"
    if (isinstance(ctx, list) and len(ctx) == 2 and all(isinstance(part, list) for part in ctx)
            and all(isinstance(k, str) for part in ctx for k in part)):
        return list(ctx[0]), list(ctx[1]), "dataclass"
    return None


def _spec_root(spec_json: str) -> Any:
    """The root node of a serialized treespec (``[protocol, root]`` or the root itself)."""
    try:
        raw = json.loads(spec_json)
    except (ValueError, TypeError) as exc:
        raise TreeSpecError(f"treespec is not JSON: {exc}") from exc
    if isinstance(raw, list) and len(raw) == 2 and isinstance(raw[0], int):
        raw = raw[1]
    return raw


def pytree_classes(spec_json: str | None) -> list[dict[str, Any]]:
    """Each non-builtin pytree node type of a serialized treespec, once, in order of appearance:
    ``{"type": serialized name, "fields": [...] or None, "style": "keys"|"dataclass"|None}``.
    ``fields`` is None when the context is not a plain list of field names (then no stand-in can
    be built and the class itself must be registered to load the program). A namedtuple
    registered under a serialized name is listed by that name, without fields."""
    if not spec_json:
        return []
    raw = _spec_root(spec_json)
    found: dict[str, dict[str, Any]] = {}
    stack: list[tuple[Any, int]] = [(raw, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > _MAX_DEPTH or len(stack) > _MAX_LEAVES or not isinstance(node, dict):
            raise TreeSpecError("malformed, too deep or too large treespec")
        typ = node.get("type")
        name, fields, style = None, None, None
        if typ == "collections.namedtuple" and isinstance(node.get("context"), str):
            name = node["context"]
        elif isinstance(typ, str) and typ not in BUILTIN_TYPES:
            name = typ
            got = class_fields(node.get("context"))
            if got is not None:
                fields, style = got[0] + got[1], got[2]
        if name is not None:
            entry = found.setdefault(name, {"type": name, "fields": fields, "style": style})
            if entry["fields"] is not None and fields is not None:
                entry["fields"] += [f for f in fields if f not in entry["fields"]]
        children = node.get("children_spec") or []
        stack.extend((c, depth + 1) for c in reversed(children))
    return list(found.values())


def leaf_paths(spec_json: str | None) -> list[str]:
    """Flat leaf paths of a serialized treespec, e.g. ``["[0][0]", "[1]['mask']"]``."""
    if not spec_json:
        return []
    raw = _spec_root(spec_json)
    out: list[str] = []
    _walk(raw, "", out, 0)
    return out


def _walk(node: Any, prefix: str, out: list[str], depth: int) -> None:
    if depth > _MAX_DEPTH or len(out) > _MAX_LEAVES:
        raise TreeSpecError("treespec too deep or too large")
    if not isinstance(node, dict):
        raise TreeSpecError("malformed treespec node")
    children = node.get("children_spec") or []
    if node.get("type") is None:
        out.append(prefix)
        return
    for key, child in zip(_children_keys(node), children):
        _walk(child, prefix + key, out, depth + 1)


def input_label(path: str) -> tuple[str, str]:
    """(kind, python-ish path) for a flat input path under the ((args), {kwargs}) spec."""
    if path.startswith("[0]"):
        return "positional", "args" + path[3:]
    if path.startswith("[1]"):
        return "keyword", "kwargs" + path[3:]
    return "positional", "args" + path
