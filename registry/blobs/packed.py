"""Reading chunks out of pack blobs (``format.packs``), several ranges at once, each verified.

A pack is an ordinary blob; what a version knows about it is a claim (its index: chunk X lies
at offset O). So nothing here trusts a pack's bytes: every chunk read from one is hashed and
compared with the chunk's own digest before it is written anywhere or reported done. Chunks
that lie close together in one pack are read with one ranged request (a ``PackRun``: at most
``RUN_BYTES`` each, a gap of up to ``RUN_GAP`` bytes read and dropped), and the runs go on
``WORKERS`` threads; memory is bounded by ``WORKERS * RUN_BYTES``.

A pull builds its runs straight from a version's pack index (``client.transfer.member_reads``,
the index's entries already in pack order); ``get_packed`` and ``check_packed`` take one
``PackedPart`` per chunk and group them (``runs``) by the same rule.

Every store provides ``read_range(digest, offset, length)`` (a raw, unverified read of one
stretch of a blob); this module is the same for all of them.
"""
from __future__ import annotations

import hashlib
import operator
from itertools import groupby
from typing import Callable, Iterable, NamedTuple, Sequence

from ..errors import IntegrityError
from ..parallel import pwrite_all, run_parallel
from .base import BlobStore, ProgressFn

__all__ = ["PackedPart", "PackRun", "RUN_BYTES", "RUN_GAP", "pack_runs", "runs", "read_runs", "get_packed",
           "check_packed"]

#: one ranged read covers at most this many bytes of a pack
RUN_BYTES = 8 * 1024 * 1024
#: chunks this close in a pack are read together (the bytes between are read and dropped)
RUN_GAP = 256 * 1024
#: runs read at once (a store with a ``read_workers`` attribute says its own: one per core for
#: a local directory, where a read is CPU work, not a wait on the network)
WORKERS = 8


def _workers(blobs: BlobStore) -> int:
    return int(getattr(blobs, "read_workers", WORKERS))


class PackedPart(NamedTuple):
    """A chunk (``digest``, ``size`` bytes) read from ``pack`` at ``pack_offset``, written at
    ``offset`` of the destination file (a named tuple: a member has one per small tensor)."""

    digest: str
    offset: int
    size: int
    pack: str
    pack_offset: int


#: one chunk of a ``PackRun``: (sha256 hex, offset in the pack, size, offset in the destination,
#: tag: what ``on_done`` and ``checked`` are called with, e.g. the chunk's index in a list)
RunChunk = tuple[str, int, int, int, int]


class PackRun(NamedTuple):
    """One ranged read: bytes ``[start, end)`` of pack ``pack``, holding ``chunks`` in pack order."""

    pack: str
    start: int
    end: int
    chunks: list[RunChunk]


def pack_runs(pack: str, chunks: Iterable[RunChunk], *, max_bytes: int = RUN_BYTES,
              gap: int = RUN_GAP) -> list[PackRun]:
    """Chunks of ``pack`` in offset order grouped into ranged reads, each at most ``max_bytes``
    long and skipping at most ``gap`` bytes between two chunks (a chunk larger than
    ``max_bytes`` is read alone).

    >>> [(r.start, r.end, [c[4] for c in r.chunks]) for r in pack_runs(
    ...     "a", [("h", 0, 10, 0, 0), ("h", 20, 10, 0, 1), ("h", 900, 10, 0, 2)], gap=100)]
    [(0, 30, [0, 1]), (900, 910, [2])]
    """
    out: list[PackRun] = []
    run: list[RunChunk] = []
    start = end = 0
    for c in chunks:
        at = c[1]
        stop = at + c[2]
        if run and at <= end + gap and (stop if stop > end else end) - start <= max_bytes:
            run.append(c)
            if stop > end:
                end = stop
            continue
        if run:
            out.append(PackRun(pack, start, end, run))
        run = [c]
        start, end = at, stop
    if run:
        out.append(PackRun(pack, start, end, run))
    return out


_PLACE = operator.itemgetter(3, 4)   # a PackedPart's (pack, pack_offset)


def _part_runs(parts: Sequence[PackedPart], *, max_bytes: int = RUN_BYTES, gap: int = RUN_GAP) -> list[PackRun]:
    """``parts`` grouped into runs (each chunk tagged with its index in ``parts``)."""
    keys = list(map(_PLACE, parts))
    order = sorted(range(len(parts)), key=keys.__getitem__)
    out: list[PackRun] = []
    for pack, in_pack in groupby(order, key=lambda i: parts[i].pack):
        out += pack_runs(pack, [(parts[i].digest[7:], parts[i].pack_offset, parts[i].size, parts[i].offset, i)
                                for i in in_pack], max_bytes=max_bytes, gap=gap)
    return out


