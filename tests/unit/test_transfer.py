"""Concurrent blob transfers: ``run_parallel``, the parallel hashing engine (``registry.parallel``),
and the push/pull flows of ``registry.client.upload`` and ``registry.client.fetch`` (a member is its chunks: each one checked
on its own, on every core; no whole-member hash)."""
from __future__ import annotations

import functools
import hashlib
import os
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from registry.blobs import LocalBlobStore
from registry.blobs.base import Part, run_parallel
from registry.client.fetch import assemble_member
from registry.client.upload import plan_upload, upload_plan
from registry.errors import IntegrityError
from registry.format.manifest import Member
from registry.format.packs import PackIndex
from registry.parallel import BUFFER, Job, Segment, crc32_combine, hash_copy, hash_ranges


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- run_parallel ------------------------------------------------------------------------------

def _until(predicate, seconds: float = 10.0) -> bool:
    """Wait (with a deadline, not a fixed sleep) for what another thread is to do."""
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.002)
    return predicate()


def test_run_parallel_returns_results_in_order_and_overlaps():
    started, others = [], []
    lock, all_others = threading.Lock(), threading.Event()

    def slow(i: int) -> int:
        started.append(i)
        if i == 0:   # waits for every other item: run in turn, they would never come
            assert all_others.wait(10), "the first item held up the rest"
        else:
            time.sleep(0.01)
            with lock:
                others.append(i)
                if len(others) == 7:
                    all_others.set()
        return i * i

    assert run_parallel(slow, list(range(8)), 4) == [i * i for i in range(8)]
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


def test_run_parallel_calls_on_error_once_and_on_a_stop_of_the_callers_own():
    """Several items failing at once call ``on_error`` once; Ctrl-C in the calling thread (a
    pool's block) calls it too, so the running transfers are cut, and is raised once every
    thread stopped."""
    calls, gate, both = [], threading.Event(), threading.Barrier(2, timeout=10)

    def fail(i: int) -> int:
        both.wait()          # the two fail together
        raise ValueError(f"item {i}")

    with pytest.raises(ValueError, match="item"):
        run_parallel(fail, [0, 1], 2, on_error=lambda: calls.append(1))
    assert calls == [1]

    from registry.parallel import TaskPool

    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        with TaskPool(2, on_stop=lambda: (calls.append(1), gate.set())) as pool:
            pool.submit(lambda: gate.wait(10))
            raise KeyboardInterrupt
    assert calls == [1] and not any(t.is_alive() for t in pool._threads)


def test_run_parallel_empty():
    assert run_parallel(lambda i: i, [], 4) == []


def test_stretches_cut_where_parts_stop_lying_back_to_back():
    """``stretches`` (whole-list operations) cuts exactly where ``split_where`` with the
    pairwise rule does, on random layouts."""
    import random

    from registry.blobs.base import Part, stretches
    from registry.parallel import split_where

    rng = random.Random(7)
    for n in (0, 1, 2, 50, 500):
        parts, at = [], 0
        for i in range(n):
            size = rng.randint(1, 9)
            at += rng.choice((0, 0, 0, 1, 5))   # mostly back to back, some gaps
            parts.append(Part(f"sha256:{i:064x}", at, size))
            at += size
        want = split_where(parts, lambda a, b: a.offset + a.size == b.offset)
        assert [list(s) for s in stretches(parts)] == want


def test_background_gives_its_result_after_the_block_and_its_error_as_soon_as_it_failed():
    """``Background``, a ``TaskPool`` of one task: its result after the block; its error at
    ``check()`` in the block, else at the block's end; stopped by the block's failure (the
    rest of its behaviour is the pool's, tested below)."""
    from concurrent.futures import CancelledError

    from registry.parallel import Background

    seen = []
    with Background(lambda report: (report(3), report(4), "done")[-1], seen.append) as job:
        pass
    assert job.result() == "done" and seen == [3, 4]

    started, steps = threading.Event(), []

    def long_transfer(report):
        started.set()
        for _ in range(1000):
            time.sleep(0.005)
            report(1)
            steps.append(1)
    with pytest.raises(KeyError):
        with Background(long_transfer, None) as job:
            started.wait(5)
            raise KeyError("the plan failed")
    assert len(steps) < 200
    with pytest.raises(CancelledError):
        job.result()
    with pytest.raises(ZeroDivisionError):   # from the block's end, had the block not asked
        with Background(lambda report: 1 / 0, None) as job:
            assert _until(lambda: job._error is not None)
            with pytest.raises(ZeroDivisionError):
                job.check()                  # seen in the block, as soon as it failed
    with pytest.raises(ZeroDivisionError):
        job.result()


