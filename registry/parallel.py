"""Hashing and copying byte ranges of files on every core, in bounded memory.

sha256 is sequential within one stream, so a big file hashes at one core's speed unless it is
cut into independent ranges: a chunked member's chunks (and a big tensor's 64 MiB pieces) are
such ranges, and every data path (bundle, push, pull, cache) hashes them at once, one range
per worker thread. A worker reads its range with ``os.preadv`` into a buffer it owns, hashes
it (and CRC-32s it when a zip header needs the sum) and writes it with ``os.pwrite`` at its
place in the destination. hashlib, ISA-L's CRC-32 and the syscalls all release the GIL, so the threads
run in parallel; memory is one :data:`BUFFER` per worker, whatever the size of the data or
the number of ranges.

    >>> import tempfile; f = tempfile.TemporaryFile(); _ = f.write(b"abcdef"); f.flush()
    >>> [h.size for h in hash_ranges([[Segment(f.fileno(), 0, 3)], [Segment(f.fileno(), 3, 3)]])]
    [3, 3]
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import hashlib
import os
import queue
import threading
from concurrent.futures import CancelledError
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

from isal.isal_zlib import crc32 as _crc32  # ISA-L: zlib's CRC-32 at ~3x the speed, GIL released

from .errors import IntegrityError

__all__ = ["WORKERS", "BUFFER", "Segment", "Hashed", "Job", "hash_copy", "hash_ranges", "run_parallel",
           "run_calls", "group_consecutive", "split_where", "preallocate", "start_writeback", "crc32_combine", "locked_progress",
           "gc_held", "GC_HOLD_SECONDS", "Background", "TaskPool", "pwrite_all", "Output", "thread_buffer", "Flusher",
           "FLUSH_BYTES"]

#: worker threads for CPU-bound hashing and copying (one per core; two at least, so reads and
#: writes that wait on the disk overlap with hashing)
WORKERS = max(2, os.cpu_count() or 1)
#: bytes each worker reads at a time: large enough that the per-call cost vanishes, small
#: enough that all workers together stay within a few tens of MiB
BUFFER = 4 * 1024 * 1024
#: a worker asks the kernel to start writing back what it copied every this many bytes, and at
#: the end of each range: larger than a chunk (64 MiB), so in practice once per finished chunk.
#: Hints every 32 MiB, mid-chunk, made a 2 GiB bundle 1.16x ``cp`` + ``sync`` against 0.72x
#: with one per chunk (medians of 5, interleaved, benchmarks/README.md "Scale")
WRITEBACK = 128 * 1024 * 1024

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
            h.update(data)
            if crc:
                sc = _crc32(data, sc)
            if out is not None:
                out.write(data)
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


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


#: writeback requests waiting for the writeback thread; beyond this many, new ones are dropped
#: (each holds a duplicated descriptor, and the disk is busy anyway)
WRITEBACK_QUEUE = 16


class _Writeback:
    """One thread that passes ranges to ``sync_file_range(SYNC_FILE_RANGE_WRITE)``.

    The call can block while the disk's queue is full; made by the copying workers themselves
    it stalled their hashing behind the disk (a 2 GiB bundle: 1.39-1.48x ``cp`` + ``sync``,
    1.20x since; benchmarks/README.md "Scale"). Here the workers only queue the range (on a
    duplicate of the descriptor, so it stays open whatever the caller closes) and go on
    hashing, while this thread keeps the disk busy. At most ``WRITEBACK_QUEUE`` requests (and
    duplicated descriptors) wait; more are dropped: they are hints."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[int, int, int]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, fd: int, offset: int, size: int) -> None:
        if _sync_file_range is None or self._queue.qsize() >= WRITEBACK_QUEUE:
            return
        try:
            dup = os.dup(fd)
        except OSError:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pt2reg-writeback", daemon=True)
                self._thread.start()
        self._queue.put((dup, offset, size))

    def _run(self) -> None:
        while True:
            fd, offset, size = self._queue.get()
            try:
                if _sync_file_range is not None:
                    _sync_file_range(fd, offset, size, _SYNC_FILE_RANGE_WRITE)
            finally:
                os.close(fd)

    def _after_fork(self) -> None:
        """In a forked child: the thread did not survive; close the descriptors it had queued
        and start afresh."""
        pending, self._queue = self._queue, queue.SimpleQueue()
        self._lock, self._thread = threading.Lock(), None
        while not pending.empty():
            os.close(pending.get_nowait()[0])


