"""Concurrent blob transfers: ``run_parallel``, the in-order ``RangeHasher``, and the push/pull
flows of ``registry.client.transfer`` (members split into chunks, checked whole on the side)."""
from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from registry.blobs import LocalBlobStore
from registry.blobs.base import Part, run_parallel
from registry.errors import IntegrityError
from registry.client.transfer import RangeHasher, assemble_member, upload_bundle


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- run_parallel ------------------------------------------------------------------------------

def test_run_parallel_returns_results_in_order_and_overlaps():
    started = []

    def slow(i: int) -> int:
        started.append(i)
        time.sleep(0.2 if i == 0 else 0.01)
        return i * i

    t0 = time.monotonic()
    assert run_parallel(slow, list(range(8)), 4) == [i * i for i in range(8)]
    assert time.monotonic() - t0 < 0.2 + 8 * 0.01   # the slow first item did not hold up the rest
    assert sorted(started) == list(range(8))


def test_run_parallel_first_failure_stops_the_rest_and_calls_on_error():
    ran, errors = [], []
    gate = threading.Event()

    def work(i: int) -> int:
        ran.append(i)
        if i == 0:
            raise IntegrityError("item 0 is bad")
        gate.wait(5)       # running items are interrupted by on_error, not waited out
        return i

    with pytest.raises(IntegrityError, match="item 0 is bad"):
        run_parallel(work, list(range(50)), 2, on_error=lambda: (errors.append(1), gate.set()))
    assert errors == [1]
    assert 0 in ran and set(ran) <= {0, 1}   # at most the one running beside it: nothing after


def test_run_parallel_empty():
    assert run_parallel(lambda i: i, [], 4) == []


# -- RangeHasher -------------------------------------------------------------------------------

@pytest.fixture
def data_file(tmp_path) -> tuple[Path, bytes]:
    data = os.urandom(3 * 1024 * 1024 + 77)
    path = tmp_path / "data"
    path.write_bytes(data)
    return path, data


def _ranges(total: int, n: int) -> list[tuple[int, int]]:
    step = total // n
    return [(i * step, step if i < n - 1 else total - i * step) for i in range(n)]


def test_range_hasher_ungated_hashes_the_ranges_in_order(data_file):
    path, data = data_file
    fd = os.open(path, os.O_RDONLY)
    try:
        assert RangeHasher(fd, [(100, len(data) - 200)]).hexdigest() == sha(data[100:-100])
    finally:
        os.close(fd)


def test_range_hasher_gated_waits_for_each_range_whatever_order_they_complete(data_file):
    path, data = data_file
    ranges = _ranges(len(data), 5)
    fd = os.open(path, os.O_RDONLY)
    try:
        hasher = RangeHasher(fd, ranges, gated=True)
        for i in (3, 1, 4, 0):
            hasher.ready(i)
        time.sleep(0.05)
        assert hasher._thread.is_alive()           # range 2 is not ready: still waiting
        hasher.ready(2)
        assert hasher.hexdigest() == sha(data)
    finally:
        os.close(fd)


def test_range_hasher_cancel_and_short_file(data_file):
    path, data = data_file
    fd = os.open(path, os.O_RDONLY)
    try:
        hasher = RangeHasher(fd, _ranges(len(data), 3), gated=True)
        hasher.cancel()                              # returns although nothing became ready
        assert not hasher._thread.is_alive()
        with pytest.raises(OSError, match="bytes early"):
            RangeHasher(fd, [(0, len(data) + 10)]).hexdigest()
    finally:
        os.close(fd)


# -- push and pull of a chunked member ---------------------------------------------------------

def _chunked(tmp_path: Path, *, member_sha: str | None = None, chunk_shas: list[str] | None = None):
    """A fake opened bundle: one 4-chunk member at offset 64 of a file, plus its manifest view."""
    chunks = [os.urandom(n) for n in (70_000, 1_000_000, 123, 900_000)]
    body = b"".join(chunks)
    path = tmp_path / "fake.pt2b"
    path.write_bytes(b"H" * 64 + body + b"T" * 10)
    member = SimpleNamespace(path="programs/m.pt2", size=len(body), sha256=member_sha or sha(body),
                             digest="sha256:" + (member_sha or sha(body)),
                             chunks=[(s, len(c)) for s, c in zip(chunk_shas or [sha(c) for c in chunks], chunks)])
    bundle = SimpleNamespace(path=path, manifest=SimpleNamespace(members=[member]),
                             member_span=lambda _p: (64, len(body)))
    return bundle, member, body


