"""What one server process holds: its stores, limits, public URL and byte counters.

Nothing here is registry state: that lives only in the database and the blob store, so any
number of replicas over one database and one store are one registry.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .limits import ServerLimits

if TYPE_CHECKING:
    from ..blobs.base import BlobStore
    from ..store.sql import SqlMetadataStore

__all__ = ["ServerState", "Counters"]


@dataclass
class Counters:
    """Blob bytes this process streamed itself (local store only: with S3 the bytes go
    between the client and S3, and these stay at zero) and presigned URLs handed out."""

    blob_bytes_served: int = 0
    blob_bytes_received: int = 0
    presigned_gets: int = 0
    presigned_puts: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, amount: int) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + amount)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {"blob_bytes_served": self.blob_bytes_served,
                    "blob_bytes_received": self.blob_bytes_received,
                    "presigned_gets": self.presigned_gets,
                    "presigned_puts": self.presigned_puts}


@dataclass
class ServerState:
    meta: "SqlMetadataStore"
    blobs: "BlobStore"
    limits: ServerLimits
    public_url: str | None = None
    counters: Counters = field(default_factory=Counters)

    @property
    def presigns(self) -> bool:
        """True when the blob store hands out presigned URLs (S3): bytes never pass here."""
        return hasattr(self.blobs, "presign_put")

    def close(self) -> None:
        self.meta.close()