def test_task_pool_runs_what_the_block_hands_it_and_stops_at_the_first_failure():
    """``TaskPool``: tasks run on its threads while the block goes on; the first failure drops
    the tasks not started, stops the running ones at their next progress report, and is
    raised by ``submit`` and by the block's exit; ``finish`` runs once, after the last thread."""
    from concurrent.futures import CancelledError

    from registry.parallel import TaskPool

    seen, finished = [], []
    with TaskPool(3, seen.append, finish=lambda: finished.append(threading.active_count())) as pool:
        assert len(pool._threads) == 3 and all(t.is_alive() for t in pool._threads)
        pool.submit_all([functools.partial(pool.progress, n) for n in range(1, 11)])
    assert sorted(seen) == list(range(1, 11)) and len(finished) == 1
    assert not any(t.is_alive() for t in pool._threads)

    started, steps, ran = threading.Event(), [], []

    def long_transfer():
        started.set()
        for _ in range(1000):
            time.sleep(0.005)
            pool.progress(1)
            steps.append(1)

    def fail():
        started.wait(5)
        raise ZeroDivisionError("the chunk did not match")
    finished.clear()
    with pytest.raises(ZeroDivisionError):
        with TaskPool(2, None, finish=lambda: finished.append(1)) as pool:
            pool.submit(long_transfer)
            pool.submit(fail)
            deadline = time.monotonic() + 5
            while pool._error is None and time.monotonic() < deadline:
                time.sleep(0.01)
            pool.submit(lambda: ran.append(1))   # raises: the pool failed
    assert len(steps) < 200 and not ran and finished == [1]

    # the block fails: the running task stops at its next report, the block's error stands
    steps.clear()
    started.clear()
    with pytest.raises(KeyError) as info:
        with TaskPool(2, None) as pool:
            pool.submit(long_transfer)
            started.wait(5)
            raise KeyError("the pack index is invalid")
    assert len(steps) < 200 and not getattr(info.value, "__notes__", None)
    assert isinstance(pool._error, CancelledError)
    with pytest.raises(KeyError) as info:    # a real failure meanwhile is a note on it
        with TaskPool(2, None) as pool:
            pool.submit(lambda: 1 / 0)
            assert _until(lambda: pool._error is not None)
            raise KeyError("the plan failed")
    assert any("division by zero" in note for note in info.value.__notes__)

    # Ctrl-C while the block's end waits: the tasks stop too
    steps.clear()
    started.clear()
    with pytest.raises(KeyboardInterrupt):
        with TaskPool(2, None) as pool:
            pool.submit(long_transfer)
            started.wait(5)
            real_join, calls = pool._threads[0].join, []

            def interrupted_join(*args):
                calls.append(1)
                if len(calls) == 1:
                    raise KeyboardInterrupt
                return real_join(*args)
            pool._threads[0].join = interrupted_join
    assert len(steps) < 200 and not any(t.is_alive() for t in pool._threads)


def test_task_pool_interrupted_while_starting_leaves_no_thread_and_finishes(monkeypatch):
    """Ctrl-C inside ``Thread.start`` once the thread runs (its wait for the thread's first
    line): that thread is stopped with the others, ``finish`` runs once; and nothing can be
    handed to a pool after its block."""
    from registry.parallel import TaskPool

    real_start, starts, finished = threading.Thread.start, [], []

    def start(thread):
        real_start(thread)
        starts.append(thread)
        if len(starts) == 2:
            raise KeyboardInterrupt
    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(KeyboardInterrupt):
        with TaskPool(3, None, finish=lambda: finished.append(1)):
            raise AssertionError("the block does not run")
    monkeypatch.undo()
    for thread in starts:
        thread.join(5)
    assert len(starts) == 2 and not any(t.is_alive() for t in starts) and finished == [1]

    with TaskPool(2, None) as pool:
        pass
    with pytest.raises(RuntimeError, match="after its with block"):
        pool.submit(lambda: None)

