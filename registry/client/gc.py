"""Garbage collection: delete blobs no version references and no live push has claimed.

The algorithm lives with the store that holds the claims (``registry.store.gc``); a metadata
store declares where it runs (``VersionStore.gc``: here over SQL, on the server over HTTP).
``Registry.gc`` is the public entry point.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..store.gc import claim_alive as _claim_alive  # noqa: F401  (tests judge claims with it)
from ..store.records import GcResult
from .ports import BlobStore, MetadataStore

__all__ = ["GcResult", "collect_garbage"]


def collect_garbage(meta: MetadataStore, blobs: BlobStore, *, dry_run: bool = False,
                    grace_seconds: float = 0.0, actor: str | None = None, host: str | None = None,
                    audit_details: Mapping[str, Any] | None = None) -> GcResult:
    """``meta.gc``: ``registry.store.gc.collect_garbage`` where ``meta`` runs it (here over SQL,
    or on the server), with this process's actor and host unless ``actor``/``host`` are given
    (the registry server passes its caller's)."""
    from ..config import actor as current_actor
    from ..config import hostname

    return meta.gc(blobs, dry_run=dry_run, grace_seconds=grace_seconds, actor=actor or current_actor(),
                   host=host or hostname(), audit_details=audit_details)

