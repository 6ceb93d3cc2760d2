"""Moving a bundle's blobs to and from a store, several at once.

A chunked member (a program split at its weights, see ``format.chunking``) is stored as one
blob per chunk, and its chunk list is its integrity: the store verifies each chunk against its
own sha256 as it transfers it, and the chunks tile the member exactly (the manifest's schema
checks the sizes). So no step needs a sequential hash of a whole member, and every chunk moves
and hashes on its own core:

* push: ``put_parts`` reads each chunk's range of the bundle file, hashes it and stores it;
* pull: ``get_parts`` writes each chunk at its place in the member's file, verified as it
  arrives, and the file becomes visible (atomically) only once every chunk matched.

A cold ``registry.load`` overlaps the two halves of its work (``fetch_members_deferred``): a
program member's chunks that hold nothing but raw weight bytes are fetched in the background
while torch deserializes the graph from the chunks already verified (it maps the weights and
reads none of them, ``runtime.torchrt``); the load returns only once every chunk matched.
"""
from __future__ import annotations

import io
import os
import threading
from bisect import bisect_left
from concurrent.futures import CancelledError
from pathlib import Path
from typing import Callable, Collection

from ..atomic import atomic_write, new_temp
from ..blobs.base import BlobStore, Part, ProgressFn, locked_progress
from ..errors import UnsafeArchiveError
from ..format.bundle import BundleFile
from ..format.chunking import chunks_inside
from ..format.manifest import Manifest, Member
from ..format.zipsafe import canonical_data_spans
from ..parallel import preallocate
from ..sources import BlobCache

__all__ = ["bundle_parts", "upload_bundle", "assemble_member", "fetch_members", "fetch_members_deferred",
           "DeferredMembers"]


def bundle_parts(bundle: BundleFile) -> list[Part]:
    """Every blob a bundle is stored as, where it sits in the bundle file: one per chunk of a
    chunked member, one per other member."""
    parts = []
    for m in bundle.manifest.members:
        offset, _size = bundle.member_span(m.path)
        if m.chunks:
            parts.extend(Part("sha256:" + sha, offset + at, size) for sha, at, size in m.chunk_spans())
        else:
            parts.append(Part(m.digest, offset, m.size))
    return parts


def upload_bundle(bundle: BundleFile, blobs: BlobStore, progress: ProgressFn | None, *,
                  unrecorded: Collection[str] = ()) -> tuple[int, int]:
    """Store every blob of an opened bundle file (several at once); returns (bytes uploaded,
    bytes already stored). ``IntegrityError`` (exit 5) when a chunk does not match its digest.
    ``unrecorded``: digests no version records (stored without asking the store first)."""
    return blobs.put_parts(bundle.path, bundle_parts(bundle), progress=progress, unrecorded=unrecorded)


def assemble_member(member: Member, blobs: BlobStore, dest: str | os.PathLike,
                    progress: ProgressFn | None) -> None:
    """Rebuild a chunked member at ``dest`` (atomically) from its chunk blobs, fetched several
    at once into their places, each verified; nothing is left behind on failure. Not fsynced:
    a cache file (see ``BlobCache``: re-hashed after a reboot)."""
    parts = [Part("sha256:" + sha, offset, size) for sha, offset, size in member.chunk_spans()]
    with atomic_write(Path(dest), fsync=False) as out:
        out.flush()
        preallocate(out.fileno(), member.size)
        blobs.get_parts(out.fileno(), parts, progress=progress)


def fetch_members(manifest: Manifest, blobs: BlobStore, cache: BlobCache, progress: ProgressFn | None, *,
                  skip: Collection[str] = ()) -> dict[str, Path]:
    """Every member of ``manifest`` as a verified file in ``cache`` (fetched from ``blobs``
    unless already cached intact), and the manifest itself cached; ``{member path: file}``.
    ``skip``: member paths left out (being fetched by the caller)."""
    files = {}
    for m in manifest.members:
        if m.path in skip:
            continue
        path = cache.member_path(m)
        if not cache.usable_member(m):
            path.parent.mkdir(parents=True, exist_ok=True)
            if m.chunks:
                assemble_member(m, blobs, path, progress)
            else:
                blobs.get_file(m.digest, path, progress=progress)
            os.chmod(path, 0o444)
            cache.stamp_member(m)
        elif progress:
            progress(m.size)
        files[m.path] = path
    if not cache.has(manifest.digest):
        cache.put_stream(manifest.digest, io.BytesIO(manifest.canonical))
    return files


