"""The client: publish, resolve, pull, lifecycle and gc over a metadata store and a blob store::

    from registry.client import Registry
    with Registry() as reg:
        reg.push("model.pt2b", "team/encoder", aliases=["staging"], parents=["team/base@3"])

``api`` is the ``Registry`` facade; ``push``, ``pull`` and ``gc`` hold the push protocol, the
fetch of a version and the gc policy; ``provenance`` the lineage and environment recorded with
a push, ``transfer`` the parallel blob moves, ``trust`` the client trust policy, and ``ports``
the two interfaces (``MetadataStore``, ``BlobStore``) a remote implementation fills.
"""
from __future__ import annotations

from .api import Registry
from .gc import GcResult
from .ports import BlobStore, MetadataStore
from .pull import Located, PullResult
from .push import PushResult

__all__ = ["Registry", "Located", "PushResult", "PullResult", "GcResult", "MetadataStore", "BlobStore"]
