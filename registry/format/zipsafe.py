"""Reading zips we do not trust.

Every check is decided from the central directory and local headers, in bounded memory, before
any member is read: member count, names (no absolute paths, no ``..``, no backslashes, no
duplicates), no symlinks or directories posing as files, stored (uncompressed) members only,
and data ranges that lie inside the file and do not overlap. A stored member cannot inflate, so
a zip bomb is refused by the compression check alone. For example::

    entries = read_entries("model.pt2")
    entries["archive/models/model.json"].data_offset
"""
from __future__ import annotations

import os
import stat
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

from ..constants import MAX_MEMBER_BYTES, MAX_MEMBERS
from ..errors import NotFoundError, UnsafeArchiveError

__all__ = ["ZipEntry", "read_entries", "read_canonical_entries", "check_member_name", "open_entry",
           "read_entry_bytes", "canonical_data_spans", "END_RECORDS_MAX"]

_LOCAL_HEADER = struct.Struct("<4s5H3L2H")
_LOCAL_MAGIC = b"PK\x03\x04"


@dataclass(frozen=True)
class ZipEntry:
    """One stored member: where its bytes are in the file and how many there are."""

    name: str
    size: int
    crc: int
    header_offset: int
    data_offset: int


def check_member_name(name: str, *, where: str = "archive") -> str:
    """Refuse names that could escape an extraction directory or alias another member."""
    bad = (not name or name.startswith(("/", "\\")) or "\\" in name or "\x00" in name
           or (len(name) > 1 and name[1] == ":") or len(name) > 1024)
    if bad or any(p in ("..", ".", "") for p in name.split("/")):
        raise UnsafeArchiveError(f"{where}: unsafe member path {name!r}", member=name,
                                 hint="absolute, '..', empty or drive-letter paths are refused")
    return name


def _local_data_offset(fp: BinaryIO, info: zipfile.ZipInfo, file_size: int, where: str) -> int:
    fp.seek(info.header_offset)
    raw = fp.read(_LOCAL_HEADER.size)
    if len(raw) != _LOCAL_HEADER.size:
        raise UnsafeArchiveError(f"{where}: truncated local header for {info.filename!r}",
                                 member=info.filename)
    magic, _ver, _flags, method, _t, _d, _crc, _csize, _usize, nlen, xlen = _LOCAL_HEADER.unpack(raw)
    if magic != _LOCAL_MAGIC:
        raise UnsafeArchiveError(f"{where}: bad local header for {info.filename!r}",
                                 member=info.filename, hint="the file is truncated or malformed")
    if method != zipfile.ZIP_STORED:
        raise UnsafeArchiveError(f"{where}: member {info.filename!r} is compressed in its local header",
                                 member=info.filename)
    name = fp.read(nlen)
    if name.decode("utf-8", "replace") != info.filename and name.decode("cp437", "replace") != info.filename:
        raise UnsafeArchiveError(f"{where}: local and central names of {info.filename!r} disagree",
                                 member=info.filename)
    return info.header_offset + _LOCAL_HEADER.size + nlen + xlen


def read_entries(path: str | os.PathLike, *, where: str | None = None,
                 max_members: int = MAX_MEMBERS) -> dict[str, ZipEntry]:
    """Validate the zip structure of ``path`` and return its members by name (in file order)."""
    where = where or str(path)
    try:
        file_size = os.path.getsize(path)
    except FileNotFoundError as exc:
        raise NotFoundError(f"{where}: no such file", what="file", name=str(path)) from exc
    except OSError as exc:
        raise UnsafeArchiveError(f"{where}: cannot read: {exc.strerror}") from exc
    if Path(path).is_dir():
        raise UnsafeArchiveError(f"{where}: is a directory, not a bundle file")
    try:
        with open(path, "rb") as fp:
            try:
                zf = zipfile.ZipFile(fp)
            except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, OSError,
                    NotImplementedError, struct.error, UnicodeDecodeError, KeyError, IndexError) as exc:
                raise UnsafeArchiveError(f"{where}: not a valid zip archive ({exc})",
                                         hint="the file is truncated, corrupt or not a bundle") from exc
            infos = zf.infolist()
            if len(infos) > max_members:
                raise UnsafeArchiveError(f"{where}: {len(infos)} members exceeds the limit of {max_members}")
            entries: dict[str, ZipEntry] = {}
            spans: list[tuple[int, int, str]] = []
            for info in infos:
                name = info.filename
                check_member_name(name, where=where)
                if name in entries:
                    raise UnsafeArchiveError(f"{where}: duplicate member {name!r}", member=name)
                mode = info.external_attr >> 16
                if stat.S_ISLNK(mode):
                    raise UnsafeArchiveError(f"{where}: member {name!r} is a symlink", member=name)
                if info.is_dir() or name.endswith("/"):
                    raise UnsafeArchiveError(f"{where}: member {name!r} is a directory entry", member=name)
                if info.compress_type != zipfile.ZIP_STORED:
                    raise UnsafeArchiveError(
                        f"{where}: member {name!r} is compressed (method {info.compress_type})",
                        member=name, hint="bundles and .pt2 files store members uncompressed")
                if info.flag_bits & 0x1:
                    raise UnsafeArchiveError(f"{where}: member {name!r} is encrypted", member=name)
                if info.file_size != info.compress_size or info.file_size > MAX_MEMBER_BYTES:
                    raise UnsafeArchiveError(f"{where}: member {name!r} has an impossible size", member=name)
                data_offset = _local_data_offset(fp, info, file_size, where)
                end = data_offset + info.file_size
                if end > file_size:
                    raise UnsafeArchiveError(
                        f"{where}: member {name!r} extends past the end of the file",
                        member=name, hint="the file is truncated")
                entries[name] = ZipEntry(name, info.file_size, info.CRC, info.header_offset, data_offset)
                spans.append((info.header_offset, end, name))
            spans.sort()
            for (_s1, e1, n1), (s2, _e2, n2) in zip(spans, spans[1:]):
                if s2 < e1:
                    raise UnsafeArchiveError(f"{where}: members {n1!r} and {n2!r} overlap", member=n2)
            return entries
    except OSError as exc:
        raise UnsafeArchiveError(f"{where}: cannot read: {exc}") from exc


