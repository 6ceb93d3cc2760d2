"""``AuditLog`` over SQL: append, read, verify (``registry.store.audit_log``)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ...errors import UsageError
from .. import audit_log
from ..audit_chain import ChainVerdict, format_ts
from ..orm import (
    AuditEventRow,
    json_text,
)
from ..records import (
    AuditEvent,
    SignedAuditHead,
)
from ._base import SqlStoreBase

__all__ = ["SqlAuditLog"]


class SqlAuditLog(SqlStoreBase):
    """The hash-chained audit log, its checks, and the signed heads."""

    def record_event(self, action: str, *, actor: str, host: str, model: str | None = None,
                     number: int | None = None, digest: str | None = None,
                     ref: str | None = None, details: Mapping[str, Any] | None = None,
                     ) -> AuditEvent:
        """Append an event that has no state change of its own (pull, load, gc.delete).

        For example (``store`` an open ``SqlMetadataStore``)::

            store.record_event("pull", actor="svc", host="inf-3", model="bert", number=2,
                               ref="bert@prod").seq   # -> 7
        """
        if not isinstance(action, str) or not action or len(action) > 32:
            raise UsageError(f"invalid audit action {action!r}")
        if details is not None:
            json_text(dict(details), "audit details")
        return self._write(lambda s: audit_log.append_event(
            s, action, actor=actor, host=host, model=model, number=number, digest=digest,
            ref=ref, details=details).to_record())

    def events(self, model: str | None = None, since: datetime | None = None
               ) -> list[AuditEvent]:
        """Audit events in chain order, optionally of one model and at or after ``since``.

        For example (``store`` an open ``SqlMetadataStore``)::

            [e.action for e in store.events(model="bert")]   # -> ['publish', 'alias.set', 'pull']
        """
        stmt = select(AuditEventRow).order_by(AuditEventRow.seq)
        if model is not None:
            stmt = stmt.where(AuditEventRow.model == model)
        if since is not None:
            stmt = stmt.where(AuditEventRow.ts >= format_ts(since))
        return self._read(lambda s: [row.to_record() for row in s.scalars(stmt)])

    def audit_hashes(self, seqs: Sequence[int] = ()) -> tuple[tuple[int, str] | None, dict[int, str]]:
        """The newest event as ``(seq, hash)`` (None for an empty log), and the hashes of the
        events ``seqs`` that exist, read in one transaction.

        For example (``store`` an open ``SqlMetadataStore``)::

            store.audit_hashes([3])   # -> ((7, '9f2c...'), {3: '41ab...'})
        """
        def work(s: Session) -> tuple[tuple[int, str] | None, dict[int, str]]:
            head = s.execute(select(AuditEventRow.seq, AuditEventRow.hash)
                             .order_by(AuditEventRow.seq.desc()).limit(1)).first()
            found = dict(s.execute(select(AuditEventRow.seq, AuditEventRow.hash)
                                   .where(AuditEventRow.seq.in_(list(seqs)))).all()) if seqs else {}
            return (tuple(head) if head else None), found
        return self._read(work)

    def verify_version_contents(self) -> ChainVerdict | None:
        """None when every stored manifest hashes to its version's digest and each version's
        size, metadata and blob records are what its manifest says; else a failed verdict
        naming the version."""
        return self._read(audit_log.verify_contents)

    def verify_audit_chain(self) -> ChainVerdict:
        """Re-walk the whole chain, then check versions, statuses and aliases against a replay
        of it (catches a deleted newest event and state edited behind the log's back):
        ``(ok, first_bad_seq, reason)``; ``first_bad_seq`` is None when no event names the
        mismatch (e.g. a version row inserted without any event).

        For example (``store`` an open ``SqlMetadataStore``)::

            store.verify_audit_chain()   # -> ChainVerdict(ok=True, first_bad_seq=None, reason='7 events, chain intact')
        """
        return self._read(audit_log.verify)

    def find_events(self, *, model: str | None = None, actor: str | None = None,
                    action: str | None = None, since: datetime | None = None,
                    until: datetime | None = None, limit: int = 500) -> tuple[list[AuditEvent], int]:
        """The newest ``limit`` audit events matching every given filter (``action``: that
        action or its sub-actions, ``alias`` matches ``alias.set``), newest first, and how many
        match in all: the web page's audit log, filtered in SQL.

        For example (``store`` an open ``SqlMetadataStore``)::

            events, total = store.find_events(model="bert", action="alias", limit=10)
        """
        stmt = select(AuditEventRow)
        if model is not None:
            stmt = stmt.where(AuditEventRow.model == model)
        if actor is not None:
            stmt = stmt.where(AuditEventRow.actor == actor)
        if action is not None:
            stmt = stmt.where((AuditEventRow.action == action)
                              | AuditEventRow.action.startswith(action + ".", autoescape=True))
        if since is not None:
            stmt = stmt.where(AuditEventRow.ts >= format_ts(since))
        if until is not None:
            stmt = stmt.where(AuditEventRow.ts <= format_ts(until))

        def work(s: Session) -> tuple[list[AuditEvent], int]:
            total = s.scalar(select(func.count()).select_from(stmt.subquery())) or 0
            rows = s.scalars(stmt.order_by(AuditEventRow.seq.desc()).limit(limit))
            return [row.to_record() for row in rows], total

        return self._read(work)

    def audit_heads(self, *, newest_only: bool = False) -> list[SignedAuditHead]:
        """The audit heads the server signed, oldest first (``newest_only``: just the newest)."""
        from .. import outbox

        return self._read(lambda s: outbox.heads(s, newest_only=newest_only))
