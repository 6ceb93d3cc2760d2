"""The writeback thread (registry.parallel): hints never make a copying worker wait, their
descriptors stay bounded and are all closed, and only copies that will be synced send them."""
from __future__ import annotations

import os
import threading
import time

import pytest

from registry import parallel
from registry.parallel import Segment, hash_copy
from registry.parallel import ranges as ranges_mod
from registry.parallel import writeback as writeback_mod
from tests.until import HANG_GUARD_S, wait_until


def _open_fds(path) -> int:
    """How many descriptors of this process are open on ``path`` (other tests' files, and the
    process-wide writeback thread's duplicates of them, are not counted)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:   # closed meanwhile
            pass
    return n


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd") or writeback_mod._sync_file_range is None,
                    reason="Linux only: sync_file_range and /proc/self/fd")
def test_a_stuck_disk_never_blocks_the_caller_and_descriptors_stay_bounded(tmp_path, monkeypatch):
    release, calls, returned = threading.Event(), [], []

    path = tmp_path / "f"

    def stuck(fd, offset, size, flags):  # a disk whose queue is full: the call blocks until released
        if os.readlink(f"/proc/self/fd/{fd}") == str(path):   # not another test's leftover
            calls.append((offset, size))
        release.wait(HANG_GUARD_S)
        returned.append(offset)
        return 0

    monkeypatch.setattr(writeback_mod, "_sync_file_range", stuck)
    wb = writeback_mod._Writeback()
    with open(path, "wb") as f:
        before = _open_fds(path)
        for i in range(100):
            wb.submit(f.fileno(), i, 1)
        # the caller never waited on the disk: every submit returned while the disk still holds
        # the first request (a submit that waited would wait until release, which comes below)
        assert returned == [] and not release.is_set()
        # one request held by the blocked thread, at most WRITEBACK_QUEUE waiting: the rest dropped
        assert _open_fds(path) - before <= writeback_mod.WRITEBACK_QUEUE + 1
        release.set()
        wait_until(lambda: _open_fds(path) == before, "every duplicated descriptor closed")
    assert 1 <= len(calls) <= writeback_mod.WRITEBACK_QUEUE + 1


def test_only_copies_that_will_be_synced_send_hints(tmp_path, monkeypatch):
    sent = []
    monkeypatch.setattr(ranges_mod, "start_writeback", lambda fd, offset, size: sent.append((offset, size)))
    src = tmp_path / "src"
    src.write_bytes(os.urandom(3 * parallel.BUFFER + 5))
    n = src.stat().st_size
    with open(src, "rb") as s, open(tmp_path / "a", "wb") as a, open(tmp_path / "b", "wb") as b:
        hash_copy([Segment(s.fileno(), 0, n)], out_fd=a.fileno())  # a cache file: never synced
        assert sent == []
        got = hash_copy([Segment(s.fileno(), 0, n)], out_fd=b.fileno(), writeback=True)
    assert got.size == n and (tmp_path / "b").read_bytes() == src.read_bytes()
    assert sent == [(0, n)]  # smaller than WRITEBACK: one hint, for the finished range


def _wait(predicate, seconds: float = HANG_GUARD_S) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.005)
    return predicate()


def test_the_flusher_syncs_each_time_enough_was_written(tmp_path, monkeypatch):
    """``Flusher``: one ``fdatasync`` of the file per ``every`` bytes written, on its own
    thread; none before that, none after the block."""
    calls = []
    monkeypatch.setattr(os, "fdatasync", lambda fd: calls.append(fd))
    with open(tmp_path / "f", "wb") as f:
        with parallel.Flusher(f.fileno(), every=1000) as flusher:
            flusher.wrote(999)
            time.sleep(0.05)
            assert calls == []                      # not yet: 999 bytes since the last flush
            flusher.wrote(1)
            assert _wait(lambda: calls == [f.fileno()])
            flusher.wrote(400)
            flusher.wrote(700)
            assert _wait(lambda: len(calls) == 2)
        assert not any(t.name == "pt2reg-flush" and t.is_alive() for t in threading.enumerate())
        assert len(calls) == 2                     # the final fsync is the caller's


def test_a_failed_flush_fails_the_block(tmp_path, monkeypatch):
    """An fsync error is reported once: the flusher must not swallow it (the caller's final
    fsync could then succeed over lost writes)."""
    def eio(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", eio)
    with open(tmp_path / "f", "wb") as f:
        with pytest.raises(OSError, match="Input/output error"):
            with parallel.Flusher(f.fileno(), every=10) as flusher:
                flusher.wrote(10)
                time.sleep(0.05)
        with pytest.raises(ValueError, match="the block's own"):   # the block's error wins
            with parallel.Flusher(f.fileno(), every=10) as flusher:
                flusher.wrote(10)
                time.sleep(0.05)
                raise ValueError("the block's own")


class _LateFlusher(parallel.Flusher):
    """A flusher whose thread wakes after the block has already ended (a slow thread start
    under the GIL, as when the copy is quicker than the thread)."""

    def _run(self) -> None:
        time.sleep(0.05)
        super()._run()


def test_a_flush_owed_when_the_block_ends_is_still_made(tmp_path, monkeypatch):
    """Bytes enough for a flush, written before the thread woke, are flushed at the exit (and
    a failure there fails the block); less than that is left to the caller's final fsync."""
    calls = []
    monkeypatch.setattr(os, "fdatasync", lambda fd: calls.append(fd))
    with open(tmp_path / "f", "wb") as f:
        with _LateFlusher(f.fileno(), every=1000) as flusher:
            flusher.wrote(1000)
        assert calls == [f.fileno()]
        with _LateFlusher(f.fileno(), every=1000) as flusher:
            flusher.wrote(999)
        assert calls == [f.fileno()]

        def eio(fd):
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(os, "fdatasync", eio)
        with pytest.raises(OSError, match="Input/output error"):
            with _LateFlusher(f.fileno(), every=10) as flusher:
                flusher.wrote(10)