class _RangeReader:
    """A read-only window [offset, offset+size) over an open file."""

    def __init__(self, fp: BinaryIO, offset: int, size: int) -> None:
        self._fp, self._start, self._size, self._pos = fp, offset, size, 0

    def read(self, n: int = -1) -> bytes:
        left = self._size - self._pos
        if n is None or n < 0 or n > left:
            n = left
        if n <= 0:
            return b""
        self._fp.seek(self._start + self._pos)
        data = self._fp.read(n)
        self._pos += len(data)
        return data

    def close(self) -> None:
        self._fp.close()

    def __enter__(self) -> _RangeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_entry(path: str | os.PathLike, entry: ZipEntry) -> IO[bytes]:
    """A stream of one member's stored bytes (unverified; hash it as you read)."""
    return _RangeReader(open(path, "rb"), entry.data_offset, entry.size)  # type: ignore[return-value]


def read_entry_bytes(path: str | os.PathLike, entry: ZipEntry, *, max_size: int, where: str) -> bytes:
    if entry.size > max_size:
        raise UnsafeArchiveError(f"{where}: member {entry.name!r} is {entry.size} bytes, over the "
                                 f"limit of {max_size}", member=entry.name)
    with open_entry(path, entry) as fp:
        data = fp.read(entry.size)
    if len(data) != entry.size:
        raise UnsafeArchiveError(f"{where}: member {entry.name!r} is truncated", member=entry.name)
    return data


# ---------------------------------------------------------------------------------------------
# Canonical zips: the only layout torch is ever handed.
#
# Python's zipfile and torch's reader (miniz) find members differently: zipfile locates the end
# record by scanning back over a comment and shifts every offset by any data prepended to the
# archive; miniz does neither, and it looks names up without regard to case. A program member
# is therefore accepted only in the exact layout DeterministicZipWriter produces: the first
# local header at offset 0, each member's header exactly the bytes the writer would write for
# its name, size and CRC, members back to back with no gap, the central directory right after
# the last member, the end record (zip64 when needed) closing the file with no comment. In that
# layout there is one way to read the archive, so both readers see the same members.

_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")
_CENTRAL_MAGIC = b"PK\x01\x02"
_EOCD = struct.Struct("<4s4H2LH")
_EOCD_MAGIC = b"PK\x05\x06"
_EOCD64 = struct.Struct("<4sQ2H2L4Q")
_EOCD64_MAGIC = b"PK\x06\x06"
_LOCATOR = struct.Struct("<4sLQL")
_LOCATOR_MAGIC = b"PK\x06\x07"


def _not_canonical(where: str, what: str, member: str | None = None) -> UnsafeArchiveError:
    return UnsafeArchiveError(f"{where}: not a canonical program archive: {what}", member=member,
                              hint="program members are written by `pt2reg bundle`; rebuild the bundle "
                                   "with it (an edited or foreign zip is never handed to torch)")


def _read_exact(fp: BinaryIO, pos: int, n: int) -> bytes:
    fp.seek(pos)
    return fp.read(n)


