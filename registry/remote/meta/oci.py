"""``OciArtifacts`` over ``/v1/oci``."""
from __future__ import annotations

from collections.abc import Mapping
from typing import (
    TYPE_CHECKING,
    Any,
)

from ...store.records import (
    OciArtifactRecord,
)
from ..wire import decode, decode_list

if TYPE_CHECKING:
    pass

from ._base import HttpStoreBase, _field

__all__ = ["HttpOciArtifacts"]


class HttpOciArtifacts(HttpStoreBase):
    """``OciArtifacts`` over ``/v1/oci``."""

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
