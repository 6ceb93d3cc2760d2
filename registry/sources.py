"""Bundles made local: every member a verified file in the client cache, keyed by digest.

The cache (``HOME/cache/blobs/sha256/ab/<hex>``, the same layout as a local blob store) holds
only bytes whose sha256 was checked while they were written, so a cached, pinned version is
served with no network and no database round trip. Each verified file gets a stamp
(``HOME/cache/verified/ab/<hex>``: inode, size, mtime and ctime). A file whose stat still
matches its stamp is used as is (one ``stat``, no re-hash: warm loads stay at
``torch.export.load`` speed). One that changed, even by a byte written in place (any write or
``chmod`` moves ctime, which no user call can set back), is re-hashed before use, and evicted
when it no longer matches its digest, so it is fetched again instead of being loaded.

    >>> src = materialize_file("model.pt2b", cache_dir)      # doctest: +SKIP
    >>> src.member_file("programs/encoder.pt2")
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable

from .format.bundle import BundleFile
from .atomic import atomic_write
from .digests import hex_of, iter_chunks
from .errors import IntegrityError
from .format.manifest import Manifest

__all__ = ["MaterializedBundle", "BlobCache", "materialize_file"]


class BlobCache:
    """A write-once, verify-on-write directory of blobs addressed by sha256."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    def path(self, digest: str) -> Path:
        h = hex_of(digest)
        return self.root / "blobs" / "sha256" / h[:2] / h

    def has(self, digest: str) -> bool:
        """The blob is cached (not checked: see ``usable``)."""
        return self.path(digest).is_file()

    def _stamp_path(self, digest: str) -> Path:
        h = hex_of(digest)
        return self.root / "verified" / h[:2] / h

    @staticmethod
    def _stat_line(path: Path) -> str | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return f"{st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}\n"

    def stamp(self, digest: str) -> None:
        """Record that the cached file for ``digest`` was just verified, as it is now."""
        line = self._stat_line(self.path(digest))
        if line is not None:
            with atomic_write(self._stamp_path(digest), fsync=False) as f:
                f.write(line.encode("ascii"))

    def usable(self, digest: str) -> bool:
        """True when the blob is cached and intact: its stat matches the stamp written when it
        was verified, or else it re-hashes to ``digest`` (and is stamped again). A cached file
        that does not match is removed, so the caller fetches it again. Never raises for a
        damaged cache entry."""
        path = self.path(digest)
        line = self._stat_line(path)
        if line is None:
            return False
        try:
            if self._stamp_path(digest).read_text("ascii") == line:
                return True
        except (OSError, UnicodeDecodeError):
            pass
        try:
            good = self.verify(digest)
        except OSError:
            good = False
        if good:
            self.stamp(digest)
            return True
        self.evict(digest)
        return False

    def evict(self, digest: str) -> None:
        for p in (self.path(digest), self._stamp_path(digest)):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass

    def put_stream(self, digest: str, src: IO[bytes], size: int | None = None,
                   progress: Callable[[int], None] | None = None, label: str | None = None) -> Path:
        """Copy ``src`` into the cache, checking its sha256; ``label`` names the source for the
        user (``model.pt2b: member programs/encoder.pt2``) when it does not match."""
        dest = self.path(digest)
        if self.usable(digest):
            return dest
        with atomic_write(dest, mode=0o444) as out:
            h = hashlib.sha256()
            for chunk in iter_chunks(src):
                h.update(chunk)
                out.write(chunk)
                if progress:
                    progress(len(chunk))
            if h.hexdigest() != hex_of(digest):
                what = label or f"blob {digest}"
                raise IntegrityError(f"{what} is corrupt: expected {digest}, got sha256:{h.hexdigest()}",
                                     hint="the source is damaged; nothing was cached")
        self.stamp(digest)
        return dest

    def verify(self, digest: str) -> bool:
        """Re-hash a cached blob (used when a cached file is suspected)."""
        p = self.path(digest)
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1024 * 1024), b""):
                h.update(chunk)
        return h.hexdigest() == hex_of(digest)


@dataclass(frozen=True)
class MaterializedBundle:
    """A bundle whose members are verified local files."""

    manifest: Manifest
    files: dict[str, Path]
    signatures: list[dict[str, Any]] = field(default_factory=list)
    label: str = ""
    name: str | None = None
    version: int | None = None
    #: key ids of trusted keys (the trust policy's, or ``--require-signature``) whose signature
    #: over this digest verified; non-empty allows AOTInductor variants and skips the sandbox.
    trusted_signers: tuple[str, ...] = ()

    @property
    def digest(self) -> str:
        return self.manifest.digest

    def member_file(self, path: str) -> Path:
        try:
            return self.files[path]
        except KeyError as exc:
            raise IntegrityError(f"{self.label}: bundle has no member {path!r}", member=path) from exc


def materialize_file(path: str | os.PathLike, cache_dir: str | os.PathLike,
                     progress: Callable[[int], None] | None = None) -> MaterializedBundle:
    """Open a `.pt2b`, verify it and copy its members into the cache (hash checked on write)."""
    bundle = BundleFile.open(path)
    cache = BlobCache(cache_dir)
    files = {}
    for m in bundle.manifest.members:
        with bundle.open_member(m.path) as src:
            files[m.path] = cache.put_stream(m.digest, src, m.size, progress, label=f"{path}: member {m.path}")
    return MaterializedBundle(bundle.manifest, files, list(bundle.signatures), label=str(path))
