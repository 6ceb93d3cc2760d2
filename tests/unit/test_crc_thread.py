"""CRC-32 on a thread of its own (``registry.parallel.crc``): the sums are zlib's, and ISA-L runs
on no thread but ``pt2reg-crc`` (a thread that ran it hashes SHA-256 1.34x slower for the rest
of its life on an AVX-512 processor: benchmarks/bench_hashing.py)."""
import multiprocessing
import os
import threading
import zlib

import pytest

from registry.format.bundle import BundleFile, FileRange, write_bundle
from registry.parallel import Job, Segment, crc32_combine, hash_ranges
from registry.parallel import crc as crc_mod


@pytest.fixture
def isal_threads(monkeypatch):
    """The name of the thread of every ISA-L call."""
    seen: list[str] = []
    real = crc_mod._isal_crc32

    def spy(data, value):
        seen.append(threading.current_thread().name)
        return real(data, value)

    monkeypatch.setattr(crc_mod, "_isal_crc32", spy)
    return seen


@pytest.mark.parametrize("size", [0, 1, 4096, crc_mod.INLINE_BYTES - 1, crc_mod.INLINE_BYTES, 5 * 1024 * 1024 + 3])
def test_sums_are_zlibs_whatever_the_size_and_starting_value(size):
    data = os.urandom(size)
    assert crc_mod.crc32(data) == zlib.crc32(data)
    assert crc_mod.crc32(data, 0x12345678) == zlib.crc32(data, 0x12345678)
    assert crc_mod.crc32_later(memoryview(data), 7).result() == zlib.crc32(data, 7)


def test_large_buffers_are_summed_on_the_crc_thread_small_ones_inline(isal_threads):
    crc_mod.crc32(b"x" * (crc_mod.INLINE_BYTES - 1))
    assert isal_threads == []
    crc_mod.crc32(b"x" * crc_mod.INLINE_BYTES)
    assert isal_threads and all(name.startswith("pt2reg-crc") for name in isal_threads)


def test_hash_ranges_never_runs_isal_in_a_hashing_worker(tmp_path, isal_threads):
    data = os.urandom(9 * 1024 * 1024 + 5)
    path = tmp_path / "data"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        step = 3 * 1024 * 1024
        jobs = [Job((Segment(fd, at, min(step, len(data) - at)),)) for at in range(0, len(data), step)]
        got = hash_ranges(jobs, crc=True, workers=2)
    finally:
        os.close(fd)
    whole = 0
    for h in got:
        whole = crc32_combine(whole, h.crc32, h.size)
    assert whole == zlib.crc32(data)
    assert len(isal_threads) >= 3 and set(isal_threads) == {isal_threads[0]}
    assert isal_threads[0].startswith("pt2reg-crc")


def test_a_bundle_rewritten_from_file_ranges_has_zlibs_crcs(tmp_path, isal_threads):
    """``write_bundle`` from ranges of another bundle (as a pull from a local store): the zip's
    CRC-32s, each summed on the CRC thread, are the ones zlib computes."""
    import zipfile

    from tests.fixtures_pt2 import ROOT

    original = ROOT / "tests" / "data" / "format1" / "mlp.pt2b"
    src = BundleFile.open(original)
    sources = {m.path: FileRange(original, *src.member_span(m.path)) for m in src.manifest.members}
    write_bundle(tmp_path / "b.pt2b", src.manifest, sources)
    with zipfile.ZipFile(original) as a, zipfile.ZipFile(tmp_path / "b.pt2b") as b:
        assert b.testzip() is None
        for m in src.manifest.members:
            assert b.getinfo(m.path).CRC == a.getinfo(m.path).CRC == zlib.crc32(a.read(m.path))
    assert isal_threads and all(name.startswith("pt2reg-crc") for name in isal_threads)


def _sum_in_child(conn):
    conn.send(crc_mod.crc32(b"y" * (2 * crc_mod.INLINE_BYTES)))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # 3.12: fork() of a process with threads
def test_a_forked_child_gets_a_crc_thread_of_its_own():
    crc_mod.crc32(b"z" * crc_mod.INLINE_BYTES)   # the parent's thread is running
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_sum_in_child, args=(child,))
    p.start()
    p.join(120)
    assert p.exitcode == 0
    assert parent.recv() == zlib.crc32(b"y" * (2 * crc_mod.INLINE_BYTES))