@pytest.mark.parametrize("parallel", [1, 4])
def test_upload_then_assemble_round_trip(tmp_path, monkeypatch, parallel):
    monkeypatch.setattr("registry.blobs.local.PARALLEL_BLOBS", parallel)
    store = LocalBlobStore(tmp_path / "store")
    bundle, member, body = _chunked(tmp_path)
    seen = []
    assert upload_bundle(bundle, store, seen.append) == (len(body), 0)
    assert sum(seen) == len(body)
    assert upload_bundle(bundle, store, None) == (0, len(body))     # all there: nothing written
    dest = tmp_path / "cache" / "m.pt2"
    assemble_member(member, store, dest, None)
    assert dest.read_bytes() == body


def test_push_refuses_a_member_whose_chunks_are_not_it(tmp_path):
    store = LocalBlobStore(tmp_path / "store")
    bundle, _member, _body = _chunked(tmp_path, member_sha="ab" * 32)
    with pytest.raises(IntegrityError, match="does not match its sha256 in the manifest"):
        upload_bundle(bundle, store, None)


def test_push_refuses_a_wrong_chunk_digest(tmp_path):
    store = LocalBlobStore(tmp_path / "store")
    bundle, member, _body = _chunked(tmp_path)
    member.chunks[2] = ("cd" * 32, member.chunks[2][1])
    with pytest.raises(IntegrityError, match="cd" * 32):
        upload_bundle(bundle, store, None)
    assert not store.exists("sha256:" + "cd" * 32)
    assert not list((tmp_path / "store" / "tmp").iterdir())


def test_pull_refuses_an_inconsistent_member_and_leaves_nothing(tmp_path):
    store = LocalBlobStore(tmp_path / "store")
    bundle, member, _body = _chunked(tmp_path)
    upload_bundle(bundle, store, None)
    member.sha256 = "ef" * 32          # the manifest now claims other bytes than its chunks make
    dest = tmp_path / "cache" / "m.pt2"
    with pytest.raises(IntegrityError, match="rebuilt from its chunks does not match"):
        assemble_member(member, store, dest, None)
    assert not dest.exists() and not list(dest.parent.iterdir())


def test_pull_refuses_a_corrupt_chunk_and_leaves_nothing(tmp_path):
    store = LocalBlobStore(tmp_path / "store")
    bundle, member, _body = _chunked(tmp_path)
    upload_bundle(bundle, store, None)
    victim = store._path("sha256:" + member.chunks[1][0])
    os.chmod(victim, 0o644)
    victim.write_bytes(b"x" * member.chunks[1][1])
    dest = tmp_path / "cache" / "m.pt2"
    with pytest.raises(IntegrityError, match="is corrupt in the store"):
        assemble_member(member, store, dest, None)
    assert not dest.exists() and not list(dest.parent.iterdir())


def test_parts_do_not_write_outside_their_range(tmp_path):
    """A blob longer than its manifest entry says must not overwrite its neighbour's range."""
    store = LocalBlobStore(tmp_path / "store")
    a, b = os.urandom(5000), os.urandom(5000)
    store.put_bytes(a, "sha256:" + sha(a))
    store.put_bytes(b, "sha256:" + sha(b))
    out = tmp_path / "out"
    out.write_bytes(b"\0" * 9000)
    fd = os.open(out, os.O_RDWR)
    try:
        with pytest.raises(IntegrityError, match="larger than"):
            store.get_parts(fd, [Part("sha256:" + sha(a), 0, 4000), Part("sha256:" + sha(b), 4000, 5000)])
    finally:
        os.close(fd)
    assert out.read_bytes()[4000:] in (b"\0" * 5000, b[:5000])   # a never spilled into b's range