def _end_record(fp: BinaryIO, start: int, end: int, where: str) -> tuple[int, int, int, int]:
    """(entry count, central directory offset, its size, where the end records begin), all
    relative to ``start``; the end records must close the span exactly."""
    raw = _read_exact(fp, end - _EOCD.size, _EOCD.size) if end - start >= _EOCD.size else b""
    if len(raw) != _EOCD.size or raw[:4] != _EOCD_MAGIC:
        raise _not_canonical(where, "the end-of-archive record is not at the end of the file "
                                    "(trailing data, an archive comment, or not a zip)")
    _m, disk, cd_disk, n_disk, n_total, cd_size, cd_offset, comment = _EOCD.unpack(raw)
    if comment or disk or cd_disk or n_disk != n_total:
        raise _not_canonical(where, "the end-of-archive record has a comment or spans disks")
    tail = end - _EOCD.size
    # zipfile writes the zip64 records from 2 GiB on (its ZIP64_LIMIT), with the real values in
    # the plain end record while they fit: the locator's presence, not a sentinel, says so
    loc = _read_exact(fp, tail - _LOCATOR.size, _LOCATOR.size) if tail - start >= _LOCATOR.size else b""
    zip64 = len(loc) == _LOCATOR.size and loc[:4] == _LOCATOR_MAGIC
    if 0xFFFF in (n_total,) or 0xFFFFFFFF in (cd_size, cd_offset) or zip64:
        if not zip64:
            raise _not_canonical(where, "zip64 end locator missing")
        _m, ldisk, rec_offset, disks = _LOCATOR.unpack(loc)
        tail -= _LOCATOR.size
        if ldisk or disks != 1 or rec_offset != tail - _EOCD64.size - start:
            raise _not_canonical(where, "zip64 end record is not right before its locator")
        rec = _read_exact(fp, tail - _EOCD64.size, _EOCD64.size)
        if len(rec) != _EOCD64.size or rec[:4] != _EOCD64_MAGIC:
            raise _not_canonical(where, "zip64 end record missing")
        plain = (n_total, cd_size, cd_offset)
        _m, rec_size, _made, _need, d1, d2, n_disk, n_total, cd_size, cd_offset = _EOCD64.unpack(rec)
        if rec_size != _EOCD64.size - 12 or d1 or d2 or n_disk != n_total:
            raise _not_canonical(where, "zip64 end record is malformed")
        if plain != (min(n_total, 0xFFFF), min(cd_size, 0xFFFFFFFF), min(cd_offset, 0xFFFFFFFF)):
            raise _not_canonical(where, "the zip64 and plain end records disagree")
        tail -= _EOCD64.size
    if cd_offset + cd_size != tail - start:
        raise _not_canonical(where, "data between the central directory and the end record, or "
                                    "data prepended to the archive")
    return n_total, cd_offset, cd_size, tail


def _central_entries(fp: BinaryIO, start: int, cd_offset: int, cd_size: int, count: int,
                     where: str) -> list[tuple[str, int, int, int, int]]:
    """(name, crc, size, header offset, flags) of each central-directory entry, in order."""
    raw = _read_exact(fp, start + cd_offset, cd_size)
    if len(raw) != cd_size:
        raise _not_canonical(where, "truncated central directory")
    out, pos = [], 0
    for _ in range(count):
        if pos + _CENTRAL.size > len(raw) or raw[pos:pos + 4] != _CENTRAL_MAGIC:
            raise _not_canonical(where, "malformed central directory")
        (_m, _made, system, _need, _nsys, flags, method, _t, _d, crc, csize, usize, nlen, xlen,
         clen, disk, iattr, eattr, offset) = _CENTRAL.unpack_from(raw, pos)
        name_raw = raw[pos + _CENTRAL.size:pos + _CENTRAL.size + nlen]
        extra = raw[pos + _CENTRAL.size + nlen:pos + _CENTRAL.size + nlen + xlen]
        try:
            name = name_raw.decode("ascii")
        except UnicodeDecodeError:
            raise _not_canonical(where, f"member name {name_raw[:60]!r} is not ASCII") from None
        if clen or disk or iattr or eattr != 0o644 << 16 or system != 3 or method or flags:
            raise _not_canonical(where, f"member {name!r} has non-canonical attributes", name)
        if 0xFFFFFFFF in (csize, usize, offset):
            usize, csize, offset = _zip64_sizes(extra, usize, csize, offset, name, where)
        if csize != usize:
            raise _not_canonical(where, f"member {name!r} is compressed", name)
        out.append((name, crc, usize, offset, flags))
        pos += _CENTRAL.size + nlen + xlen
    if pos != len(raw):
        raise _not_canonical(where, "data inside the central directory")
    return out


