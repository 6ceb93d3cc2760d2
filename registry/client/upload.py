"""The push half of moving a bundle's blobs: plan what a store lacks, and upload it.

A chunked member (a program split at its weights, see ``format.chunking``) is stored as one
blob per chunk, and its chunk list is its integrity: the store verifies each chunk against its
own sha256 as it transfers it, and the chunks tile the member exactly (the manifest's schema
checks the sizes). So no step needs a sequential hash of a whole member, and every chunk moves
and hashes on its own core: ``put_parts`` reads each chunk's range of the bundle file, hashes
it and stores it.

Chunks under ``PACK_BELOW`` bytes (tiny tensors, zip headers) are the exception: a push stores
the ones the store lacks concatenated in pack blobs (``plan_upload``: a chunk some version
already stored in a pack is reused from there) and records the version's pack index. The pull
half is ``client.fetch``.
"""
from __future__ import annotations

import dataclasses
import io
import operator
import os
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, repeat
from typing import Any, cast

from ..blobs.base import BlobStore, Part, ProgressFn, as_pack_writer, hash_parts, locked_progress, stretches
from ..errors import NotFoundError
from ..format.bundle import BundleFile
from ..format.packs import PACK_BELOW, PACK_BYTES, Pack, PackEntry, PackIndex
from ..parallel import BATCH_BYTES, WORKERS, group_consecutive, run_parallel
from .ports import MetadataStore

__all__ = ["NewPack", "UploadPlan", "plan_upload", "upload_plan", "bundle_parts"]


@dataclass(frozen=True)
class NewPack:
    """A pack a push stores: ``digest`` and ``size`` of the concatenation of ``segments``
    ((offset, size) ranges of the bundle file, in pack order)."""

    digest: str
    size: int
    segments: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class UploadPlan:
    """How a push stores a bundle: ``whole`` parts as blobs of their own, ``packs`` to store,
    and the version's pack ``index`` (chunks in new packs and in packs stored before).

    ``groups``: new packs not named yet, each the chunks it holds in order (``plan_upload``
    with ``hash_packs=False``: a store that names them as it writes them, ``put_packs``); the
    index lacks their chunks until ``named`` gives their digests."""

    whole: list[Part]
    packs: list[NewPack]
    index: PackIndex
    reused_bytes: int     # packed chunks found in packs already stored
    groups: list[list[Part]] = field(default_factory=list)

    def blobs(self) -> list[tuple[str, int]]:
        """(digest, size) of every blob the version records, but its manifest (and the packs
        of ``groups``, not named yet)."""
        return sorted({(p.digest, p.size) for p in self.whole} | self.index.blobs())

    def named(self, packs: Sequence[tuple[str, int]]) -> UploadPlan:
        """This plan once each of ``groups`` was stored as a pack: (digest, size) of each, in order."""
        if len(packs) != len(self.groups):
            raise ValueError(f"{len(packs)} packs named for {len(self.groups)} groups")
        listed = {(p.digest, p.size): p for p in self.index.packs}
        new = []
        for (digest, size), group in zip(packs, self.groups):
            sizes = list(map(_SIZE, group))
            offsets = list(accumulate(sizes, initial=0))
            if offsets.pop() != size:
                raise ValueError(f"pack {digest} has {size} bytes, its chunks {sum(sizes)}")
            entries = tuple(map(tuple.__new__, repeat(PackEntry), zip(map(_DIGEST, group), offsets, sizes)))
            if (digest, size) in listed:  # the same bytes twice: one pack, every entry
                entries = tuple({*listed[digest, size].entries, *entries})
            listed[digest, size] = Pack.of(digest, size, entries)
            new.append(NewPack(digest, size, _segments(group)))
        return dataclasses.replace(self, packs=[*self.packs, *new], groups=[],
                                   index=PackIndex(tuple(listed[k] for k in sorted(listed))))


