"""The interfaces ``Registry`` reaches its storage through: the seam a remote client fills.

``Registry`` holds a ``MetadataStore`` and a ``BlobStore`` (``registry.blobs``:
content-addressed bytes). ``MetadataStore`` is a small composite of one port per concern:

==================  ==========================================================================
``VersionStore``    publish, resolve, list, status, aliases, signatures, lineage
``PushStore``       pending-push claims, chunk lookups, garbage collection
``AuditLog``        the hash-chained audit events and the server's signed heads
``AccessStore``     API tokens, and who the store takes this client for
``GovernanceStore`` alias policies and attestations
``WebhookStore``    webhook subscriptions and their deliveries
``OciArtifacts``    where versions were pushed as OCI artifacts
==================  ==========================================================================

Two implementations fill every port: ``registry.store.SqlMetadataStore`` (SQLite/PostgreSQL,
one class per concern in ``registry.store.sql``) and ``registry.remote.HttpMetadataStore`` (a
registry server's ``/v1`` routes, split the same way); ``tests/contract`` runs the same cases
against both. ``Registry``, the CLI and ``registry.load`` work unchanged over either::

    >>> reg = Registry(meta=HttpMetadataStore(client), blobs=HttpBlobStore(client))   # doctest: +SKIP

What differs between them is declared, never probed: ``PushStore.extends_claims`` (a claim can
grow while a push uploads), ``PushStore.gc`` (runs here or on the server, one signature),
``locate_chunks``/``recorded_blobs`` returning None (the store cannot say), and
``AccessStore.whoami`` returning None (direct database access, no token).

All are structural (``typing.Protocol``): an implementation needs no base class. Records
cross the seam as the frozen dataclasses of ``registry.store.records``, never as rows or
sessions. Every write is one transaction and audited; errors are ``RegistryError`` subclasses
(NotFoundError, ConflictError, StoreError, ...), never a backend's own exceptions. Every write
takes ``audit_details``: JSON values added to its audit events' details (the server records
the token id and ``via``); a key the store itself records is a UsageError.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..blobs.base import BlobStore, PackWriter
from ..store.records import GcResult, PublishRequest

if TYPE_CHECKING:  # records only: importing the store package would load SQLAlchemy
    from ..access.policy import AliasPolicy
    from ..access.scopes import Identity
    from ..format.packs import ChunkLocation
    from ..refs import Ref
    from ..store.audit_chain import ChainVerdict
    from ..store.records import (
        AliasRecord,
        AttestationRecord,
        AuditEvent,
        LineageNode,
        ModelRecord,
        OciArtifactRecord,
        SignatureRecord,
        SignedAuditHead,
        TokenRecord,
        VersionRecord,
        WebhookDelivery,
        WebhookRecord,
    )

__all__ = ["MetadataStore", "VersionStore", "PushStore", "AuditLog", "AccessStore", "GovernanceStore",
           "WebhookStore", "OciArtifacts", "BlobStore", "PackWriter", "PublishRequest", "GcResult"]

#: JSON values a write adds to its audit events (the server: the token id, ``via``)
AuditDetails = Mapping[str, Any]


@runtime_checkable
class VersionStore(Protocol):
    """Models and their immutable versions: publish, resolve, list, lifecycle, lineage."""

    def publish(self, request: PublishRequest, *, actor: str, host: str,
                missing_blobs: Callable[[list[str]], list[str]] | None = None,
                audit_details: AuditDetails | None = None) -> tuple[VersionRecord, bool]:
        """Record ``request`` (a version with its blobs, lineage, signatures, aliases and pack
        index): ``(version, created)``; the same digest again returns the existing version.
        ``missing_blobs(digests)``: those the blob store lacks (a server checks its own)."""

    def resolve(self, ref: Ref) -> VersionRecord:
        """The version a ref names (latest non-yanked, number, alias or digest)."""

    def build_info(self, name: str, number: int) -> dict[str, Any] | None:
        """The build record published with a version, if any."""

    def signatures(self, name: str, number: int) -> list[SignatureRecord]:
        """Signatures recorded for a version, oldest first."""

    def add_signature(self, name: str, number: int, signature: Mapping[str, Any], *, actor: str, host: str,
                      audit_details: AuditDetails | None = None) -> SignatureRecord:
        """Record a signature of an existing version (audited ``sign``)."""

    def list_models(self) -> list[ModelRecord]:
        """Every model, by name."""

    def list_versions(self, name: str) -> list[VersionRecord]:
        """Every version of a model, by number."""

    def set_alias(self, name: str, alias: str, number: int, *, actor: str, host: str,
                  ref_for_audit: str | None = None, audit_details: AuditDetails | None = None) -> AliasRecord:
        """Point ``alias`` at ``name@number``."""

    def remove_alias(self, name: str, alias: str, *, actor: str, host: str,
                     ref_for_audit: str | None = None, audit_details: AuditDetails | None = None) -> AliasRecord:
        """Delete an alias; returns where it pointed."""

    def set_status(self, name: str, number: int, status: str, reason: str | None, *,
                   actor: str, host: str, ref_for_audit: str | None = None,
                   audit_details: AuditDetails | None = None) -> VersionRecord:
        """Deprecate, yank or restore a version."""

    def alias_at(self, name: str, alias: str, when: datetime) -> int | None:
        """The version number ``name@alias`` pointed at ``when`` (None: nowhere)."""

    def ancestors(self, name: str, number: int) -> list[LineageNode]:
        """The version and every version it derives from, nearest first."""

    def descendants(self, name: str, number: int) -> list[LineageNode]:
        """The version and every version derived from it, nearest first."""

    def versions_from_dataset(self, uri: str, *, digest: str | None = None) -> list[LineageNode]:
        """Versions trained on a dataset and everything derived from them."""


@runtime_checkable
class PushStore(Protocol):
    """What a push and gc need: claims on the blobs an upload writes, where chunks already lie,
    and the collection itself.

    ``extends_claims``: ``extend_pending`` works (the SQL store); a push then names new packs
    as it writes them and claims them then. Without it (a server client) packs are hashed
    before the upload, so the first claim names them, and ``extend_pending`` raises UsageError.
    """

    extends_claims: bool

    def begin_pending(self, blobs: Iterable[str], host: str, pid: int, *, name: str | None = None) -> int:
        """Claim the blobs a push to model ``name`` is uploading, so gc spares them; returns
        the claim id (a server refuses the claim when the token may not push to ``name``)."""

    def extend_pending(self, claim_id: int, blobs: Iterable[str]) -> bool:
        """Add blobs to a live claim; False when gc reaped it (see ``extends_claims``)."""

    def heartbeat_pending(self, claim_id: int) -> bool:
        """Refresh a claim; False when gc already reaped it."""

    def end_pending(self, claim_id: int) -> None:
        """Release a claim (idempotent)."""

    def db_now(self) -> datetime:
        """The store's clock (claims are judged by it, not by the client's)."""

    def locate_chunks(self, digests: Sequence[str], *, name: str) -> dict[str, ChunkLocation] | None:
        """Where each of ``digests`` is stored inside a pack a version of model ``name``
        references (absent: in none). None: this store keeps no packs (a server older than
        packs); a push then stores every chunk as a blob of its own."""

    def recorded_blobs(self, digests: Sequence[str]) -> set[str] | None:
        """Which of ``digests`` some version records, or None when this store cannot say (a
        remote client: the server decides what to upload)."""

    def gc(self, blobs: BlobStore, *, dry_run: bool, grace_seconds: float, actor: str, host: str,
           audit_details: AuditDetails | None = None) -> GcResult:
        """Delete blobs of ``blobs`` no version references and no live push claims, abort dead
        pushes' uploads and release their claims. The SQL store sweeps here under its gc lock;
        a server client asks the server (admin token), which sweeps its own blob store."""


@runtime_checkable
class AuditLog(Protocol):
    """The append-only, hash-chained audit log."""

    def record_event(self, action: str, *, actor: str, host: str, model: str | None = None,
                     number: int | None = None, digest: str | None = None, ref: str | None = None,
                     details: Mapping[str, Any] | None = None) -> AuditEvent:
        """Append an event that changes no state (pull, load)."""

    def events(self, model: str | None = None, since: datetime | None = None) -> list[AuditEvent]:
        """Audit events in chain order."""

    def audit_hashes(self, seqs: Sequence[int] = ()) -> tuple[tuple[int, str] | None, dict[int, str]]:
        """The newest event's ``(seq, hash)`` and the hashes of the events ``seqs``."""

    def verify_audit_chain(self) -> ChainVerdict:
        """Re-walk the chain and replay it against the registry's state."""

    def verify_version_contents(self) -> ChainVerdict | None:
        """None when every version's manifest and blob records agree with its digest."""

    def audit_heads(self, *, newest_only: bool = False) -> list[SignedAuditHead]:
        """The audit heads the server signed, oldest first."""


