"""Reading chunks out of pack blobs (``format.packs``), several ranges at once, each verified.

A pack is an ordinary blob; what a version knows about it is a claim (its index: chunk X lies
at offset O). So nothing here trusts a pack's bytes: every chunk read from one is hashed and
compared with the chunk's own digest before it is written anywhere or reported done. Chunks
that lie close together in one pack are read with one ranged request (``runs``: at most
``RUN_BYTES`` each, a gap of up to ``RUN_GAP`` bytes read and dropped), and the runs go on
``WORKERS`` threads; memory is bounded by ``WORKERS * RUN_BYTES``.

Every store provides ``read_range(digest, offset, length)`` (a raw, unverified read of one
stretch of a blob); this module is the same for all of them.
"""
from __future__ import annotations

import hashlib
import operator
from typing import Callable, NamedTuple, Sequence

from ..errors import IntegrityError
from ..parallel import pwrite_all, run_parallel, split_where
from .base import BlobStore, ProgressFn

__all__ = ["PackedPart", "RUN_BYTES", "RUN_GAP", "runs", "get_packed", "check_packed"]

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


_PLACE = operator.itemgetter(3, 4)   # (pack, pack_offset)


def runs(parts: Sequence[PackedPart], *, max_bytes: int = RUN_BYTES, gap: int = RUN_GAP) -> list[list[int]]:
    """Indices of ``parts`` grouped into ranged reads: same pack, in pack order, each read at
    most ``max_bytes`` long and skipping at most ``gap`` bytes between two chunks.

    >>> P = lambda pack, at: PackedPart("c", 0, 10, pack, at)
    >>> runs([P("a", 20), P("a", 0), P("b", 0), P("a", 1000)], gap=100)
    [[1, 0], [3], [2]]
    """
    keys = list(map(_PLACE, parts))
    order = sorted(range(len(parts)), key=keys.__getitem__)
    out: list[list[int]] = []
    run: list[int] = []
    pack, start, end = None, 0, 0
    for i in order:
        _digest, _offset, size, p_pack, p_at = parts[i]
        stop = p_at + size
        if stop < end:
            stop = end
        if p_pack == pack and p_at <= end + gap and stop - start <= max_bytes:
            run.append(i)
            end = stop
            continue
        run = [i]
        out.append(run)
        pack, start, end = p_pack, p_at, p_at + size
    return out


def _mismatch(part: PackedPart, got: str) -> IntegrityError:
    return IntegrityError(f"chunk {part.digest} read from pack {part.pack} at offset {part.pack_offset} does not "
                          f"match its digest (got sha256:{got[:12]}...): the pack is corrupt in the store, or its "
                          f"index is wrong", hint="the versions that read this chunk from that pack cannot be "
                          "pulled until the pack is restored (from a backup of the store)")


def _read_run(blobs: BlobStore, parts: Sequence[PackedPart], run: list[int],
              checked: Callable[[int, bool], None] | None = None) -> memoryview:
    """Read one run and verify each chunk in it; the bytes, from the first chunk's pack offset.
    ``checked(i, ok)`` for each chunk verified (the first that does not match raises)."""
    first = parts[run[0]]
    start = first.pack_offset
    end = max(parts[i].pack_offset + parts[i].size for i in run)
    data = memoryview(blobs.read_range(first.pack, start, end - start))
    for i in run:
        p = parts[i]
        got = hashlib.sha256(data[p.pack_offset - start:p.pack_offset - start + p.size]).hexdigest()
        ok = "sha256:" + got == p.digest
        if checked is not None:
            checked(i, ok)
        if not ok:
            raise _mismatch(p, got)
    return data


def _spans(parts: Sequence[PackedPart], run: list[int]) -> list[list[int]]:
    """The run's chunks cut where they stop lying back to back both in the pack and in the
    destination (each span is then one write)."""
    def joined(i: int, j: int) -> bool:
        q, p = parts[i], parts[j]
        return q.pack_offset + q.size == p.pack_offset and q.offset + q.size == p.offset

    return split_where(run, joined)


def get_packed(blobs: BlobStore, fd: int, parts: Sequence[PackedPart], *, progress: ProgressFn | None = None,
               on_done: Callable[[int], None] | None = None) -> None:
    """Read every chunk of ``parts`` from its pack, verify it and write it at its ``offset`` of
    the open file ``fd``; ``on_done(i)`` once ``parts[i]`` is written. ``IntegrityError`` for
    a chunk that does not match (nothing more is written; discard the file)."""
    def one(run: list[int]) -> None:
        data = _read_run(blobs, parts, run)
        start = parts[run[0]].pack_offset
        for span in _spans(parts, run):
            first, last = parts[span[0]], parts[span[-1]]
            span_bytes = data[first.pack_offset - start:last.pack_offset + last.size - start]
            pwrite_all(fd, span_bytes, first.offset)
            if progress is not None:
                progress(len(span_bytes))
            if on_done is not None:
                for i in span:
                    on_done(i)

    run_parallel(one, runs(parts), _workers(blobs))


def check_packed(blobs: BlobStore, parts: Sequence[PackedPart], *,
                 checked: Callable[[int, bool], None] | None = None) -> None:
    """Verify that each chunk of ``parts`` is in its pack where the part says (a server checks a
    pusher's pack index this way before recording it); ``IntegrityError`` for the first that
    is not, ``NotFoundError`` when a pack is not stored. ``checked(i, ok)`` as each part is
    found to match or not (from several threads)."""
    run_parallel(lambda run: _read_run(blobs, parts, run, checked), runs(parts), _workers(blobs))