#: the records of a program archive a cold load may verify while torch deserializes the rest:
#: raw weights and constants, which torch maps (``runtime.torchrt``); JSON configs are never deferred
_PAYLOAD_DIRS = ("data/weights/", "data/constants/")


class _MemberFetch:
    """A chunked member being fetched into a new temp file beside its cache path (``new_temp``,
    as ``atomic_write``'s), its chunks in an order of our choosing, each marked done
    once verified; the file replaces the cache path only when every chunk matched."""

    def __init__(self, member: Member, blobs: BlobStore, dest: Path, progress: ProgressFn | None) -> None:
        self.member, self.dest, self._blobs, self._progress = member, dest, blobs, progress
        self.parts = [Part("sha256:" + sha, offset, size) for sha, offset, size in member.chunk_spans()]
        self._done = [False] * len(self.parts)
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._stop = False
        self._thread: threading.Thread | None = None
        dest.parent.mkdir(parents=True, exist_ok=True)
        self.fd, tmp = new_temp(dest)
        self.path = Path(tmp)
        try:
            preallocate(self.fd, member.size)
            os.ftruncate(self.fd, member.size)  # full size from the start: it is mapped at that size
        except BaseException:
            self._discard()
            raise

    def _fetch(self, indices: list[int]) -> None:
        def on_done(j: int) -> None:
            with self._cond:
                if self._stop:  # raising here stops the batch (get_parts cancels the rest)
                    raise CancelledError("fetch abandoned")
                self._done[indices[j]] = True
                self._cond.notify_all()

        if indices:
            self._blobs.get_parts(self.fd, [self.parts[i] for i in indices], progress=self._progress,
                                  on_done=on_done)

    def fetch_range(self, lo: int, hi: int) -> None:
        """Fetch now (in this thread) every chunk overlapping bytes ``[lo, hi)`` not fetched yet."""
        self._fetch([i for i, p in enumerate(self.parts)
                     if p.offset < hi and p.offset + p.size > lo and not self._done[i]])

    def start(self, order: list[int]) -> None:
        """Fetch the chunks not fetched yet in the background, those in ``order`` first."""
        rest = [i for i in order if not self._done[i]]
        seen = set(rest)
        rest += [i for i in range(len(self.parts)) if i not in seen and not self._done[i]]

        def run() -> None:
            try:
                self._fetch(rest)
            except BaseException as exc:
                with self._cond:
                    self._error = exc
                    self._cond.notify_all()

        self._thread = threading.Thread(target=run, name="pt2reg-fetch", daemon=True)
        self._thread.start()

    def wait_for(self, indices: Collection[int]) -> None:
        """Block until the chunks ``indices`` are verified; the fetch's error if it failed."""
        with self._cond:
            while not all(self._done[i] for i in indices):
                if self._error is not None:
                    raise self._error
                if self._thread is None:
                    raise RuntimeError("chunks waited for were never fetched")
                self._cond.wait(1.0)

    def finish(self) -> Path:
        """Wait for every chunk, then move the file into its cache path (read-only)."""
        try:
            self.wait_for(range(len(self.parts)))
            if self._thread is not None:
                self._thread.join()
            os.close(self.fd)
            self.fd = -1
            os.chmod(self.path, 0o444)
            os.replace(self.path, self.dest)
        except BaseException:
            self.abort()
            raise
        return self.dest

    def abort(self) -> None:
        """Stop the background fetch (chunks in flight end first) and remove the temp file."""
        with self._cond:
            self._stop = True
        if self._thread is not None:
            self._thread.join()
        self._discard()

    def _discard(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class DeferredMembers:
    """The members of a cold load still being fetched (``fetch_members_deferred``).

    Their files (the temp paths in the files it returned) hold verified bytes everywhere
    except in the records ``unverified`` names per member path: raw weights and constants that
    torch maps without reading them. ``wait`` finishes them and returns the final files;
    ``abort`` stops them and leaves nothing behind. Either must be called.
    """

    def __init__(self, fetches: list[_MemberFetch], files: dict[str, Path], cache: BlobCache,
                 unverified: dict[str, frozenset[str]]) -> None:
        self._fetches, self._files, self._cache = fetches, dict(files), cache
        self.unverified = unverified
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._result: dict[str, Path] | None = None

    def on_success(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once every member is complete (the pull's audit record)."""
        self._callbacks.append(fn)

    def wait(self) -> dict[str, Path]:
        """Every member complete and verified in the cache: ``{member path: file}``. The fetch's
        error (``IntegrityError`` for a chunk that does not match) when one failed; then no
        file of it is left."""
        with self._lock:
            if self._result is None:
                try:
                    for f in self._fetches:
                        self._files[f.member.path] = f.finish()
                        self._cache.stamp_member(f.member)
                except BaseException:
                    for f in self._fetches:
                        f.abort()
                    raise
                self._result = dict(self._files)
                for fn in self._callbacks:
                    fn()
            return dict(self._result)

    def abort(self) -> None:
        """Stop every fetch still running and remove its temp file (nothing when finished)."""
        with self._lock:
            if self._result is None:
                for f in self._fetches:
                    f.abort()


def _defer_plan(fetch: _MemberFetch, where: str) -> tuple[list[int], frozenset[str]]:
    """The chunks of a program member that hold nothing but the bytes of raw weights and
    constants, and those records' names; read from the end records and central directory,
    whose chunks are fetched (and verified) first. Nothing is deferred for a member that is
    not a canonical archive (the loader's vetting reports it)."""
    try:
        with open(fetch.path, "rb") as fp:
            spans = canonical_data_spans(fp, fetch.member.size, where=where, ensure=fetch.fetch_range)
    except UnsafeArchiveError:
        return [], frozenset()
    payload = []
    for name, offset, size in spans:
        rel = name.split("/", 1)[1] if "/" in name else name
        if rel.startswith(_PAYLOAD_DIRS) and not rel.endswith(".json"):
            payload.append((rel, offset, size))
    deferred = chunks_inside([(p.offset, p.size) for p in fetch.parts], [(o, n) for _, o, n in payload])
    starts = sorted(fetch.parts[i].offset for i in deferred)  # each lies wholly inside one record
    records = frozenset(rel for rel, offset, size in payload
                        if (k := bisect_left(starts, offset)) < len(starts) and starts[k] < offset + size)
    return deferred, records


def fetch_members_deferred(manifest: Manifest, blobs: BlobStore, cache: BlobCache, progress: ProgressFn | None
                           ) -> tuple[dict[str, Path], DeferredMembers | None]:
    """``fetch_members`` for a load that overlaps the fetch of the weights with deserializing.

    Each chunked member not cached is fetched chunk by chunk into a temp file: first its end
    records and central directory, then every chunk that holds anything but raw weight or
    constant bytes (headers, JSON, small tensors) -- the files returned hold these verified --
    and the rest in the background (``DeferredMembers``; None when nothing was left)."""
    progress = locked_progress(progress)
    fetches: list[_MemberFetch] = []
    unverified: dict[str, frozenset[str]] = {}
    files: dict[str, Path] = {}
    try:
        for m in manifest.members:
            if not m.chunks or cache.usable_member(m):
                continue
            fetch = _MemberFetch(m, blobs, cache.member_path(m), progress)
            fetches.append(fetch)
            deferred, records = _defer_plan(fetch, f"member {m.path}")
            later = set(deferred)
            now = [i for i in range(len(fetch.parts)) if i not in later]
            fetch.start(now + deferred)
            fetch.wait_for(now)
            files[m.path] = fetch.path
            if records:
                unverified[m.path] = records
        done = fetch_members(manifest, blobs, cache, progress, skip=set(files))
    except BaseException:
        for f in fetches:
            f.abort()
        raise
    done.update(files)
    if not fetches:
        return done, None
    return done, DeferredMembers(fetches, done, cache, unverified)