@runtime_checkable
class AccessStore(Protocol):
    """API tokens (only their hashes are kept) and the caller's identity."""

    def create_token(self, owner: str, scopes: Sequence[str], *, expires_at: datetime | None,
                     actor: str, host: str, audit_details: AuditDetails | None = None) -> tuple[TokenRecord, str]:
        """Create a token: ``(record, secret)``; the secret is shown this once, only its hash kept."""

    def list_tokens(self) -> list[TokenRecord]:
        """Every token, by id (never a secret)."""

    def revoke_token(self, token_id: int, *, actor: str, host: str,
                     audit_details: AuditDetails | None = None) -> TokenRecord:
        """Revoke a token now; returns it."""

    def whoami(self) -> Identity | None:
        """Who the store takes this client for: a server client's token identity
        (NotAuthenticatedError when the token is not valid); None with direct database access,
        where no token is involved."""


@runtime_checkable
class GovernanceStore(Protocol):
    """Alias policies and conformance attestations."""

    def set_policy(self, name: str, alias: str, *, role_scope: str | None = None,
                   signers: Sequence[str] = (), attestations: Sequence[str] = (),
                   immutable: bool = False, actor: str, host: str,
                   audit_details: AuditDetails | None = None) -> AliasPolicy:
        """Create or replace the policy on ``name@alias`` (``signers``: public keys, PEM text)."""

    def remove_policy(self, name: str, alias: str, *, actor: str, host: str,
                      audit_details: AuditDetails | None = None) -> AliasPolicy:
        """Delete the policy on ``name@alias``; returns it."""

    def policies(self, name: str) -> list[AliasPolicy]:
        """The alias policies of a model, by alias."""

    def record_attestation(self, name: str, number: int, *, label: str, passed: bool, device: str,
                           target: Mapping[str, Any], results: Sequence[Any], error: str | None = None,
                           signature: Mapping[str, Any] | None = None, public_key: str | None = None,
                           actor: str, host: str, audit_details: AuditDetails | None = None) -> AttestationRecord:
        """Record a conformance attestation (a signature is verified on record)."""

    def attestations(self, name: str, number: int) -> list[AttestationRecord]:
        """A version's attestations, oldest first."""


