"""SQLAlchemy 2.0 declarative rows of the metadata store. Schema changes go through Alembic.

Conventions, chosen so the same rows round-trip identically on SQLite and PostgreSQL:

- Timestamps are canonical UTC text (``2026-11-22T02:03:04.123456Z``, see
  :func:`registry.store.audit_chain.format_ts`): the audit hash covers them, they sort as text and
  compare with ``>=`` without per-backend datetime semantics.
- JSON values are canonical JSON text (``*_json`` columns): byte-stable, portable, hashable.
- Constraint names follow :data:`NAMING` so future migrations can refer to them on both backends.

Nothing here is visible to callers: :mod:`registry.store.sql` converts rows to the frozen
records of :mod:`registry.store.records`.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from ..digests import canonical_json
from ..errors import UsageError
from .audit_chain import format_ts, parse_ts
from .records import AuditEvent, LineageEdge, PendingPush, SignatureRecord, TokenRecord, VersionRecord

__all__ = [
    "NAMING", "Base", "ModelRow", "VersionRow", "VersionBlobRow", "VersionPackRow", "AliasRow", "SignatureRow",
    "LineageRow", "PendingPushRow", "AuditEventRow", "TokenRow", "STATUSES", "LINEAGE_KINDS", "now_text",
    "db_clock",
    "json_text", "AliasPolicyRow", "AttestationRow", "WebhookRow", "WebhookDeliveryRow",
    "WebhookAttemptRow", "AuditHeadRow", "UPLOADED", "FOR_MODEL",
]

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

STATUSES = ("active", "deprecated", "yanked")
LINEAGE_KINDS = ("parent", "dataset", "run", "commit", "code")

TS = String(32)
DIGEST = String(71)  # "sha256:" + 64 hex


def now_text(session: Any = None) -> str:
    """The current time as stored: ``2026-11-22T02:03:04.123456Z``.

    With a session, the *database's* clock (one reading per transaction, cached on the
    session), so a client whose clock is wrong cannot stamp rows or audit events with its own
    time: PostgreSQL's ``clock_timestamp()`` in UTC; SQLite's ``'now'`` (millisecond
    precision; SQLite has no server, so that is the clock of the host running the process).
    Without a session, this process's clock (only for callers outside any transaction).
    """
    if session is None:
        return format_ts(datetime.now(timezone.utc))
    cached = session.info.get("pt2reg_now")
    if cached is None:
        cached = session.info["pt2reg_now"] = db_clock(session)
    return cached


def db_clock(session: Any) -> str:
    """One reading of the database server's clock, as canonical UTC text."""
    from sqlalchemy import text

    if session.get_bind().dialect.name == "postgresql":
        return session.execute(text(
            "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', "
            "'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')")).scalar_one()
    raw = session.execute(text("SELECT strftime('%Y-%m-%dT%H:%M:%f', 'now')")).scalar_one()
    return format_ts(datetime.fromisoformat(raw).replace(tzinfo=timezone.utc))


def json_text(value: Any, what: str) -> str:
    """A value as stored in a ``*_json`` column; UsageError naming ``what`` if not JSON."""
    try:
        return canonical_json(value).decode("utf-8")
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{what} is not JSON-serializable: {exc}") from exc


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class ModelRow(Base):
    __tablename__ = "models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[str] = mapped_column(TS)


