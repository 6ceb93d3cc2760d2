"""The metadata store: SQL rows behind a small API that returns frozen records.

    >>> store = open_metadata_store("sqlite://", auto_create=True)   # in memory; a file: sqlite:////srv/reg.db
    >>> store.list_models()
    []
    >>> store.close()
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engine import make_engine
    from .migrate import current_revision, ensure_schema, head_revision, upgrade
    from .records import (
        AliasRecord,
        AuditEvent,
        LineageEdge,
        LineageNode,
        ModelRecord,
        PendingPush,
        SignatureRecord,
        VersionRecord,
    )
    from .sql import SqlMetadataStore

#: every name below loads its module on first use: ``registry.store.records`` (plain dataclasses,
#: what a bundle's build info and lineage are made of) must not cost SQLAlchemy's import
_LAZY = {
    "make_engine": "engine", "ensure_schema": "migrate", "upgrade": "migrate", "current_revision": "migrate",
    "head_revision": "migrate", "SqlMetadataStore": "sql",
    **dict.fromkeys(("AliasRecord", "AuditEvent", "LineageEdge", "LineageNode", "ModelRecord", "PendingPush",
                     "SignatureRecord", "VersionRecord"), "records"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_metadata_store(url: str, *, auto_create: bool) -> SqlMetadataStore:
    """A store for ``url`` whose schema is checked (and created when fresh and ``auto_create``).

    Raises DatabaseOutdatedError when the database is behind this software (run
    ``pt2reg db upgrade``) and StoreError when it is ahead or unreachable. For example, on a
    database without the registry's tables::

        open_metadata_store("postgresql://reg@db/registry", auto_create=False)
        # raises DatabaseOutdatedError: the database ... has no registry schema yet
    """
    from .engine import kept_engine
    from .sql import SqlMetadataStore

    # looked up in this package's namespace at call time, as a module-level import would be
    ensure_schema = globals().get("ensure_schema") or __getattr__("ensure_schema")
    engine, release = kept_engine(url, lambda e: ensure_schema(e, auto_create=auto_create))  # shared in-process
    return SqlMetadataStore(engine, on_close=release)

__all__ = [
    "SqlMetadataStore", "open_metadata_store", "make_engine", "ensure_schema", "upgrade", "current_revision",
    "head_revision", "ModelRecord", "VersionRecord", "AliasRecord", "SignatureRecord",
    "LineageEdge", "LineageNode", "AuditEvent", "PendingPush",
]
