"""Webhooks in SQL: subscriptions, the delivery outbox, attempts, and signed audit heads.

:func:`enqueue` runs inside :func:`registry.store.audit_log.append_event`, in the transaction
that records the change: an event worth announcing (:data:`EVENT_TYPES`) becomes one
``webhook_deliveries`` row per subscribed webhook, so a change and its outbox rows commit or
roll back together. Server replicas then :func:`claim` due rows with a conditional UPDATE (one
winner per row, whatever the number of replicas; PostgreSQL also skips rows another replica
holds locked), deliver them and :func:`record_attempt`. Each webhook's rows are its own queue
(:func:`due_webhooks`, ``claim(webhook_id=...)``), so a server works on each endpoint apart.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from ..access.scopes import glob_matches, validate_glob
from ..errors import NotFoundError, UsageError
from .audit_chain import format_ts, parse_ts
from .orm import AuditEventRow, AuditHeadRow, WebhookAttemptRow, WebhookDeliveryRow, WebhookRow, json_text, now_text
from .records import SignedAuditHead, WebhookAttempt, WebhookDelivery, WebhookRecord

__all__ = ["EVENT_TYPES", "ACTION_EVENTS", "enqueue", "add_webhook", "list_webhooks", "remove_webhook",
           "deliveries", "redeliver", "due_webhooks", "claim", "release", "record_attempt", "secret_of", "add_head",
           "heads", "newest_event", "validate_webhook_url", "MAX_ATTEMPTS", "EXCERPT_CHARS"]

#: audit action -> webhook event type (actions not listed are not announced: pulls, tokens...)
ACTION_EVENTS = {
    "publish": "version.published",
    "alias.set": "alias.moved",
    "alias.move": "alias.moved",
    "alias.remove": "alias.removed",
    "yank": "version.yanked",
    "deprecate": "version.deprecated",
    "restore": "version.restored",
    "sign": "version.signed",
    "attestation.record": "attestation.recorded",
    "policy.set": "policy.changed",
    "policy.remove": "policy.changed",
}
EVENT_TYPES = tuple(sorted(set(ACTION_EVENTS.values())))
MAX_ATTEMPTS = 12
EXCERPT_CHARS = 256
_DETAILS_HIDDEN = ("fields",)  # the chain's own bookkeeping, not news


def _payload(row: AuditEventRow, event_type: str, details: dict[str, Any]) -> dict[str, Any]:
    """The JSON body a webhook receives (Standard Webhooks shape: type, timestamp, data)."""
    return {"type": event_type, "timestamp": row.ts,
            "data": {"model": row.model, "version": row.version, "digest": row.digest,
                     "ref": row.ref, "actor": row.actor, "action": row.action,
                     "audit_seq": row.seq, "audit_hash": row.hash,
                     "details": {k: v for k, v in details.items() if k not in _DETAILS_HIDDEN}}}


def enqueue(session: Session, row: AuditEventRow, details: dict[str, Any]) -> int:
    """Outbox rows for ``row`` (just appended, same transaction); how many were written."""
    event_type = ACTION_EVENTS.get(row.action)
    if event_type is None:
        return 0
    written = 0
    for hook in session.scalars(select(WebhookRow).order_by(WebhookRow.id)):
        if event_type not in json.loads(hook.events_json):
            continue
        if hook.model_glob and not (row.model and glob_matches(hook.model_glob, row.model)):
            continue
        session.add(WebhookDeliveryRow(
            webhook_id=hook.id, message_id=f"msg_{row.seq}_{hook.id}_{row.hash[:12]}",
            event_type=event_type, audit_seq=row.seq,
            payload_json=json_text(_payload(row, event_type, details), "webhook payload"),
            status="pending", attempts=0, next_attempt_at=row.ts, created_at=row.ts))
        written += 1
    return written


def _hook_record(row: WebhookRow) -> WebhookRecord:
    return WebhookRecord(id=row.id, url=row.url, events=list(json.loads(row.events_json)),
                         model_glob=row.model_glob, created_at=parse_ts(row.created_at),
                         created_by=row.created_by)


def _shown(url: str) -> str:
    """The URL for an error line: at most 80 characters, any ``user:password@`` hidden."""
    import re

    return re.sub(r"(?<=//)[^/?#]*@", "***@", url)[:80]


def validate_webhook_url(url: str) -> str:
    """``url`` when it is an absolute http(s) URL with a host and no credentials; UsageError
    otherwise. Webhook URLs are hostile input: see the README on SSRF (the server POSTs to
    whatever an admin registers, from inside its network).

    >>> validate_webhook_url("https://hooks.example.com/pt2")
    'https://hooks.example.com/pt2'
    """
    from urllib.parse import urlsplit

    if len(url) > 2048 or not url.isprintable() or any(c.isspace() for c in url):
        raise UsageError("a webhook URL must be printable, without spaces, at most 2048 characters")
    if not url.isascii():
        raise UsageError(f"a webhook URL must be ASCII, not {_shown(url)!r}",
                         hint="write an international host name as punycode (xn--...) and "
                              "percent-encode the path")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as exc:
        raise UsageError(f"invalid webhook URL {_shown(url)!r}: {exc}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"a webhook URL must be http:// or https:// with a host, not {_shown(url)!r}")
    if parts.username or parts.password or "@" in parts.netloc:
        raise UsageError("a webhook URL must not carry credentials (user:password@)",
                         hint="the receiver authenticates the registry by the webhook signature")
    return url


def add_webhook(s: Session, url: str, events: Sequence[str], model_glob: str | None,
                secret_enc: str, key_id: str, *, actor: str) -> WebhookRecord:
    """Insert a subscription (the caller validated the URL and encrypted the secret)."""
    validate_webhook_url(url)
    if model_glob is not None:  # the scopes' model globs: '*' within a segment, '**' across
        validate_glob(model_glob)
    unknown = sorted(set(events) - set(EVENT_TYPES))
    if unknown or not events:
        raise UsageError(f"unknown webhook event {unknown[0]!r}" if unknown else "give at least one event",
                         hint="events: " + ", ".join(EVENT_TYPES))
    row = WebhookRow(url=url, events_json=json_text(sorted(set(events)), "events"),
                     model_glob=model_glob, secret_enc=secret_enc, key_id=key_id,
                     created_at=now_text(s), created_by=actor)
    s.add(row)
    s.flush()
    return _hook_record(row)


def list_webhooks(s: Session) -> list[WebhookRecord]:
    return [_hook_record(r) for r in s.scalars(select(WebhookRow).order_by(WebhookRow.id))]


def remove_webhook(s: Session, webhook_id: int) -> WebhookRecord:
    """Delete a subscription; its undelivered outbox rows are dropped, the log is kept."""
    row = s.get(WebhookRow, webhook_id)
    if row is None:
        raise NotFoundError(f"no webhook {webhook_id}", hint="list them with `pt2reg webhook list`")
    record = _hook_record(row)
    s.execute(update(WebhookDeliveryRow)
              .where(WebhookDeliveryRow.webhook_id == webhook_id,
                     WebhookDeliveryRow.status.in_(("pending", "failing")))
              .values(status="dead"))
    s.delete(row)
    return record


def _delivery(row: WebhookDeliveryRow, attempts: list[WebhookAttemptRow]) -> WebhookDelivery:
    return WebhookDelivery(
        id=row.id, webhook_id=row.webhook_id, message_id=row.message_id, event_type=row.event_type,
        audit_seq=row.audit_seq, status=row.status, attempts=row.attempts,
        created_at=parse_ts(row.created_at),
        next_attempt_at=parse_ts(row.next_attempt_at) if row.status in ("pending", "failing") else None,
        delivered_at=parse_ts(row.delivered_at) if row.delivered_at else None,
        history=[WebhookAttempt(at=parse_ts(a.at), replica=a.replica, ok=bool(a.ok),
                                duration_ms=a.duration_ms, status_code=a.status_code, error=a.error,
                                response_excerpt=a.response_excerpt) for a in attempts])


def deliveries(s: Session, *, failed: bool = False, webhook_id: int | None = None,
               limit: int = 200) -> list[WebhookDelivery]:
    """Newest deliveries first with their attempts; ``failed``: only those not delivered whose
    last attempt failed (``failing``: still retried; ``dead``: given up)."""
    q = select(WebhookDeliveryRow).order_by(WebhookDeliveryRow.id.desc()).limit(limit)
    if failed:
        q = q.where(WebhookDeliveryRow.status.in_(("failing", "dead")))
    if webhook_id is not None:
        q = q.where(WebhookDeliveryRow.webhook_id == webhook_id)
    rows = list(s.scalars(q))
    attempts: dict[int, list[WebhookAttemptRow]] = {}
    if rows:
        for a in s.scalars(select(WebhookAttemptRow)
                           .where(WebhookAttemptRow.delivery_id.in_([r.id for r in rows]))
                           .order_by(WebhookAttemptRow.id)):
            attempts.setdefault(a.delivery_id, []).append(a)
    return [_delivery(r, attempts.get(r.id, [])) for r in rows]


def redeliver(s: Session, delivery_id: int) -> WebhookDelivery:
    """Queue a delivery again now (any status; a delivered one is sent once more)."""
    row = s.get(WebhookDeliveryRow, delivery_id)
    if row is None:
        raise NotFoundError(f"no webhook delivery {delivery_id}",
                            hint="list them with `pt2reg webhook deliveries`")
    if s.get(WebhookRow, row.webhook_id) is None:
        raise UsageError(f"delivery {delivery_id} belongs to webhook {row.webhook_id}, which was removed")
    row.status, row.attempts, row.next_attempt_at = "pending", 0, now_text(s)
    row.claimed_by = row.claimed_until = None
    s.flush()
    return _delivery(row, [])


def _due(now: str) -> tuple[Any, ...]:
    """Rows waiting for an attempt now and held by no replica (or by one whose lease ran out)."""
    return (WebhookDeliveryRow.status.in_(("pending", "failing")),
            WebhookDeliveryRow.next_attempt_at <= now,
            (WebhookDeliveryRow.claimed_until.is_(None)) | (WebhookDeliveryRow.claimed_until < now))


def due_webhooks(s: Session) -> dict[int, int]:
    """``webhook id -> deliveries due now`` that no replica holds: each webhook's own queue."""
    rows = s.execute(select(WebhookDeliveryRow.webhook_id, func.count())
                     .where(*_due(now_text(s))).group_by(WebhookDeliveryRow.webhook_id))
    return {webhook_id: count for webhook_id, count in rows}


