"""``HttpMetadataStore``: the ``MetadataStore`` protocol (``registry.client.ports``) over a
registry server's ``/v1`` routes.

Records travel as ``registry.remote.wire`` JSON, so every method returns the same frozen
records ``SqlMetadataStore`` does, and every error is the ``RegistryError`` the server raised
(``registry.remote.http``). Who acts is the server's business: it records the token's owner,
so the ``actor`` arguments here are not sent (the claimed ``host`` is, as a detail).

What only the server may do (gc's sweep, listing every claim or every referenced blob) raises
``UsageError`` here: ``pt2reg gc`` with an admin token runs it there (:meth:`gc`).

    >>> meta = HttpMetadataStore(HttpClient("http://127.0.0.1:8710", token))   # doctest: +SKIP
    >>> meta.resolve(Ref.parse("team/bert@prod")).number                       # doctest: +SKIP
    3
"""
from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence, TypeVar

from ..access.policy import AliasPolicy
from ..access.scopes import Identity, parse_scope
from ..errors import NotFoundError, UsageError
from ..format.packs import ChunkLocation, PackIndex
from ..refs import validate_digest
from ..store.audit_chain import ChainVerdict
from ..store.records import (AliasRecord, AttestationRecord, AuditEvent, LineageEdge, LineageNode, ModelRecord, OciArtifactRecord,
                             PendingPush,
                             SignatureRecord, TokenRecord, VersionRecord)
from .http import HttpClient
from .wire import decode, decode_list, encode, format_datetime, parse_datetime

if TYPE_CHECKING:
    from ..refs import Ref

__all__ = ["HttpMetadataStore", "SERVER_SIDE_HINT"]

T = TypeVar("T")

#: what a remote client is told when it asks for work only the server does
SERVER_SIDE_HINT = "gc runs on the server: run `pt2reg gc` with an admin token"

#: chunk digests per locate request (~0.4 MB of JSON, under the server's 1 MiB body limit)
LOCATE_BATCH = 5000


