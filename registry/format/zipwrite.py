"""A deterministic zip writer: stored members, 64-byte aligned data, fixed timestamps.

The same members in the same order always give the same bytes, whatever the clock, the user or
the original file name, so a bundle or a normalized `.pt2` is content-addressable. Data is
aligned like torch's own writer so weights stay mmap-able at their offset.
"""
from __future__ import annotations

import os
import struct
import zipfile
from typing import IO, BinaryIO

from ..digests import pump

__all__ = ["DeterministicZipWriter", "ALIGNMENT", "member_info", "local_header", "uses_zip64", "PAD_TAG"]

ALIGNMENT = 64
PAD_TAG = 0xCAFE  # an extra-field id that readers skip; carries only alignment padding
_FIXED_DATE = (1980, 1, 1, 0, 0, 0)


def uses_zip64(size: int) -> bool:
    """Whether zipfile writes a member of ``size`` bytes with zip64 size fields (it does from
    1/1.05 of the limit on, for the room compression could need)."""
    return size >= zipfile.ZIP64_LIMIT or size * 1.05 > zipfile.ZIP64_LIMIT


def member_info(name: str, size: int, offset: int) -> zipfile.ZipInfo:
    """The ZipInfo this writer uses for a member of ``size`` bytes whose local header starts at
    ``offset``: fixed date and attributes, an extra field padding the data to ``ALIGNMENT``."""
    info = zipfile.ZipInfo(name, date_time=_FIXED_DATE)
    info.compress_type = zipfile.ZIP_STORED
    info.external_attr = 0o644 << 16
    info.create_system = 3
    info.file_size = size
    # local header = 30 + len(name) + len(extra) (+20 for the zip64 extra zipfile appends)
    base = offset + 30 + len(name.encode("utf-8")) + (20 if uses_zip64(size) else 0)
    pad = (-(base + 4)) % ALIGNMENT
    info.extra = struct.pack("<HH", PAD_TAG, pad) + b"\x00" * pad
    return info


def local_header(name: str, size: int, crc: int, offset: int) -> bytes:
    """The exact local-header bytes this writer leaves at ``offset`` for a member (zipfile
    writes the header, the data, then the header again with the CRC and sizes)."""
    info = member_info(name, size, offset)
    info.compress_size = size
    info.CRC = crc
    info.flag_bits = 0
    info.header_offset = offset
    return info.FileHeader(uses_zip64(size))


class DeterministicZipWriter:
    """Write stored members to an open binary file in a reproducible layout.

    >>> with open("out.zip", "wb") as f, DeterministicZipWriter(f) as w:   # doctest: +SKIP
    ...     w.write_bytes("a.txt", b"hi")
    """

    def __init__(self, fp: BinaryIO) -> None:
        self._zf = zipfile.ZipFile(fp, "w", compression=zipfile.ZIP_STORED, allowZip64=True)
        self._fp = fp
        self._names: set[str] = set()

    def _info(self, name: str, size: int) -> zipfile.ZipInfo:
        if name in self._names:
            raise ValueError(f"duplicate member {name!r}")
        self._names.add(name)
        return member_info(name, size, self._fp.tell())

    def write_stream(self, name: str, src: IO[bytes], size: int) -> None:
        info = self._info(name, size)
        zip64 = size >= zipfile.ZIP64_LIMIT
        with self._zf.open(info, "w", force_zip64=zip64) as dst:
            n = pump(src, dst.write, size=size)
            if n < size:
                raise OSError(f"source for {name!r} ended {size - n} bytes early")

    def write_bytes(self, name: str, data: bytes) -> None:
        import io
        self.write_stream(name, io.BytesIO(data), len(data))

    def write_file(self, name: str, path: str | os.PathLike) -> None:
        size = os.path.getsize(path)
        with open(path, "rb") as src:
            self.write_stream(name, src, size)

    def close(self) -> None:
        self._zf.close()

    def abort(self) -> None:
        """Give up on a failed write (the caller discards the file): nothing more is written,
        and zipfile's finalizer does not try to finish the archive on a closed file later."""
        self._zf.fp = None  # ZipFile.close() (and __del__) return at once when fp is None

    def __enter__(self) -> "DeterministicZipWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

