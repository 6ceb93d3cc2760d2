"""``AuditLog`` over ``/v1/events`` and ``/v1/audit/...``."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import (
    TYPE_CHECKING,
    Any,
)

from ...store.audit_chain import ChainVerdict
from ...store.records import (
    AuditEvent,
    SignedAuditHead,
)
from ..wire import decode, decode_list, encode, format_datetime

if TYPE_CHECKING:
    pass

from ._base import HttpStoreBase, _field, _malformed

__all__ = ["HttpAuditLog"]


class HttpAuditLog(HttpStoreBase):
    """``AuditLog`` over ``/v1/events`` and ``/v1/audit/...``."""

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

    def audit_heads(self, *, newest_only: bool = False) -> list[SignedAuditHead]:
        if newest_only:
            return [decode(SignedAuditHead, self.client.get_json("/v1/audit/head"))]
        return decode_list(SignedAuditHead, _field(self.client.get_json("/v1/audit/heads"), "heads"))