class HttpMetadataStore:
    """A registry server's metadata, through ``client`` (shared with ``HttpBlobStore``)."""

    def __init__(self, client: HttpClient) -> None:
        self.client = client

    def __repr__(self) -> str:
        return f"HttpMetadataStore({self.client.base_url!r})"

    @property
    def url(self) -> str:
        return self.client.base_url

    def close(self) -> None:
        self.client.close()

    # -- versions ---------------------------------------------------------------------------
    def publish(self, name: str, digest: str, manifest_json: str, size: int,
                blobs: Iterable[tuple[str, int]], *, aliases: Iterable[str] = (),
                metadata: Mapping[str, Any] | None = None, build: Mapping[str, Any] | None = None,
                lineage: Iterable[LineageEdge] = (), signatures: Iterable[Mapping[str, Any]] = (),
                environment: Mapping[str, Any] | None = None, actor: str, host: str,
                ref_for_audit: str | None = None, claim: int | None = None,
                missing_blobs: Callable[[list[str]], list[str]] | None = None, packs_json: str | None = None,
                packs: PackIndex | None = None) -> tuple[VersionRecord, bool]:
        """Record a version; the server checks every blob is stored (size and digest), and every
        chunk the pack index places in a pack it has not checked before, before the version
        becomes visible (``missing_blobs`` is the server's own, so this one is not used)."""
        answer = self.client.post_json("/v1/publish", {
            "name": name, "digest": digest, "manifest_json": manifest_json, "size": size,
            "blobs": [[d, s] for d, s in blobs], "aliases": list(aliases), "metadata": dict(metadata or {}),
            "build": dict(build) if build is not None else None, "lineage": encode(list(lineage)),
            "signatures": [dict(s) for s in signatures],
            "environment": dict(environment) if environment is not None else None,
            "host": host, "ref_for_audit": ref_for_audit, "claim": claim,
            "packs_json": packs.to_json() if packs else packs_json})
        return decode(VersionRecord, _field(answer, "version")), bool(_field(answer, "created"))

    def resolve(self, ref: Ref) -> VersionRecord:
        return decode(VersionRecord, self.client.get_json("/v1/resolve", {"ref": str(ref)}))

    def build_info(self, name: str, number: int) -> dict[str, Any] | None:
        build = _field(self.client.get_json("/v1/build", {"name": name, "number": number}), "build")
        return dict(build) if isinstance(build, dict) else None

    def signatures(self, name: str, number: int) -> list[SignatureRecord]:
        answer = self.client.get_json("/v1/signatures", {"name": name, "number": number})
        return decode_list(SignatureRecord, _field(answer, "signatures"))

    def add_signature(self, name: str, number: int, signature: Mapping[str, Any], *, actor: str, host: str,
                      audit_details: Mapping[str, Any] | None = None) -> SignatureRecord:
        answer = self.client.post_json("/v1/signatures", {"name": name, "number": number,
                                                          "signature": dict(signature), "host": host})
        return decode(SignatureRecord, _field(answer, "signature"))

    def list_models(self) -> list[ModelRecord]:
        return decode_list(ModelRecord, _field(self.client.get_json("/v1/models"), "models"))

    def list_versions(self, name: str) -> list[VersionRecord]:
        return decode_list(VersionRecord, _field(self.client.get_json("/v1/versions", {"name": name}), "versions"))

    def set_alias(self, name: str, alias: str, number: int, *, actor: str, host: str,
                  ref_for_audit: str | None = None) -> AliasRecord:
        return decode(AliasRecord, self.client.put_json("/v1/alias", {
            "name": name, "alias": alias, "number": number, "host": host, "ref_for_audit": ref_for_audit}))

    def remove_alias(self, name: str, alias: str, *, actor: str, host: str,
                     ref_for_audit: str | None = None) -> AliasRecord:
        return decode(AliasRecord, self.client.delete_json("/v1/alias", {
            "name": name, "alias": alias, "host": host, "ref_for_audit": ref_for_audit}))

    def set_status(self, name: str, number: int, status: str, reason: str | None, *,
                   actor: str, host: str, ref_for_audit: str | None = None) -> VersionRecord:
        return decode(VersionRecord, self.client.post_json("/v1/status", {
            "name": name, "number": number, "status": status, "reason": reason, "host": host,
            "ref_for_audit": ref_for_audit}))

    def alias_at(self, name: str, alias: str, when: datetime) -> int | None:
        answer = self.client.get_json("/v1/alias-at", {"name": name, "alias": alias, "when": format_datetime(when)})
        number = _field(answer, "number")
        return int(number) if number is not None else None

    # -- lineage ----------------------------------------------------------------------------
    def ancestors(self, name: str, number: int) -> list[LineageNode]:
        return self._lineage(name, number, "ancestors")

    def descendants(self, name: str, number: int) -> list[LineageNode]:
        return self._lineage(name, number, "descendants")

    def _lineage(self, name: str, number: int, direction: str) -> list[LineageNode]:
        answer = self.client.get_json("/v1/lineage", {"name": name, "number": number, "direction": direction})
        return decode_list(LineageNode, _field(answer, "nodes"))

    def versions_from_dataset(self, uri: str, *, digest: str | None = None) -> list[LineageNode]:
        answer = self.client.get_json("/v1/lineage/dataset", {"uri": uri, "digest": digest})
        return decode_list(LineageNode, _field(answer, "nodes"))

    # -- audit ------------------------------------------------------------------------------
    def record_event(self, action: str, *, actor: str, host: str, model: str | None = None,
                     number: int | None = None, digest: str | None = None, ref: str | None = None,
                     details: Mapping[str, Any] | None = None) -> AuditEvent:
        return decode(AuditEvent, self.client.post_json("/v1/events", {
            "action": action, "model": model, "number": number, "digest": digest, "ref": ref,
            "host": host, "details": encode(dict(details or {}))}))

    def events(self, model: str | None = None, since: datetime | None = None) -> list[AuditEvent]:
        answer = self.client.get_json("/v1/audit/events", {
            "model": model, "since": format_datetime(since) if since is not None else None})
        return decode_list(AuditEvent, _field(answer, "events"))

    def audit_hashes(self, seqs: Sequence[int] = ()) -> tuple[tuple[int, str] | None, dict[int, str]]:
        answer = self.client.get_json("/v1/audit/hashes", {"seqs": ",".join(str(int(s)) for s in seqs) or None})
        head, found = _field(answer, "head"), _field(answer, "found")
        try:
            return ((int(head[0]), str(head[1])) if head else None,
                    {int(k): str(v) for k, v in (found or {}).items()})
        except (TypeError, ValueError, IndexError, AttributeError) as exc:
            raise _malformed("/v1/audit/hashes") from exc

    def verify_audit_chain(self) -> ChainVerdict:
        return decode(ChainVerdict, self.client.get_json("/v1/audit/verify"))

    def verify_version_contents(self) -> ChainVerdict | None:
        answer = self.client.get_json("/v1/audit/contents")
        return None if answer is None else decode(ChainVerdict, answer)

    # -- push claims ------------------------------------------------------------------------
    def begin_pending(self, blobs: Iterable[str], host: str, pid: int, *, name: str | None = None) -> int:
        body: dict[str, object] = {"blobs": list(blobs), "host": host, "pid": pid}
        if name is not None:  # the server checks push on this model before anything is sent
            body["name"] = name
        answer = self.client.post_json("/v1/pending", body)
        return _int(_field(answer, "id"), "/v1/pending")

    def heartbeat_pending(self, claim_id: int) -> bool:
        answer = self.client.post_json(f"/v1/pending/{int(claim_id)}/heartbeat", idempotent=True)
        return bool(_field(answer, "alive"))

    def end_pending(self, claim_id: int) -> None:
        self.client.delete_json(f"/v1/pending/{int(claim_id)}")

    def db_now(self) -> datetime:
        return parse_datetime(_field(self.client.get_json("/v1/now"), "now"))

    # -- gc: on the server only -------------------------------------------------------------
    def gc(self, result: type[T], *, dry_run: bool, grace_seconds: float) -> T:
        """Run gc on the server (admin token); its answer decoded as ``result`` (``GcResult``)."""
        answer = self.client.post_json("/v1/gc", {"dry_run": bool(dry_run), "grace_seconds": float(grace_seconds)})
        return decode(result, answer)

    def pending_claims(self) -> list[PendingPush]:
        raise UsageError("a remote client cannot list push claims", hint=SERVER_SIDE_HINT)

    def referenced_blobs(self) -> set[str]:
        raise UsageError("a remote client cannot list referenced blobs", hint=SERVER_SIDE_HINT)

    def sweep_blobs(self, candidates: Iterable[tuple[str, int]], *, is_alive: Callable[[PendingPush, datetime], bool],
                    delete: Callable[[str], None], actor: str, host: str, released: list[int] | None = None,
                    audit_details: Mapping[str, Any] | None = None) -> list[tuple[str, int]]:
        raise UsageError("a remote client cannot sweep blobs", hint=SERVER_SIDE_HINT)

    def pullable_blob_models(self, digests: Sequence[str]) -> dict[str, set[str]]:
        raise UsageError("a remote client cannot map blobs to models", hint="the server checks blob access itself")

    def locate_chunks(self, digests: Sequence[str], *, name: str) -> dict[str, ChunkLocation] | None:
        """The server's ``locate_chunks`` for model ``name``, in batches; None from a server that
        predates packs (no such route): the push then stores every chunk as a blob of its own."""
        found: dict[str, ChunkLocation] = {}
        wanted = sorted(set(digests))
        for start in range(0, len(wanted), LOCATE_BATCH):
            try:
                answer = self.client.post_json("/v1/chunks/locate",
                                               {"name": name, "digests": wanted[start:start + LOCATE_BATCH]})
            except NotFoundError as exc:
                if exc.message.startswith("no such route"):  # a server older than packs
                    return None
                raise
            items = _field(answer, "locations")
            if not isinstance(items, dict):
                raise _malformed("chunk locations")
            for chunk, loc in items.items():
                try:
                    pack, pack_size, offset, size = loc
                    found[validate_digest(chunk)] = ChunkLocation(validate_digest(pack), int(pack_size), int(offset),
                                                                  int(size))
                except (TypeError, ValueError, UsageError):
                    raise _malformed("chunk locations") from None
        return found

    def recorded_blobs(self, digests: Sequence[str]) -> set[str] | None:
        """None: the server answers which blobs it lacks when the upload starts."""
        return None

    # -- tokens and identity ----------------------------------------------------------------
    def whoami(self) -> Identity:
        """Who the server takes this client's token for (``NotAuthenticatedError`` if nobody)."""
        answer = self.client.get_json("/v1/whoami")
        try:
            expires = answer.get("expires_at")
            return Identity(token_id=int(answer["token_id"]), owner=str(answer["owner"]),
                            scopes=tuple(parse_scope(str(s)) for s in answer["scopes"]),
                            expires_at=parse_datetime(expires) if expires else None)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise _malformed("/v1/whoami") from exc

    def authenticate(self, secret: str) -> Identity:
        raise UsageError("tokens are checked by the server", hint="use whoami() for this client's own token")

    def create_token(self, owner: str, scopes: Sequence[str], *, expires_at: datetime | None, actor: str,
                     host: str, audit_details: Mapping[str, Any] | None = None) -> tuple[TokenRecord, str]:
        answer = self.client.post_json("/v1/tokens", {
            "owner": owner, "scopes": list(scopes), "host": host,
            "expires_at": format_datetime(expires_at) if expires_at is not None else None})
        secret = _field(answer, "secret")
        if not isinstance(secret, str):
            raise _malformed("/v1/tokens")
        return decode(TokenRecord, _field(answer, "token")), secret

    def list_tokens(self) -> list[TokenRecord]:
        return decode_list(TokenRecord, _field(self.client.get_json("/v1/tokens"), "tokens"))

    def revoke_token(self, token_id: int, *, actor: str, host: str,
                     audit_details: Mapping[str, Any] | None = None) -> TokenRecord:
        return decode(TokenRecord, self.client.delete_json(f"/v1/tokens/{int(token_id)}"))

    # -- governance -------------------------------------------------------------------------
    def set_policy(self, name: str, alias: str, *, role_scope: str | None = None,
                   signers: Sequence[str] = (), attestations: Sequence[str] = (),
                   immutable: bool = False, actor: str, host: str,
                   audit_details: Mapping[str, Any] | None = None) -> AliasPolicy:
        return decode(AliasPolicy, self.client.put_json("/v1/policies", {
            "name": name, "alias": alias, "role_scope": role_scope, "signers": list(signers),
            "attestations": list(attestations), "immutable": bool(immutable), "host": host}))

    def remove_policy(self, name: str, alias: str, *, actor: str, host: str,
                      audit_details: Mapping[str, Any] | None = None) -> AliasPolicy:
        return decode(AliasPolicy, self.client.delete_json("/v1/policies", {
            "name": name, "alias": alias, "host": host}))

    def policies(self, name: str) -> list[AliasPolicy]:
        return decode_list(AliasPolicy, _field(self.client.get_json("/v1/policies", {"name": name}), "policies"))

    def record_attestation(self, name: str, number: int, *, label: str, passed: bool, device: str,
                           target: Mapping[str, Any], results: Sequence[Any], error: str | None = None,
                           signature: Mapping[str, Any] | None = None, public_key: str | None = None,
                           actor: str, host: str,
                           audit_details: Mapping[str, Any] | None = None) -> AttestationRecord:
        return decode(AttestationRecord, self.client.post_json("/v1/attestations", {
            "name": name, "number": number, "label": label, "passed": bool(passed), "device": device,
            "target": encode(dict(target)), "results": encode(list(results)), "error": error,
            "signature": dict(signature) if signature is not None else None, "public_key": public_key,
            "host": host}))

    def attestations(self, name: str, number: int) -> list[AttestationRecord]:
        answer = self.client.get_json("/v1/attestations", {"name": name, "number": number})
        return decode_list(AttestationRecord, _field(answer, "attestations"))

    # -- OCI artifacts ----------------------------------------------------------------------
    def record_oci_artifact(self, name: str, number: int, *, location: str, tag: str | None, manifest_digest: str,
                            actor: str, host: str, audit_details: Mapping[str, Any] | None = None
                            ) -> OciArtifactRecord:
        answer = self.client.post_json("/v1/oci", {"name": name, "number": number, "location": location, "tag": tag,
                                                   "manifest_digest": manifest_digest, "host": host},
                                       idempotent=True)
        return decode(OciArtifactRecord, _field(answer, "artifact"))

    def oci_artifacts(self, name: str, number: int) -> list[OciArtifactRecord]:
        answer = self.client.get_json("/v1/oci", {"name": name, "number": number})
        return decode_list(OciArtifactRecord, _field(answer, "artifacts"))

    def oci_repositories(self, host: str) -> list[str]:
        answer = self.client.get_json("/v1/oci/repositories", {"host": host})
        repos = _field(answer, "repositories")
        return [r for r in repos if isinstance(r, str)] if isinstance(repos, list) else []

    # -- webhooks and signed audit heads ------------------------------------------------------
    def add_webhook(self, url: str, events: Sequence[str], model_glob: str | None, *, secret: str,
                    actor: str, host: str, audit_details: Mapping[str, Any] | None = None) -> Any:
        """Subscribe ``url``; the server encrypts the secret (``whsec_...``) under its own key."""
        from ..store.records import WebhookRecord

        return decode(WebhookRecord, self.client.post_json("/v1/webhooks", {
            "url": url, "events": list(events), "model_glob": model_glob, "secret": secret,
            "host": host}))

    def list_webhooks(self) -> list[Any]:
        from ..store.records import WebhookRecord

        return decode_list(WebhookRecord, _field(self.client.get_json("/v1/webhooks"), "webhooks"))

    def remove_webhook(self, webhook_id: int, *, actor: str, host: str,
                       audit_details: Mapping[str, Any] | None = None) -> Any:
        from ..store.records import WebhookRecord

        return decode(WebhookRecord, self.client.delete_json(f"/v1/webhooks/{int(webhook_id)}",
                                                             {"host": host}))

    def webhook_deliveries(self, *, failed: bool = False, limit: int = 200) -> list[Any]:
        from ..store.records import WebhookDelivery

        answer = self.client.get_json("/v1/webhooks/deliveries",
                                      {"failed": "true" if failed else None, "limit": limit})
        return decode_list(WebhookDelivery, _field(answer, "deliveries"))

    def redeliver_webhook(self, delivery_id: int) -> Any:
        from ..store.records import WebhookDelivery

        return decode(WebhookDelivery, self.client.post_json(
            f"/v1/webhooks/deliveries/{int(delivery_id)}/redeliver", {}))

    def audit_heads(self, *, newest_only: bool = False) -> list[Any]:
        from ..store.records import SignedAuditHead

        if newest_only:
            return [decode(SignedAuditHead, self.client.get_json("/v1/audit/head"))]
        return decode_list(SignedAuditHead, _field(self.client.get_json("/v1/audit/heads"), "heads"))


def _field(answer: Any, key: str) -> Any:
    """``answer[key]``, or ``StoreError`` when the server sent something else."""
    if not isinstance(answer, dict) or key not in answer:
        raise _malformed(f"a request (no {key!r} in the answer)")
    return answer[key]


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _malformed(where)
    return value


def _malformed(where: str) -> Exception:
    from ..errors import StoreError

    return StoreError(f"the registry server sent a malformed answer to {where}",
                      hint="the client and the server may be different versions of pt2reg")
