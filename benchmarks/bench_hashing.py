"""Hashing and summing the same bytes: what a CRC-32 costs the SHA-256 beside it.

Every data path (bundle, push, pull, cache) hashes each byte with SHA-256 (OpenSSL: SHA-NI where
the processor has it) and sums it with CRC-32 for the zip headers. ISA-L's CRC-32 is ~12x
zlib's, but on a processor with AVX-512 it leaves the thread that ran it slower at SHA-256 for
the rest of the thread's life (``registry.parallel.crc``). Side by side in one run, medians of
``--reps``, each case in a thread of its own started for it:

sha256 mechanism   SHA-256 of ``--mib`` in a new thread (hot 4 MiB buffer), against the same in a
                   thread that first summed 4 MiB with ISA-L (and, for contrast, with zlib).
hash_ranges        ``registry.parallel.hash_ranges`` over a file in the page cache (64 MiB
                   ranges, every core): with CRC-32 (summed on the CRC thread) against without;
                   and against the sum inline in each worker, as before (``inline``: the same
                   loop as ``hash_copy``, ISA-L called in the worker).

    .venv/bin/python benchmarks/bench_hashing.py              # 1 GiB, 5 repetitions
    .venv/bin/python benchmarks/bench_hashing.py --quick      # smoke test: 32 MiB, 1 repetition
"""
from __future__ import annotations

import hashlib
import os
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

from _common import MiB, Row, median, parse_args, report, scratch, side_by_side

from registry.parallel import BUFFER, Job, Segment, hash_ranges, run_parallel, thread_buffer
from registry.parallel.crc import crc32_combine


def in_thread(fn: Callable[[], Any]) -> Callable[[], None]:
    """``fn`` in a thread started for it (what a thread did before is part of the case)."""
    def go() -> None:
        t = threading.Thread(target=fn)
        t.start()
        t.join()
    return go


def sha_case(total: int, before: Callable[[memoryview], Any] | None) -> Callable[[], None]:
    buf = memoryview(bytearray(os.urandom(BUFFER)))

    def work() -> None:
        if before is not None:
            before(buf)
        h = hashlib.sha256()
        for _ in range(total // BUFFER):
            h.update(buf)
    return in_thread(work)


def isal_sum(buf: memoryview) -> int:
    from isal.isal_zlib import crc32
    return int(crc32(buf))


def inline_hash_ranges(jobs: list[Job]) -> None:
    """``hash_ranges(jobs, crc=True)`` as it was: ISA-L's CRC-32 called in each worker."""
    from isal.isal_zlib import crc32

    def one(job: Job) -> tuple[str, int]:
        buf, h, c = thread_buffer(), hashlib.sha256(), 0
        for seg in job.segments:
            at, left, sc = seg.offset, seg.size, 0
            while left > 0:
                n = os.preadv(seg.fd, [buf[:min(left, BUFFER)]], at)
                h.update(buf[:n])
                sc = crc32(buf[:n], sc)
                at, left = at + n, left - n
            c = crc32_combine(c, sc, seg.size)
        return h.hexdigest(), c

    run_parallel(one, jobs, os.cpu_count() or 2)


def main() -> None:
    args = parse_args(__doc__)
    total = (32 if args.quick else 1024) * MiB
    with scratch("hashing-") as work:
        data = work / "data"
        with open(data, "wb") as f:
            for _ in range(total // BUFFER):
                f.write(os.urandom(BUFFER))
        fd = os.open(data, os.O_RDONLY)
        try:
            step = 64 * MiB if not args.quick else 4 * MiB
            jobs = [Job((Segment(fd, at, min(step, total - at)),)) for at in range(0, total, step)]
            for j in jobs:   # the file in the page cache, and the answers agreed on
                assert os.pread(fd, 1, j.segments[0].offset)
            summed = hash_ranges(jobs, crc=True)
            assert [h.sha256 for h in summed] == [h.sha256 for h in hash_ranges(jobs)]
            whole = 0
            for h in summed:
                whole = crc32_combine(whole, h.crc32, h.size)
            assert whole == zlib.crc32(data.read_bytes())
            t = side_by_side(args.reps, {
                "sha clean": sha_case(total, None),
                "sha after isal": sha_case(total, isal_sum),
                "sha after zlib": sha_case(total, zlib.crc32),
                "ranges crc": lambda: hash_ranges(jobs, crc=True),
                "ranges no crc": lambda: hash_ranges(jobs),
                "ranges inline crc": lambda: inline_hash_ranges(jobs),
            })
        finally:
            os.close(fd)
    m = {k: median(v) for k, v in t.items()}
    size = f"{total // MiB:,} MiB"
    at = time.strftime("%Y-%m-%d")
    rows = [
        Row(f"SHA-256 of {size}, one thread that summed 4 MiB with ISA-L first", m["sha after isal"],
            m["sha clean"], note=f"{at}; vs a new thread; the mechanism (registry.parallel.crc)"),
        Row(f"SHA-256 of {size}, one thread that summed 4 MiB with zlib first", m["sha after zlib"],
            m["sha clean"], note="vs a new thread"),
        Row(f"hash_ranges of {size} with CRC-32 (CRC thread)", m["ranges crc"], m["ranges no crc"],
            target="<= 1.1x", ok=m["ranges crc"] <= 1.1 * m["ranges no crc"] if not args.quick else None,
            note="vs hash_ranges without CRC-32; every core, page cache"),
        Row(f"hash_ranges of {size} with CRC-32 inline (ISA-L in each worker, as before)", m["ranges inline crc"],
            m["ranges no crc"], note="vs hash_ranges without CRC-32"),
    ]
    report("hashing", "SHA-256 beside CRC-32", rows, args, extra={"timings": t, "mib": total // MiB})


if __name__ == "__main__":
    main()
