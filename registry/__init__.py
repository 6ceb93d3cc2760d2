"""pt2-registry: a registry and packaging format for PyTorch ``torch.export`` programs.

Bundle an ExportedProgram ``ep``, push it, verify it and load it::

    from registry import Registry, Target, bundle_exported_programs, load, open_source, verify_bundle
    bundle_exported_programs("m.pt2b", {"encoder": ep}, dynamic_shapes={"encoder": ds})
    with Registry() as reg:
        reg.push("m.pt2b", "team/encoder", aliases=["staging"], datasets=["s3://corpora/wmt"])
        src = open_source("team/encoder@staging", registry=reg)   # a file or a ref, verified
    verify_bundle(src, target=Target.load("box.json")).raise_for_status()   # what `pt2reg verify` does
    model = load("team/encoder@staging", device="cuda:0"); model["encoder"](tokens)

Importing this package does not import torch, SQLAlchemy or boto3.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .constants import VERSION as __version__

__all__ = [
    "__version__", "Registry", "Settings", "Ref", "Manifest", "BundleFile", "build_bundle",
    "bundle_exported_programs", "ProgramInput", "SampleInput", "load", "verify_bundle", "Target",
    "open_source", "errors",
]

_LAZY = {
    "Registry": ("registry.client", "Registry"),
    "Settings": ("registry.config", "Settings"),
    "Ref": ("registry.refs", "Ref"),
    "Manifest": ("registry.format.manifest", "Manifest"),
    "BundleFile": ("registry.format.bundle", "BundleFile"),
    "build_bundle": ("registry.bundler", "build_bundle"),
    "bundle_exported_programs": ("registry.bundler", "bundle_exported_programs"),
    "ProgramInput": ("registry.bundler", "ProgramInput"),
    "SampleInput": ("registry.bundler", "SampleInput"),
    "load": ("registry.runtime.loader", "load"),
    "verify_bundle": ("registry.runtime.loader", "verify_bundle"),
    "Target": ("registry.runtime.target", "Target"),
    "open_source": ("registry.client.sources", "open_source"),
}

if TYPE_CHECKING:  # pragma: no cover
    from .bundler import ProgramInput, SampleInput, build_bundle, bundle_exported_programs
    from .client import Registry
    from .client.sources import open_source
    from .config import Settings
    from .format.bundle import BundleFile
    from .format.manifest import Manifest
    from .refs import Ref
    from .runtime.loader import load, verify_bundle
    from .runtime.target import Target


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(mod), attr)
        globals()[name] = value
        return value
    if name == "errors":
        import importlib

        return importlib.import_module("registry.errors")
    raise AttributeError(f"module 'registry' has no attribute {name!r}")
