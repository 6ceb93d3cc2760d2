"""The two interfaces ``Registry`` reaches its storage through: the seam a remote client fills.

``Registry`` holds a ``MetadataStore`` (versions, aliases, lineage, audit, push claims) and a
``BlobStore`` (``registry.blobs``: content-addressed bytes). Today they are
``registry.store.SqlMetadataStore`` (SQLite/PostgreSQL) and a local or S3 blob store; an HTTP
client that talks to a registry server implements the same two protocols, and ``Registry``,
the CLI and ``registry.load`` work unchanged over it::

    >>> reg = Registry(meta=HttpMetadataStore(url), blobs=HttpBlobStore(url))   # doctest: +SKIP

Both are structural (``typing.Protocol``): an implementation needs no base class. Records
cross the seam as the frozen dataclasses of ``registry.store.records``, never as rows or
sessions.
"""
from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

from ..blobs.base import BlobStore

if TYPE_CHECKING:  # records only: importing the store package would load SQLAlchemy
    from ..format.packs import ChunkLocation, PackIndex
    from ..access.policy import AliasPolicy
    from ..access.scopes import Identity
    from ..refs import Ref
    from ..store.audit_chain import ChainVerdict
    from ..store.records import (AliasRecord, AttestationRecord, AuditEvent, LineageEdge, LineageNode, ModelRecord,
                                 OciArtifactRecord, PendingPush, SignatureRecord, TokenRecord, VersionRecord)

__all__ = ["MetadataStore", "BlobStore"]


