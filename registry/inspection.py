"""The inspect view of a bundle (file or registry ref) as plain JSON values."""
from __future__ import annotations

import os
from typing import Any, Callable

from .archive.bundle import BundleFile
from .errors import NotFoundError
from .manifest import Manifest

__all__ = ["inspect_target", "bundle_view", "manifest_warnings", "looks_like_file"]


def looks_like_file(target: str) -> bool:
    return os.path.exists(target) or target.endswith((".pt2b", ".pt2", ".zip")) or \
        target.startswith((".", "~")) or os.sep in target and os.path.isabs(target)


def manifest_warnings(manifest: Manifest) -> list[str]:
    out = []
    for name, prog in manifest.programs.items():
        for b in prog.baked_devices:
            where = f" at {b['source']}" if b.get("source") else ""
            out.append(f"program {name!r}: device {b['device']!r} baked into {b['op']}{where}")
        for op in prog.required_ops:
            if not op.get("schema"):
                out.append(f"program {name!r}: custom op {op['name']} is required; its schema was not "
                           f"known at bundle time")
    return out


def bundle_view(manifest: Manifest, **extra: Any) -> dict[str, Any]:
    raw = manifest.to_json()
    view = {"digest": manifest.digest, "size": manifest.total_size, **raw,
            "warnings": manifest_warnings(manifest)}
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