_writeback = _Writeback()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_writeback._after_fork)


def start_writeback(fd: int, offset: int, size: int) -> None:
    """Ask the kernel to start writing these bytes to disk soon (Linux's
    ``sync_file_range(SYNC_FILE_RANGE_WRITE)``, from a background thread: the caller never
    waits): the disk works while the copy goes on, so the ``fsync``/``syncfs`` that makes the
    file durable at the end finds little left to do. It is only a hint: durability still comes
    from that final sync."""
    _writeback.submit(fd, offset, size)


#: ``Flusher`` makes a file's data durable each time this many more bytes were written to it
FLUSH_BYTES = 64 * 1024 * 1024


class Flusher:
    """``fdatasync(fd)`` on a thread of its own each time ``FLUSH_BYTES`` more were written
    (``wrote(n)``), for the length of a ``with`` block, so that the ``fsync`` that makes the
    file durable at the end has little left to do.

    On this kind of machine (a VM's virtio disk) the cost of making writes durable is in the
    disk cache flush, ~1 ms per MiB written since the last one however long the bytes have
    been waiting (``sync_file_range``, ``start_writeback``, only starts the writes, it does
    not flush): a 2 GiB bundle spent 1.7-2.0 s in its final ``fsync``, after its last write.
    Flushing while the copy still hashes hides most of it (the local store's push does the
    same with ``syncfs``). Every ``FLUSH_BYTES`` written are flushed here, even those the
    thread had not woken for when the block ended: the exit waits for that flush (the final
    ``fsync`` then finds nothing left), so a slow thread start cannot skip every flush. A failed
    flush is raised at the exit (an fsync error is reported once: swallowed here, the final
    ``fsync`` could miss it)."""

    def __init__(self, fd: int, every: int | None = None) -> None:
        self._fd, self._every = fd, FLUSH_BYTES if every is None else every
        self._cond = threading.Condition()
        self._pending = 0
        self._closing = False
        self._error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="pt2reg-flush", daemon=True)

    def wrote(self, n: int) -> None:
        with self._cond:
            self._pending += n
            if self._pending >= self._every:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closing and self._pending < self._every:
                    self._cond.wait()
                if self._pending < self._every:   # closing, with less than a flush's worth left
                    return
                self._pending = 0
            try:
                os.fdatasync(self._fd)
            except OSError as exc:
                self._error = exc
                return

    def __enter__(self) -> "Flusher":
        self._thread.start()
        return self

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()
        if self._error is not None and kind is None:
            raise self._error


def preallocate(fd: int, size: int) -> None:
    """Reserve ``size`` bytes for a file about to be filled out of order (several writers at
    their offsets): the filesystem allocates its blocks once instead of on every write. A
    filesystem that cannot is simply written as it is."""
    if size <= 0 or not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError:
        pass


def run_parallel(fn: Callable[[T], R], items: Sequence[T], workers: int, *,
                 on_error: Callable[[], None] | None = None) -> list[R]:
    """``[fn(item) for item in items]`` on up to ``workers`` threads (a ``TaskPool``), results
    in order.

    The first exception (or a ``KeyboardInterrupt`` here) stops every item not yet started (a
    worker checks before it starts one, so at most the ``workers`` already running go on) and
    calls ``on_error``, once, from whichever thread saw it (to interrupt those, e.g. cancel
    their transfers: it must be safe from any thread); it is raised once every thread has
    stopped, so nothing keeps writing behind the caller's back. One item, or one worker, runs
    in the calling thread.

    >>> run_parallel(lambda x: x * x, [1, 2, 3], 2)
    [1, 4, 9]
    """
    if not items:
        return []
    if len(items) == 1 or workers <= 1:
        return [fn(item) for item in items]
    results: list[Any] = [None] * len(items)

    def one(i: int, item: T) -> None:
        results[i] = fn(item)

    with TaskPool(min(workers, len(items)), on_stop=on_error) as pool:
        for i, item in enumerate(items):
            pool.submit(functools.partial(one, i, item))
    return results


