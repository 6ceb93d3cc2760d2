"""``VersionStore`` over ``/v1/publish``, ``/v1/resolve``, ``/v1/alias``, ``/v1/lineage`` ..."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import (
    TYPE_CHECKING,
    Any,
)

from ...store.records import (
    AliasRecord,
    LineageNode,
    ModelRecord,
    PublishRequest,
    SignatureRecord,
    VersionRecord,
)
from ..wire import decode, decode_list, encode, format_datetime

if TYPE_CHECKING:
    from ...refs import Ref

from ._base import HttpStoreBase, _field

__all__ = ["HttpVersionStore"]


class HttpVersionStore(HttpStoreBase):
    """``VersionStore`` over ``/v1/publish``, ``/v1/resolve``, ``/v1/alias``, ``/v1/lineage`` ..."""

    def publish(self, request: PublishRequest, *, actor: str, host: str,
                missing_blobs: Callable[[list[str]], list[str]] | None = None,
                audit_details: Mapping[str, Any] | None = None) -> tuple[VersionRecord, bool]:
        """Record a version; the server checks every blob is stored (size and digest), and every
        chunk the pack index places in a pack it has not checked before, before the version
        becomes visible (``missing_blobs`` is the server's own, so this one is not used)."""
        r = request
        answer = self.client.post_json("/v1/publish", {
            "name": r.name, "digest": r.digest, "manifest_json": r.manifest_json, "size": r.size,
            "blobs": [[d, s] for d, s in r.blobs], "aliases": list(r.aliases), "metadata": dict(r.metadata or {}),
            "build": dict(r.build) if r.build is not None else None, "lineage": encode(list(r.lineage)),
            "signatures": [dict(s) for s in r.signatures],
            "environment": dict(r.environment) if r.environment is not None else None,
            "host": host, "ref_for_audit": r.ref_for_audit, "claim": r.claim, "packs_json": r.index_json()})
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
                  ref_for_audit: str | None = None, audit_details: Mapping[str, Any] | None = None) -> AliasRecord:
        return decode(AliasRecord, self.client.put_json("/v1/alias", {
            "name": name, "alias": alias, "number": number, "host": host, "ref_for_audit": ref_for_audit}))

    def remove_alias(self, name: str, alias: str, *, actor: str, host: str,
                     ref_for_audit: str | None = None, audit_details: Mapping[str, Any] | None = None) -> AliasRecord:
        return decode(AliasRecord, self.client.delete_json("/v1/alias", {
            "name": name, "alias": alias, "host": host, "ref_for_audit": ref_for_audit}))

    def set_status(self, name: str, number: int, status: str, reason: str | None, *,
                   actor: str, host: str, ref_for_audit: str | None = None,
                   audit_details: Mapping[str, Any] | None = None) -> VersionRecord:
        return decode(VersionRecord, self.client.post_json("/v1/status", {
            "name": name, "number": number, "status": status, "reason": reason, "host": host,
            "ref_for_audit": ref_for_audit}))

    def alias_at(self, name: str, alias: str, when: datetime) -> int | None:
        answer = self.client.get_json("/v1/alias-at", {"name": name, "alias": alias, "when": format_datetime(when)})
        number = _field(answer, "number")
        return int(number) if number is not None else None

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
