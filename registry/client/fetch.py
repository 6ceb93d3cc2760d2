"""The pull half of moving a bundle's blobs: every chunk fetched at its place, verified.

A chunked member is stored as one blob per chunk (``client.upload``); a pull's ``get_parts``
writes each chunk at its place in the member's file, verified against its own sha256 as it
arrives, and the file becomes visible (atomically) only once every chunk matched.

Chunks a push stored in pack blobs are read back with ranged reads of the packs
(``blobs.packed``), each chunk verified against its own digest all the same. A chunk of
``PACK_BELOW`` bytes or more is never in a pack, so a pull starts those before it has read the
version's pack index (``IndexSource``): for a program of 10,000 tensors, reading the index and
planning the pack reads take 15 ms on one core, and the large chunks are copied and hashed on
the other meanwhile.

A cold ``registry.load`` overlaps the two halves of its work (``fetch_members_deferred``): a
program member's chunks that hold nothing but raw weight bytes are fetched in the background
while torch deserializes the graph from the chunks already verified (it maps the weights and
reads none of them, ``runtime.torchrt``); the load returns only once every chunk matched.
"""
from __future__ import annotations

import functools
import mmap
import os
import threading
from bisect import bisect_left
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import CancelledError
from itertools import compress, groupby
from pathlib import Path
from typing import cast

from ..atomic import atomic_write, new_temp
from ..blobs.base import BlobStore, Part, ProgressFn, corrupt_blob_error, locked_progress
from ..blobs.inplace import ALIGN as IN_PLACE_ALIGN
from ..blobs.inplace import InPlaceFile, InPlaceSegment, NotInPlace, hash_in_place
from ..blobs.packed import PackedPart, PackRun, get_packed, pack_runs, read_run, run_workers
from ..errors import IntegrityError, UnsafeArchiveError
from ..format.chunking import chunks_inside
from ..format.manifest import Manifest, Member
from ..format.packs import PACK_BELOW, PackIndex
from ..format.zipsafe import canonical_data_spans
from ..parallel import WORKERS, TaskPool, preallocate, run_parallel, split_where
from .sources import BlobCache

__all__ = ["assemble_member", "fetch_members", "fetch_members_deferred", "DeferredMembers", "member_parts",
           "member_reads", "fetch_parts", "IndexSource", "index_of", "AnyPart"]


#: a chunk stored in a pack is read back as a ``PackedPart``
AnyPart = Part | PackedPart

#: where a pull learns which chunks are in packs: the version's pack index, or a function that
#: reads it, called when it is needed (after the chunks that cannot be in a pack are under way),
#: once per chunked member: ``fetch_version`` passes the parse of the stored index, cached; or
#: None (no packs)
IndexSource = PackIndex | Callable[[], PackIndex] | None


def index_of(index: IndexSource) -> PackIndex:
    """The pack index ``index`` is or reads (empty for None)."""
    if index is None:
        return PackIndex()
    return index if isinstance(index, PackIndex) else index()


def member_parts(member: Member, index: PackIndex | None = None) -> list[AnyPart]:
    """Where each chunk of ``member`` is read from, one part per chunk in member order (a
    ``PackedPart`` for a chunk ``index`` places in a pack): ``member_reads``' placement, for a
    caller that picks chunks by their place (the cold load's deferred fetch)."""
    runs, own = member_reads(member, index or PackIndex())
    out: list[AnyPart | None] = [None] * len(member.chunks)
    for r in runs:
        for sha, at, size, offset, i in r.chunks:
            out[i] = PackedPart("sha256:" + sha, offset, size, r.pack, at)
    rest = iter(own)   # the other chunks, in member order
    return [p if p is not None else next(rest) for p in out]