# -- the parallel hashing engine ---------------------------------------------------------------

def test_hash_ranges_match_hashlib_and_copy_exactly(tmp_path):
    import zlib

    data = os.urandom(3 * BUFFER + 12345)
    src = tmp_path / "src"
    src.write_bytes(data)
    cuts = [0, 1, 70_000, BUFFER + 5, 2 * BUFFER, len(data)]
    spans = list(zip(cuts, cuts[1:]))
    dst = tmp_path / "dst"
    fd, out = os.open(src, os.O_RDONLY), os.open(dst, os.O_RDWR | os.O_CREAT)
    seen = []
    try:
        done = hash_ranges([Job((Segment(fd, a, b - a),), out, 7 + a) for a, b in spans], crc=True,
                           progress=seen.append, workers=3)
    finally:
        os.close(fd)
        os.close(out)
    assert [h.sha256 for h in done] == [sha(data[a:b]) for a, b in spans]
    assert [h.crc32 for h in done] == [zlib.crc32(data[a:b]) for a, b in spans]
    assert dst.read_bytes() == b"\0" * 7 + data and sum(seen) == len(data)
    assert max(seen) <= BUFFER                       # read in bounded pieces, whatever the range
    whole = 0
    for h in done:
        whole = crc32_combine(whole, h.crc32, h.size)
    assert whole == zlib.crc32(data)


def test_hash_ranges_names_the_job_that_does_not_match(tmp_path):
    data = os.urandom(100_000)
    (tmp_path / "f").write_bytes(data)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        jobs = [Job((Segment(fd, 0, 50_000),), expect=sha(data[:50_000])),
                Job((Segment(fd, 50_000, 50_000),), expect="ab" * 32)]
        with pytest.raises(IntegrityError, match="job 1"):
            hash_ranges(jobs, mismatch=lambda i, got: IntegrityError(f"job {i}: got {got}"))
        with pytest.raises(OSError, match="early"):
            hash_copy([Segment(fd, 90_000, 20_000)])
    finally:
        os.close(fd)


# -- push and pull of a chunked member ---------------------------------------------------------

def _chunked(tmp_path: Path, *, chunk_shas: list[str] | None = None):
    """A fake opened bundle: one 4-chunk member at offset 64 of a file, plus its manifest view."""
    chunks = [os.urandom(n) for n in (70_000, 1_000_000, 123, 900_000)]
    body = b"".join(chunks)
    path = tmp_path / "fake.pt2b"
    path.write_bytes(b"H" * 64 + body + b"T" * 10)
    member = Member("programs/m.pt2", None, len(body), "program",
                    tuple((s, len(c)) for s, c in zip(chunk_shas or [sha(c) for c in chunks], chunks)))
    bundle = SimpleNamespace(path=path, manifest=SimpleNamespace(members=[member]),
                             member_span=lambda _p: (64, len(body)))
    return bundle, member, body


class _Empty:
    """A metadata store with no versions: no chunk is in a pack yet, no blob is recorded."""

    def locate_chunks(self, digests, *, name):
        return {}

    def recorded_blobs(self, digests):
        return set()


def upload_bundle(bundle, store, progress):
    """A push's upload of ``bundle`` into an empty registry: (uploaded, skipped)."""
    return upload_plan(bundle, plan_upload(bundle, _Empty(), store, "m"), store, progress)


def pack_index(bundle, store):
    """Where the push put the small chunks (the version's pack index)."""
    return plan_upload(bundle, _Empty(), store, "m").index


@pytest.mark.parametrize("parallel", [1, 4])
def test_upload_then_assemble_round_trip(tmp_path, monkeypatch, parallel):
    monkeypatch.setattr("registry.blobs.local.WORKERS", parallel)
    store = LocalBlobStore(tmp_path / "store")
    bundle, member, body = _chunked(tmp_path)
    seen = []
    assert upload_bundle(bundle, store, seen.append) == (len(body), 0)
    assert sum(seen) == len(body)
    assert upload_bundle(bundle, store, None) == (0, len(body))     # all there: nothing written
    dest = tmp_path / "cache" / "m.pt2"
    assemble_member(member, store, dest, None, pack_index(bundle, store))
    assert dest.read_bytes() == body