def claim(s: Session, replica: str, *, lease_seconds: float, limit: int = 10,
          webhook_id: int | None = None) -> list[tuple[int, str, str, str, str, int]]:
    """Due deliveries this replica now holds for ``lease_seconds``, oldest first (only
    ``webhook_id``'s when given): ``(id, message_id, payload_json, url, secret_enc+key,
    attempts)``. Each row is taken by a conditional UPDATE that only one replica's transaction
    can win."""
    now = now_text(s)
    until = format_ts(parse_ts(now) + timedelta(seconds=lease_seconds))
    due = _due(now)
    q = select(WebhookDeliveryRow.id).where(*due).order_by(WebhookDeliveryRow.id).limit(limit)
    if webhook_id is not None:
        q = q.where(WebhookDeliveryRow.webhook_id == webhook_id)
    if s.get_bind().dialect.name == "postgresql":
        q = q.with_for_update(skip_locked=True)
    won = []
    for did in s.scalars(q).all():
        got = s.execute(update(WebhookDeliveryRow).where(WebhookDeliveryRow.id == did, *due)
                        .values(claimed_by=replica, claimed_until=until)
                        .execution_options(synchronize_session=False))
        if got.rowcount == 1:
            won.append(did)
    out = []
    for did in won:
        row = s.get(WebhookDeliveryRow, did)
        hook = s.get(WebhookRow, row.webhook_id)
        if hook is None:
            row.status = "dead"
            continue
        out.append((row.id, row.message_id, row.payload_json, hook.url,
                    f"{hook.key_id} {hook.secret_enc}", row.attempts))
    return out