def member_reads(member: Member, index: PackIndex) -> tuple[list[PackRun], list[Part]]:
    """How a pull reads ``member``: the runs of ranged pack reads (``blobs.packed.PackRun``, in
    pack order) of the chunks ``index`` places in packs, and the other chunks as blobs of their
    own. Built from the index's entries as they come (in pack order), without a location per
    chunk or a sort: a pull of a 10,000-tensor program does this once. A chunk is read from a
    pack when the index lists it there at its size; one listed at several places of the member
    is read from its pack for each of them."""
    shas, sizes, offsets = member.chunk_columns
    if not index:
        return [], list(map(Part, map("sha256:".__add__, shas), offsets, sizes))
    first = dict(zip(reversed(shas), range(len(shas) - 1, -1, -1)))   # sha256 hex -> its first place
    runs: list[PackRun] = []
    placed: set[int] = set()
    for p in index.packs:
        places = list(map(first.get, p.chunks))
        if None in places or list(map(sizes.__getitem__, places)) != list(p.sizes):
            # some entries are not chunks of this member (of another member, or at another size)
            kept = [k for k, (i, n) in enumerate(zip(places, p.sizes)) if i is not None and sizes[i] == n]
            places = [places[k] for k in kept]
            entries = zip([p.chunks[k] for k in kept], [p.offsets[k] for k in kept], [p.sizes[k] for k in kept],
                          map(offsets.__getitem__, places), places)
        else:   # every entry is a chunk of this member (tuples made in C)
            entries = zip(p.chunks, p.offsets, p.sizes, map(offsets.__getitem__, places), places)
        placed.update(places)
        runs += pack_runs(p.digest, entries)
    if len(first) < len(shas):   # repeated chunks: each other place reads the same pack bytes as the first
        where = {c[4]: (r.pack, c[1]) for r in runs for c in r.chunks}
        again = sorted((*where[first[sha]], size, i, sha) for i, (sha, size) in enumerate(zip(shas, sizes))
                       if i not in placed and first[sha] in placed)
        for pack, group in groupby(again, key=lambda a: a[0]):
            runs += pack_runs(pack, [(sha, at, size, offsets[i], i) for _pack, at, size, i, sha in group])
        placed.update(a[3] for a in again)
    own = [Part("sha256:" + shas[i], offsets[i], sizes[i]) for i in sorted(set(range(len(shas))) - placed)]
    return runs, own


def fetch_parts(blobs: BlobStore, fd: int, parts: Sequence[AnyPart], *, progress: ProgressFn | None = None,
                on_done: Callable[[int], None] | None = None) -> None:
    """Fetch ``parts`` into the open file ``fd``, each verified: chunks in packs with ranged
    reads of their packs (``blobs.packed``), the others with ``get_parts``; ``on_done(i)`` once
    ``parts[i]`` is complete. (The two one after the other: at once, they took as long on two
    cores, locally and against SeaweedFS, measured. ``assemble_member`` hands the large chunks
    to its pool first, while the pack index is read: a window in which only one core has work.)"""
    packed: list[int] = []
    own: list[int] = []
    for i, p in enumerate(parts):
        (packed if type(p) is PackedPart else own).append(i)

    def done(idx: list[int]) -> Callable[[int], None] | None:
        return None if on_done is None else (lambda j: on_done(idx[j]))

    if packed:
        get_packed(blobs, fd, cast(list[PackedPart], [parts[i] for i in packed]), progress=progress,
                   on_done=done(packed))
    if own:
        blobs.get_parts(fd, cast(list[Part], [parts[i] for i in own]), progress=progress, on_done=done(own))


def assemble_member(member: Member, blobs: BlobStore, dest: str | os.PathLike,
                    progress: ProgressFn | None, index: IndexSource = None) -> None:
    """Rebuild a chunked member at ``dest`` (atomically) from its chunk blobs and the packs
    ``index`` places chunks in (``member_reads``), fetched several at once into their places,
    each verified; nothing is left behind on failure. Not fsynced: a cache file (see
    ``BlobCache``: re-hashed after a reboot).

    Every fetch runs on one ``TaskPool`` (one thread per core for a local store), already
    running when the member's chunks of ``PACK_BELOW`` bytes or more (never in a pack) are
    handed to it: they go first, while ``index`` is read and the pack runs are planned on this
    thread; then the runs, then the small chunks stored on their own (a version pushed before
    packs), on the same threads. The 10,000-tensor program from a local store, medians of
    13-15 pulls interleaved in one process: 185-186 ms with the large chunks on a thread of
    their own that started a pool of its own, then a pool for the runs; 179 ms."""
    with atomic_write(Path(dest), fsync=False) as out:
        out.flush()
        preallocate(out.fileno(), member.size)
        _fetch_into(out.fileno(), member, blobs, progress, index)