def test_writes_reach_the_kernel_in_pieces_of_at_most_write_piece(tmp_path, monkeypatch):
    """``pwrite_all`` (every hashing copy writes through it) hands the kernel at most
    ``WRITE_PIECE`` bytes a call, so a buffered write never asks for multi-MiB page-cache
    folios, and writes every byte, in place, also when the kernel takes less than asked."""
    calls, real = [], os.pwrite

    def pwrite(fd, data, offset):
        calls.append(len(data))
        return real(fd, memoryview(data)[:max(1, len(data) - 7)], offset)   # a short write each time

    monkeypatch.setattr(ranges_mod, "WRITE_PIECE", 64 * 1024)
    monkeypatch.setattr(os, "pwrite", pwrite)
    data = os.urandom(1024 * 1024 + 123)
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    fd = os.open(path, os.O_RDWR)
    try:
        parallel.pwrite_all(fd, data, 10)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"x" * 10 + data
    assert max(calls) == 64 * 1024 and len(calls) > len(data) // (64 * 1024)


def test_fill_holes_without_copy_file_range_copies_in_write_pieces(tmp_path, monkeypatch):
    """Where ``copy_file_range`` is not supported, ``fill_holes`` (the bundler filling the
    weights a normalized program left as holes) copies through user space, writing with
    ``pwrite_all``: every byte in place, at most ``WRITE_PIECE`` a call."""
    from registry.format.bundle import FileRange
    from registry.pt2.normalize import fill_holes

    def unsupported(*args, **kwargs):
        raise OSError(95, "Operation not supported")

    src, dest = tmp_path / "src", tmp_path / "dest"
    weights = os.urandom(3 * 1024 * 1024 + 5)
    src.write_bytes(b"s" * 7 + weights)
    dest.write_bytes(b"head" + bytes(len(weights)) + b"tail")
    calls, real = [], os.pwrite

    def pwrite(fd, data, offset):
        calls.append(len(data))
        return real(fd, data, offset)

    monkeypatch.setattr(os, "copy_file_range", unsupported)
    monkeypatch.setattr(os, "pwrite", pwrite)
    monkeypatch.setattr(ranges_mod, "WRITE_PIECE", 128 * 1024)
    fill_holes(dest, [FileRange(dest, 0, 4), FileRange(src, 7, len(weights)), FileRange(dest, 4 + len(weights), 4)])
    assert dest.read_bytes() == b"head" + weights + b"tail"
    assert calls and max(calls) == 128 * 1024


@pytest.mark.parametrize("sizes", [[1000, 70_000, 5], [parallel.BUFFER + 3, 10], [7] * 3000])
def test_hash_parts_reads_through_one_buffer_and_checks_every_part(tmp_path, sizes):
    """``blobs.base.hash_parts`` (a push's packs) reads each block into the thread's buffer,
    or into one of its own when the block is larger: the copy, the concatenation's digest and
    each part's check are those of the file's bytes, whichever buffer held them, and nothing of
    an earlier block leaks into a later one."""
    import hashlib

    from registry.blobs.base import Part, hash_parts
    from registry.errors import IntegrityError

    data = os.urandom(sum(sizes) + 11)
    src = tmp_path / "src"
    src.write_bytes(data)
    offsets = [11 + sum(sizes[:i]) for i in range(len(sizes))]
    parts = [Part("sha256:" + hashlib.sha256(data[o:o + n]).hexdigest(), o, n) for o, n in zip(offsets, sizes)]
    out = tmp_path / "out"
    with open(src, "rb") as f, open(out, "wb") as o:
        got = hash_parts(src, f.fileno(), parts, out_fd=o.fileno())
    assert got == hashlib.sha256(data[11:]).hexdigest()
    assert out.read_bytes() == data[11:]

    bad = parts[-1]._replace(digest="sha256:" + "0" * 64)
    with open(src, "rb") as f, pytest.raises(IntegrityError, match=f"offset {bad.offset}"):
        hash_parts(src, f.fileno(), [*parts[:-1], bad])
    src.write_bytes(data[:-1])   # the file ends inside the last part
    with open(src, "rb") as f, pytest.raises(IntegrityError, match="1 bytes early"):
        hash_parts(src, f.fileno(), parts)