def run_calls(calls: Sequence[Callable[[], R]], workers: int, *,
              on_error: Callable[[], None] | None = None) -> list[R]:
    """``run_parallel`` of calls that take no argument (a store's ``part_fetches``).

    >>> run_calls([lambda: 1, lambda: 2], 2)
    [1, 2]
    """
    return run_parallel(_call, calls, workers, on_error=on_error)


def _call(fn: Callable[[], R]) -> R:
    return fn()

#: the longest the collector stays held off, however many holds overlap (a long transfer, or
#: pushes and pulls in several threads back to back, must not keep it off for minutes)
GC_HOLD_SECONDS = 10.0


class _GcHold:
    """The process's one hold on the cyclic collector (``gc_held``), counted."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders = 0
        self.was_on = False                           # the collector was on when the first hold began
        self.timer: threading.Timer | None = None

    def enter(self, limit: float) -> None:
        with self.lock:
            self.holders += 1
            if self.holders == 1:
                self.was_on = gc.isenabled()
                gc.disable()
                self.timer = threading.Timer(limit, self.expire)
                self.timer.daemon = True
                self.timer.start()

    def exit(self) -> None:
        with self.lock:
            self.holders -= 1
            if self.holders == 0:
                if self.timer is not None:
                    self.timer.cancel()
                    self.timer = None
                if self.was_on:
                    gc.enable()

    def expire(self) -> None:
        """The time limit: the collector runs again, though holds are still open."""
        with self.lock:
            if self.holders and self.was_on:
                gc.enable()


_GC_HOLD = _GcHold()


@contextlib.contextmanager
def gc_held(limit: float = GC_HOLD_SECONDS) -> Iterator[None]:
    """Hold off Python's cyclic garbage collector while a step builds and drops per-chunk
    records (a manifest, a pack index and the parts of a 10,000-tensor program: some 50,000
    objects that live a few dozen milliseconds). Collected while they live, they are promoted
    to the oldest generation, and every few pulls that triggers a full collection of the whole
    process, 80 ms in a process that imported torch (measured); held, they are freed by their
    reference counts before any collection sees them.

    Nested and concurrent holds are counted: the collector runs again when the last one ends,
    and only if it was on before the first; and after ``limit`` seconds of overlapping holds in
    any case, so other threads' cyclic garbage is never kept for long. (An application that
    turns the collector off while a hold lasts finds it on again when the hold ends.)"""
    _GC_HOLD.enter(limit)
    try:
        yield
    finally:
        _GC_HOLD.exit()


class TaskPool:
    """Tasks handed one at a time (``submit``) to ``workers`` threads for the length of a
    ``with`` block, the threads already running when the block begins: what is handed over
    first starts at once while the block plans the rest, and then runs on the same threads (a
    pull fetches a member's large chunks while it reads the pack index and plans the pack
    reads, which then take their turn: one thread per core, not one set per kind of work).

    ``__enter__`` waits until every thread runs: a thread started while the block runs Python
    waits for the GIL up to ``sys.getswitchinterval()`` (5 ms) before its first line. Threads
    started in a row that way (one for the large chunks, which then started the pool of its
    ``get_parts``) had the large chunks of a 10,000-tensor pull wait 7-18 ms while its pack
    index was parsed; this pool took that pull from 185-186 to 179 ms (medians of 13-15,
    interleaved, one process).

    ``progress`` is the caller's, made safe across threads; ``self.progress``, what tasks
    report to, raises ``CancelledError`` once the pool stopped, so a transfer stops where it is.
    The first failure stops the pool: tasks not yet started are dropped, ``submit`` and
    ``check`` raise it in the block, and the block's exit, which waits for every thread, raises
    it; a block that failed on its own gets it as a note. ``finish`` runs once every thread
    has stopped, on the last one: closing what the tasks write through, so that a caller that
    stops waiting (a second Ctrl-C while the exit waits) never has it closed under a task.

    >>> seen = []
    >>> with TaskPool(2, seen.append) as pool:
    ...     pool.submit(lambda: pool.progress(3))
    ...     pool.submit(lambda: pool.progress(4))
    >>> sorted(seen)
    [3, 4]
    """

    def __init__(self, workers: int, progress: Callable[[int], None] | None = None, *,
                 finish: Callable[[], None] | None = None, on_stop: Callable[[], None] | None = None) -> None:
        self._finish = finish
        self._on_stop = on_stop
        self._queue: queue.SimpleQueue[Callable[[], Any] | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._threads: list[threading.Thread] = []
        self._live = 0
        self._closed = False
        self._workers = max(1, workers)
        stop, locked = self._stop, locked_progress(progress)

        def report(n: int) -> None:
            if stop.is_set():
                raise CancelledError("stopped: the operation it was part of failed")
            if locked is not None:
                locked(n)
        report._locked = True  # type: ignore[attr-defined]  # locked_progress leaves it as it is
        self.progress: Callable[[int], None] = report

    def _fail(self, exc: BaseException) -> None:
        with self._lock:   # the first failure wins, unless it was only a task told to stop
            if self._error is None or (isinstance(self._error, CancelledError)
                                       and not isinstance(exc, CancelledError)):
                self._error = exc
        self._halt()

    def _halt(self) -> None:
        """Stop the pool (tasks not started are dropped, running ones stop at their next
        report) and, the first time, call ``on_stop``: what interrupts the tasks' transfers."""
        with self._lock:
            if self._stop.is_set():
                return
            self._stop.set()
            on_stop, self._on_stop = self._on_stop, None
        if on_stop is not None:
            on_stop()

    def _run(self, started: threading.Semaphore) -> None:
        started.release()
        try:
            while (task := self._queue.get()) is not None:
                if self._stop.is_set():
                    continue    # dropped: the pool failed
                try:
                    task()
                except BaseException as exc:
                    self._fail(exc)
        finally:
            with self._lock:
                self._live -= 1
                last = self._live == 0
            if last:
                self._finished()

    def _finished(self) -> None:
        finish, self._finish = self._finish, None
        if finish is not None:
            try:
                finish()
            except BaseException as exc:
                self._fail(exc)

    def __enter__(self) -> "TaskPool":
        started = threading.Semaphore(0)
        try:
            for _ in range(self._workers):
                thread = threading.Thread(target=self._run, args=(started,), name="pt2reg-worker", daemon=True)
                with self._lock:
                    self._live += 1
                self._threads.append(thread)   # before start: Ctrl-C inside start() may come once it runs
                try:
                    thread.start()
                except BaseException:
                    if thread.ident is None:   # it never ran
                        self._threads.pop()
                        with self._lock:
                            self._live -= 1
                    raise
            for _ in self._threads:
                started.acquire()
        except BaseException:   # no thread, or interrupted: stop those that run, then finish
            self._halt()
            self._close()
            if not self._threads:
                self._finished()
            raise
        return self

    def submit(self, task: Callable[[], Any]) -> None:
        """Run ``task()`` on the next free thread; raises the pool's failure if it failed
        (``RuntimeError`` once the block ended: nothing would run it)."""
        if self._closed:
            raise RuntimeError("TaskPool.submit after its with block")
        self.check()
        self._queue.put(task)

    def submit_all(self, tasks: Iterable[Callable[[], Any]]) -> None:
        for task in tasks:
            self.submit(task)

    def check(self) -> None:
        """Raise the pool's failure now if a task failed already."""
        if self._error is not None:
            raise self._error

    def _close(self) -> None:
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        try:
            for thread in self._threads:
                thread.join()
        except BaseException:   # interrupted while waiting (Ctrl-C): stop the tasks, then wait for them
            self._halt()
            for thread in self._threads:
                thread.join()
            raise

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        if exc is not None:
            self._halt()
        self._close()
        if exc is None:
            self.check()
        elif isinstance(exc, BaseException) and self._error is not None and exc is not self._error \
                and not isinstance(self._error, CancelledError):
            exc.add_note(f"meanwhile, on another thread: {self._error}")



