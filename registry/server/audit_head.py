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

import json
import logging
import os
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

__all__ = ["ServerKey", "load_key", "sign_newest", "served_head", "router"]

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
    #: the newest head this server signed, as signed, and the file under the server's home
    #: that keeps it across restarts: the database's writers cannot delete it, so a rewrite
    #: whose signed heads were deleted too is still refused (and still shown to verifiers)
    last_head: dict[str, Any] | None = field(default=None)
    head_file: Path | None = field(default=None)
    #: which database the remembered head belongs to (set by the first :func:`sign_newest`;
    #: until then the remembered head is neither trusted nor served)
    db_id: str | None = field(default=None)
    recalled_db: str | None = field(default=None)

    def __post_init__(self) -> None:
        self.key_id = server_key.server_key_id(self.private)
        self.public_pem = server_key.public_pem(self.private)
        self.secrets_key = server_key.secrets_key(self.private)


HEAD_FILE = "audit-head.json"


def load_key(home: Path, explicit: str | None = None) -> ServerKey:
    path, may_create = server_key.key_path(home, explicit)
    key = ServerKey(private=server_key.load_or_create(path, may_create), path=path,
                    head_file=Path(home) / HEAD_FILE)
    _recall(key)
    return key


def _recall(key: ServerKey) -> None:
    """Load the newest head this key signed from ``key.head_file`` (ignored unless its
    signature verifies under this very key)."""
    from ..store.audit_chain import parse_ts
    from ..store.records import SignedAuditHead

    if key.head_file is None:
        return
    try:
        kept = json.loads(key.head_file.read_text("utf-8"))
        head, db = kept["head"], str(kept["db"])
        record = SignedAuditHead(seq=int(head["seq"]), hash=str(head["hash"]),
                                 signed_at=parse_ts(head["signed_at"]), key_id=str(head["key_id"]),
                                 signature=str(head["signature"]))
    except FileNotFoundError:
        return
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring %s: %s", key.head_file, exc)
        return
    if server_key.check_heads([record], {record.seq: record.hash}, key.public_pem.encode("ascii"),
                              ts_text=lambda _: head["signed_at"]) is not None:
        log.warning("ignoring %s: not a head signed by this server's key", key.head_file)
        return
    key.last_head, key.last_signed, key.recalled_db = head, (record.seq, record.hash), db


def _bind(key: ServerKey, engine: Any) -> None:
    """Tie the remembered head to this database: one kept for another database (a home
    reused with a new database URL) is dropped."""
    if key.db_id is not None:
        return
    import hashlib

    url = engine.url.render_as_string(hide_password=True)
    key.db_id = hashlib.sha256(url.encode("utf-8")).hexdigest()[:32]
    if key.last_head is not None and key.recalled_db not in (None, key.db_id):
        log.warning("ignoring the audit head kept in %s: it was signed for another database",
                    key.head_file)
        key.last_head = key.last_signed = None


def served_head(key: ServerKey) -> dict[str, Any] | None:
    """The remembered head, once tied to this server's database."""
    return key.last_head if key.db_id is not None else None


def _remember(key: ServerKey, signed: dict[str, Any]) -> None:
    key.last_head, key.last_signed = signed, (signed["seq"], signed["hash"])
    if key.head_file is None:
        return
    try:
        key.head_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = key.head_file.with_name(f"{key.head_file.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"db": key.db_id, "head": signed}, sort_keys=True), "utf-8")
        os.replace(tmp, key.head_file)
    except OSError as exc:  # memory still holds it for this process
        log.warning("cannot keep the signed audit head in %s: %s", key.head_file, exc)


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
    _bind(key, engine)

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
        _remember(key, signed)
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
    remembered = served_head(_key(request))
    if remembered is not None and (not found or found[0].seq < remembered["seq"]):
        return dict(remembered)  # newer than any stored: the stored ones were deleted
    if not found:
        raise NotFoundError("no signed audit head yet", hint="the server signs within seconds of a change")
    head = found[0]
    return {**encode(head), "signed_at": format_ts(head.signed_at)}


@router.get("/v1/audit/heads", tags=["audit"])
def audit_heads(request: Request, call: Call = on_scope(AUDIT_READ)) -> Any:
    """Every signed audit head, oldest first (``audit --verify --server-key`` checks them all)."""
    heads = [{**encode(h), "signed_at": format_ts(h.signed_at)}
             for h in request.app.state.registry.meta.audit_heads()]
    remembered = served_head(_key(request))
    if remembered is not None and not any(
            h["seq"] == remembered["seq"] and h["signature"] == remembered["signature"] for h in heads):
        # this server signed it, the database lost it: a verifier checks the chain against it
        heads = sorted([*heads, dict(remembered)], key=lambda h: h["seq"])
    return {"heads": heads}
