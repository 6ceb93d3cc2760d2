"""The inspect view of a bundle (file or registry ref) as plain JSON values."""
from __future__ import annotations

from typing import Any, Callable

from ..format.bundle import BundleFile
from ..format.manifest import Manifest, baked_device_groups
from ..refs import Ref
from ..sources import parse_source

__all__ = ["inspect_source", "bundle_view"]


def bundle_view(manifest: Manifest, **extra: Any) -> dict[str, Any]:
    """``inspect --json``: the manifest as JSON (its ``to_json()``), its digest, size and warnings."""
    view = {"digest": manifest.digest, "size": manifest.total_size, **manifest.to_json(),
            "warnings": manifest.warnings(),
            # what the warnings say, as data: per program, one entry per device and source line
            "baked_device_groups": {name: [g.to_json() for g in baked_device_groups(prog.baked_devices)]
                                    for name, prog in manifest.programs.items() if prog.baked_devices}}
    view.update(extra)
    return view


def inspect_source(target: str, registry: Callable[[], Any]) -> tuple[Manifest, dict[str, Any]]:
    """The manifest of a bundle file (verified member by member) or a registry ref (from the
    metadata only), and what the view says besides (``path`` or ``ref``, build, signatures...)."""
    where = parse_source(target)  # a file must exist (exit 3); anything else is a ref
    if not isinstance(where, Ref):
        bundle = BundleFile.open(where)
        bundle.verify()
        return bundle.manifest, {"path": str(target), "build": bundle.build, "signatures": bundle.signatures}
    version = registry().resolve(where)  # the metadata only: no blob is downloaded
    manifest = Manifest.from_bytes(version.manifest_json.encode("utf-8"))
    return manifest, {"ref": f"{version.name}@{version.number}", "name": version.name,
                      "version": version.number, "status": version.status}