@runtime_checkable
class WebhookStore(Protocol):
    """Webhook subscriptions (secrets sealed under the server's key) and their deliveries."""

    def add_webhook(self, url: str, events: Sequence[str], model_glob: str | None, *, secret: str,
                    actor: str, host: str, audit_details: AuditDetails | None = None) -> WebhookRecord:
        """Subscribe ``url`` to ``events``; ``secret`` (``whsec_...``) is stored sealed under the
        server's key, never in the log (audited ``webhook.add``)."""

    def list_webhooks(self) -> list[WebhookRecord]:
        """Webhook subscriptions, never their secrets."""

    def remove_webhook(self, webhook_id: int, *, actor: str, host: str,
                       audit_details: AuditDetails | None = None) -> WebhookRecord:
        """Delete a subscription (audited); its undelivered deliveries are dropped."""

    def webhook_deliveries(self, *, failed: bool = False, limit: int = 200) -> list[WebhookDelivery]:
        """Newest deliveries first with every attempt."""

    def redeliver_webhook(self, delivery_id: int) -> WebhookDelivery:
        """Queue a delivery again now."""


@runtime_checkable
class OciArtifacts(Protocol):
    """Where versions were pushed as OCI artifacts."""

    def record_oci_artifact(self, name: str, number: int, *, location: str, tag: str | None, manifest_digest: str,
                            actor: str, host: str, audit_details: AuditDetails | None = None) -> OciArtifactRecord:
        """Record a push of ``name@number`` to an OCI registry (``oci.push``); idempotent."""

    def oci_artifacts(self, name: str, number: int) -> list[OciArtifactRecord]:
        """Where ``name@number`` was pushed as an OCI artifact, oldest first."""

    def oci_repositories(self, host: str) -> list[str]:
        """Repositories of OCI registry ``host`` that versions (the caller may pull) were pushed to."""


@runtime_checkable
class MetadataStore(VersionStore, PushStore, AuditLog, AccessStore, GovernanceStore, WebhookStore, OciArtifacts,
                    Protocol):
    """Everything ``Registry`` needs of the metadata: every port above, and ``close``."""

    def close(self) -> None:
        """Release connections; the store is not used afterwards."""
