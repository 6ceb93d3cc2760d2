"""Frozen records the metadata store returns. Plain values: no session, no lazy loading.

    >>> v = VersionRecord(name="bert", number=3, digest="sha256:" + "0" * 64, size=10,
    ...                   status="active", status_reason=None, created_at=None, created_by="ana")
    >>> v.ref
    'bert@3'
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..format.times import iso_utc

if TYPE_CHECKING:
    from ..format.packs import PackIndex

__all__ = [
    "ModelRecord", "VersionRecord", "AliasRecord", "SignatureRecord", "LineageEdge",
    "LineageNode", "AuditEvent", "PendingPush", "TokenRecord", "AttestationRecord",
    "WebhookRecord", "WebhookAttempt", "WebhookDelivery", "SignedAuditHead", "OciArtifactRecord",
    "PublishRequest", "GcResult",
]


@dataclass(frozen=True)
class ModelRecord:
    """A model: how many versions, the highest number, and its aliases (alias -> number)."""

    name: str
    version_count: int
    latest: int | None
    aliases: dict[str, int] = field(default_factory=dict)
    created_at: datetime | None = None


@dataclass(frozen=True)
class VersionRecord:
    """An immutable version. ``manifest_json`` is None in listings (use ``get_manifest``)."""

    name: str
    number: int
    digest: str
    size: int
    status: str
    status_reason: str | None
    created_at: datetime | None
    created_by: str
    metadata: dict[str, Any] = field(default_factory=dict)
    aliases: list[str] = field(default_factory=list)
    manifest_json: str | None = None
    build: dict[str, Any] | None = None
    environment: dict[str, Any] | None = None
    status_by: str | None = None
    status_at: datetime | None = None
    #: where its small chunks are stored (``format.packs``; None: every chunk is a blob of its
    #: own); like ``manifest_json``, only set when the version is fetched, not in listings
    packs_json: str | None = None

    @property
    def ref(self) -> str:
        """The pinned-by-number ref text, e.g. ``bert@3``."""
        return f"{self.name}@{self.number}"

    @property
    def is_yanked(self) -> bool:
        return self.status == "yanked"


@dataclass(frozen=True)
class AliasRecord:
    """Where an alias points now (``number``) and who moved it last."""

    name: str
    alias: str
    number: int
    digest: str
    updated_at: datetime
    updated_by: str


@dataclass(frozen=True)
class SignatureRecord:
    """A detached signature (base64) over a version's ``digest``; ``key_id`` is
    ``sha256:<hex>`` of the raw public key.

        >>> SignatureRecord("sha256:" + "1" * 64, "ed25519", "c2ln", digest="sha256:...").to_json()
        {'algorithm': 'ed25519', 'key_id': 'sha256:111...', 'digest': 'sha256:...', 'signature': 'c2ln'}
    """

    key_id: str
    algorithm: str
    signature: str
    digest: str | None = None
    created_at: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        """The entry as written in a bundle's ``signatures.json``."""
        return {"algorithm": self.algorithm, "key_id": self.key_id, "digest": self.digest,
                "signature": self.signature}


@dataclass(frozen=True)
class LineageEdge:
    """One lineage fact about a version.

    ``kind`` is parent|dataset|run|commit|code. For ``parent`` the ``value`` is the parent's ref
    as resolved (``bert@1``) and ``digest`` its version digest; for ``dataset`` the value is the
    URI and ``digest`` the optional dataset digest.

        >>> LineageEdge("dataset", "s3://data/train", "sha256:" + "a" * 64).kind
        'dataset'
    """

    kind: str
    value: str
    digest: str | None = None
    extra: dict[str, Any] | None = None


@dataclass(frozen=True)
class LineageNode:
    """A version met in a lineage walk: ``depth`` 0 is where the walk started (or a direct
    dataset match), 1 its parents/children, and so on. ``edges`` are all its recorded edges;
    parent edges carry the parent's digest, which links nodes into a graph. ``created_by`` and
    ``environment`` (python/torch/CUDA) say who published it from where."""

    name: str
    number: int
    digest: str
    status: str
    depth: int
    edges: list[LineageEdge] = field(default_factory=list)
    aliases: list[str] = field(default_factory=list)
    created_by: str | None = None
    created_at: datetime | None = None
    environment: dict[str, Any] | None = None

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.number}"

    @property
    def parents(self) -> list[str]:
        """Digests of this version's parent versions."""
        return [e.digest for e in self.edges if e.kind == "parent" and e.digest]


@dataclass(frozen=True)
class AuditEvent:
    """One entry of the append-only, hash-chained audit log."""

    seq: int
    ts: datetime
    actor: str
    host: str
    action: str
    model: str | None
    version: int | None
    digest: str | None
    ref: str | None
    details: dict[str, Any]
    prev_hash: str
    hash: str


@dataclass(frozen=True)
class PendingPush:
    """A publish in progress: its blobs must survive gc until it ends or stops heartbeating.
    ``uploaded``: the blobs of ``blobs`` whose bytes its holder sent to a registry server that
    keeps them in a local directory (the server saw them arrive); ``model``: the model it pushes,
    when it said (see ``registry.server.ownership``)."""

    id: int
    host: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    blobs: list[str]
    uploaded: list[str] = field(default_factory=list)
    model: str | None = None


