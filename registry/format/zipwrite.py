"""A deterministic zip writer: stored members, 64-byte aligned data, fixed timestamps, and
members that can be filled in parallel at known offsets.

The same members in the same order always give the same bytes, whatever the clock, the user or
the original file name, so a bundle or a normalized `.pt2` is content-addressable. Data is
aligned like torch's own writer so weights stay mmap-able at their offset.
"""
from __future__ import annotations

import struct
import zipfile
from dataclasses import dataclass
from typing import IO, BinaryIO

from ..digests import pump
from ..parallel.crc import crc32

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


def _final_info(name: str, size: int, crc: int, offset: int) -> zipfile.ZipInfo:
    info = member_info(name, size, offset)
    info.compress_size = size
    info.CRC = crc
    info.flag_bits = 0
    info.header_offset = offset
    return info


def local_header(name: str, size: int, crc: int, offset: int) -> bytes:
    """The exact local-header bytes this writer leaves at ``offset`` for a member (the bytes
    zipfile writes for it: its local header, after the data, holds the CRC and sizes)."""
    return _final_info(name, size, crc, offset).FileHeader(uses_zip64(size))


@dataclass
class _Entry:
    name: str
    size: int
    header_offset: int
    data_offset: int
    crc: int | None = None


class DeterministicZipWriter:
    """Write stored members to an open binary file in a reproducible layout.

    Members are laid out one after the other as they are added. ``write_stream`` /
    ``write_bytes`` copy a member at once; ``reserve`` only places one (its data offset is
    returned, so the caller can fill it with ``os.pwrite``, several ranges at once, from other
    threads) and ``set_crc`` gives its CRC-32 afterwards. Local headers and the central
    directory are written by ``close``, once every CRC is known.

    >>> with open("out.zip", "wb") as f, DeterministicZipWriter(f) as w:   # doctest: +SKIP
    ...     w.write_bytes("a.txt", b"hi")
    """

    def __init__(self, fp: BinaryIO) -> None:
        self._fp = fp
        self._start = self._pos = fp.tell()
        self._entries: dict[str, _Entry] = {}

    def reserve(self, name: str, size: int) -> int:
        """Place a member of ``size`` bytes after the previous one; returns its data offset."""
        if name in self._entries:
            raise ValueError(f"duplicate member {name!r}")
        header = len(local_header(name, size, 0, self._pos))
        entry = _Entry(name, size, self._pos, self._pos + header)
        self._entries[name] = entry
        self._pos = entry.data_offset + size
        return entry.data_offset

    def set_crc(self, name: str, crc: int) -> None:
        self._entries[name].crc = crc

    @property
    def end(self) -> int:
        """Where the next member (or the central directory) starts."""
        return self._pos

    def write_stream(self, name: str, src: IO[bytes], size: int) -> None:
        offset = self.reserve(name, size)
        crc = 0

        def write(data: bytes) -> None:
            nonlocal crc
            crc = crc32(data, crc)
            self._fp.write(data)

        self._fp.seek(offset)
        n = pump(src, write, size=size)
        if n < size:
            raise OSError(f"source for {name!r} ended {size - n} bytes early")
        self.set_crc(name, crc)

    def write_bytes(self, name: str, data: bytes) -> None:
        import io
        self.write_stream(name, io.BytesIO(data), len(data))

    def close(self) -> None:
        infos = []
        for e in self._entries.values():
            if e.crc is None:
                raise ValueError(f"member {e.name!r} was reserved but its CRC was never set")
            info = _final_info(e.name, e.size, e.crc, e.header_offset)
            self._fp.seek(e.header_offset)
            self._fp.write(info.FileHeader(uses_zip64(e.size)))
            infos.append(info)
        self._fp.seek(self._pos)
        # zipfile writes the central directory (zip64 records included) of the infos at the
        # position it starts at: the bytes it writes for the same members itself
        zf = zipfile.ZipFile(self._fp, "w", compression=zipfile.ZIP_STORED, allowZip64=True)
        for info in infos:
            zf.filelist.append(info)
            zf.NameToInfo[info.filename] = info
        zf.close()

    def abort(self) -> None:
        """Give up on a failed write (the caller discards the file): nothing more is written."""
        self._entries.clear()

    def __enter__(self) -> DeterministicZipWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
