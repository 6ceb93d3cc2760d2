"""What one server process holds: its stores, limits, public URL and byte counters.

Nothing here is registry state: that lives only in the database and the blob store, so any
number of replicas over one database and one store are one registry.
"""
from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .limits import ServerLimits

if TYPE_CHECKING:
    from ..blobs.base import BlobStore
    from ..store.sql import SqlMetadataStore

__all__ = ["ServerState", "Counters", "PackChecks"]


@dataclass
class Counters:
    """Blob bytes this process streamed itself (local store only: with S3 the bytes go
    between the client and S3, and these stay at zero) and presigned URLs handed out."""

    blob_bytes_served: int = 0
    blob_bytes_received: int = 0
    presigned_gets: int = 0
    presigned_puts: int = 0
    pack_entries_checked: int = 0    # pack index entries read from their pack and hashed
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, amount: int) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + amount)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {"blob_bytes_served": self.blob_bytes_served,
                    "blob_bytes_received": self.blob_bytes_received,
                    "presigned_gets": self.presigned_gets,
                    "presigned_puts": self.presigned_puts,
                    "pack_entries_checked": self.pack_entries_checked}


class PackChecks:
    """The pack index entries this process read from their pack and hashed, and what it found.

    A publish's index is checked against the packs' bytes (``routes._check_pack_index``); a
    client repeating a publish whose index is wrong would make the server read the same packs
    every time. A pack is content-addressed, so an entry that matched matches for good: it is
    not read again while remembered. One that did not is refused from here for
    ``BAD_SECONDS`` (then read again: the pack may have been damaged in the store and written
    anew since). Bounded: ``limit`` entries each way, the least recently used forgotten first;
    an entry is remembered by the sha256 of (chunk, pack, offset, size), 32 bytes.
    """

    BAD_SECONDS = 600.0

    def __init__(self, limit: int = 200_000) -> None:
        self._limit = limit
        self._good: OrderedDict[bytes, None] = OrderedDict()
        self._bad: OrderedDict[bytes, float] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(chunk: str, pack: str, offset: int, size: int) -> bytes:
        return hashlib.sha256(f"{chunk} {pack} {offset} {size}".encode()).digest()

    def verdict(self, key: bytes) -> bool | None:
        """True: it matched; False: it did not, lately; None: not known."""
        with self._lock:
            if key in self._good:
                self._good.move_to_end(key)
                return True
            at = self._bad.get(key)
            if at is not None and time.monotonic() - at < self.BAD_SECONDS:
                return False
            return None

    def record(self, key: bytes, ok: bool) -> None:
        with self._lock:
            seen: OrderedDict = self._good if ok else self._bad
            seen[key] = None if ok else time.monotonic()
            seen.move_to_end(key)
            (self._bad if ok else self._good).pop(key, None)
            while len(seen) > self._limit:
                seen.popitem(last=False)


@dataclass
class ServerState:
    meta: SqlMetadataStore
    blobs: BlobStore
    limits: ServerLimits
    public_url: str | None = None
    counters: Counters = field(default_factory=Counters)
    pack_checks: PackChecks = field(default_factory=PackChecks)

    @property
    def presigns(self) -> bool:
        """True when the blob store hands out presigned URLs (S3): bytes never pass here."""
        return self.blobs.presigns

    def close(self) -> None:
        self.meta.close()