@dataclass(frozen=True)
class TokenRecord:
    """An API token as listed: never its secret (the store keeps only the secret's hash).
    ``scopes`` are canonical scope texts (``registry.access.scopes``)."""

    id: int
    owner: str
    scopes: list[str]
    created_at: datetime
    created_by: str
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    last_used_at: datetime | None = None

    def state(self, now: datetime) -> str:
        """``revoked``, ``expired`` (at ``now``) or ``active``."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"


@dataclass(frozen=True)
class OciArtifactRecord:
    """A push of a version to an OCI registry (``pt2reg oci push``): ``location`` is
    ``HOST/REPOSITORY``, ``tag`` the tag it was pushed under (None: by digest alone), and
    ``manifest_digest`` the OCI manifest's digest, what ``oci pull`` pins."""

    location: str
    tag: str | None
    manifest_digest: str
    pushed_at: datetime
    pushed_by: str

    @property
    def reference(self) -> str:
        """``HOST/REPO@sha256:...``: the pinned OCI reference."""
        return f"{self.location}@{self.manifest_digest}"

    def to_json(self) -> dict[str, Any]:
        return {"location": self.location, "tag": self.tag, "manifest_digest": self.manifest_digest,
                "reference": self.reference, "pushed_at": iso_utc(self.pushed_at), "pushed_by": self.pushed_by}


@dataclass(frozen=True)
class AttestationRecord:
    """A conformance attestation of one version: ``verify`` and its golden samples run on a
    target (``target``: the probed torch, device, compute capability, CUDA), per-output errors
    in ``results``, the verdict ``passed``, who recorded it and when. ``key_id``/``signature``:
    the Ed25519 signature over ``registry.access.policy.attestation_digest`` of its statement,
    verified when recorded (None: unsigned)."""

    id: int
    name: str
    number: int
    digest: str
    label: str
    passed: bool
    device: str
    target: dict
    results: list
    created_at: datetime
    created_by: str
    error: str | None = None
    key_id: str | None = None
    signature: str | None = None


@dataclass(frozen=True)
class WebhookRecord:
    """A webhook subscription as listed: never its secret. ``events``: the event types it
    receives; ``model_glob``: only events about matching models (None: every model)."""

    id: int
    url: str
    events: list[str]
    model_glob: str | None
    created_at: datetime
    created_by: str


@dataclass(frozen=True)
class WebhookAttempt:
    """One delivery attempt: ``status_code`` None when no response came (``error`` says why);
    ``response_excerpt``: at most the first few hundred characters of the response body."""

    at: datetime
    replica: str
    ok: bool
    duration_ms: int
    status_code: int | None = None
    error: str | None = None
    response_excerpt: str | None = None


@dataclass(frozen=True)
class WebhookDelivery:
    """One event for one webhook (the outbox row) and its attempts, oldest first.
    ``status``: pending | failing | delivered | dead."""

    id: int
    webhook_id: int
    message_id: str
    event_type: str
    audit_seq: int
    status: str
    attempts: int
    created_at: datetime
    next_attempt_at: datetime | None = None
    delivered_at: datetime | None = None
    history: list[WebhookAttempt] = field(default_factory=list)


@dataclass(frozen=True)
class SignedAuditHead:
    """The server's Ed25519 ``signature`` (base64) over the audit head ``(seq, hash)`` at
    ``signed_at`` (``registry.server.audit_head.head_message``)."""

    seq: int
    hash: str
    signed_at: datetime
    key_id: str
    signature: str


@dataclass(frozen=True)
class PublishRequest:
    """What a publish records: one version of ``name`` with its blobs, aliases, lineage,
    signatures and pack index. The same value goes to every ``VersionStore.publish`` (SQL, or a
    server's ``/v1/publish``, whose route builds one from the body); who publishes (``actor``,
    ``host``) and the claim checks are arguments of the call, not of the content.

    ``blobs``: ``(digest, size)`` of each stored blob; ``lineage``: ``LineageEdge`` records (or
    mappings with their keys); ``signatures``: ``signatures.json`` entries; ``metadata``,
    ``build`` and ``environment``: informational JSON; ``packs_json`` the pack index as JSON text,
    or ``packs`` the same already parsed (``format.packs``); ``claim``: the pending-push claim
    the upload held (``begin_pending``), which must still be alive when the version is recorded.

        >>> PublishRequest("bert", "sha256:" + "a" * 64, "{}", 10, (("sha256:" + "b" * 64, 10),),
        ...                aliases=("prod",)).aliases
        ('prod',)
    """

    name: str
    digest: str
    manifest_json: str
    size: int
    blobs: Iterable[tuple[str, int]] = ()
    aliases: Iterable[str] = ()
    metadata: Mapping[str, Any] | None = None
    build: Mapping[str, Any] | None = None
    lineage: Iterable[Any] = ()
    signatures: Iterable[Any] = ()
    environment: Mapping[str, Any] | None = None
    ref_for_audit: str | None = None
    claim: int | None = None
    packs_json: str | None = None
    packs: PackIndex | None = None

    def index_json(self) -> str | None:
        """The pack index as JSON text (``packs`` written out, else ``packs_json``)."""
        return self.packs.to_json() if self.packs else self.packs_json


@dataclass(frozen=True)
class GcResult:
    """What a garbage collection deleted (``(digest, size)``), kept for live claims, aborted
    (abandoned uploads) and released (claims of dead pushes)."""

    deleted: list[tuple[str, int]] = field(default_factory=list)
    kept_claimed: int = 0
    dry_run: bool = False
    aborted_uploads: list[str] = field(default_factory=list)   # digests of abandoned uploads
    released_claims: int = 0                                     # claims of dead pushes

    @property
    def reclaimed_bytes(self) -> int:
        return sum(size for _, size in self.deleted)