def runs(parts: Sequence[PackedPart], *, max_bytes: int = RUN_BYTES, gap: int = RUN_GAP) -> list[list[int]]:
    """Indices of ``parts`` grouped into ranged reads (``pack_runs``), in pack order.

    >>> P = lambda pack, at: PackedPart("c", 0, 10, pack, at)
    >>> runs([P("a", 20), P("a", 0), P("b", 0), P("a", 1000)], gap=100)
    [[1, 0], [3], [2]]
    """
    return [[c[4] for c in r.chunks] for r in _part_runs(parts, max_bytes=max_bytes, gap=gap)]


def _mismatch(digest: str, pack: str, pack_offset: int, got: str) -> IntegrityError:
    return IntegrityError(f"chunk {digest} read from pack {pack} at offset {pack_offset} does not "
                          f"match its digest (got sha256:{got[:12]}...): the pack is corrupt in the store, or its "
                          f"index is wrong", hint="the versions that read this chunk from that pack cannot be "
                          "pulled until the pack is restored (from a backup of the store)")


def _read_verified(blobs: BlobStore, run: PackRun, checked: Callable[[int, bool], None] | None = None) -> memoryview:
    """Read one run and verify each chunk in it; its bytes (from ``run.start``). ``checked(tag,
    ok)`` for each chunk verified (the first that does not match raises)."""
    pack, start, _end, chunks = run
    data = memoryview(blobs.read_range(pack, start, run.end - start))
    sha = hashlib.sha256
    for hex_, at, n, _dest, tag in chunks:
        got = sha(data[at - start:at - start + n]).hexdigest()
        if checked is not None:
            checked(tag, got == hex_)
        if got != hex_:
            raise _mismatch("sha256:" + hex_, pack, at, got)
    return data


def read_runs(blobs: BlobStore, fd: int, runs_: Sequence[PackRun], *, progress: ProgressFn | None = None,
              on_done: Callable[[int], None] | None = None) -> None:
    """Read every run, verify each of its chunks and write it at its destination offset of the
    open file ``fd`` (chunks lying back to back both in the pack and in the file in one write);
    ``on_done(tag)`` once a chunk is written. ``IntegrityError`` for a chunk that does not match
    (nothing more is written; discard the file)."""
    def write(data: memoryview, start: int, span: list[RunChunk]) -> None:
        at, dest = span[0][1], span[0][3]
        n = span[-1][1] + span[-1][2] - at
        pwrite_all(fd, data[at - start:at - start + n], dest)
        if progress is not None:
            progress(n)
        if on_done is not None:
            for c in span:
                on_done(c[4])

    def one(run: PackRun) -> None:
        data = _read_verified(blobs, run)
        span: list[RunChunk] = []
        for c in run.chunks:
            if span:
                last = span[-1]
                if c[1] == last[1] + last[2] and c[3] == last[3] + last[2]:
                    span.append(c)
                    continue
                write(data, run.start, span)
            span = [c]
        if span:
            write(data, run.start, span)

    run_parallel(one, runs_, _workers(blobs))


def get_packed(blobs: BlobStore, fd: int, parts: Sequence[PackedPart], *, progress: ProgressFn | None = None,
               on_done: Callable[[int], None] | None = None) -> None:
    """Read every chunk of ``parts`` from its pack, verify it and write it at its ``offset`` of
    the open file ``fd`` (``read_runs``); ``on_done(i)`` once ``parts[i]`` is written.
    ``IntegrityError`` for a chunk that does not match (nothing more is written; discard the file)."""
    read_runs(blobs, fd, _part_runs(parts), progress=progress, on_done=on_done)


def check_packed(blobs: BlobStore, parts: Sequence[PackedPart], *,
                 checked: Callable[[int, bool], None] | None = None) -> None:
    """Verify that each chunk of ``parts`` is in its pack where the part says (a server checks a
    pusher's pack index this way before recording it); ``IntegrityError`` for the first that
    is not, ``NotFoundError`` when a pack is not stored. ``checked(i, ok)`` as each part is
    found to match or not (from several threads)."""
    run_parallel(lambda run: _read_verified(blobs, run, checked), _part_runs(parts), _workers(blobs))