def _watch_fetches(store):
    """``store.part_fetches`` noting the size of each part as its fetch starts, and an event set
    at the first."""
    calls, started, real = [], threading.Event(), store.part_fetches

    def part_fetches(fd, parts, **kwargs):
        def watched(part, fetch):
            calls.append(part.size)
            started.set()
            fetch()
        return [functools.partial(watched, p, f) for p, f in zip(parts, real(fd, parts, **kwargs))]
    store.part_fetches = part_fetches
    return calls, started


def test_a_pull_reads_the_pack_index_while_the_large_chunks_come(tmp_path):
    """The chunks of ``PACK_BELOW`` bytes or more (never in a pack) are under way before the
    pack index is read: a pull of a 10,000-tensor program parses its index and plans the pack
    reads on one core while they copy on the others (``assemble_member`` with a function)."""
    store = LocalBlobStore(tmp_path / "store")
    bundle, member, body = _chunked(tmp_path)
    upload_bundle(bundle, store, None)
    index = pack_index(bundle, store)
    calls, started = _watch_fetches(store)

    def read_index():
        assert started.wait(5), "the pack index was read before the large chunks were started"
        return index
    seen = []
    dest = tmp_path / "cache" / "m.pt2"
    assemble_member(member, store, dest, seen.append, read_index)
    assert dest.read_bytes() == body
    assert sum(seen) == len(body)
    assert sorted(calls) == [70_000, 900_000, 1_000_000]   # the large ones, each once; the small one from its pack


def test_a_pack_index_that_does_not_read_fails_the_pull_and_leaves_nothing(tmp_path):
    """Its error stops the large chunks already under way; the temp file is removed after them."""
    store = LocalBlobStore(tmp_path / "store")
    bundle, member, _body = _chunked(tmp_path)
    upload_bundle(bundle, store, None)
    _calls, started = _watch_fetches(store)

    def read_index():
        assert started.wait(5)
        raise IntegrityError("m@1: its stored pack index is invalid (not JSON)")
    dest = tmp_path / "cache" / "m.pt2"
    with pytest.raises(IntegrityError, match="stored pack index is invalid"):
        assemble_member(member, store, dest, None, read_index)
    assert not dest.exists() and not list(dest.parent.iterdir())


def test_the_large_chunks_land_in_their_file_even_once_the_caller_let_go_of_it(tmp_path):
    """A second Ctrl-C can make the caller stop waiting for the pool and close the file; a
    fetch still running writes into that file (the pool's own duplicate of the descriptor,
    closed after its last thread), never into another file that got the same number."""
    from registry.client.fetch import _fetch_into
    from registry.format.manifest import Member

    entered, gate = threading.Event(), threading.Event()

    class Slow:
        read_workers = 8   # declared, as every BlobStore does

        def part_fetches(self, fd, parts, progress=None):
            def fetch():
                entered.set()
                gate.wait(5)
                os.pwrite(fd, b"late", 0)
            return [fetch]

    member = Member("programs/m.pt2", None, 5 * 1024 * 1024, "program", (("ab" * 32, 5 * 1024 * 1024),))
    dest = tmp_path / "member"
    fd = os.open(dest, os.O_RDWR | os.O_CREAT)
    caller = threading.Thread(target=_fetch_into, args=(fd, member, Slow(), None, PackIndex()))
    caller.start()
    assert entered.wait(5)
    os.close(fd)
    other = os.open(tmp_path / "other", os.O_RDWR | os.O_CREAT)
    try:
        assert other == fd   # the lowest free number: the one just closed
        gate.set()
        caller.join(5)
        assert os.pread(other, 16, 0) == b""
        assert dest.read_bytes() == b"late"
    finally:
        os.close(other)


