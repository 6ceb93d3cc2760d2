"""The audit log's table side: appending chained events and reading alias history.

Hashing and verification rules live in :mod:`registry.store.audit_chain` (pure); this module applies
them inside a store transaction. An append serializes with every other append before it reads
the previous hash: PostgreSQL takes a transaction-scoped advisory lock, SQLite already holds the
database write lock (``BEGIN IMMEDIATE``). The event commits or rolls back with the change it
records, because it is written in the same transaction.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from ..digests import digest_of_bytes
from ..errors import ManifestError, UsageError
from . import outbox
from .audit_chain import GENESIS_HASH, ChainVerdict, format_ts, seal, verify_chain, version_fields_hash
from .engine import AUDIT_LOCK_KEY, advisory_lock
from .orm import (
    AliasRow,
    AuditEventRow,
    LineageRow,
    ModelRow,
    TokenRow,
    VersionBlobRow,
    VersionPackRow,
    VersionRow,
    json_text,
    now_text,
)

__all__ = ["ALIAS_ACTIONS", "TOKEN_ACTIONS", "append_event", "merge_details", "alias_at", "verify", "reconcile",
           "stored_fields"]

ALIAS_ACTIONS = ("alias.set", "alias.move", "alias.remove")
TOKEN_ACTIONS = ("token.create", "token.revoke")
_STATUS_OF = {"deprecate": "deprecated", "yank": "yanked", "restore": "active"}


def append_event(session: Session, action: str, *, actor: str, host: str,
                 model: str | None = None, number: int | None = None,
                 digest: str | None = None, ref: str | None = None,
                 details: Mapping[str, Any] | None = None,
                 extra: Mapping[str, Any] | None = None) -> AuditEventRow:
    """Append one event at the end of the chain, in the session's transaction.

    ``extra`` (a write method's ``audit_details``, e.g. the server's ``token_id`` and ``via``)
    is merged into ``details``; a key both name is a UsageError, never a silent overwrite (the
    replay reads the store's own keys)."""
    details = merge_details(details, extra)
    advisory_lock(session, AUDIT_LOCK_KEY)
    last = session.execute(select(AuditEventRow.seq, AuditEventRow.hash, AuditEventRow.ts)
                           .order_by(AuditEventRow.seq.desc()).limit(1)).first()
    # Never earlier than the previous event, so time order and chain order agree even when
    # hosts' clocks disagree (time travel and --since rely on it).
    now = now_text(session)  # the database's clock, never a client's
    ts = max(now, last.ts) if last else now
    event = seal({"seq": last.seq + 1 if last else 1, "ts": ts, "actor": actor, "host": host,
                  "action": action, "model": model, "version": number, "digest": digest,
                  "ref": ref, "details": dict(details or {})},
                 prev_hash=last.hash if last else GENESIS_HASH)
    row = AuditEventRow(**{k: v for k, v in event.items() if k != "details"},
                        details_json=json_text(event["details"], "audit details"))
    session.add(row)
    session.flush()
    # Webhook outbox rows in this same transaction: the change and its announcement commit
    # (or roll back) together.
    outbox.enqueue(session, row, event["details"])
    return row


def merge_details(details: Mapping[str, Any] | None, extra: Mapping[str, Any] | None
                  ) -> dict[str, Any]:
    """``details`` with ``extra``'s keys added; UsageError when they share a key."""
    merged = dict(details or {})
    for key, value in (extra or {}).items():
        if key in merged:
            raise UsageError(f"audit detail {key!r} is reserved for the {key} the store records",
                             hint="give the caller's detail another name")
        merged[key] = value
    return merged


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
    """Re-walk the stored chain, streaming, with values exactly as stored; then check that the
    registry's state is what the log says it should be (:func:`reconcile`).

    The chain alone cannot see its newest events being deleted (nothing links to them); the
    state check catches that for state changes, and catches state edited behind the log's back.
    """
    if session.get_bind().dialect.name == "postgresql":
        # One snapshot for the chain and the state, so concurrent writers cause no false alarm
        # (SQLite's read transaction is already a snapshot).
        session.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
    rows = session.scalars(select(AuditEventRow).order_by(AuditEventRow.seq)
                           .execution_options(yield_per=1000))
    verdict = verify_chain(row.to_chain_dict() for row in rows)
    return reconcile(session, verdict) if verdict.ok else verdict


def _blobs_disagree(session: Session) -> tuple[str, int, str] | None:
    """The first version whose stored manifest does not hash to its digest, whose size or
    metadata are not its manifest's (``recorded_facts``), or whose ``version_blobs`` rows are not
    exactly the blobs its manifest needs."""
    from ..format.manifest import recorded_facts, stored_blobs  # a manifest parse: not for every command

    rows: dict[int, set[tuple[str, int]]] = {}
    for vid, digest, size in session.execute(select(VersionBlobRow.version_id, VersionBlobRow.blob_digest,
                                                    VersionBlobRow.size).execution_options(yield_per=5000)):
        rows.setdefault(vid, set()).add((digest, size))
    for vid, name, number, digest, text_, packs_, size, metadata in session.execute(
            select(VersionRow.id, ModelRow.name, VersionRow.number, VersionRow.digest, VersionRow.manifest_json,
                   VersionPackRow.packs_json, VersionRow.size, VersionRow.metadata_json)
            .join(ModelRow, ModelRow.id == VersionRow.model_id)
            .outerjoin(VersionPackRow, VersionPackRow.version_id == VersionRow.id)
            .order_by(ModelRow.name, VersionRow.number).execution_options(yield_per=1000)):
        if digest_of_bytes(text_.encode("utf-8")) != digest:
            return name, number, f"has a stored manifest that does not hash to its digest {digest}"
        try:
            needed = stored_blobs(text_, packs_)
            facts = recorded_facts(text_)
        except ManifestError:
            return name, number, "has an unreadable stored manifest or pack index"
        if size != facts[0]:
            return name, number, f"records size {size}, its manifest says {facts[0]}"
        if json.loads(metadata) != facts[1]:
            return name, number, "records metadata that is not its manifest's"
        have = rows.get(vid, set())
        if have != needed:
            missing = sorted(needed - have)
            what = (f"lacks the blob record {missing[0][0]}" if missing
                    else f"records blob {sorted(have - needed)[0][0]}, which its manifest does not name")
            return name, number, what
    return None


def verify_contents(session: Session) -> ChainVerdict | None:
    """None when every version's stored manifest hashes to its digest, its size and metadata
    are that manifest's and its blob records are exactly what that manifest needs; else a failed
    verdict naming the version (and its publish event). This is what gc, pulls and ``show``
    rely on, checked apart from the log's replay."""
    bad = _blobs_disagree(session)
    if bad is None:
        return None
    name, number, what = bad
    seq = session.scalars(select(AuditEventRow.seq).where(
        AuditEventRow.action == "publish", AuditEventRow.model == name,
        AuditEventRow.version == number)).first()
    return ChainVerdict(False, seq, f"version {name}@{number} {what} (the metadata database was altered)")


def stored_fields(session: Session) -> dict[tuple[str, int], str]:
    """``(model, number) -> version_fields_hash`` of every version as the tables hold it now."""
    edges: dict[int, list[tuple[str, str, str | None, str | None]]] = {}
    for vid, kind, value, digest, extra in session.execute(
            select(LineageRow.version_id, LineageRow.kind, LineageRow.value, LineageRow.digest,
                   LineageRow.extra_json).execution_options(yield_per=5000)):
        edges.setdefault(vid, []).append((kind, value, digest, extra))
    return {(name, number): version_fields_hash(by, meta, edges.get(vid, []))
            for vid, name, number, by, meta in session.execute(
                select(VersionRow.id, ModelRow.name, VersionRow.number, VersionRow.created_by,
                       VersionRow.metadata_json)
                .join(ModelRow, ModelRow.id == VersionRow.model_id)
                .execution_options(yield_per=1000))}


def reconcile(session: Session, verdict: ChainVerdict) -> ChainVerdict:
    """``verdict`` unless versions, statuses or aliases disagree with a replay of the log.

    Every version must have exactly its one publish event; every version's status and every
    alias must be where the last event about it left them; every API token must be what its
    ``token.create`` event recorded, revoked exactly when a ``token.revoke`` event says so. A mismatch names the last event about
    the thing that disagrees (or no event, when the log never mentions it).
    """
    published: dict[tuple[str, int], tuple[int, str | None]] = {}
    vouched: dict[tuple[str, int], tuple[int, str | None]] = {}  # publish/attest "fields"
    status: dict[tuple[str, int], tuple[int, str]] = {}
    aliases: dict[tuple[str, str], tuple[int, int | None]] = {}
    for seq, action, model, number, digest, details in session.execute(
            select(AuditEventRow.seq, AuditEventRow.action, AuditEventRow.model,
                   AuditEventRow.version, AuditEventRow.digest, AuditEventRow.details_json)
            .where(AuditEventRow.action.in_(("publish", "attest", *_STATUS_OF, *ALIAS_ACTIONS)))
            .order_by(AuditEventRow.seq).execution_options(yield_per=1000)):
        if action in ("publish", "attest"):
            if action == "publish":
                published[(model, number)] = (seq, digest)
            vouched[(model, number)] = (seq, json.loads(details).get("fields"))
        elif action in _STATUS_OF:
            status[(model, number)] = (seq, _STATUS_OF[action])
        else:
            alias = json.loads(details).get("alias")
            aliases[(model, alias)] = (seq, None if action == "alias.remove" else number)

    def broken(seq: int | None, what: str) -> ChainVerdict:
        return ChainVerdict(False, seq, f"{what} (the log and the registry disagree)")

    current = stored_fields(session)
    for name, number, digest, state in session.execute(
            select(ModelRow.name, VersionRow.number, VersionRow.digest, VersionRow.status)
            .join(ModelRow, ModelRow.id == VersionRow.model_id)
            .order_by(ModelRow.name, VersionRow.number)):
        seq, logged = published.pop((name, number), (None, None))
        if logged != digest:
            return broken(seq, f"version {name}@{number} ({digest}) "
                               + ("has no publish event" if seq is None
                                  else f"was published as {logged}"))
        seq, logged = vouched.get((name, number), (seq, None))
        if logged != current.get((name, number)):
            return broken(seq, f"version {name}@{number}: its publisher (created_by), metadata "
                               f"or lineage edges differ from what event {seq} recorded")
        seq, logged = status.get((name, number), (None, "active"))
        if logged != state:
            return broken(seq, f"version {name}@{number} is {state} but the log says {logged}")
    if published:
        (name, number), (seq, _) = min(published.items(), key=lambda kv: kv[1][0])
        return broken(seq, f"event {seq} publishes {name}@{number}, which is not in the registry")
    for name, alias, number in session.execute(
            select(ModelRow.name, AliasRow.alias, VersionRow.number)
            .join(AliasRow, AliasRow.model_id == ModelRow.id)
            .join(VersionRow, VersionRow.id == AliasRow.version_id)):
        seq, logged = aliases.pop((name, alias), (None, None))
        if logged != number:
            where = "not set" if logged is None else f"at {name}@{logged}"
            return broken(seq, f"alias {name}@{alias} points at {name}@{number} but the log "
                               f"says it is {where}")
    for (name, alias), (seq, logged) in sorted(aliases.items(), key=lambda kv: kv[1][0]):
        if logged is not None:
            return broken(seq, f"alias {name}@{alias} is missing but the log says it points at "
                               f"{name}@{logged}")
    token_problem = _tokens_disagree(session)
    if token_problem is not None:
        return broken(*token_problem)
    return verdict


def _tokens_disagree(session: Session) -> tuple[int | None, str] | None:
    """``(seq, what)`` for the first token whose row is not what its ``token.create`` /
    ``token.revoke`` events say (a token inserted, widened, un-revoked or deleted behind the
    log's back), else None."""
    created: dict[int, tuple[int, dict]] = {}
    revoked: dict[int, int] = {}
    for seq, action, details in session.execute(
            select(AuditEventRow.seq, AuditEventRow.action, AuditEventRow.details_json)
            .where(AuditEventRow.action.in_(TOKEN_ACTIONS)).order_by(AuditEventRow.seq)):
        logged = json.loads(details)
        token = logged.get("token")
        if action == "token.revoke":
            revoked.setdefault(token, seq)
        elif token in created:
            return seq, f"event {seq} creates token {token} again (event {created[token][0]} did)"
        else:
            created[token] = (seq, logged)
    for row in session.scalars(select(TokenRow).order_by(TokenRow.id)):
        seq, logged = created.pop(row.id, (None, None))
        if logged is None:
            return None, f"token {row.id} ({row.owner}) has no token.create event"
        stored = {"owner": row.owner, "scopes": json.loads(row.scopes_json),
                  "expires_at": row.expires_at}
        if {k: logged.get(k) for k in stored} != stored:
            return seq, (f"token {row.id}: its owner, scopes or expiry differ from what event "
                         f"{seq} recorded")
        revoke_seq = revoked.pop(row.id, None)
        if revoke_seq is None and row.revoked_at is not None:
            return seq, f"token {row.id} is revoked but the log has no token.revoke event for it"
        if revoke_seq is not None and row.revoked_at is None:
            return revoke_seq, f"token {row.id} is not revoked but event {revoke_seq} revoked it"
    if created:
        token, (seq, _) = min(created.items(), key=lambda kv: kv[1][0])
        return seq, f"event {seq} creates token {token}, which is not in the registry"
    return None
