"""CRC-32 for zip headers, on a thread of its own (``crc32``, ``crc32_later``), and the CRC-32
of a concatenation from the CRCs of its parts (``crc32_combine``).

ISA-L's CRC-32 sums 2 GiB in 0.04 s on this kind of machine (zlib's: 0.50 s), with AVX-512
where the processor has it, and that leaves a mark on the thread that ran it: SHA-256
(OpenSSL's, SHA-NI) then runs 1.34x slower *in that thread*, for as long as the thread lives
(sleeps and context switches included; other threads are unaffected). Measured 2026-12-05 on
the 2-core AMD EPYC (Zen 4) VM: 1 GiB hashed in 0.60 s by a thread, 0.80 s by a thread that had
summed 4 MiB with ISA-L first; 0.60 s after zlib's CRC-32. Every data path hashes and sums the
same bytes, so with the sum inline each copy paid ~0.4 CPU-seconds per 2 GiB in its SHA-256,
ten times what the CRC-32 itself costs. So ISA-L runs only on one long-lived thread that does
nothing else (``pt2reg-crc``): a worker hands it a buffer (``crc32_later``), hashes the same
buffer meanwhile, and collects the sum before it reuses the buffer. Below ``INLINE_BYTES`` the
hand-off costs more than zlib's sum, which is computed in the caller's thread.

Zip headers need the CRC-32 of a whole member, and its ranges are summed on different threads:
zlib's crc32_combine joins them in O(log n). Python's zlib module does not expose it; libz
does (loaded with ctypes), and a pure-Python port of the same algorithm stands in without it."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import threading
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # the executor is imported when the first large sum is asked for
    from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["crc32", "crc32_later", "crc32_combine", "INLINE_BYTES"]

#: buffers smaller than this are summed by zlib in the caller's thread (20 KiB: 5 us; a hand-off
#: to the CRC thread and back costs tens of microseconds)
INLINE_BYTES = 256 * 1024

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None


def _crc_thread() -> ThreadPoolExecutor:
    """The process's CRC thread, started on first use."""
    global _executor
    with _lock:
        if _executor is None:
            from concurrent.futures import ThreadPoolExecutor

            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pt2reg-crc")
        return _executor


def _forget_after_fork() -> None:
    """In a forked child: a fork copies no thread (the parent's CRC thread is not there to answer)
    and may copy ``_lock`` held, so both start afresh."""
    global _executor, _lock
    _executor, _lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _isal_crc32(data: bytes | memoryview, value: int) -> int:
    from isal.isal_zlib import crc32 as isal_crc32  # GIL released while it sums

    return int(isal_crc32(data, value))


class _Done:
    """A sum already known (summed inline): ``crc32_later``'s answer for a small buffer."""

    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value

    def result(self) -> int:
        return self.value


def crc32_later(data: bytes | memoryview, value: int = 0) -> Future[int] | _Done:
    """The CRC-32 of ``data`` continuing ``value``, computed on the CRC thread while the caller
    goes on (``.result()`` waits for it). ``data`` must not change until then."""
    if len(data) < INLINE_BYTES:
        return _Done(zlib.crc32(data, value))
    return _crc_thread().submit(_isal_crc32, data, value)


def crc32(data: bytes | memoryview, value: int = 0) -> int:
    """``zlib.crc32(data, value)``, summed on the CRC thread when ``data`` is large (see the
    module's docstring for why never in the caller's thread).

    >>> crc32(b"abc" * 100_000) == zlib.crc32(b"abc" * 100_000)
    True
    """
    return crc32_later(data, value).result()


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
