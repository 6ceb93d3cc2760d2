"""The audit log's table side: appending chained events and reading alias history.

Hashing and verification rules live in :mod:`registry.audit_chain` (pure); this module applies
them inside a store transaction. An append serializes with every other append before it reads
the previous hash: PostgreSQL takes a transaction-scoped advisory lock, SQLite already holds the
database write lock (``BEGIN IMMEDIATE``). The event commits or rolls back with the change it
records, because it is written in the same transaction.
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Mapping

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from ..audit_chain import GENESIS_HASH, ChainVerdict, format_ts, seal, verify_chain
from .orm import AuditEventRow, json_text, now_text

__all__ = ["AUDIT_LOCK_KEY", "ALIAS_ACTIONS", "append_event", "alias_at", "verify"]

#: pg_advisory_xact_lock key serializing audit appends ("pt2a").
AUDIT_LOCK_KEY = 0x70743261
ALIAS_ACTIONS = ("alias.set", "alias.move", "alias.remove")


def append_event(session: Session, action: str, *, actor: str, host: str,
                 model: str | None = None, number: int | None = None,
                 digest: str | None = None, ref: str | None = None,
                 details: Mapping[str, Any] | None = None) -> AuditEventRow:
    """Append one event at the end of the chain, in the session's transaction."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": AUDIT_LOCK_KEY})
    last = session.execute(select(AuditEventRow.seq, AuditEventRow.hash, AuditEventRow.ts)
                           .order_by(AuditEventRow.seq.desc()).limit(1)).first()
    # Never earlier than the previous event, so time order and chain order agree even when
    # hosts' clocks disagree (time travel and --since rely on it).
    ts = max(now_text(), last.ts) if last else now_text()
    event = seal({"seq": last.seq + 1 if last else 1, "ts": ts, "actor": actor, "host": host,
                  "action": action, "model": model, "version": number, "digest": digest,
                  "ref": ref, "details": dict(details or {})},
                 prev_hash=last.hash if last else GENESIS_HASH)
    row = AuditEventRow(**{k: v for k, v in event.items() if k != "details"},
                        details_json=json_text(event["details"], "audit details"))
    session.add(row)
    session.flush()
    return row


def alias_at(session: Session, model: str, alias: str, when: datetime) -> int | None:
    """The number ``model@alias`` pointed to at ``when`` per the log (None: no such alias)."""
    rows = session.execute(
        select(AuditEventRow.action, AuditEventRow.version, AuditEventRow.details_json)
        .where(AuditEventRow.model == model, AuditEventRow.action.in_(ALIAS_ACTIONS),
               AuditEventRow.ts <= format_ts(when))
        .order_by(AuditEventRow.seq.desc()))
    for action, number, details in rows:
        if json.loads(details).get("alias") == alias:
            return None if action == "alias.remove" else number
    return None


def verify(session: Session) -> ChainVerdict:
    """Re-walk the stored chain, streaming, with values exactly as stored."""
    rows = session.scalars(select(AuditEventRow).order_by(AuditEventRow.seq)
                           .execution_options(yield_per=1000))
    return verify_chain(row.to_chain_dict() for row in rows)
