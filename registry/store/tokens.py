"""API tokens in SQL: create, list, revoke and authenticate, each inside a store transaction.

Only the SHA-256 of a secret is stored, looked up through the unique ``secret_hash`` index.
Times are the database's clock (:func:`registry.store.orm.now_text`), so an expiry means the
same thing on every replica. Creation and revocation append ``token.create`` /
``token.revoke`` audit events (owner, scopes, expiry; never the secret or its hash), which
``audit --verify`` replays against the ``tokens`` table (:func:`registry.store.audit_log.reconcile`).

``last_used_at`` is bookkeeping, not security: it is refreshed at most once per
:data:`TOUCH_INTERVAL` so that authenticating a request is a read, not a write, almost always.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from ..access.scopes import Identity, parse_scope
from ..errors import NotAuthenticatedError, NotFoundError, UsageError
from .audit_chain import format_ts, parse_ts
from .audit_log import append_event
from .engine import in_batches
from .orm import ModelRow, TokenRow, VersionBlobRow, VersionRow, json_text, now_text

__all__ = ["TOUCH_INTERVAL", "create", "revoke", "check", "touch", "blob_models",
           "create_details"]

TOUCH_INTERVAL = timedelta(seconds=60)
_NEW_TOKEN_HINT = "ask an admin for a new token (pt2reg token create)"


def create_details(row: TokenRow) -> dict[str, Any]:
    """What a ``token.create`` event records (and the audit replay compares to the row)."""
    return {"token": row.id, "owner": row.owner, "scopes": json.loads(row.scopes_json),
            "expires_at": row.expires_at}


def create(s: Session, *, owner: str, scopes: Sequence[str], secret_hash: str,
           expires_at: datetime | None, actor: str, host: str,
           extra: Mapping[str, Any] | None) -> TokenRow:
    """Insert a token (scopes already canonical) and its ``token.create`` event."""
    now = now_text(s)
    expires = format_ts(expires_at) if expires_at is not None else None
    if expires is not None and expires <= now:
        raise UsageError(f"the token would expire at {expires}, which has already passed",
                         hint="give a later --expires")
    row = TokenRow(owner=owner, secret_hash=secret_hash,
                   scopes_json=json_text(list(scopes), "token scopes"), created_at=now,
                   created_by=actor, expires_at=expires)
    s.add(row)
    s.flush()
    append_event(s, "token.create", actor=actor, host=host, details=create_details(row),
                 extra=extra)
    return row


def _row(s: Session, token_id: int) -> TokenRow:
    row = s.get(TokenRow, token_id) if isinstance(token_id, int) else None
    if row is None:
        raise NotFoundError(f"token {token_id} not found", what="token", name=str(token_id),
                            hint="`pt2reg token list` shows the tokens")
    return row


def revoke(s: Session, token_id: int, *, actor: str, host: str,
           extra: Mapping[str, Any] | None) -> TokenRow:
    """Revoke a token now (audited). Revoking a revoked token changes nothing and logs nothing."""
    row = _row(s, token_id)
    if row.revoked_at is None:
        row.revoked_at = now_text(s)
        append_event(s, "token.revoke", actor=actor, host=host,
                     details={"token": row.id, "owner": row.owner}, extra=extra)
    return row


def check(s: Session, secret_hash: str) -> tuple[Identity, bool]:
    """The identity of the token whose secret hashes to ``secret_hash``, and whether its
    ``last_used_at`` is due for a refresh. NotAuthenticatedError when unknown, revoked or
    expired (by the database's clock), saying which and when."""
    row = s.scalars(select(TokenRow).where(TokenRow.secret_hash == secret_hash)).one_or_none()
    if row is None:
        raise NotAuthenticatedError("unknown token: no token of this registry has that secret",
                                    hint="check PT2REG_TOKEN or --token-file, or " + _NEW_TOKEN_HINT)
    if row.revoked_at is not None:
        raise NotAuthenticatedError(f"token {row.id} was revoked at {row.revoked_at}",
                                    hint=_NEW_TOKEN_HINT)
    now = now_text(s)
    if row.expires_at is not None and row.expires_at <= now:
        raise NotAuthenticatedError(f"token {row.id} expired at {row.expires_at}",
                                    hint=_NEW_TOKEN_HINT)
    identity = Identity(row.id, row.owner, tuple(parse_scope(t) for t in json.loads(row.scopes_json)),
                        parse_ts(row.expires_at) if row.expires_at else None)
    due = row.last_used_at is None or \
        parse_ts(row.last_used_at) <= parse_ts(now) - TOUCH_INTERVAL
    return identity, due


def touch(s: Session, token_id: int) -> None:
    """Set ``last_used_at`` to now unless another request did within :data:`TOUCH_INTERVAL`
    (a conditional update: concurrent requests on several replicas write once between them)."""
    now = now_text(s)
    cutoff = format_ts(parse_ts(now) - TOUCH_INTERVAL)
    s.execute(update(TokenRow).where(TokenRow.id == token_id,
                                     or_(TokenRow.last_used_at.is_(None),
                                         TokenRow.last_used_at <= cutoff))
              .values(last_used_at=now))


def blob_models(s: Session, digests: Sequence[str]) -> dict[str, set[str]]:
    """``digest -> names of the models with a version that references it``, for the digests
    some version references (others are absent)."""
    found: dict[str, set[str]] = {}
    for among in in_batches(s, VersionBlobRow.blob_digest, sorted(set(digests))):
        for digest, name in s.execute(
                select(VersionBlobRow.blob_digest, ModelRow.name).distinct()
                .join(VersionRow, VersionRow.id == VersionBlobRow.version_id)
                .join(ModelRow, ModelRow.id == VersionRow.model_id)
                .where(among)):
            found.setdefault(digest, set()).add(name)
    return found
