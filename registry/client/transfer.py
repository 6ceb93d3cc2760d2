"""Moving a bundle's blobs to and from a store, several at once, checking whole members on the side.

A chunked member (a program split at its weights, see ``chunking``) is stored as one blob per
chunk. The store verifies each chunk against its own sha256 as it transfers it; the member's
whole-file sha256 (the one the manifest records, what ``sha256sum`` of the ``.pt2`` prints) is
checked by a ``RangeHasher`` thread that reads the member in order while the chunks move:

* push: the hasher reads the bundle file from the start of the member while the chunks are
  uploaded, so a manifest whose chunks do not make up its member is refused (exit 5) before
  the version is recorded;
* pull: chunks arrive out of order into their place in the file; the hasher follows behind,
  hashing each chunk's range as soon as it and every chunk before it are complete (from the
  page cache: a memory read, not a second transfer).

Both sides are CPU-bound on sha256 locally and IO-bound on S3, so these threads overlap with
the transfers instead of adding to them.
"""
from __future__ import annotations

import io
import os
import threading
from pathlib import Path
from typing import Sequence

from ..atomic import atomic_write
from ..blobs.base import BlobStore, Part, ProgressFn
from ..digests import PreadReader, pump
from ..errors import IntegrityError
from ..format.bundle import BundleFile
from ..format.manifest import Manifest, Member
from ..sources import BlobCache

__all__ = ["RangeHasher", "bundle_parts", "upload_bundle", "assemble_member", "fetch_members"]


class RangeHasher:
    """sha256 of ``ranges`` of an open file, read in order on a background thread.

    With ``gated=True`` range ``i`` is read only after ``ready(i)``; otherwise at once.
    ``hexdigest()`` waits for the end and re-raises any read error; ``cancel()`` stops it.
    """

    def __init__(self, fd: int, ranges: Sequence[tuple[int, int]], *, gated: bool = False) -> None:
        import hashlib

        self._fd, self._ranges = fd, list(ranges)
        self._h = hashlib.sha256()
        self._ready: set[int] | None = set() if gated else None
        self._cond = threading.Condition()
        self._cancelled = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="pt2reg-member-hash", daemon=True)
        self._thread.start()

    def ready(self, i: int) -> None:
        with self._cond:
            if self._ready is not None:
                self._ready.add(i)
            self._cond.notify_all()

    def cancel(self) -> None:
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()
        self._thread.join()

    def wait(self) -> None:
        """Until the thread has finished (or failed); never raises."""
        self._thread.join()

    def hexdigest(self) -> str:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._h.hexdigest()

    def _wait_for(self, i: int) -> bool:
        with self._cond:
            while not self._cancelled and self._ready is not None and i not in self._ready:
                self._cond.wait()
            return not self._cancelled

    def _run(self) -> None:
        try:
            for i, (offset, size) in enumerate(self._ranges):
                if not self._wait_for(i):
                    return
                n = pump(PreadReader(self._fd, offset), self._h.update, size=size)
                if n < size:
                    raise OSError(f"file ended at byte {offset + n}, {size - n} bytes early")
                if self._cancelled:
                    return
        except BaseException as exc:  # reported by hexdigest()
            self._error = exc


def bundle_parts(bundle: BundleFile) -> list[Part]:
    """Every blob a bundle is stored as, where it sits in the bundle file: one per chunk of a
    chunked member, one per other member."""
    parts = []
    for m in bundle.manifest.members:
        offset, _size = bundle.member_span(m.path)
        if m.chunks:
            for sha, size in m.chunks:
                parts.append(Part("sha256:" + sha, offset, size))
                offset += size
        else:
            parts.append(Part(m.digest, offset, m.size))
    return parts


def upload_bundle(bundle: BundleFile, blobs: BlobStore, progress: ProgressFn | None) -> tuple[int, int]:
    """Store every blob of an opened bundle file (several at once); returns (bytes uploaded,
    bytes already stored). ``IntegrityError`` (exit 5) when a chunk does not match its digest
    or a chunked member's chunks do not make up the member its manifest describes."""
    chunked = [m for m in bundle.manifest.members if m.chunks]
    fd = os.open(bundle.path, os.O_RDONLY)
    try:
        hashers = [(m, RangeHasher(fd, [bundle.member_span(m.path)])) for m in chunked]
        try:
            result = blobs.put_parts(bundle.path, bundle_parts(bundle), progress=progress)
        except BaseException:
            for _m, hasher in hashers:
                hasher.cancel()
            raise
        for _m, hasher in hashers:      # every reader done before fd is closed
            hasher.wait()
        for m, hasher in hashers:
            try:
                digest = hasher.hexdigest()
            except OSError as exc:
                raise IntegrityError(f"{bundle.path}: member {m.path!r} could not be read back: {exc}",
                                     member=m.path, hint="the bundle file changed during the push") from exc
            if digest != m.sha256:
                raise IntegrityError(f"{bundle.path}: member {m.path!r} does not match its sha256 in "
                                     f"the manifest", member=m.path,
                                     hint="the bundle is corrupt or was altered")
        return result
    finally:
        os.close(fd)


def assemble_member(member: Member, blobs: BlobStore, dest: str | os.PathLike,
                    progress: ProgressFn | None) -> None:
    """Rebuild a chunked member at ``dest`` (atomically) from its chunk blobs, fetched several
    at once into their places, each verified, then the whole member checked against its
    sha256; nothing is left behind on failure."""
    parts, ranges, offset = [], [], 0
    for sha, size in member.chunks:
        parts.append(Part("sha256:" + sha, offset, size))
        ranges.append((offset, size))
        offset += size
    with atomic_write(Path(dest)) as out:
        fd = out.fileno()
        hasher = RangeHasher(fd, ranges, gated=True)
        try:
            blobs.get_parts(fd, parts, progress=progress, on_done=hasher.ready)
        except BaseException:
            hasher.cancel()
            raise
        got = hasher.hexdigest()
        if got != member.sha256:
            raise IntegrityError(f"member {member.path!r} rebuilt from its chunks does not match its "
                                 f"sha256 (got {got[:12]}...)", member=member.path,
                                 hint="the version's manifest is inconsistent; nothing was cached")


def fetch_members(manifest: Manifest, blobs: BlobStore, cache: BlobCache, progress: ProgressFn | None
                  ) -> dict[str, Path]:
    """Every member of ``manifest`` as a verified file in ``cache`` (fetched from ``blobs``
    unless already cached intact), and the manifest itself cached; ``{member path: file}``."""
    files = {}
    for m in manifest.members:
        path = cache.path(m.digest)
        if not cache.usable(m.digest):
            path.parent.mkdir(parents=True, exist_ok=True)
            if m.chunks:
                assemble_member(m, blobs, path, progress)
            else:
                blobs.get_file(m.digest, path, progress=progress)
            os.chmod(path, 0o444)
            cache.stamp(m.digest)
        elif progress:
            progress(m.size)
        files[m.path] = path
    if not cache.has(manifest.digest):
        cache.put_stream(manifest.digest, io.BytesIO(manifest.canonical))
    return files
