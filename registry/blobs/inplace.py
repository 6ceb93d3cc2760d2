"""Stored bytes used where they lie: a local store's blob files read and mapped in place.

A cold ``registry.load`` from a local store on this machine need not copy a program's weights
into the client cache: each weight chunk is hashed in the store file that holds it, and torch
maps it from there (``runtime.torchrt``). That is as safe as the copy only if the bytes cannot
change between the hash and their use, so a file is used in place only when

* it is a regular file owned by this process's user,
* nobody else may write it: no group or other write bit (an ACL that grants a write shows in
  the group bits too), and
* it is on a local filesystem (``LOCAL_FILESYSTEMS``): a blob deleted by another machine of a
  network filesystem would leave its map stale, and the next page read would kill the process;

and every later open of it (to hash it, to map it) must find the very file first seen: same
device, inode, size, mtime and ctime (any write or ``chmod`` moves ctime, which no user call
can set back). Only this user (or root) could then have changed it, and this user trusts their
own files as they trust their cache. Anything else (another user's shared store, a file
replaced meanwhile) is copied and verified on the way, as before. For example::

    found = in_place_file("/srv/store/blobs/sha256/ab/ab12...", size=4096)
    fd = open_in_place(found.path, found.identity)   # OSError if it is not that file now
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import mmap
import os
import platform
import re
import stat
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

__all__ = ["MAPPABLE", "ALIGN", "FileIdentity", "map_together", "InPlaceFile", "InPlaceSegment", "NotInPlace", "in_place_file", "open_in_place",
           "hash_in_place", "usable_in_place"]

#: mapping a file by its open descriptor (never by a path that could be swapped meanwhile) needs
#: ``/proc/self/fd``: elsewhere nothing is used in place
MAPPABLE = os.path.isdir("/proc/self/fd")
#: filesystems whose files stay readable through a map for as long as it lives (the inode is kept
#: while mapped): anything else (NFS, SMB, FUSE, ...) is copied
LOCAL_FILESYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs", "f2fs",
                               "bcachefs", "jfs", "reiserfs", "ramfs"})
#: ``MAP_FIXED`` (``map_together``) where its value is 0x10: every Linux architecture but these
_FIXED_ELSEWHERE = ("alpha", "parisc", "hppa")
#: a segment used in place lies at the same offset modulo this in its file as in its member, so
#: every record aligned for its dtype in the member is aligned in the file too (complex128: 16)
ALIGN = 16


class FileIdentity(NamedTuple):
    """What tells one version of one file from any other: changed by any write or ``chmod``."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int


class InPlaceFile(NamedTuple):
    path: str
    identity: FileIdentity


class InPlaceSegment(NamedTuple):
    """``size`` bytes at ``offset`` of a member, held at ``file_offset`` of a store file."""

    offset: int
    size: int
    path: str
    file_offset: int
    identity: FileIdentity


class NotInPlace(OSError):
    """The file at a path is no longer the one first seen (replaced, written, re-permissioned)."""


def identity_of(st: os.stat_result) -> FileIdentity:
    return FileIdentity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def usable_in_place(st: os.stat_result) -> bool:
    """A regular file this user owns and nobody else may write."""
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def in_place_file(path: str | os.PathLike, *, size: int | None = None) -> InPlaceFile | None:
    """``path`` as it is now, if its bytes may be used in place (and it has ``size`` bytes
    when given); None otherwise (missing, a link, another user's, writable by others)."""
    if not MAPPABLE:
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not usable_in_place(st) or (size is not None and st.st_size != size) or \
            filesystem_type(st.st_dev, os.fspath(path)) not in LOCAL_FILESYSTEMS:
        return None
    return InPlaceFile(os.fspath(path), identity_of(st))


def filesystem_type(dev: int, path: str, mountinfo: str | None = None) -> str | None:
    """The type of the filesystem holding ``path`` (on device ``dev``), from
    ``/proc/self/mountinfo`` (or ``mountinfo``, its text): the mount of that device, else the
    longest mount point above the path's real location; None if neither is found."""
    by_dev, mounts = _parse_mounts(_mountinfo() if mountinfo is None else mountinfo)
    if dev not in by_dev and mountinfo is None:  # mounted since it was read: read it again
        _mountinfo.cache_clear()
        by_dev, mounts = _parse_mounts(_mountinfo())
    if dev in by_dev:
        return by_dev[dev]
    real = os.path.realpath(path)
    best = max((m for m in mounts if real == m[0] or real.startswith(m[0].rstrip("/") + "/")),
               key=lambda m: len(m[0]), default=None)
    return best[1] if best else None