class VersionRow(Base):
    __tablename__ = "versions"
    __table_args__ = (
        UniqueConstraint("model_id", "number"),
        UniqueConstraint("model_id", "digest"),
        CheckConstraint("status IN ('active', 'deprecated', 'yanked')", name="status"),
        CheckConstraint("number >= 1", name="number"),
        # Parent edges and digest pins across models look versions up by digest alone.
        Index(None, "digest"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"))
    number: Mapped[int] = mapped_column(Integer)
    digest: Mapped[str] = mapped_column(DIGEST)
    manifest_json: Mapped[str] = mapped_column(Text)
    size: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16))
    status_reason: Mapped[str | None] = mapped_column(Text)
    status_by: Mapped[str | None] = mapped_column(String(256))
    status_at: Mapped[str | None] = mapped_column(TS)
    created_at: Mapped[str] = mapped_column(TS)
    created_by: Mapped[str] = mapped_column(String(256))
    build_json: Mapped[str | None] = mapped_column(Text)
    environment_json: Mapped[str | None] = mapped_column(Text)
    metadata_json: Mapped[str] = mapped_column(Text)

    def to_record(self, name: str, aliases: list[str], *, with_manifest: bool = True,
                  packs_json: str | None = None) -> VersionRecord:
        return VersionRecord(
            name=name, number=self.number, digest=self.digest, size=self.size,
            status=self.status, status_reason=self.status_reason,
            created_at=parse_ts(self.created_at), created_by=self.created_by,
            metadata=json.loads(self.metadata_json), aliases=sorted(aliases),
            manifest_json=self.manifest_json if with_manifest else None,
            packs_json=packs_json if with_manifest else None,
            build=json.loads(self.build_json) if self.build_json else None,
            environment=json.loads(self.environment_json) if self.environment_json else None,
            status_by=self.status_by,
            status_at=parse_ts(self.status_at) if self.status_at else None,
        )


class VersionBlobRow(Base):
    __tablename__ = "version_blobs"
    # gc asks "is this blob referenced by any version" by digest alone.
    __table_args__ = (Index(None, "blob_digest"),)

    version_id: Mapped[int] = mapped_column(ForeignKey("versions.id"),
                                            primary_key=True)
    blob_digest: Mapped[str] = mapped_column(DIGEST, primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)


class VersionPackRow(Base):
    """A version's pack index (``format.packs``): where its small chunks lie inside pack blobs.
    No row: every chunk of the version is a blob of its own (all versions pushed before packs)."""

    __tablename__ = "version_packs"

    version_id: Mapped[int] = mapped_column(ForeignKey("versions.id"), primary_key=True)
    packs_json: Mapped[str] = mapped_column(Text)