def plan_upload(bundle: BundleFile, meta: MetadataStore, blobs: BlobStore, name: str, *,
                hash_packs: bool = True, parts: tuple[list[Part], list[Part]] | None = None) -> UploadPlan:
    """Decide where each chunk of ``bundle`` is stored, and hash every chunk that goes into a
    pack or is reused from one (``IntegrityError``, exit 5, when the bundle file's bytes do not
    match a chunk's digest); without ``hash_packs``, the new packs are left to the upload that
    writes them (``UploadPlan.groups``: ``put_packs`` checks and names them in the pass that
    copies them), and only the reused chunks are hashed here. Chunks of ``PACK_BELOW`` bytes or more, unchunked members, and small
    chunks an older version stored as blobs of their own stay ``whole`` (``put_parts`` hashes
    those); other small chunks are reused from a pack a version of model ``name`` already
    references (when the pack is still stored) or concatenated, in bundle order, into new packs
    of up to ``PACK_BYTES``. A metadata store that keeps no packs (a server older than packs:
    ``locate_chunks`` answers None) gets every chunk as a blob of its own. ``parts``: the bundle's
    ``bundle_parts``, when the caller has them already."""
    large, small = parts if parts is not None else bundle_parts(bundle)
    whole = list(large)
    located = meta.locate_chunks([p.digest for p in small], name=name) if small else None
    if located is None:
        return UploadPlan(whole + small, [], PackIndex(), 0)
    sizes = {p.digest: p.size for p in small}
    located = {d: loc for d, loc in located.items() if loc.size == sizes.get(d)}
    packs = sorted({(loc.pack, loc.pack_size) for loc in located.values()})
    stored = run_parallel(lambda pack: _stored_whole(blobs, *pack), packs, 8) if packs else []
    gone = {d for (d, _n), ok in zip(packs, stored) if not ok}
    located = {d: loc for d, loc in located.items() if loc.pack not in gone}
    rest = [p for p in small if p.digest not in located]
    recorded = (meta.recorded_blobs([p.digest for p in rest]) if rest else None) or set()
    whole += [p for p in rest if p.digest in recorded]
    fresh = [p for p in rest if p.digest not in recorded]
    groups = _pack_groups(fresh)
    reused = [p for p in small if p.digest in located]
    with open(bundle.path, "rb") as f:
        fd = f.fileno()
        run_parallel(lambda b: hash_parts(bundle.path, fd, b, concatenation=False),
                     [[reused[i] for i in r] for r in group_consecutive([p.size for p in reused], BATCH_BYTES)],
                     WORKERS)
        plan = UploadPlan(whole, [], PackIndex.from_locations(located), sum(p.size for p in reused), groups)
        if not hash_packs:
            return plan
        names = run_parallel(lambda g: "sha256:" + cast(str, hash_parts(bundle.path, fd, g)), groups, WORKERS)
    return plan.named([(digest, sum(p.size for p in g)) for digest, g in zip(names, groups)])


def bundle_parts(bundle: BundleFile) -> tuple[list[Part], list[Part]]:
    """The ranges of ``bundle`` a push stores: those ``plan_upload`` stores as blobs of their
    own whatever else it finds (members not chunked, and chunks of ``PACK_BELOW`` bytes or more,
    in bundle order, a repeated one too: ``put_parts`` counts it as already stored), and the
    small chunks (each digest once), which may go into packs."""
    large: list[Part] = []
    small: list[Part] = []
    seen: set[str] = set()
    for m in bundle.manifest.members:
        offset, _size = bundle.member_span(m.path)
        if not m.chunks:
            large.append(Part(m.digest, offset, m.size))
            continue
        shas, sizes, ats = m.chunk_columns
        for part in map(tuple.__new__, repeat(Part), zip(map("sha256:".__add__, shas), map(offset.__add__, ats), sizes)):
            if part[2] >= PACK_BELOW:
                large.append(part)
            elif part[0] not in seen:
                seen.add(part[0])
                small.append(part)
    return large, small


def _stored_whole(blobs: BlobStore, digest: str, size: int) -> bool:
    """Whether the store holds blob ``digest`` at its ``size`` (a pack lost or cut short is not
    reused: its chunks are packed and stored again, and a pack that comes out the same bytes
    replaces the damaged one, which mends the versions that read from it)."""
    try:
        return blobs.stat(digest).size == size
    except NotFoundError:
        return False