def _fetch_into(fd: int, member: Member, blobs: BlobStore, progress: ProgressFn | None,
                index: IndexSource) -> None:
    """``assemble_member``'s fetches, written through a duplicate of ``fd`` that the pool
    closes once its last thread stopped: should the caller stop waiting for them (a second
    Ctrl-C while the pool's exit waits) and close ``fd``, what is still written lands in this
    file, never in another that reuses the number."""
    workers = min(run_workers(blobs), len(member.chunks))   # no more threads than fetches (a run has a chunk or more)
    own = os.dup(fd)
    with TaskPool(workers, progress, finish=functools.partial(os.close, own)) as pool:
        large = _large_parts(member)
        if large:
            pool.submit_all(blobs.part_fetches(own, large, progress=pool.progress))
        packed, rest = member_reads(member, index_of(index))
        pool.submit_all([functools.partial(read_run, blobs, run, own, progress=pool.progress) for run in packed])
        small = [p for p in rest if p.size < PACK_BELOW]   # the large ones are under way
        if small:
            pool.submit_all(blobs.part_fetches(own, small, progress=pool.progress))


def _large_parts(member: Member) -> list[Part]:
    """The member's chunks of ``PACK_BELOW`` bytes or more (never in a pack), in member order
    (a 10,000-chunk list filtered in C, no step per chunk)."""
    shas, sizes, offsets = member.chunk_columns
    return [Part("sha256:" + shas[i], offsets[i], sizes[i])
            for i in compress(range(len(sizes)), map(PACK_BELOW.__le__, sizes))]


def fetch_members(manifest: Manifest, blobs: BlobStore, cache: BlobCache, progress: ProgressFn | None, *,
                  skip: Collection[str] = (), index: IndexSource = None) -> dict[str, Path]:
    """Every member of ``manifest`` as a verified file in ``cache`` (fetched from ``blobs``
    unless already cached intact, or copied from a bundle a pull wrote), and the manifest itself cached; ``{member path: file}``.
    ``skip``: member paths left out (being fetched by the caller); ``index``: the version's
    pack index (where its small chunks are stored), or how to read it when it is needed."""
    files = {}
    for m in manifest.members:
        if m.path in skip:
            continue
        path = cache.member_path(m)
        if not cache.usable_member(m):
            pulled = cache.member_in_bundle(m)   # verified in a bundle a pull wrote: copied from there
            if pulled is not None:
                files[m.path] = cache.put_member(m, pulled, progress, label=f"{pulled.path}: member {m.path}")
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            if m.chunks:
                assemble_member(m, blobs, path, progress, index)
            else:
                blobs.get_file(m.digest, path, progress=progress)
            os.chmod(path, 0o444)
            cache.stamp_member(m)
        elif progress:
            progress(m.size)
        files[m.path] = path
    cache.put_manifest(manifest)
    return files


#: the records of a program archive a cold load may verify while torch deserializes the rest:
#: raw weights and constants, which torch maps (``runtime.torchrt``); JSON configs are never deferred
_PAYLOAD_DIRS = ("data/weights/", "data/constants/")


