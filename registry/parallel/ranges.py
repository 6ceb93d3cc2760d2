"""Hashing and copying byte ranges of files on every core, in bounded memory.

sha256 is sequential within one stream, so a big file hashes at one core's speed unless it is
cut into independent ranges: a chunked member's chunks (and a big tensor's 64 MiB pieces) are
such ranges, and every data path (bundle, push, pull, cache) hashes them at once, one range
per worker thread. A worker reads its range with ``os.preadv`` into a buffer it owns, hashes
it (the CRC-32 a zip header needs is summed meanwhile on the CRC thread: ``crc``) and writes
it with ``os.pwrite`` at its place in the destination. hashlib, ISA-L's CRC-32 and the syscalls
all release the GIL, so the threads run in parallel; memory is one :data:`BUFFER` per worker,
whatever the size of the data or the number of ranges.

    >>> import tempfile; f = tempfile.TemporaryFile(); _ = f.write(b"abcdef"); f.flush()
    >>> [h.size for h in hash_ranges([[Segment(f.fileno(), 0, 3)], [Segment(f.fileno(), 3, 3)]])]
    [3, 3]
"""
from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from ..errors import IntegrityError
from .crc import crc32_combine, crc32_later
from .tasks import WORKERS, locked_progress, run_parallel
from .writeback import WRITEBACK, start_writeback

__all__ = ["BUFFER", "Segment", "Hashed", "Job", "thread_buffer", "hash_copy", "hash_ranges", "WRITE_PIECE",
           "pwrite_all", "Output", "BATCH_BYTES", "split_where", "group_consecutive"]

#: bytes each worker reads at a time: large enough that the per-call cost vanishes, small
#: enough that all workers together stay within a few tens of MiB
BUFFER = 4 * 1024 * 1024

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Segment:
    """``size`` bytes at ``offset`` of the open file descriptor ``fd``."""

    fd: int
    offset: int
    size: int


@dataclass(frozen=True)
class Hashed:
    """What one pass over a range gave: its sha256 (hex), CRC-32 (0 unless asked) and length;
    with CRCs asked, ``segment_crcs`` holds each segment's own CRC-32, in order."""

    sha256: str
    crc32: int
    size: int
    segment_crcs: tuple[int, ...] = ()


@dataclass(frozen=True)
class Job:
    """One range to hash: the concatenation of ``segments``; written at ``out_offset`` of
    ``out_fd`` when given; checked against ``expect`` (sha256 hex) when given."""

    segments: tuple[Segment, ...]
    out_fd: int | None = None
    out_offset: int = 0
    expect: str | None = None


_local = threading.local()


def thread_buffer() -> memoryview:
    """This thread's ``BUFFER`` bytes of scratch memory (reused: one per thread, never freed);
    nothing that may run while a caller holds it may take it too."""
    buf = getattr(_local, "buf", None)
    if buf is None:
        buf = _local.buf = memoryview(bytearray(BUFFER))
    return buf


def hash_copy(segments: Sequence[Segment], *, out_fd: int | None = None, out_offset: int = 0,
              crc: bool = False, progress: Callable[[int], None] | None = None,
              writeback: bool = False) -> Hashed:
    """sha256 (and CRC-32) of the concatenated ``segments``, in this thread, one buffer at a
    time; with ``out_fd`` every byte hashed is the byte written at ``out_offset`` onwards (the
    copy is exactly what was hashed, even if the source changes meanwhile). ``OSError`` when a
    source ends early. ``writeback``: the copy will be fsynced, so its bytes are sent to the
    disk as it goes (``start_writeback``); a copy that is never synced (the client cache) is
    left to the page cache, where the disk cannot slow it down."""
    buf = thread_buffer()
    h = hashlib.sha256()
    c = 0
    out = Output(out_fd, out_offset, writeback=writeback) if out_fd is not None else None
    total = 0
    crcs = []
    for seg in segments:
        offset, left = seg.offset, seg.size
        sc = 0
        while left > 0:
            view = buf[:min(left, BUFFER)]
            n = os.preadv(seg.fd, [view], offset)
            if n <= 0:
                raise OSError(f"file ended {left} bytes early (at byte {offset})")
            data = view[:n]
            summed = crc32_later(data, sc) if crc else None   # on the CRC thread, meanwhile
            h.update(data)
            if out is not None:
                out.write(data)
            if summed is not None:   # before the buffer is read into again
                sc = summed.result()
            offset += n
            left -= n
            total += n
            if progress is not None:
                progress(n)
        if crc:
            crcs.append(sc)
            c = crc32_combine(c, sc, seg.size)
    if out is not None:
        out.close()
    return Hashed(h.hexdigest(), c, total, tuple(crcs))