#: a stretch of new small chunks lying back to back in the bundle at least this long is packed
#: on its own (a pack that is one range of the bundle file uploads like any chunk); shorter
#: ones (a fine-tune's scattered tensors) are gathered into shared packs
RUN_PACK = 1024 * 1024


def _pack_groups(parts: list[Part]) -> list[list[Part]]:
    """The new small chunks (in bundle order) grouped into packs of at most ``PACK_BYTES``:
    each stretch of ``RUN_PACK`` bytes or more that lies back to back in the bundle file makes
    packs of its own (one range each), the shorter stretches are gathered together."""
    sized = [(s, sum(map(_SIZE, s))) for s in stretches(parts)]
    long = [s for s, n in sized if n >= RUN_PACK]
    scattered = [p for s, n in sized if n < RUN_PACK for p in s]
    return [list(s[g.start:g.stop]) for s in [*long, scattered] if s
            for g in group_consecutive(list(map(_SIZE, s)), PACK_BYTES)]


def _segments(parts: Sequence[Part]) -> tuple[tuple[int, int], ...]:
    """The ranges of the bundle file ``parts`` (one pack's chunks, in order) read from."""
    return tuple((s[0].offset, sum(map(_SIZE, s))) for s in stretches(parts))


_DIGEST, _SIZE = operator.itemgetter(0), operator.itemgetter(2)   # a Part's digest, size


class _SegmentReader(io.RawIOBase):
    """The concatenation of ranges of an open file, read in order (a pack's bytes)."""

    def __init__(self, fd: int, segments: tuple[tuple[int, int], ...]) -> None:
        self._fd, self._segments, self._i, self._at = fd, segments, 0, 0

    def readable(self) -> bool:
        return True

    def readinto(self, out: Any) -> int:
        while self._i < len(self._segments):
            start, size = self._segments[self._i]
            if self._at < size:
                n = os.preadv(self._fd, [memoryview(out)[:size - self._at]], start + self._at)
                if n <= 0:
                    raise OSError(f"file ended early (at byte {start + self._at})")
                self._at += n
                return n
            self._i, self._at = self._i + 1, 0
        return 0


def upload_plan(bundle: BundleFile, plan: UploadPlan, blobs: BlobStore, progress: ProgressFn | None, *,
                unrecorded: Collection[str] = (), tag: str | None = None,
                claim: Callable[[list[tuple[str, int]]], None] | None = None) -> tuple[int, int]:
    """Store every blob of ``plan`` (several at once); returns (bytes uploaded, bytes already
    stored). ``IntegrityError`` (exit 5) when a chunk does not match its digest.
    ``unrecorded``: digests no version records (stored without asking the store first).
    A plan with ``groups`` needs a store with ``put_packs``, the ``tag`` its temp files are
    named by and the ``claim`` it calls with the new packs' (digest, size) before they become
    visible (the caller gets their names there: ``UploadPlan.named``)."""
    progress = locked_progress(progress)
    # a pack that is one range of the bundle file goes up like any chunk, in the same batch
    ranges = [Part(p.digest, p.segments[0][0], p.size) for p in plan.packs if len(p.segments) == 1]
    gathered = [p for p in plan.packs if len(p.segments) > 1]
    if plan.groups:
        if tag is None or claim is None:
            raise ValueError("a plan with packs not named yet needs a tag and a claim")
        uploaded, skipped, _named = as_pack_writer(blobs).put_packs(
            bundle.path, plan.whole + ranges, plan.groups, tag=tag, claim=claim, progress=progress,
            unrecorded=unrecorded)
    else:
        uploaded, skipped = blobs.put_parts(bundle.path, plan.whole + ranges, progress=progress,
                                            unrecorded=unrecorded)
    if progress is not None and plan.reused_bytes:
        progress(plan.reused_bytes)
    with open(bundle.path, "rb") as f:
        def one(pack: NewPack) -> bool:
            with io.BufferedReader(_SegmentReader(f.fileno(), pack.segments), 1 << 20) as reader:
                return blobs.put_stream(reader, pack.digest, size=pack.size, progress=progress)

        stored = run_parallel(one, gathered, 4)
    for pack, new in zip(gathered, stored):
        if new:
            uploaded += pack.size
        else:
            skipped += pack.size
    return uploaded, skipped + plan.reused_bytes