class _MemberFetch:
    """A chunked member being fetched into a new temp file beside its cache path (``new_temp``,
    as ``atomic_write``'s), its chunks in an order of our choosing, each marked done
    once verified; the file replaces the cache path only when every chunk matched."""

    def __init__(self, member: Member, blobs: BlobStore, dest: Path, progress: ProgressFn | None,
                 index: PackIndex | None = None) -> None:
        self.member, self.dest, self._blobs, self._progress = member, dest, blobs, progress
        self.parts = member_parts(member, index)
        self._done = [False] * len(self.parts)
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._stop = False
        self._thread: threading.Thread | None = None
        dest.parent.mkdir(parents=True, exist_ok=True)
        #: chunks verified where they lie in a local store, not copied here (``_in_place_parts``)
        self.in_place: dict[int, InPlaceSegment] = {}
        self.fd, tmp = new_temp(dest)
        self.path = Path(tmp)
        try:
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

        here = [j for j, i in enumerate(indices) if i in self.in_place]
        if len(here) < len(indices):
            copied = [j for j, i in enumerate(indices) if i not in self.in_place]
            fetch_parts(self._blobs, self.fd, [self.parts[indices[j]] for j in copied], progress=self._progress,
                        on_done=lambda k: on_done(copied[k]))
        if here:
            def verify(j: int) -> None:
                part = self.parts[indices[j]]
                try:
                    got = hash_in_place(self.in_place[indices[j]])
                except NotInPlace as exc:  # replaced or rewritten since planned: torch may have mapped either
                    raise IntegrityError(f"blob {part.digest} changed in {self._blobs.url} while being "
                                         f"loaded ({exc})", hint="load again") from None
                if got != part.digest[7:]:
                    raise corrupt_blob_error(part.digest, got, self._blobs.url)
                if self._progress is not None:
                    self._progress(part.size)
                on_done(j)

            run_parallel(verify, here, WORKERS)

    def verified(self, indices: Collection[int]) -> None:
        """Count the chunks ``indices`` as verified already (checked in place before)."""
        with self._cond:
            for i in indices:
                self._done[i] = True
        if self._progress is not None:
            self._progress(sum(self.parts[i].size for i in indices))

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

    def finish(self) -> Path | None:
        """Wait for every chunk, then move the file into its cache path (read-only); None when
        chunks were verified in place: the file lacks them, and is removed (a load that mapped it
        keeps its map)."""
        try:
            self.wait_for(range(len(self.parts)))
            if self._thread is not None:
                self._thread.join()
            if self.in_place:
                self._discard()
                return None
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

    From a local store, a record whose chunks (one, or the pieces of a split tensor) lie in files
    this user owns and nobody else may write is not copied: each chunk is hashed where it lies
    and torch maps the record from there (``in_place``; ``blobs.inplace`` says why that is as
    safe as the copy). Such a member gets no cache file: ``wait`` leaves it out of the files it
    returns, and stamps the files as verified (``BlobCache.stamp_in_place``), so a later load
    of the same unchanged files hashes nothing.
    """

    def __init__(self, fetches: list[_MemberFetch], files: dict[str, Path], cache: BlobCache,
                 unverified: dict[str, frozenset[str]]) -> None:
        self._fetches, self._files, self._cache = fetches, dict(files), cache
        self.unverified = unverified
        #: per member path, its records whose bytes are verified where they lie in a local store
        #: (``blobs.inplace``) rather than copied into its file, for torch to map from there
        self.in_place = {f.member.path: tuple(sorted(f.in_place.values())) for f in fetches if f.in_place}
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
                        final = f.finish()
                        if final is None:  # verified in place: no complete file (``complete``)
                            self._files.pop(f.member.path, None)
                            self._cache.stamp_in_place(f.member, self.in_place[f.member.path])
                            continue
                        self._files[f.member.path] = final
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


def _defer_plan(fetch: _MemberFetch, where: str) -> tuple[list[int], frozenset[str], set[tuple[int, int]]]:
    """The chunks of a program member that hold nothing but the bytes of raw weights and
    constants, those records' names, and the (offset, size) of every such record; read from the
    end records and central directory, whose chunks are fetched (and verified) first. Nothing is deferred for a member that is
    not a canonical archive (the loader's vetting reports it)."""
    try:
        with open(fetch.path, "rb") as fp:
            spans = canonical_data_spans(fp, fetch.member.size, where=where, ensure=fetch.fetch_range)
    except UnsafeArchiveError:
        return [], frozenset(), set()
    payload = []
    for name, offset, size in spans:
        rel = name.split("/", 1)[1] if "/" in name else name
        if rel.startswith(_PAYLOAD_DIRS) and not rel.endswith(".json"):
            payload.append((rel, offset, size))
    deferred = chunks_inside([(p.offset, p.size) for p in fetch.parts], [(o, n) for _, o, n in payload])
    starts = sorted(fetch.parts[i].offset for i in deferred)  # each lies wholly inside one record
    records = frozenset(rel for rel, offset, size in payload
                        if (k := bisect_left(starts, offset)) < len(starts) and starts[k] < offset + size)
    return deferred, records, {(offset, size) for _rel, offset, size in payload}


def _in_place_parts(parts: Sequence[AnyPart], deferred: Sequence[int], records: Collection[tuple[int, int]],
                    blobs: BlobStore) -> dict[int, InPlaceSegment]:
    """Which deferred chunks are verified and mapped where they lie (a local store's
    ``in_place``), each in a file usable in place: a chunk that is a whole record, at an offset
    in its file that keeps the record's alignment; and the pieces of a split record, each its
    own blob, every one but the last a whole number of pages (torch needs a record in one map:
    ``inplace.map_together`` maps them side by side). The others are copied."""
    if not blobs.maps_in_place:
        return {}
    find = blobs.in_place
    files: dict[str, InPlaceFile | None] = {}

    def segment(p: AnyPart) -> InPlaceSegment | None:
        if type(p) is PackedPart:
            key, at, size = p.pack, p.pack_offset, None
        else:
            key, at, size = p.digest, 0, p.size
        if (at - p.offset) % IN_PLACE_ALIGN:
            return None
        if key not in files:
            files[key] = find(key, size)
        found = files[key]
        if found is None or at + p.size > found.identity.size:
            return None
        return InPlaceSegment(p.offset, p.size, found.path, at, found.identity)

    record_end = {offset: offset + size for offset, size in records}

    def same_record(i: int, j: int) -> bool:  # j goes on where i stops, and starts no record
        return parts[i].offset + parts[i].size == parts[j].offset and parts[j].offset not in record_end

    out: dict[int, InPlaceSegment] = {}
    for run in split_where(sorted(deferred, key=lambda i: parts[i].offset), same_record):
        last = parts[run[-1]]
        if record_end.get(parts[run[0]].offset) != last.offset + last.size:
            continue  # not a whole record in deferred chunks: copied
        if len(run) > 1 and any(type(parts[i]) is PackedPart or parts[i].size % mmap.PAGESIZE for i in run[:-1]):
            continue
        found = [segment(parts[i]) for i in run]
        if all(s is not None and (len(run) == 1 or s.file_offset == 0) for s in found):
            out.update(zip(run, cast(list[InPlaceSegment], found)))
    return out


def fetch_members_deferred(manifest: Manifest, blobs: BlobStore, cache: BlobCache, progress: ProgressFn | None,
                           index: IndexSource = None, *, in_place: bool = True
                           ) -> tuple[dict[str, Path], DeferredMembers | None]:
    """``fetch_members`` for a load that overlaps the fetch of the weights with deserializing.

    Each chunked member not cached is fetched chunk by chunk into a temp file: first its end
    records and central directory, then every chunk that holds anything but raw weight or
    constant bytes (headers, JSON, small tensors) -- the files returned hold these verified --
    and the rest in the background (``DeferredMembers``; None when nothing was left)."""
    progress = locked_progress(progress)
    index = index_of(index)
    fetches: list[_MemberFetch] = []
    unverified: dict[str, frozenset[str]] = {}
    files: dict[str, Path] = {}
    try:
        for m in manifest.members:
            if not m.chunks or cache.usable_member(m) or cache.member_in_bundle(m) is not None:
                continue   # copied by fetch_members below
            fetch = _MemberFetch(m, blobs, cache.member_path(m), progress, index)
            fetches.append(fetch)
            deferred, records, spans = _defer_plan(fetch, f"member {m.path}")
            fetch.in_place = _in_place_parts(fetch.parts, deferred, spans, blobs) if in_place else {}
            if not fetch.in_place:
                preallocate(fetch.fd, m.size)
            elif cache.verified_in_place(m, sorted(fetch.in_place.values())):
                fetch.verified(fetch.in_place)  # their files unchanged since: not hashed again
            later = set(deferred)
            now = [i for i in range(len(fetch.parts)) if i not in later]
            fetch.start(now + deferred)
            fetch.wait_for(now)
            files[m.path] = fetch.path
            if records:
                unverified[m.path] = records
        done = fetch_members(manifest, blobs, cache, progress, skip=set(files), index=index)
    except BaseException:
        for f in fetches:
            f.abort()
        raise
    done.update(files)
    if not fetches:
        return done, None
    return done, DeferredMembers(fetches, done, cache, unverified)
