"""CRC-32 for zip headers: ISA-L's ``crc32`` (zlib's at ~3x the speed, GIL released), and the
CRC-32 of a concatenation from the CRCs of its parts (``crc32_combine``).

Zip headers need the CRC-32 of a whole member, and its ranges are summed on different threads:
zlib's crc32_combine joins them in O(log n). Python's zlib module does not expose it; libz
does (loaded with ctypes), and a pure-Python port of the same algorithm stands in without it."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

from isal.isal_zlib import crc32  # ISA-L: zlib's CRC-32 at ~3x the speed, GIL released

__all__ = ["crc32", "crc32_combine"]


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