class Background(TaskPool):
    """``work(progress)`` on a thread of its own for the length of a ``with`` block (a push's
    large chunks going up while the rest of it is planned): a ``TaskPool`` of one thread and
    one task. ``progress`` raises ``CancelledError`` once the block failed (or the wait at its
    end was interrupted), so the block's exit does not wait for the rest of a large upload;
    ``check()`` in the block raises the work's error as soon as it failed, the exit raises it
    otherwise; ``result()`` after the block: what ``work`` returned.

    >>> with Background(lambda progress: 6 * 7, None) as job:
    ...     pass
    >>> job.result()
    42
    """

    def __init__(self, work: Callable[[Callable[[int], None]], R], progress: Callable[[int], None] | None) -> None:
        super().__init__(1, progress)
        self._work = work
        self._value: list[R] = []

    def __enter__(self) -> "Background":
        super().__enter__()
        try:
            self.submit(lambda: self._value.append(self._work(self.progress)))
        except BaseException as exc:   # Ctrl-C right here: the thread is not left waiting for work
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def result(self) -> Any:
        self.check()
        return self._value[0]

def locked_progress(progress: Callable[[int], None] | None) -> Callable[[int], None] | None:
    """``progress`` made safe to call from several threads at once."""
    if progress is None or getattr(progress, "_locked", False):
        return progress
    lock = threading.Lock()

    def call(n: int) -> None:
        with lock:
            progress(n)
    call._locked = True  # type: ignore[attr-defined]
    return call