def test_push_refuses_a_damaged_file_chunk_by_chunk(tmp_path):
    store = LocalBlobStore(tmp_path / "store")
    bundle, member, _body = _chunked(tmp_path)
    raw = bytearray(bundle.path.read_bytes())
    raw[64 + 70_000 + 1_000_000 + 5] ^= 0xFF       # one byte of chunk 2 (123 bytes)
    bundle.path.write_bytes(bytes(raw))
    with pytest.raises(IntegrityError, match=f"does not match its digest sha256:{member.chunks[2][0]}"):
        upload_bundle(bundle, store, None)
    assert not store.exists("sha256:" + member.chunks[2][0])
    assert not list((tmp_path / "store").rglob("tmp/*"))  # nothing half written (here: nothing at all)


def test_push_refuses_a_wrong_chunk_digest(tmp_path):
    store = LocalBlobStore(tmp_path / "store")
    bundle, member, _body = _chunked(tmp_path)
    chunks = list(member.chunks)
    chunks[2] = ("cd" * 32, chunks[2][1])
    bundle.manifest.members[0] = Member(member.path, None, member.size, member.role, tuple(chunks))
    with pytest.raises(IntegrityError, match="cd" * 32):
        upload_bundle(bundle, store, None)
    assert not store.exists("sha256:" + "cd" * 32)
    assert not list((tmp_path / "store").rglob("tmp/*"))  # nothing half written (here: nothing at all)


def test_pull_refuses_a_blob_of_the_wrong_size_and_leaves_nothing(tmp_path):
    store = LocalBlobStore(tmp_path / "store")
    bundle, member, _body = _chunked(tmp_path)
    upload_bundle(bundle, store, None)
    chunks = list(member.chunks)
    chunks[0], chunks[1] = (chunks[0][0], chunks[0][1] + 10), (chunks[1][0], chunks[1][1] - 10)
    lying = Member(member.path, None, member.size, member.role, tuple(chunks))  # still tiles the member
    dest = tmp_path / "cache" / "m.pt2"
    # both lying chunks fail; whichever worker reports first names its own
    with pytest.raises(IntegrityError, match=r"has (70000 bytes, expected 70010|1000000 bytes, expected 999990)"):
        assemble_member(lying, store, dest, None)
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
        with pytest.raises(IntegrityError, match="5000 bytes, expected 4000"):
            store.get_parts(fd, [Part("sha256:" + sha(a), 0, 4000), Part("sha256:" + sha(b), 4000, 5000)])
    finally:
        os.close(fd)
    assert out.read_bytes()[4000:] in (b"\0" * 5000, b[:5000])   # a never spilled into b's range


def test_the_python_crc32_combine_matches_zlib():
    """The stand-in used where libz cannot be loaded with ctypes."""
    import zlib

    from registry.parallel.crc import _combine_py

    for n in (0, 1, 7, 8, 4096, 77_777):
        a, b = os.urandom(13), os.urandom(n)
        assert _combine_py(zlib.crc32(a), zlib.crc32(b), n) == zlib.crc32(a + b), n


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="libz.so.1: the Linux soname")
def test_libz_crc32_combine_is_loaded_by_its_soname_and_matches_zlib():
    """Loaded on first use without ``find_library`` (which runs ``ldconfig`` in a child process)."""
    import zlib

    from registry.parallel.crc import _load_combine

    combine = _load_combine()
    assert combine is not None
    for n in (0, 1, 4096, 3 << 30):
        a, b = os.urandom(13), os.urandom(min(n, 1 << 16))
        if n == len(b):
            assert combine(zlib.crc32(a), zlib.crc32(b), n) == zlib.crc32(a + b), n
        else:  # a length beyond 32 bits (crc32_combine64): agrees with the Python port
            from registry.parallel.crc import _combine_py

            assert combine(zlib.crc32(a), 0x1234567, n) == _combine_py(zlib.crc32(a), 0x1234567, n)