@functools.lru_cache(maxsize=1)
def _mountinfo() -> str:
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except OSError:
        return ""


@functools.lru_cache(maxsize=4)
def _parse_mounts(text: str) -> tuple[dict[int, str], list[tuple[str, str]]]:
    """``({device: type}, [(mount point, type)])`` of mountinfo lines."""
    by_dev: dict[int, str] = {}
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, kind = left.split(), right.split()
        if not sep or len(fields) < 5 or not kind:
            continue
        major, _, minor = fields[2].partition(":")
        if major.isdigit() and minor.isdigit():
            by_dev.setdefault(os.makedev(int(major), int(minor)), kind[0])
        mounts.append((re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4]), kind[0]))
    return by_dev, mounts


def open_in_place(path: str, identity: FileIdentity) -> int:
    """A read-only descriptor of ``path``, which must still be the file ``identity`` names and
    still be usable in place; ``NotInPlace`` otherwise. The caller closes it."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise NotInPlace(f"{path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if identity_of(st) != identity or not usable_in_place(st):
            raise NotInPlace(f"{path} changed since it was first seen")
    except BaseException:
        os.close(fd)
        raise
    return fd


def hash_in_place(segment: InPlaceSegment) -> str:
    """The sha256 (hex) of ``segment``'s bytes, read through a map of its file: one call that
    runs without the GIL, so a busy Python thread (torch deserializing) does not slow it."""
    fd = open_in_place(segment.path, segment.identity)
    try:
        if not segment.size:
            return hashlib.sha256(b"").hexdigest()
        if segment.file_offset + segment.size > segment.identity.size:
            raise NotInPlace(f"{segment.path} is shorter than the bytes it should hold")
        start = segment.file_offset - segment.file_offset % mmap.ALLOCATIONGRANULARITY
        with mmap.mmap(fd, segment.file_offset + segment.size - start, access=mmap.ACCESS_READ,
                       offset=start) as m:
            with memoryview(m) as view:
                skip = segment.file_offset - start
                with view[skip:skip + segment.size] as data:
                    return hashlib.sha256(data).hexdigest()
    finally:
        os.close(fd)


_PROT_NONE, _MAP_FIXED = 0, 0x10  # Linux (MAPPABLE is Linux only): in a range this module reserved itself


def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def map_together(segments: Sequence[InPlaceSegment]) -> Any:
    """One private (copy-on-write) map of several files side by side: the pieces of one split
    tensor, each a whole blob file (``file_offset`` 0), every one but the last a whole number
    of pages long. Returns a writable buffer over it that unmaps it when it is freed (what
    ``torch.frombuffer`` keeps alive for as long as its tensors live). ``NotInPlace`` if a
    file changed since it was first seen, ``OSError`` if the maps cannot be made."""
    page = mmap.PAGESIZE
    if platform.machine().lower().startswith(_FIXED_ELSEWHERE):
        raise NotInPlace("MAP_FIXED has another value on this architecture")
    if any(s.file_offset % page or s.size % page for s in segments[:-1]) or segments[-1].file_offset % page:
        raise NotInPlace("pieces that do not end on page boundaries cannot be mapped side by side")
    total = sum(s.size for s in segments)
    length = -(-total // page) * page
    libc = _libc()
    base = libc.mmap(None, length, _PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if base in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), f"cannot reserve {length} bytes of address space")
    try:
        at = 0
        for s in segments:
            fd = open_in_place(s.path, s.identity)
            try:
                size = -(-s.size // page) * page
                got = libc.mmap(base + at, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | _MAP_FIXED,
                                fd, s.file_offset)
                if got != base + at:
                    raise OSError(ctypes.get_errno(), f"cannot map {s.path}")
            finally:
                os.close(fd)
            at += s.size
    except BaseException:
        libc.munmap(base, length)
        raise

    region = (ctypes.c_char * total).from_address(base)
    weakref.finalize(region, libc.munmap, base, length)  # when the last view of it is gone
    return region
