"""The client: publish, resolve, pull, lifecycle and gc over a metadata store and a blob store::

    from registry.client import Registry
    with Registry() as reg:
        reg.push("model.pt2b", "team/encoder", aliases=["staging"], parents=["team/base@3"])

``api`` is the ``Registry`` facade; ``push``, ``pull`` and ``gc`` hold the push protocol, the
fetch of a version and the gc policy; ``provenance`` the lineage and environment recorded with
a push, ``upload`` and ``fetch`` the parallel blob moves of a push and a pull, ``sources`` bundles made
local (the client cache, ``open_source``), ``trust`` the client trust policy, and ``ports``
the two interfaces (``MetadataStore``, ``BlobStore``) a remote implementation fills.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .api import Registry

if TYPE_CHECKING:
    from .gc import GcResult
    from .ports import BlobStore, MetadataStore
    from .pull import Located, PullResult
    from .push import PushResult

__all__ = ["Registry", "Located", "PushResult", "PullResult", "GcResult", "MetadataStore", "BlobStore"]

#: names whose modules load on first use: the push, pull and gc paths (and the blob stores the
#: ports name) would cost `pt2reg list` their imports
_LAZY = {"Located": "pull", "PullResult": "pull", "PushResult": "push", "GcResult": "gc",
         "BlobStore": "ports", "MetadataStore": "ports"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