def test_gc_held_pauses_the_collector_for_nested_and_concurrent_holds_only():
    """``gc_held`` (a push or pull of a program with many tensors): the collector is off while
    any hold lasts, on again after the last one, and left off if it was off before."""
    import gc
    import threading

    from registry.parallel import gc_held

    was = gc.isenabled()
    try:
        gc.enable()
        inside, release = threading.Event(), threading.Event()

        def other() -> None:
            with gc_held():
                inside.set()
                release.wait(10)

        t = threading.Thread(target=other)
        with gc_held():
            assert not gc.isenabled()
            t.start()
            assert inside.wait(10)
            with gc_held():
                assert not gc.isenabled()
        assert not gc.isenabled()          # the other thread still holds it
        release.set()
        t.join(10)
        assert gc.isenabled()
        gc.disable()
        with gc_held():
            pass
        assert not gc.isenabled()          # off before: left off
        gc.enable()
        try:
            with gc_held():
                raise KeyError("boom")
        except KeyError:
            pass
        assert gc.isenabled()
        with gc_held(limit=0.5):                 # however long the holds last: on again after the limit
            assert not gc.isenabled()
            deadline = __import__("time").monotonic() + 10
            while not gc.isenabled() and __import__("time").monotonic() < deadline:
                __import__("time").sleep(0.01)
            assert gc.isenabled()
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


# -- how a pull reads a member: member_reads ------------------------------------------------------

def _placed_one_by_one(member, index):
    """The placement rule, one chunk at a time: from the pack the index lists it in at its size,
    else as a blob of its own."""
    from registry.blobs.base import Part
    from registry.blobs.packed import PackedPart

    located = index.locations()
    out = []
    for sha, offset, size in member.chunk_spans():
        loc = located.get("sha256:" + sha)
        out.append(PackedPart("sha256:" + sha, offset, size, loc.pack, loc.offset) if loc is not None
                   and loc.size == size else Part("sha256:" + sha, offset, size))
    return out


def test_member_reads_places_every_chunk_as_the_rule_says():
    """The pull's placement (runs of pack reads built from the index in pack order, and the rest
    as blobs of their own), and ``member_parts`` made from it, are the rule's, chunk by chunk, on
    random members and indexes: repeated chunks, entries of other members or at another size,
    several packs; each run in one pack, in offset order, at most ``RUN_BYTES`` long unless it
    is one chunk."""
    import random

    from registry.blobs.packed import RUN_BYTES, PackedPart
    from registry.client.fetch import member_parts, member_reads
    from registry.format.packs import Pack, PackEntry, PackIndex

    rng = random.Random(11)
    for _ in range(300):
        pool = [(f"{rng.getrandbits(256):064x}", rng.choice([1, 7, 4000, 60_000, 3 << 20])) for _ in range(12)]
        chunks = tuple(rng.choice(pool) for _ in range(rng.randint(1, 40)))      # repeats, like zeros and ones
        member = Member("programs/m.pt2", None, sum(n for _h, n in chunks), "program", chunks)
        packs = []
        for p in range(rng.randint(0, 3)):
            entries, at = [], 0
            for h, n in rng.sample(pool, rng.randint(1, len(pool))):
                if n >= 64 * 1024 or any(h == e.chunk[7:] for q in packs for e in q.entries):
                    continue
                n = n if rng.random() > 0.1 else n + 1       # now and then at another size
                entries.append(PackEntry("sha256:" + h, at, n))
                at += n + rng.choice([0, 0, 5, 300_000])     # gaps, some past RUN_GAP
            if entries:
                packs.append(Pack.of(f"sha256:{p:064x}", max(at, 1), entries))
        index = PackIndex(tuple(packs))
        runs, own = member_reads(member, index)
        want = _placed_one_by_one(member, index)
        assert member_parts(member, index) == want
        assert own == [p for p in want if type(p) is not PackedPart]
        got = {(c[4], "sha256:" + c[0], c[3], c[2], r.pack, c[1]) for r in runs for c in r.chunks}
        got |= {(i, p.digest, p.offset, p.size) for i, p in enumerate(want) if p in own}
        assert sorted(got) == sorted((i, *p) for i, p in enumerate(want))
        assert len({c[4] for r in runs for c in r.chunks}) == sum(len(r.chunks) for r in runs)  # each place once
        assert len(own) == sum(type(p) is not PackedPart for p in want)
        for r in runs:
            assert [c[1] for c in r.chunks] == sorted(c[1] for c in r.chunks)
            assert r.start == r.chunks[0][1] and r.end == max(c[1] + c[2] for c in r.chunks)
            assert r.end - r.start <= RUN_BYTES or len(r.chunks) == 1
