"""``PushStore`` over ``/v1/pending``, ``/v1/chunks/locate`` and ``/v1/gc`` (gc runs on the server)."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import (
    TYPE_CHECKING,
    Any,
)

from ...errors import NotFoundError, UsageError
from ...format.packs import ChunkLocation
from ...refs import validate_digest
from ...store.records import (
    GcResult,
)
from ..wire import decode, parse_datetime

if TYPE_CHECKING:
    from ...blobs.base import BlobStore

from ._base import HttpStoreBase, _field, _int, _malformed

__all__ = ["HttpPushStore", "SERVER_SIDE_HINT", "LOCATE_BATCH"]

#: what a remote client is told when it asks for work only the server does
SERVER_SIDE_HINT = "gc runs on the server: run `pt2reg gc` with an admin token"

#: chunk digests per locate request (~0.4 MB of JSON, under the server's 1 MiB body limit)
LOCATE_BATCH = 5000


class HttpPushStore(HttpStoreBase):
    """``PushStore`` over ``/v1/pending``, ``/v1/chunks/locate`` and ``/v1/gc`` (gc runs on the server)."""

    #: a claim cannot grow over the wire: a push hashes its packs first, so one claim names them all
    extends_claims = False

    def extend_pending(self, claim_id: int, blobs: Iterable[str]) -> bool:
        """UsageError: this store declares ``extends_claims`` False (no route adds to a claim)."""
        raise UsageError("a remote client cannot add blobs to a push claim",
                         hint="claim every blob in begin_pending (extends_claims is False)")

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

    def gc(self, blobs: BlobStore, *, dry_run: bool, grace_seconds: float, actor: str, host: str,
           audit_details: Mapping[str, Any] | None = None) -> GcResult:
        """Run gc on the server (admin token), over the server's own blob store (``blobs``, this
        client's view of it, is not swept from here); its answer decoded as a ``GcResult``."""
        answer = self.client.post_json("/v1/gc", {"dry_run": bool(dry_run), "grace_seconds": float(grace_seconds)})
        return decode(GcResult, answer)

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