#: ``pwrite_all`` hands the kernel at most this many bytes per call. A buffered write is given
#: page-cache folios sized to it: 4 MiB writes get multi-MiB folios, whose allocation on this
#: kind of machine (a VM on Linux 6.18, ext4) now and then stalls for seconds while the host
#: backs the memory again, and the other writer spins on the file's lock meanwhile. 2 GiB
#: written by two threads, medians of 6: 4 MiB writes 3.69 s (0.35-5.03), 1 MiB 0.51 s
#: (0.38-1.68), 256 KiB 0.43 s (0.42-0.79), 64 KiB 0.52 s; a 2 GiB bundle 3.54 -> 1.93 s
#: (benchmarks/README.md, "Writes of 256 KiB").
WRITE_PIECE = 256 * 1024


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """All of ``data`` written at ``offset`` of ``fd``, ``WRITE_PIECE`` bytes per ``os.pwrite``
    at most (which may also write less than asked)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view[:WRITE_PIECE], offset)
        offset += n
        view = view[n:]


class Output:
    """Where a hashing copy writes (``hash_copy``, ``blobs.base.hash_parts``): each block at
    ``pos`` onwards of ``fd``, in order. ``writeback``: the copy will be synced, so the disk is
    asked to start writing every ``WRITEBACK`` bytes and at ``close`` (``start_writeback``)."""

    def __init__(self, fd: int, pos: int = 0, *, writeback: bool = False) -> None:
        self.fd, self.pos, self._flushed, self._writeback = fd, pos, pos, writeback

    def write(self, data: bytes | memoryview) -> None:
        pwrite_all(self.fd, data, self.pos)
        self.pos += len(data)
        if self._writeback and self.pos - self._flushed >= WRITEBACK:
            start_writeback(self.fd, self._flushed, self.pos - self._flushed)
            self._flushed = self.pos

    def close(self) -> None:
        if self._writeback and self.pos > self._flushed:
            start_writeback(self.fd, self._flushed, self.pos - self._flushed)
            self._flushed = self.pos


def hash_ranges(jobs: Sequence[Job | Sequence[Segment]], *, crc: bool = False,
                progress: Callable[[int], None] | None = None, workers: int = WORKERS,
                mismatch: Callable[[int, str], IntegrityError] | None = None,
                writeback: bool = False) -> list[Hashed]:
    """``hash_copy`` of every job on up to ``workers`` threads, results in order. A job whose
    ``expect`` differs raises ``mismatch(index, got_hex)`` (an ``IntegrityError``; a generic one
    without it); the first failure stops the jobs not yet started."""
    progress = locked_progress(progress)
    items = [j if isinstance(j, Job) else Job(tuple(j)) for j in jobs]

    def one(i: int) -> Hashed:
        job = items[i]
        got = hash_copy(job.segments, out_fd=job.out_fd, out_offset=job.out_offset, crc=crc, progress=progress,
                        writeback=writeback)
        if job.expect is not None and got.sha256 != job.expect:
            if mismatch is not None:
                raise mismatch(i, got.sha256)
            raise IntegrityError(f"bytes do not match their sha256 {job.expect[:12]}... (got {got.sha256[:12]}...)")
        return got

    batches = group_consecutive([sum(s.size for s in job.segments) for job in items], BATCH_BYTES)
    done = run_parallel(lambda batch: [one(i) for i in batch], batches, workers)
    return [h for batch in done for h in batch]


#: jobs smaller than this share a thread task with their neighbours (``_batches``)
BATCH_BYTES = 4 * 1024 * 1024


def split_where(items: Sequence[T], joined: Callable[[T, T], bool]) -> list[list[T]]:
    """``items`` in order, cut between each pair of neighbours ``joined(a, b)`` rejects (chunks
    that stop lying back to back in a file).

    >>> split_where([1, 2, 3, 7, 8], lambda a, b: a + 1 == b)
    [[1, 2, 3], [7, 8]]
    """
    out: list[list[T]] = []
    for item in items:
        if out and joined(out[-1][-1], item):
            out[-1].append(item)
        else:
            out.append([item])
    return out


def group_consecutive(sizes: Sequence[int], limit: int) -> list[range]:
    """Consecutive indices of ``sizes`` grouped so that each group holds at most ``limit``
    (an item that large is alone): batches of thread tasks (ten thousand tiny chunks cost a few
    hundred hand-offs, not ten thousand) and the packs of a push (``format.packs``).

    >>> group_consecutive([1, 1, 5, 1, 1], 4)
    [range(0, 2), range(2, 3), range(3, 5)]
    """
    out, start, total = [], 0, 0
    for i, n in enumerate(sizes):
        if i > start and total + n > limit:
            out.append(range(start, i))
            start, total = i, 0
        total += n
    if start < len(sizes):
        out.append(range(start, len(sizes)))
    return out
