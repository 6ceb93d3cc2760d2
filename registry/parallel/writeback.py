"""Getting written bytes to the disk while a copy goes on: writeback hints from a thread of
their own (``start_writeback``), periodic ``fdatasync`` (``Flusher``) and ``preallocate``."""
from __future__ import annotations

import ctypes
import os
import queue
import threading
from collections.abc import Callable

__all__ = ["WRITEBACK", "WRITEBACK_QUEUE", "start_writeback", "FLUSH_BYTES", "Flusher", "preallocate"]

#: a worker asks the kernel to start writing back what it copied every this many bytes, and at
#: the end of each range: larger than a chunk (64 MiB), so in practice once per finished chunk.
#: Hints every 32 MiB, mid-chunk, made a 2 GiB bundle 1.16x ``cp`` + ``sync`` against 0.72x
#: with one per chunk (medians of 5, interleaved, benchmarks/README.md "Scale")
WRITEBACK = 128 * 1024 * 1024


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

    def __enter__(self) -> Flusher:
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