@runtime_checkable
class MetadataStore(Protocol):
    """What ``Registry`` needs of the metadata: the methods of ``SqlMetadataStore`` it calls.

    Every write is one transaction and audited; every read returns frozen records. Errors are
    ``RegistryError`` subclasses (NotFoundError, ConflictError, StoreError, ...), never a
    backend's own exceptions. Every write takes ``audit_details``: JSON values added to its
    audit events' details (the server records the token id and ``via``); a key the store
    itself records is a UsageError.
    """

    def close(self) -> None:
        """Release connections; the store is not used afterwards."""

    # -- versions ---------------------------------------------------------------------------
    def publish(self, name: str, digest: str, manifest_json: str, size: int,
                blobs: Iterable[tuple[str, int]], *, aliases: Iterable[str] = (),
                metadata: Mapping[str, Any] | None = None, build: Mapping[str, Any] | None = None,
                lineage: Iterable[LineageEdge] = (), signatures: Iterable[Mapping[str, Any]] = (),
                environment: Mapping[str, Any] | None = None, actor: str, host: str,
                ref_for_audit: str | None = None, claim: int | None = None,
                missing_blobs: Callable[[list[str]], list[str]] | None = None,
                audit_details: Mapping[str, Any] | None = None, packs_json: str | None = None,
                packs: PackIndex | None = None) -> tuple[VersionRecord, bool]:
        """Record a version with its blobs, lineage, signatures, aliases and pack index
        (``format.packs``: ``packs``, or its JSON text ``packs_json``): ``(version, created)``."""

    def resolve(self, ref: Ref) -> VersionRecord:
        """The version a ref names (latest non-yanked, number, alias or digest)."""

    def build_info(self, name: str, number: int) -> dict[str, Any] | None:
        """The build record published with a version, if any."""

    def signatures(self, name: str, number: int) -> list[SignatureRecord]:
        """Signatures recorded for a version, oldest first."""

    def add_signature(self, name: str, number: int, signature: Mapping[str, Any], *, actor: str, host: str,
                      audit_details: Mapping[str, Any] | None = None) -> SignatureRecord:
        """Record a signature of an existing version (audited ``sign``)."""

    def list_models(self) -> list[ModelRecord]:
        """Every model, by name."""

    def list_versions(self, name: str) -> list[VersionRecord]:
        """Every version of a model, by number."""

    def set_alias(self, name: str, alias: str, number: int, *, actor: str, host: str,
                  ref_for_audit: str | None = None,
                  audit_details: Mapping[str, Any] | None = None) -> AliasRecord:
        """Point ``alias`` at ``name@number``."""

    def remove_alias(self, name: str, alias: str, *, actor: str, host: str,
                     ref_for_audit: str | None = None,
                     audit_details: Mapping[str, Any] | None = None) -> AliasRecord:
        """Delete an alias; returns where it pointed."""

    def set_status(self, name: str, number: int, status: str, reason: str | None, *,
                   actor: str, host: str, ref_for_audit: str | None = None,
                   audit_details: Mapping[str, Any] | None = None) -> VersionRecord:
        """Deprecate, yank or restore a version."""

    def alias_at(self, name: str, alias: str, when: datetime) -> int | None:
        """The version number ``name@alias`` pointed at ``when`` (None: nowhere)."""

    # -- lineage ----------------------------------------------------------------------------
    def ancestors(self, name: str, number: int) -> list[LineageNode]:
        """The version and every version it derives from, nearest first."""

    def descendants(self, name: str, number: int) -> list[LineageNode]:
        """The version and every version derived from it, nearest first."""

    def versions_from_dataset(self, uri: str, *, digest: str | None = None) -> list[LineageNode]:
        """Versions trained on a dataset and everything derived from them."""

    # -- audit ------------------------------------------------------------------------------
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

    # -- push claims and gc -----------------------------------------------------------------
    def begin_pending(self, blobs: Iterable[str], host: str, pid: int, *, name: str | None = None) -> int:
        """Claim the blobs a push to model ``name`` is uploading, so gc spares them; returns
        the claim id (a server refuses the claim when the token may not push to ``name``)."""

    # Optional (``SqlMetadataStore`` has it; a server client does not): ``extend_pending(claim_id,
    # blobs) -> bool`` adds blobs to a live claim, False when gc reaped it. With it, a push to a
    # store that has ``put_packs`` names new packs as it writes them and claims them then; without
    # it, packs are hashed before the upload so the first claim names them.

    def heartbeat_pending(self, claim_id: int) -> bool:
        """Refresh a claim; False when gc already reaped it."""

    def end_pending(self, claim_id: int) -> None:
        """Release a claim (idempotent)."""

    def pending_claims(self) -> list[PendingPush]:
        """Every open claim, oldest first."""

    def db_now(self) -> datetime:
        """The store's clock (claims are judged by it, not by the client's)."""

    def referenced_blobs(self) -> set[str]:
        """Digests of every blob some version references."""

    def sweep_blobs(self, candidates: Iterable[tuple[str, int]], *,
                    is_alive: Callable[[PendingPush, datetime], bool],
                    delete: Callable[[str], None], actor: str, host: str,
                    released: list[int] | None = None,
                    audit_details: Mapping[str, Any] | None = None) -> list[tuple[str, int]]:
        """Delete unreferenced, unclaimed blobs under the gc lock; returns what was deleted."""

    def pullable_blob_models(self, digests: Sequence[str]) -> dict[str, set[str]]:
        """``digest -> names of the models whose versions reference it`` (unreferenced: absent)."""

    def locate_chunks(self, digests: Sequence[str], *, name: str) -> dict[str, ChunkLocation] | None:
        """Where each of ``digests`` is stored inside a pack a version of model ``name``
        references (absent: in none). None: this store keeps no packs (a server older than
        packs); a push then stores every chunk as a blob of its own. Optional: a store without
        this method is treated the same way."""

    def recorded_blobs(self, digests: Sequence[str]) -> set[str] | None:
        """Which of ``digests`` some version records, or None when this store cannot say (a
        remote client: the server decides what to upload). A push asks the blob store whether
        these are stored; the others it uploads without asking (one query instead of a HEAD
        per chunk)."""

    # -- tokens -----------------------------------------------------------------------------
    def create_token(self, owner: str, scopes: Sequence[str], *, expires_at: datetime | None,
                     actor: str, host: str, audit_details: Mapping[str, Any] | None = None,
                     ) -> tuple[TokenRecord, str]:
        """Create a token: ``(record, secret)``; the secret is shown this once, only its hash kept."""

    def list_tokens(self) -> list[TokenRecord]:
        """Every token, by id (never a secret)."""

    def revoke_token(self, token_id: int, *, actor: str, host: str,
                     audit_details: Mapping[str, Any] | None = None) -> TokenRecord:
        """Revoke a token now; returns it."""

    def authenticate(self, secret: str) -> Identity:
        """The token's identity; NotAuthenticatedError when unknown, expired or revoked."""

    # -- governance -------------------------------------------------------------------------
    def set_policy(self, name: str, alias: str, *, role_scope: str | None = None,
                   signers: Sequence[str] = (), attestations: Sequence[str] = (),
                   immutable: bool = False, actor: str, host: str,
                   audit_details: Mapping[str, Any] | None = None) -> AliasPolicy:
        """Create or replace the policy on ``name@alias`` (``signers``: public keys, PEM text)."""

    def remove_policy(self, name: str, alias: str, *, actor: str, host: str,
                      audit_details: Mapping[str, Any] | None = None) -> AliasPolicy:
        """Delete the policy on ``name@alias``; returns it."""

    def policies(self, name: str) -> list[AliasPolicy]:
        """The alias policies of a model, by alias."""

    def record_attestation(self, name: str, number: int, *, label: str, passed: bool, device: str,
                           target: Mapping[str, Any], results: Sequence[Any], error: str | None = None,
                           signature: Mapping[str, Any] | None = None, public_key: str | None = None,
                           actor: str, host: str,
                           audit_details: Mapping[str, Any] | None = None) -> AttestationRecord:
        """Record a conformance attestation (a signature is verified on record)."""

    def attestations(self, name: str, number: int) -> list[AttestationRecord]:
        """A version's attestations, oldest first."""

    def record_oci_artifact(self, name: str, number: int, *, location: str, tag: str | None, manifest_digest: str,
                            actor: str, host: str, audit_details: Mapping[str, Any] | None = None
                            ) -> OciArtifactRecord:
        """Record a push of ``name@number`` to an OCI registry (``oci.push``); idempotent."""

    def oci_artifacts(self, name: str, number: int) -> list[OciArtifactRecord]:
        """Where ``name@number`` was pushed as an OCI artifact, oldest first."""

    def oci_repositories(self, host: str) -> list[str]:
        """Repositories of OCI registry ``host`` that versions (the caller may pull) were pushed to."""

    def list_webhooks(self) -> list[Any]:
        """Webhook subscriptions (``WebhookRecord``), never their secrets."""

    def remove_webhook(self, webhook_id: int, *, actor: str, host: str,
                       audit_details: Mapping[str, Any] | None = None) -> Any:
        """Delete a subscription (audited); its undelivered deliveries are dropped."""

    def webhook_deliveries(self, *, failed: bool = False, limit: int = 200) -> list[Any]:
        """Newest deliveries first (``WebhookDelivery``) with every attempt."""

    def redeliver_webhook(self, delivery_id: int) -> Any:
        """Queue a delivery again now."""

    def audit_heads(self, *, newest_only: bool = False) -> list[Any]:
        """The audit heads the server signed (``SignedAuditHead``), oldest first."""