def release(s: Session, delivery_ids: Sequence[int], replica: str) -> None:
    """Hand back claims this replica took but will not send now (due again at once)."""
    if delivery_ids:
        s.execute(update(WebhookDeliveryRow)
                  .where(WebhookDeliveryRow.id.in_(list(delivery_ids)),
                         WebhookDeliveryRow.claimed_by == replica)
                  .values(claimed_by=None, claimed_until=None)
                  .execution_options(synchronize_session=False))


def record_attempt(s: Session, delivery_id: int, replica: str, *, ok: bool, status_code: int | None,
                   error: str | None, excerpt: str | None, duration_ms: int,
                   backoff_seconds: float) -> str:
    """Log one attempt and settle the row: delivered, or failing (retry after
    ``backoff_seconds``), or dead after :data:`MAX_ATTEMPTS`. Returns the new status."""
    now = now_text(s)
    s.add(WebhookAttemptRow(delivery_id=delivery_id, at=now, replica=replica[:128],
                            status_code=status_code, ok=ok, error=(error or None) and error[:500],
                            response_excerpt=(excerpt or None) and excerpt[:EXCERPT_CHARS],
                            duration_ms=duration_ms))
    row = s.get(WebhookDeliveryRow, delivery_id)
    if row is None:  # pragma: no cover - deleted under us
        return "gone"
    row.attempts += 1
    row.claimed_by = row.claimed_until = None
    if ok:
        row.status, row.delivered_at = "delivered", now
    elif row.attempts >= MAX_ATTEMPTS:
        row.status = "dead"
    else:
        row.status = "failing"
        row.next_attempt_at = format_ts(parse_ts(now) + timedelta(seconds=backoff_seconds))
    return row.status