def _zip64_sizes(extra: bytes, usize: int, csize: int, offset: int, name: str, where: str
                 ) -> tuple[int, int, int]:
    pos = 0
    while pos + 4 <= len(extra):
        tag, n = struct.unpack_from("<HH", extra, pos)
        body = extra[pos + 4:pos + 4 + n]
        if tag == 1:
            values = list(struct.unpack_from(f"<{len(body) // 8}Q", body))
            if len(values) < [usize, csize, offset].count(0xFFFFFFFF):
                break
            if usize == 0xFFFFFFFF:
                usize = values.pop(0)
            if csize == 0xFFFFFFFF:
                csize = values.pop(0)
            if offset == 0xFFFFFFFF:
                offset = values.pop(0)
            return usize, csize, offset
        pos += 4 + n
    raise _not_canonical(where, f"member {name!r} lacks its zip64 sizes", name)


#: the end records of an archive are within this many bytes of its end (zip64 included)
END_RECORDS_MAX = _EOCD.size + _LOCATOR.size + _EOCD64.size


def canonical_data_spans(fp: BinaryIO, size: int, *, where: str,
                         ensure: Callable[[int, int], None] = lambda lo, hi: None
                         ) -> list[tuple[str, int, int]]:
    """(name, data offset, size) of every member of the canonical archive ``fp`` holds in
    ``[0, size)``, from its end records and central directory alone.

    The local headers are not read: in the canonical layout each is exactly ``local_header``'s
    bytes for the member, so its data starts right after them (``read_canonical_entries``, which
    every program goes through before torch reads it, refuses a file where that is not so).
    ``ensure(lo, hi)`` is called before bytes ``[lo, hi)`` are read, for a file still being
    filled in (the cold load fetches those chunks first). ``UnsafeArchiveError`` when the end
    records or the central directory are malformed.
    """
    from .zipwrite import local_header

    ensure(max(0, size - END_RECORDS_MAX), size)
    count, cd_offset, cd_size, _tail = _end_record(fp, 0, size, where)
    if count > MAX_MEMBERS:
        raise UnsafeArchiveError(f"{where}: {count} members exceeds the limit of {MAX_MEMBERS}")
    ensure(cd_offset, size)
    return [(name, header_offset + len(local_header(name, usize, crc, header_offset)), usize)
            for name, crc, usize, header_offset, _flags in _central_entries(fp, 0, cd_offset, cd_size, count, where)]


def read_canonical_entries(path: str | os.PathLike, *, where: str | None = None, offset: int = 0,
                           size: int | None = None, max_members: int = MAX_MEMBERS
                           ) -> dict[str, ZipEntry]:
    """The members of a zip in the writer's canonical layout, else ``UnsafeArchiveError``.

    The zip may be a span ``[offset, offset+size)`` of a larger file (a program member read in
    place inside its bundle); returned offsets are absolute in ``path``.
    """
    from .zipwrite import local_header

    where = where or str(path)
    try:
        with open(path, "rb") as fp:
            end = offset + (size if size is not None else os.fstat(fp.fileno()).st_size - offset)
            count, cd_offset, cd_size, _tail = _end_record(fp, offset, end, where)
            if count > max_members:
                raise UnsafeArchiveError(f"{where}: {count} members exceeds the limit of {max_members}")
            entries: dict[str, ZipEntry] = {}
            folded: set[str] = set()
            pos = 0
            for name, crc, usize, header_offset, _flags in _central_entries(fp, offset, cd_offset, cd_size,
                                                                            count, where):
                check_member_name(name, where=where)
                if name in entries or name.casefold() in folded:
                    raise UnsafeArchiveError(f"{where}: duplicate member {name!r} (names are compared "
                                             f"without case, as torch's reader does)", member=name)
                if usize > MAX_MEMBER_BYTES:
                    raise UnsafeArchiveError(f"{where}: member {name!r} has an impossible size", member=name)
                if header_offset != pos:
                    what = "data before the first member" if pos == 0 else f"a gap or overlap before {name!r}"
                    raise _not_canonical(where, what, name)
                want = local_header(name, usize, crc, header_offset)
                if _read_exact(fp, offset + pos, len(want)) != want:
                    raise _not_canonical(where, f"the local header of {name!r} is not the canonical one "
                                                f"(name, flags, sizes or padding differ)", name)
                data = pos + len(want)
                entries[name] = ZipEntry(name, usize, crc, offset + header_offset, offset + data)
                folded.add(name.casefold())
                pos = data + usize
            if pos != cd_offset:
                raise _not_canonical(where, "data between the last member and the central directory")
            return entries
    except FileNotFoundError as exc:
        raise NotFoundError(f"{where}: no such file", what="file", name=str(path)) from exc
    except OSError as exc:
        raise UnsafeArchiveError(f"{where}: cannot read: {exc}") from exc
