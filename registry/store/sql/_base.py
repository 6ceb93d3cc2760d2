"""What every SQL store class shares: the engine, transactions, and row lookups.

The SQL metadata store is one class per concern (``registry.store.sql``), each over this base,
over SQLAlchemy 2.0, behaving the same on SQLite and PostgreSQL. Callers get
frozen records (:mod:`registry.store.records`) and registry errors, never sessions or
SQLAlchemy exceptions. Every state change appends its audit event in the same transaction.

How concurrent writers stay correct:

- *version numbers* (gap-free per model): a publish locks its model row (PostgreSQL
  ``SELECT ... FOR UPDATE`` after an ``INSERT ... ON CONFLICT DO NOTHING``; SQLite holds the
  database write lock from ``BEGIN IMMEDIATE``) before reading ``max(number)``;
- *the audit chain* (one chain): appends take ``pg_advisory_xact_lock`` (PostgreSQL; SQLite is
  already serialized) before reading the last event's hash, always after any row lock, so lock
  order is fixed and writers cannot deadlock;
- anything that still loses a race is retried as a whole (:func:`run_transaction`).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from ...errors import NotFoundError
from ...refs import (
    Ref,
)
from ..engine import (
    GC_LOCK_KEY,
    advisory_lock,
    make_engine,
    run_transaction,
)
from ..orm import (
    AliasRow,
    ModelRow,
    VersionPackRow,
    VersionRow,
    json_text,
)
from ..records import (
    VersionRecord,
)

__all__ = ["SqlStoreBase", "LOCATE_VERSIONS"]

T = TypeVar("T")


#: how many of a model's latest versions a push looks for its small chunks in (their pack indexes)
LOCATE_VERSIONS = 8


def _audit_details(audit_details: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A write's ``audit_details``, checked to be JSON before any transaction opens."""
    if audit_details is None:
        return None
    extra = dict(audit_details)
    json_text(extra, "audit details")
    return extra


def _gc_lock(s: Session, *, exclusive: bool = False) -> None:
    """The gc lock: a sweep holds it exclusively; claims and publishes share it (they never
    wait for each other, only for a sweep). SQLite serializes write transactions anyway."""
    advisory_lock(s, GC_LOCK_KEY, shared=not exclusive)


class SqlStoreBase:
    """The engine and its transactions, and the lookups every concern needs inside one.

    Takes an engine from :func:`registry.store.engine.make_engine` (or a URL) whose schema is at
    head (see :func:`registry.store.migrate.ensure_schema`); creating tables is not its job.
    """

    def __init__(self, engine: Engine | str, *, on_close: Callable[[], None] | None = None) -> None:
        self.engine = make_engine(engine) if isinstance(engine, str) else engine
        self._on_close = on_close

    def close(self) -> None:
        """Close pooled connections (the store is unusable afterwards); with ``on_close`` (an
        engine ``kept_engine`` shares), hand the engine back instead. Idempotent."""
        on_close, self._on_close = self._on_close, (lambda: None)
        if on_close is not None:
            on_close()
        else:
            self.engine.dispose()

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, work: Callable[[Session], T]) -> T:
        return run_transaction(self.engine, work, write=False)

    def _write(self, work: Callable[[Session], T]) -> T:
        return run_transaction(self.engine, work, write=True)

    def _model(self, s: Session, name: str, *, lock: bool = False) -> ModelRow:
        stmt = select(ModelRow).where(ModelRow.name == name)
        row = s.scalars(stmt.with_for_update() if lock else stmt).one_or_none()
        if row is None:
            raise NotFoundError(f"model {name!r} not found", what="model", name=name)
        return row

    def _no_version(self, s: Session, model: ModelRow, number: int) -> NotFoundError:
        latest = s.scalar(select(func.max(VersionRow.number))
                          .where(VersionRow.model_id == model.id))
        tail = f"latest is {latest}" if latest else "it has no versions"
        return NotFoundError(f"model {model.name!r} has no version {number} ({tail})",
                             what="version", name=model.name)

    def _version(self, s: Session, model: ModelRow, number: int) -> VersionRow:
        row = s.scalars(select(VersionRow).where(VersionRow.model_id == model.id,
                                                 VersionRow.number == number)).one_or_none()
        if row is None:
            raise self._no_version(s, model, number)
        return row

    def _record(self, s: Session, name: str, row: VersionRow, *, packs: bool = False) -> VersionRecord:
        """The record of ``row``; with ``packs``, its pack index too (what a pull needs)."""
        aliases = s.scalars(select(AliasRow.alias).where(AliasRow.version_id == row.id)).all()
        index = s.get(VersionPackRow, row.id) if packs else None
        return row.to_record(name, list(aliases), packs_json=index.packs_json if index is not None else None)

    def _not_found(self, s: Session, ref: Ref) -> NotFoundError:
        model = self._model(s, ref.name)
        if ref.version is not None:
            return self._no_version(s, model, ref.version)
        if ref.digest is not None:
            return NotFoundError(f"model {ref.name!r} has no version with digest {ref.digest}",
                                 what="digest", name=ref.name)
        if ref.alias is not None:
            known = s.scalars(select(AliasRow.alias).where(AliasRow.model_id == model.id)
                              .order_by(AliasRow.alias)).all()
            return NotFoundError(f"model {ref.name!r} has no alias {ref.alias!r}", what="alias",
                                 name=ref.name, hint=f"its aliases: {', '.join(known)}"
                                 if known else "it has no aliases")
        count = s.scalar(select(func.count()).select_from(VersionRow)
                         .where(VersionRow.model_id == model.id))
        message = (f"every version of model {ref.name!r} is yanked" if count
                   else f"model {ref.name!r} has no versions")
        return NotFoundError(message, what="version", name=ref.name)

    def _start_id(self, s: Session, name: str, number: int) -> int:
        return self._version(s, self._model(s, name), number).id
