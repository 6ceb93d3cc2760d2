"""The signed audit head: the server's Ed25519 key signs the newest audit event's hash.

The key is ``pt2reg serve --signing-key FILE`` (``$PT2REG_SIGNING_KEY``), else
``HOME/server-signing.key``, generated (0600) on first start. Every replica of one registry
uses the same key. A background loop (:class:`registry.server.webhooks.Background`) calls
:func:`sign_newest` every ``PT2REG_AUDIT_SIGN_INTERVAL`` seconds (default 1): when the chain
has grown, the newest ``(seq, hash)`` is signed with the database's time and stored in
``audit_heads``, whichever path (server or direct database access) made the change.

``GET /v1/keys`` (public) gives the public key; ``GET /v1/audit/head`` the newest signed head
and ``GET /v1/audit/heads`` all of them (audit:read); ``pt2reg audit --verify --server-key PUB``
checks the stored chain against them (``registry.access.server_key.check_heads``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy import select

from ..access import server_key
from ..access.scopes import AUDIT_READ
from ..errors import NotFoundError
from ..remote.wire import encode
from ..store import outbox
from ..store.audit_chain import event_content, event_hash, format_ts
from ..store.engine import run_transaction
from ..store.orm import AuditEventRow, now_text
from .auth import Call, on_scope, public

__all__ = ["ServerKey", "load_key", "sign_newest", "router"]

log = logging.getLogger("registry.server.audit_head")
router = APIRouter()


@dataclass
class ServerKey:
    """The server's signing key, its id and public PEM, and the AES key for webhook secrets."""

    private: Any
    path: Path
    key_id: str = ""
    public_pem: str = ""
    secrets_key: bytes = b""
    last_signed: tuple[int, str] | None = field(default=None)
    refused: str | None = field(default=None)

    def __post_init__(self) -> None:
        self.key_id = server_key.server_key_id(self.private)
        self.public_pem = server_key.public_pem(self.private)
        self.secrets_key = server_key.secrets_key(self.private)


def load_key(home: Path, explicit: str | None = None) -> ServerKey:
    path, may_create = server_key.key_path(home, explicit)
    key = server_key.load_or_create(path, may_create)
    return ServerKey(private=key, path=path)


def _extends(s: Any, since: tuple[int, str] | None) -> str | None:
    """None when the stored chain still carries ``since`` (a head signed before) and every
    later event links to it and hashes right; else why not (then nothing is signed: signing a
    rewritten chain would vouch for the rewrite)."""
    if since is None:
        return None
    rows = s.scalars(select(AuditEventRow).where(AuditEventRow.seq >= since[0])
                     .order_by(AuditEventRow.seq)).all()
    if not rows or rows[0].seq != since[0] or rows[0].hash != since[1]:
        return f"event {since[0]} no longer has the hash this server signed"
    prev = rows[0]
    for row in rows[1:]:
        if (row.seq != prev.seq + 1 or row.prev_hash != prev.hash
                or event_hash(event_content(row.to_chain_dict()), row.prev_hash) != row.hash):
            return f"event {row.seq} does not extend the chain this server signed"
        prev = row
    return None


def sign_newest(engine: Any, key: ServerKey) -> dict[str, Any] | None:
    """Sign and store the newest audit head when it changed since this key last signed it,
    and only when the chain since the newest head this key signed (stored, or remembered by
    this process should the stored ones be deleted) is intact; the signed head, or None."""
    def work(s: Any) -> dict[str, Any] | None:
        newest = outbox.newest_event(s)
        if newest is None or newest == key.last_signed:
            return None
        stored = outbox.heads(s, newest_only=True, key_id=key.key_id)
        for since in {(h.seq, h.hash) for h in stored} | ({key.last_signed} if key.last_signed else set()):
            problem = _extends(s, since)
            if problem is not None:
                if key.refused != problem:
                    log.error("not signing the audit head: %s (the log was rewritten; run "
                              "`pt2reg audit --verify --server-key`)", problem)
                key.refused = problem
                return None
        signed = server_key.sign_head(key.private, newest[0], newest[1], now_text(s))
        return signed if outbox.add_head(s, signed) else None
    signed = run_transaction(engine, work, write=True)
    if signed is not None:
        key.last_signed = (signed["seq"], signed["hash"])
        log.debug("signed audit head %s", signed["seq"])
    return signed


def _key(request: Request) -> ServerKey:
    return request.app.state.server_key


@router.get("/v1/keys", tags=["audit"])
def keys(request: Request, call: Call = public()) -> dict[str, Any]:
    """The public key that signs this registry's audit heads (PEM), and its id."""
    key = _key(request)
    return {"keys": [{"key_id": key.key_id, "algorithm": "ed25519", "public_key": key.public_pem,
                      "use": "audit-head"}]}


@router.get("/v1/audit/head", tags=["audit"])
def audit_head(request: Request, call: Call = on_scope(AUDIT_READ)) -> Any:
    """The newest signed audit head."""
    found = request.app.state.registry.meta.audit_heads(newest_only=True)
    if not found:
        raise NotFoundError("no signed audit head yet", hint="the server signs within seconds of a change")
    head = found[0]
    return {**encode(head), "signed_at": format_ts(head.signed_at)}


@router.get("/v1/audit/heads", tags=["audit"])
def audit_heads(request: Request, call: Call = on_scope(AUDIT_READ)) -> Any:
    """Every signed audit head, oldest first (``audit --verify --server-key`` checks them all)."""
    return {"heads": [{**encode(h), "signed_at": format_ts(h.signed_at)}
                      for h in request.app.state.registry.meta.audit_heads()]}
