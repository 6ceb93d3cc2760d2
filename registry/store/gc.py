"""Garbage collection over a SQL metadata store and a blob store: delete blobs no version
references and no live push has claimed.

A push claims its blobs before it writes them (``registry.client.push``; new packs, named
only once written, are written under a claimed tag and claimed by name before they become
visible) and heartbeats the claim; a claim is alive while its process runs here or it
heartbeated recently elsewhere, as judged by the metadata store's clock. ``Registry.gc`` is the
public entry point; it calls ``VersionStore.gc`` (``registry.client.ports``): the SQL store runs
:func:`collect_garbage` here, a registry server's client asks the server to.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Protocol

from ..config import actor as current_actor
from ..config import hostname
from ..constants import HEARTBEAT_SECONDS
from .records import GcResult, PendingPush

if TYPE_CHECKING:
    from ..blobs.base import BlobStore

__all__ = ["GcResult", "collect_garbage", "claim_alive", "Sweeper"]


class Sweeper(Protocol):
    """What gc needs of the metadata: the SQL store's claims, references and locked sweep."""

    def referenced_blobs(self) -> set[str]: ...

    def pending_claims(self) -> list[PendingPush]: ...

    def db_now(self) -> datetime: ...

    def sweep_blobs(self, candidates: Iterable[tuple[str, int]], *,
                    is_alive: Callable[[PendingPush, datetime], bool],
                    delete: Callable[[str], None], actor: str, host: str,
                    released: list[int] | None = None,
                    audit_details: Mapping[str, Any] | None = None) -> list[tuple[str, int]]: ...


def collect_garbage(meta: Sweeper, blobs: BlobStore, *, dry_run: bool = False,
                    grace_seconds: float = 0.0, actor: str | None = None, host: str | None = None,
                    audit_details: Mapping[str, Any] | None = None) -> GcResult:
    """Delete blobs no version references and no live push has claimed; abort the uploads
    that dead pushes left half done (local tmp files, S3 multipart uploads) and release
    their claims. ``actor``/``host`` (default: this process's) and ``audit_details`` go into
    the ``gc.delete`` audit events (the registry server passes its caller's token)."""
    listed = list(blobs.list())
    referenced = meta.referenced_blobs()
    claims = meta.pending_claims()
    db_now = meta.db_now()  # claims are judged by the database's clock, not ours
    protected: set[str] = set()
    dead = []
    for claim in claims:
        if claim_alive(claim, db_now):
            protected.update(claim.blobs)
        else:
            dead.append(claim.id)
    now = time.time()
    deleted, kept = [], 0
    for blob in listed:
        if blob.digest in referenced:
            continue
        if blob.digest in protected or now - blob.mtime < grace_seconds:
            kept += 1
            continue
        deleted.append((blob.digest, blob.size))
    # claims are read again after the store has listed its uploads, so a push that started
    # meanwhile (it claims before it writes) is spared
    aborted = blobs.abort_stale_uploads(grace_seconds, dry_run=dry_run, keep=lambda: {
        d for c in meta.pending_claims() if claim_alive(c, meta.db_now()) for d in c.blobs})
    if not dry_run:
        # under the lock push claims take: claims and references are re-read there, so a
        # push that starts now either is seen (its blobs spared) or finds them gone; the
        # claims judged dead there are deleted there too, before any blob, so their push
        # fails at publish instead of recording a version whose blobs are gone
        released: list[int] = []
        deleted = meta.sweep_blobs(deleted, is_alive=claim_alive, delete=blobs.delete, released=released,
                                   actor=actor or current_actor(), host=host or hostname(),
                                   audit_details=audit_details)
        dead = released
    return GcResult(deleted, kept, dry_run, aborted, len(dead))


def claim_alive(claim: PendingPush, now: datetime | None = None) -> bool:
    """A pending push is alive if its process runs here, or it heartbeated recently elsewhere.

    ``now`` is the database's clock (heartbeats are stamped by it, so a client with a skewed
    clock can neither keep a dead claim alive nor make a live one look stale)."""
    if claim.host == hostname():
        try:
            os.kill(int(claim.pid), 0)
            return True
        except (ProcessLookupError, ValueError):
            return False
        except PermissionError:
            return True
    if now is None:
        now = datetime.now(timezone.utc)
    return (now - claim.heartbeat_at).total_seconds() < 6 * HEARTBEAT_SECONDS