class AliasRow(Base):
    __tablename__ = "aliases"
    __table_args__ = (UniqueConstraint("model_id", "alias"), Index(None, "version_id"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id"))
    alias: Mapped[str] = mapped_column(String(64))
    version_id: Mapped[int] = mapped_column(ForeignKey("versions.id"))
    updated_at: Mapped[str] = mapped_column(TS)
    updated_by: Mapped[str] = mapped_column(String(256))


class SignatureRow(Base):
    __tablename__ = "signatures"
    __table_args__ = (UniqueConstraint("version_id", "key_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("versions.id"))
    key_id: Mapped[str] = mapped_column(DIGEST)  # "sha256:<hex of the raw public key>"
    algorithm: Mapped[str] = mapped_column(String(16))
    signature: Mapped[str] = mapped_column(Text)
    created_at: Mapped[str] = mapped_column(TS)

    def to_record(self, digest: str) -> SignatureRecord:
        return SignatureRecord(self.key_id, self.algorithm, self.signature, digest=digest,
                               created_at=parse_ts(self.created_at))


class LineageRow(Base):
    __tablename__ = "lineage_edges"
    __table_args__ = (
        CheckConstraint("kind IN ('parent', 'dataset', 'run', 'commit', 'code')", name="kind"),
        Index(None, "version_id"),
        Index(None, "kind", "value"),  # "which versions came from dataset X"
        Index(None, "kind", "digest"),  # "which versions have parent D" (descendants)
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("versions.id"))
    kind: Mapped[str] = mapped_column(String(16))
    value: Mapped[str] = mapped_column(Text)
    digest: Mapped[str | None] = mapped_column(DIGEST)
    extra_json: Mapped[str | None] = mapped_column(Text)

    def to_record(self) -> LineageEdge:
        extra = json.loads(self.extra_json) if self.extra_json else None
        return LineageEdge(self.kind, self.value, self.digest, extra)


#: how ``blobs_json`` of a claim notes, beside the digests it claims, a blob its holder uploaded
#: through the server (``uploaded:sha256:...``) and the model it pushes (``model:team/bert``): a
#: server older than these reads each as one more claimed name that no blob has, so it keeps
#: working the same
UPLOADED = "uploaded:"
FOR_MODEL = "model:"


class PendingPushRow(Base):
    __tablename__ = "pending_pushes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host: Mapped[str] = mapped_column(String(256))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[str] = mapped_column(TS)
    heartbeat_at: Mapped[str] = mapped_column(TS)
    blobs_json: Mapped[str] = mapped_column(Text)

    def to_record(self) -> PendingPush:
        entries = json.loads(self.blobs_json)
        models = [e[len(FOR_MODEL):] for e in entries if e.startswith(FOR_MODEL)]
        return PendingPush(self.id, self.host, self.pid, parse_ts(self.started_at),
                           parse_ts(self.heartbeat_at), [e for e in entries if e.startswith("sha256:")],
                           uploaded=[e[len(UPLOADED):] for e in entries if e.startswith(UPLOADED)],
                           model=models[0] if models else None)


class AuditEventRow(Base):
    __tablename__ = "audit_events"
    __table_args__ = (Index(None, "model", "seq"), Index(None, "ts"))

    # Assigned by the store (last + 1) under the audit lock, never by the database.
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    ts: Mapped[str] = mapped_column(TS)
    actor: Mapped[str] = mapped_column(String(256))
    host: Mapped[str] = mapped_column(String(256))
    action: Mapped[str] = mapped_column(String(32))
    model: Mapped[str | None] = mapped_column(String(128))
    version: Mapped[int | None] = mapped_column(Integer)
    digest: Mapped[str | None] = mapped_column(DIGEST)
    ref: Mapped[str | None] = mapped_column(Text)
    details_json: Mapped[str] = mapped_column(Text)
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64), unique=True)

    def to_record(self) -> AuditEvent:
        return AuditEvent(self.seq, parse_ts(self.ts), self.actor, self.host, self.action,
                          self.model, self.version, self.digest, self.ref,
                          json.loads(self.details_json), self.prev_hash, self.hash)

    def to_chain_dict(self) -> dict:
        """The stored values verbatim, for :func:`registry.store.audit_chain.verify_chain`."""
        return {"seq": self.seq, "ts": self.ts, "actor": self.actor, "host": self.host,
                "action": self.action, "model": self.model, "version": self.version,
                "digest": self.digest, "ref": self.ref, "details": self.details_json,
                "prev_hash": self.prev_hash, "hash": self.hash}


class TokenRow(Base):
    """An API token. Only the SHA-256 of its secret is stored (``secret_hash``, unique: the
    server finds a request's token by it); the secret itself is shown once at creation."""

    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner: Mapped[str] = mapped_column(String(64))
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[str] = mapped_column(TS)
    created_by: Mapped[str] = mapped_column(String(256))
    expires_at: Mapped[str | None] = mapped_column(TS)
    revoked_at: Mapped[str | None] = mapped_column(TS)
    last_used_at: Mapped[str | None] = mapped_column(TS)

    def to_record(self) -> TokenRecord:
        return TokenRecord(
            id=self.id, owner=self.owner, scopes=list(json.loads(self.scopes_json)),
            created_at=parse_ts(self.created_at), created_by=self.created_by,
            expires_at=parse_ts(self.expires_at) if self.expires_at else None,
            revoked_at=parse_ts(self.revoked_at) if self.revoked_at else None,
            last_used_at=parse_ts(self.last_used_at) if self.last_used_at else None)


class AliasPolicyRow(Base):
    """The rules on one alias of one model (``registry.access.policy``). Keyed by the model's
    *name*, not its row: a policy may be set before the model's first publish (which may then
    not create the alias against it)."""

    __tablename__ = "alias_policies"
    __table_args__ = (UniqueConstraint("model", "alias"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(128))
    alias: Mapped[str] = mapped_column(String(64))
    role_scope: Mapped[str | None] = mapped_column(String(16))
    signers_json: Mapped[str] = mapped_column(Text)  # [[key id, public key PEM], ...]
    attestations_json: Mapped[str] = mapped_column(Text)  # [label, ...]
    immutable: Mapped[bool] = mapped_column(Boolean)
    updated_at: Mapped[str] = mapped_column(TS)
    updated_by: Mapped[str] = mapped_column(String(256))


class OciArtifactRow(Base):
    """A push of a version to an OCI registry (``registry.store.records.OciArtifactRecord``)."""

    __tablename__ = "oci_artifacts"
    __table_args__ = (Index(None, "location"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("versions.id"), index=True)
    location: Mapped[str] = mapped_column(String(255))
    tag: Mapped[str | None] = mapped_column(String(128))
    manifest_digest: Mapped[str] = mapped_column(DIGEST)
    pushed_at: Mapped[str] = mapped_column(TS)
    pushed_by: Mapped[str] = mapped_column(String(256))


class AttestationRow(Base):
    """One conformance attestation of a version (``registry.store.records.AttestationRecord``);
    ``public_key`` (PEM) is kept with a signed one so it can be checked again later."""

    __tablename__ = "attestations"
    __table_args__ = (Index(None, "version_id", "label"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("versions.id"))
    label: Mapped[str] = mapped_column(String(64))
    passed: Mapped[bool] = mapped_column(Boolean)
    device: Mapped[str] = mapped_column(String(64))
    target_json: Mapped[str] = mapped_column(Text)
    results_json: Mapped[str] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    key_id: Mapped[str | None] = mapped_column(DIGEST)
    signature: Mapped[str | None] = mapped_column(Text)
    public_key: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[str] = mapped_column(TS)
    created_by: Mapped[str] = mapped_column(String(256))


class WebhookRow(Base):
    """A webhook subscription (``registry.store.outbox``); ``secret_enc`` is the secret
    encrypted under a key derived from the server's signing key (``key_id`` names that key)."""

    __tablename__ = "webhooks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    url: Mapped[str] = mapped_column(Text)
    events_json: Mapped[str] = mapped_column(Text)  # ["alias.moved", ...]
    model_glob: Mapped[str | None] = mapped_column(String(128))
    secret_enc: Mapped[str] = mapped_column(Text)
    key_id: Mapped[str] = mapped_column(DIGEST)
    created_at: Mapped[str] = mapped_column(TS)
    created_by: Mapped[str] = mapped_column(String(256))


class WebhookDeliveryRow(Base):
    """One event for one webhook: the outbox row, written with the audit event it reports.
    ``status``: pending | failing (an attempt failed; retried at ``next_attempt_at``) |
    delivered | dead (attempts exhausted; ``webhook redeliver`` revives it)."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (UniqueConstraint("message_id"), Index(None, "status", "next_attempt_at"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    webhook_id: Mapped[int] = mapped_column(Integer)
    message_id: Mapped[str] = mapped_column(String(64))
    event_type: Mapped[str] = mapped_column(String(64))
    audit_seq: Mapped[int] = mapped_column(Integer)
    payload_json: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer)
    next_attempt_at: Mapped[str] = mapped_column(TS)
    claimed_by: Mapped[str | None] = mapped_column(String(128))
    claimed_until: Mapped[str | None] = mapped_column(TS)
    created_at: Mapped[str] = mapped_column(TS)
    delivered_at: Mapped[str | None] = mapped_column(TS)


class WebhookAttemptRow(Base):
    """One delivery attempt: HTTP status (None: no response), error, a short response excerpt."""

    __tablename__ = "webhook_attempts"
    __table_args__ = (Index(None, "delivery_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    delivery_id: Mapped[int] = mapped_column(Integer)
    at: Mapped[str] = mapped_column(TS)
    replica: Mapped[str] = mapped_column(String(128))
    status_code: Mapped[int | None] = mapped_column(Integer)
    ok: Mapped[bool] = mapped_column(Boolean)
    error: Mapped[str | None] = mapped_column(Text)
    response_excerpt: Mapped[str | None] = mapped_column(Text)
    duration_ms: Mapped[int] = mapped_column(Integer)


class AuditHeadRow(Base):
    """An audit chain head (``seq``, ``hash``) the server signed with its Ed25519 key at
    ``signed_at`` (``registry.server.audit_head``)."""

    __tablename__ = "audit_heads"
    __table_args__ = (UniqueConstraint("seq", "key_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(Integer)
    hash: Mapped[str] = mapped_column(String(64))
    signed_at: Mapped[str] = mapped_column(TS)
    key_id: Mapped[str] = mapped_column(DIGEST)
    signature: Mapped[str] = mapped_column(Text)