def secret_of(packed: str) -> tuple[str, str]:
    """``(key_id, secret_enc)`` from :func:`claim`'s packed field."""
    key_id, _, enc = packed.partition(" ")
    return key_id, enc


# -- signed audit heads ------------------------------------------------------------------------

def newest_event(s: Session) -> tuple[int, str] | None:
    row = s.execute(select(AuditEventRow.seq, AuditEventRow.hash)
                    .order_by(AuditEventRow.seq.desc()).limit(1)).first()
    return (row.seq, row.hash) if row else None


def add_head(s: Session, signed: dict[str, Any]) -> bool:
    """Store a signed head unless this key already signed that event (another replica did)."""
    exists = s.scalar(select(AuditHeadRow.id).where(AuditHeadRow.seq == signed["seq"],
                                                    AuditHeadRow.key_id == signed["key_id"]))
    if exists is not None:
        return False
    s.add(AuditHeadRow(**signed))
    return True


def heads(s: Session, *, newest_only: bool = False, key_id: str | None = None) -> list[SignedAuditHead]:
    q = select(AuditHeadRow).order_by(AuditHeadRow.seq.desc() if newest_only else AuditHeadRow.seq)
    if key_id is not None:
        q = q.where(AuditHeadRow.key_id == key_id)
    if newest_only:
        q = q.limit(1)
    return [SignedAuditHead(seq=r.seq, hash=r.hash, signed_at=parse_ts(r.signed_at), key_id=r.key_id,
                            signature=r.signature) for r in s.scalars(q)]

