"""The metadata store: SQL rows behind a small API that returns frozen records.

    >>> store = open_metadata_store("sqlite://", auto_create=True)   # in memory; a file: sqlite:////srv/reg.db
    >>> store.list_models()
    []
    >>> store.close()
"""
from __future__ import annotations

from .engine import kept_engine, make_engine
from .migrate import current_revision, ensure_schema, head_revision, upgrade
from .records import (AliasRecord, AuditEvent, LineageEdge, LineageNode, ModelRecord,
                      PendingPush, SignatureRecord, VersionRecord)
from .sql import SqlMetadataStore


def open_metadata_store(url: str, *, auto_create: bool) -> SqlMetadataStore:
    """A store for ``url`` whose schema is checked (and created when fresh and ``auto_create``).

    Raises DatabaseOutdatedError when the database is behind this software (run
    ``pt2reg db upgrade``) and StoreError when it is ahead or unreachable. For example, on a
    database without the registry's tables::

        open_metadata_store("postgresql://reg@db/registry", auto_create=False)
        # raises DatabaseOutdatedError: the database ... has no registry schema yet
    """
    engine, release = kept_engine(url, lambda e: ensure_schema(e, auto_create=auto_create))  # shared in-process
    return SqlMetadataStore(engine, on_close=release)

__all__ = [
    "SqlMetadataStore", "open_metadata_store", "make_engine", "ensure_schema", "upgrade", "current_revision",
    "head_revision", "ModelRecord", "VersionRecord", "AliasRecord", "SignatureRecord",
    "LineageEdge", "LineageNode", "AuditEvent", "PendingPush",
]
