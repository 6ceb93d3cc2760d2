"""The inspect view of a bundle (file or registry ref) as plain JSON values."""
from __future__ import annotations

import os
from typing import Any, Callable

from ..format.bundle import BundleFile
from ..errors import NotFoundError
from ..format.manifest import Manifest

__all__ = ["inspect_target", "bundle_view", "manifest_warnings", "looks_like_file", "baked_device_groups"]

_MAX_OP_NAMES = 6


def _short_op(op: str) -> str:
    """``torch.ops.aten.arange.start`` -> ``arange``; a custom op keeps its namespace."""
    parts = op.split(".")
    if len(parts) == 5 and parts[:2] == ["torch", "ops"]:
        return parts[3] if parts[2] == "aten" else f"{parts[2]}::{parts[3]}"
    return op


def _quoted(code: str) -> str:
    """The source line as torch recorded it, whole; torch records the first line of a statement
    only, so a statement that goes on (open brackets, a trailing backslash) is marked `...`."""
    import io
    import tokenize

    try:
        for _ in tokenize.generate_tokens(io.StringIO(code + "\n").readline):
            pass
    except tokenize.TokenError:  # EOF in a multi-line statement or string
        return code + " ..."
    except (SyntaxError, ValueError):
        return code
    return code + " ..." if code.rstrip().endswith("\\") else code


def baked_device_groups(baked: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Baked-device entries of one program grouped by device and source line (first seen first):
    each ``{device, source, code, ops: [op names], count, head, quote, text}``; ``text`` reads
    ``device 'cpu' baked into 12 ops at model.py:33 (arange, ones): <the line>``."""
    groups: dict[tuple[str, Any, Any], dict[str, Any]] = {}
    for b in baked:
        weight = b.get("op") == "weight"
        key = (b["device"], b.get("source"), "weight" if weight else b.get("code"))
        g = groups.setdefault(key, {"device": b["device"], "source": b.get("source"), "code": b.get("code"),
                                    "ops": [], "count": 0, "weights": weight})
        g["count"] += 1
        name = str(b.get("arg")) if weight else _short_op(str(b.get("op")))
        if name not in g["ops"]:
            g["ops"].append(name)
    out = []
    for g in groups.values():
        noun = ("weight" if g.pop("weights") else "op") + ("" if g["count"] == 1 else "s")
        names = ", ".join(g["ops"][:_MAX_OP_NAMES]) + (", ..." if len(g["ops"]) > _MAX_OP_NAMES else "")
        where = f" at {g['source']}" if g["source"] else ""
        g["head"] = f"device {g['device']!r} baked into {g['count']} {noun}{where} ({names})"
        g["quote"] = _quoted(g["code"]) if g["code"] else None
        g["text"] = g["head"] + (f": {g['quote']}" if g["quote"] else "")
        out.append(g)
    return out


def looks_like_file(target: str) -> bool:
    return os.path.exists(target) or target.endswith((".pt2b", ".pt2", ".zip")) or \
        target.startswith((".", "~")) or os.sep in target and os.path.isabs(target)


def manifest_warnings(manifest: Manifest) -> list[str]:
    out = []
    for name, prog in manifest.programs.items():
        for g in baked_device_groups(prog.baked_devices):  # each op: programs.*.baked_devices
            out.append(f"program {name!r}: {g['text']}")
        for op in prog.required_ops:
            if not op.get("schema"):
                out.append(f"program {name!r}: custom op {op['name']} is required; its schema was not "
                           f"known at bundle time")
    return out


def bundle_view(manifest: Manifest, **extra: Any) -> dict[str, Any]:
    raw = manifest.to_json()
    view = {"digest": manifest.digest, "size": manifest.total_size, **raw,
            "warnings": manifest_warnings(manifest),
            # what the warnings say, as data: per program, one entry per device and source line
            "baked_device_groups": {name: baked_device_groups(prog.baked_devices)
                                    for name, prog in manifest.programs.items() if prog.baked_devices}}
    view.update(extra)
    return view


def inspect_target(target: str, registry: Callable[[], Any]) -> dict[str, Any]:
    if looks_like_file(target):
        if not os.path.exists(target):
            raise NotFoundError(f"{target}: no such file", what="file", name=target)
        bundle = BundleFile.open(target)
        bundle.verify()
        return bundle_view(bundle.manifest, path=str(target), build=bundle.build,
                           signatures=bundle.signatures)
    version = registry().resolve(target)
    manifest = Manifest.from_bytes(version.manifest_json.encode("utf-8"))
    return bundle_view(manifest, ref=f"{version.name}@{version.number}", name=version.name,
                       version=version.number, status=version.status)
