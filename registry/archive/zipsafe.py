"""Reading zips we do not trust.

Every check is decided from the central directory and local headers, in bounded memory, before
any member is read: member count, names (no absolute paths, no ``..``, no backslashes, no
duplicates), no symlinks or directories posing as files, stored (uncompressed) members only,
and data ranges that lie inside the file and do not overlap. A stored member cannot inflate, so
a zip bomb is refused by the compression check alone.

    >>> entries = read_entries("model.pt2")          # doctest: +SKIP
    >>> entries["archive/models/model.json"].data_offset
"""
from __future__ import annotations

import os
import stat
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, BinaryIO, Iterator

from ..constants import CHUNK_SIZE, MAX_MEMBER_BYTES, MAX_MEMBERS
from ..errors import NotFoundError, UnsafeArchiveError

__all__ = ["ZipEntry", "read_entries", "check_member_name", "open_entry", "read_entry_bytes"]

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
    parts = PurePosixPath(name).parts
    if bad or any(p in ("..", ".", "") for p in name.split("/")) or not parts:
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

    def __enter__(self) -> "_RangeReader":
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


def iter_entry_chunks(path: str | os.PathLike, entry: ZipEntry) -> Iterator[bytes]:
    with open_entry(path, entry) as fp:
        while True:
            data = fp.read(CHUNK_SIZE)
            if not data:
                return
            yield data
