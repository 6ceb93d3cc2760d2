"""``GovernanceStore`` over ``/v1/policies`` and ``/v1/attestations``."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import (
    TYPE_CHECKING,
    Any,
)

from ...access.policy import AliasPolicy
from ...store.records import (
    AttestationRecord,
)
from ..wire import decode, decode_list, encode

if TYPE_CHECKING:
    pass

from ._base import HttpStoreBase, _field

__all__ = ["HttpGovernanceStore"]


class HttpGovernanceStore(HttpStoreBase):
    """``GovernanceStore`` over ``/v1/policies`` and ``/v1/attestations``."""

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
