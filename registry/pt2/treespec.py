"""Pytree specs as torch serializes them (``treespec_dumps``), read without torch.

We only need the leaf paths: which flat input is ``args[0]`` or ``kwargs['mask']``, and which
flat output is ``['h']`` or ``['extra'][1]``. Unknown container types are kept as opaque
positional containers.
"""
from __future__ import annotations

import json
from typing import Any

__all__ = ["leaf_paths", "input_label", "TreeSpecError"]

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
    return [f"[{i}]" for i in range(len(children))]


def leaf_paths(spec_json: str | None) -> list[str]:
    """Flat leaf paths of a serialized treespec, e.g. ``["[0][0]", "[1]['mask']"]``."""
    if not spec_json:
        return []
    try:
        raw = json.loads(spec_json)
    except (ValueError, TypeError) as exc:
        raise TreeSpecError(f"treespec is not JSON: {exc}") from exc
    if isinstance(raw, list) and len(raw) == 2 and isinstance(raw[0], int):
        raw = raw[1]
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
