"""The writeback thread (registry.parallel): hints never make a copying worker wait, their
descriptors stay bounded and are all closed, and only copies that will be synced send them."""
from __future__ import annotations

import os
import threading
import time

import pytest

from registry import parallel
from registry.parallel import Segment, hash_copy


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd") or parallel._sync_file_range is None,
                    reason="Linux only: sync_file_range and /proc/self/fd")
def test_a_stuck_disk_never_blocks_the_caller_and_descriptors_stay_bounded(tmp_path, monkeypatch):
    release, calls = threading.Event(), []

    def stuck(fd, offset, size, flags):  # a disk whose queue is full: the call blocks
        calls.append((offset, size))
        release.wait(10)
        return 0

    monkeypatch.setattr(parallel, "_sync_file_range", stuck)
    wb = parallel._Writeback()
    with open(tmp_path / "f", "wb") as f:
        before = _open_fds()
        started = time.monotonic()
        for i in range(100):
            wb.submit(f.fileno(), i, 1)
        assert time.monotonic() - started < 1.0  # the caller never waited on the disk
        # one request held by the blocked thread, at most WRITEBACK_QUEUE waiting: the rest dropped
        assert _open_fds() - before <= parallel.WRITEBACK_QUEUE + 1
        release.set()
        deadline = time.monotonic() + 10
        while _open_fds() > before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _open_fds() == before  # every duplicated descriptor was closed
    assert 1 <= len(calls) <= parallel.WRITEBACK_QUEUE + 1


def test_only_copies_that_will_be_synced_send_hints(tmp_path, monkeypatch):
    sent = []
    monkeypatch.setattr(parallel, "start_writeback", lambda fd, offset, size: sent.append((offset, size)))
    src = tmp_path / "src"
    src.write_bytes(os.urandom(3 * parallel.BUFFER + 5))
    n = src.stat().st_size
    with open(src, "rb") as s, open(tmp_path / "a", "wb") as a, open(tmp_path / "b", "wb") as b:
        hash_copy([Segment(s.fileno(), 0, n)], out_fd=a.fileno())  # a cache file: never synced
        assert sent == []
        got = hash_copy([Segment(s.fileno(), 0, n)], out_fd=b.fileno(), writeback=True)
    assert got.size == n and (tmp_path / "b").read_bytes() == src.read_bytes()
    assert sent == [(0, n)]  # smaller than WRITEBACK: one hint, for the finished range