# -- CRC-32 of a concatenation from the CRCs of its parts ------------------------------------------
# zip headers need the CRC-32 of a whole member, and its ranges are summed on different threads:
# zlib's crc32_combine joins them in O(log n). Python's zlib module does not expose it; libz
# does (loaded with ctypes), and a pure-Python port of the same algorithm stands in without it.

@functools.lru_cache(maxsize=1)
def _load_combine() -> Callable[[int, int, int], int] | None:
    """libz's ``crc32_combine``, loaded on first use: by its usual soname first, since
    ``find_library`` runs ``ldconfig -p`` in a child process (a cost every command that imports
    this module paid at start-up)."""
    try:
        lib = ctypes.CDLL("libz.so.1")
    except OSError:
        name = ctypes.util.find_library("z")
        if not name:
            return None
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            return None
    try:
        fn = getattr(lib, "crc32_combine64", None)
        wide = fn is not None
        if fn is None:
            fn = lib.crc32_combine
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_ulong
    fn.argtypes = [ctypes.c_ulong, ctypes.c_ulong, ctypes.c_int64 if wide else ctypes.c_long]
    return lambda a, b, n: int(fn(a, b, n)) & 0xFFFFFFFF


def _gf2_times(mat: list[int], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _gf2_square(mat: list[int]) -> list[int]:
    return [_gf2_times(mat, mat[n]) for n in range(32)]


def _combine_py(crc1: int, crc2: int, len2: int) -> int:
    """zlib's ``crc32_combine`` (the matrix method), in Python: append ``len2`` zero bytes to
    ``crc1`` by squaring the one-zero-byte operator, then add ``crc2``."""
    if len2 <= 0:
        return crc1
    op = [0xEDB88320] + [1 << n for n in range(31)]  # the operator for one zero bit
    for _ in range(3):
        op = _gf2_square(op)                          # ... for one zero byte
    while True:
        if len2 & 1:
            crc1 = _gf2_times(op, crc1)
        len2 >>= 1
        if not len2:
            return crc1 ^ crc2
        op = _gf2_square(op)


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 of ``A + B`` from ``crc1 = crc32(A)``, ``crc2 = crc32(B)`` and ``len(B)``.

    >>> import zlib
    >>> crc32_combine(zlib.crc32(b"ab"), zlib.crc32(b"cde"), 3) == zlib.crc32(b"abcde")
    True
    """
    combine = _load_combine()
    if combine is not None:
        return combine(crc1, crc2, len2)
    return _combine_py(crc1, crc2, len2)
