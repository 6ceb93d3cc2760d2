"""The blob store interface: content-addressed, write-once, verified on the way in and out.

A blob is named by the sha256 of its bytes (``sha256:<64 hex>``) and lives at
``blobs/sha256/<first 2 hex>/<64 hex>`` under the store's root (a directory or an S3 prefix;
the client cache uses the same layout), spelled out only by :func:`blob_relpath`::

    >>> blob_relpath("sha256:" + "ab" * 32)
    'blobs/sha256/ab/abababababababababababababababababababababababababababababababab'

This module knows no implementation (``open_blob_store`` in the package face picks one). It
holds what every backend shares: the blob layout (:func:`blob_relpath`), range and batch
helpers, ``PwriteWriter`` and the verified download targets ``verified_into`` and
``atomic_download`` (built on ``registry.digests``' ``HashingWriter``).
"""
from __future__ import annotations

import contextlib
import hashlib
import itertools
import operator
import os
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    BinaryIO,
    NamedTuple,
    Protocol,
    cast,
    runtime_checkable,
)

from ..atomic import atomic_write
from ..digests import HashingWriter
from ..errors import IntegrityError, NotFoundError, UsageError
from ..parallel import (
    BATCH_BYTES,
    Output,
    Segment,
    group_consecutive,
    hash_copy,
    locked_progress,
    pwrite_all,
    run_parallel,
    thread_buffer,
)
from ..refs import validate_digest

if TYPE_CHECKING:
    from .inplace import InPlaceFile

__all__ = [
    "BlobInfo", "Part", "ProgressFn", "BlobStore", "PackWriter", "as_pack_writer", "unique_parts", "locked_progress", "run_parallel",
    "BLOBS_DIR", "blob_relpath", "digest_from_relpath", "checked_range", "open_range", "check_range", "range_error",
    "corrupt_blob_error", "check_read_range", "short_blob_error", "PwriteWriter", "verified_into",
    "atomic_download", "hash_parts", "part_blocks", "stretches", "RangeSink",
]

#: Called with the number of bytes just transferred (S3 may report a negative amount when a
#: part is retried, so the running total stays exact).
ProgressFn = Callable[[int], None]


@dataclass(frozen=True)
class BlobInfo:
    """What a store knows about one blob: ``digest`` is ``sha256:<hex>``, ``mtime`` is epoch seconds."""

    digest: str
    size: int
    mtime: float


class Part(NamedTuple):
    """One blob of a batch transfer: ``size`` bytes at ``offset`` of a local file (the source
    of a ``put_parts``, the destination of a ``get_parts``). A named tuple: a push makes one per
    chunk, ten thousand for some programs."""

    digest: str
    offset: int
    size: int


class RangeSink(Protocol):
    """Where ``read_range_into`` writes: ``write`` is given each piece in order and must not
    keep it (the buffer is reused)."""

    def write(self, data: memoryview | bytes, /) -> object: ...


@runtime_checkable
class BlobStore(Protocol):
    """A content-addressed, write-once blob store (local directory or S3).

    Every put is idempotent (False when the blob was already there) and atomic (no reader ever
    sees a partial blob); every verified read raises ``IntegrityError`` on a digest mismatch.

    What a store can do beyond that is declared by its class, never probed:

    - ``read_workers``: ranged reads of packs to run at once (``blobs.packed``);
    - ``maps_in_place``: its blobs are files on this machine that ``in_place`` may hand out to
      be mapped where they lie (a local directory), so a pinned, cached manifest needs no
      database round trip;
    - ``writes_packs``: it is a ``PackWriter`` (names new packs in the pass that writes them);
    - ``presigns``: it hands out presigned URLs (S3), so a server never streams the bytes.
    """

    url: str
    read_workers: int
    maps_in_place: bool
    writes_packs: bool
    presigns: bool

    def in_place(self, digest: str, size: int | None = None) -> InPlaceFile | None:
        """The blob's file, if it may be mapped where it lies (``maps_in_place``), else None."""

    def put_file(self, path: str | os.PathLike, digest: str, *, offset: int = 0,
                 length: int | None = None, progress: ProgressFn | None = None) -> bool:
        """Store bytes ``[offset, offset+length)`` of a local file under ``digest``."""

    def put_stream(self, fp: BinaryIO, digest: str, *, size: int | None = None,
                   progress: ProgressFn | None = None) -> bool:
        """Store a stream (``size`` bytes of it when given) under ``digest``."""

    def put_bytes(self, data: bytes, digest: str) -> bool:
        """Store ``data`` under ``digest``."""

    def put_parts(self, path: str | os.PathLike, parts: Sequence[Part], *,
                  progress: ProgressFn | None = None, unrecorded: Collection[str] = ()) -> tuple[int, int]:
        """Store many ranges of one local file, several at once, each verified and atomic;
        returns (bytes uploaded, bytes already stored). The first failure cancels the rest.
        ``unrecorded``: digests no version records, stored without first asking whether the
        store holds them (a leftover copy is simply replaced by the same bytes)."""

    def get_parts(self, fd: int, parts: Sequence[Part], *, progress: ProgressFn | None = None,
                  on_done: Callable[[int], None] | None = None) -> None:
        """Fetch many blobs, several at once, each written at its ``offset`` of the open file
        ``fd`` and verified; ``on_done(i)`` once ``parts[i]`` is complete and verified.
        ``IntegrityError`` when one does not match (discard the file)."""

    def part_fetches(self, fd: int, parts: Sequence[Part], *, progress: ProgressFn | None = None,
                     on_done: Callable[[int], None] | None = None) -> list[Callable[[], None]]:
        """What ``get_parts`` runs several at once: one call per part that fetches it into its
        range of ``fd``, verified, then ``on_done(i)``; for a caller that runs them on threads
        of its own, among other work (a pull's pack reads: ``client.fetch.assemble_member``).
        Whatever the parts need first (a remote store asks its server where they are) is done
        here, once. The caller stops them through ``progress`` (raising there, as a
        ``parallel.TaskPool``'s does once it failed): unlike ``get_parts``, which also cuts
        the transfers under way, a call goes on to its next progress report (one read of a
        few hundred KiB), or to the end of a retry's wait."""

    def exists(self, digest: str) -> bool:
        """True when the blob is stored."""

    def stat(self, digest: str) -> BlobInfo:
        """Size and mtime of a stored blob; ``NotFoundError`` if missing."""

    def get_file(self, digest: str, dest: str | os.PathLike, *,
                 progress: ProgressFn | None = None) -> None:
        """Download to ``dest`` atomically, verifying the digest on the way."""

    def open(self, digest: str) -> BinaryIO:
        """A raw, unverified read stream (the caller verifies)."""

    def local_file(self, digest: str, size: int | None = None) -> os.PathLike[str] | None:
        """The local file holding the blob, for a reader that verifies what it copies (a pull
        writes a bundle from a local store's files in one pass, each chunk hashed); None for a
        store whose blobs are not local files. ``NotFoundError`` when a local one is missing or
        has another size than ``size``."""

    def read_range(self, digest: str, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes starting at byte ``offset`` of the blob: one stretch of a
        pack blob (many small chunks back to back). Raw and unverified, like :meth:`open`: the
        caller checks each chunk's sha256 itself. Never reads the whole blob; transient network
        errors are retried as the store's other reads are.

        ``NotFoundError`` when the blob is not stored; ``IntegrityError`` when it is shorter
        than ``offset + length`` (the stored pack is truncated, or not what was recorded);
        ``UsageError`` for a negative ``offset`` or a ``length`` below 1."""

    def read_range_into(self, digest: str, offset: int, length: int, out: RangeSink) -> None:
        """``read_range``'s bytes written to ``out`` in order, in pieces as they arrive (a few
        MiB at most; one request, and a body cut off mid-way goes on from the next byte, so
        ``out`` sees each byte once), never the whole range in memory at once. The same
        errors; what ``out.write`` raises stops the read and propagates as it is."""

    def read_bytes(self, digest: str, *, max_size: int) -> bytes:
        """The verified content; ``IntegrityError`` when larger than ``max_size``."""

    def delete(self, digest: str) -> None:
        """Remove a blob; a missing blob is fine."""

    def list(self) -> Iterator[BlobInfo]:
        """Every stored blob (temporary files excluded)."""

    def abort_stale_uploads(self, older_than_seconds: float = 0.0, *,
                            keep: Iterable[str] | Callable[[], Iterable[str]] = (),
                            dry_run: bool = False) -> list[str]:
        """Discard uploads a killed writer left behind (local tmp files, S3 multipart uploads),
        except those of blobs in ``keep``; returns the digests they were for."""


@runtime_checkable
class PackWriter(BlobStore, Protocol):
    """A store that declares ``writes_packs``: it writes through files no one sees until they
    are renamed into place, so it stores new packs (ranges of a file, one after the other)
    under their sha256, named in the same pass that copies and checks them, and copies blobs
    before the caller has claimed them."""

    def put_packs(self, path: str | os.PathLike, parts: Sequence[Part], packs: Sequence[Sequence[Part]], *,
                  tag: str, claim: Callable[[list[tuple[str, int]]], None], progress: ProgressFn | None = None,
                  unrecorded: Collection[str] = ()) -> tuple[int, int, list[tuple[str, int]]]:
        """``put_parts`` of ``parts`` and each of ``packs`` stored as one new blob, claimed
        (``claim``) under its name before it becomes visible; ``(written, stored, packs)``."""

    def put_parts_held(self, path: str | os.PathLike, parts: Sequence[Part], *, claimed: Callable[[], object],
                       progress: ProgressFn | None = None) -> tuple[int, int]:
        """``put_parts`` begun before the caller's claim: nothing becomes visible before
        ``claimed()`` returns (it raises when the caller claimed nothing: nothing is kept)."""


def as_pack_writer(blobs: BlobStore) -> PackWriter:
    """``blobs`` as the ``PackWriter`` its class declares it is (``writes_packs``); a store that
    does not declare it is a caller's error (it should have planned packs hashed first)."""
    if not blobs.writes_packs:
        raise UsageError(f"{type(blobs).__name__} does not write packs", hint="plan the upload with hashed packs")
    return cast(PackWriter, blobs)


#: Where blobs live under a store's root (a directory, an S3 prefix, the client cache).
BLOBS_DIR = "blobs/sha256"


def blob_relpath(digest: str, *, under: str = BLOBS_DIR) -> str:
    """``blobs/sha256/ab/abcdef...`` for ``sha256:abcdef...`` (``under`` replaces the
    ``blobs/sha256`` part, for files kept beside blobs); ``UsageError`` on a malformed digest."""
    hex_ = validate_digest(digest).split(":", 1)[1]
    return f"{under}/{hex_[:2]}/{hex_}"


def digest_from_relpath(fan: str, name: str) -> str | None:
    """The digest a ``<fan>/<name>`` entry under ``blobs/sha256/`` stands for, or None if it is not a blob."""
    digest = "sha256:" + name
    try:
        validate_digest(digest)
    except UsageError:
        return None
    return digest if fan == name[:2] else None


def checked_range(file_size: int, offset: int, length: int | None, path: str | os.PathLike) -> int:
    """The number of bytes to read, or ``UsageError`` when the range is outside the file."""
    if offset < 0 or (length is not None and length < 0):
        raise UsageError(f"negative offset or length for {os.fspath(path)}: {offset}, {length}")
    if length is None:
        length = max(file_size - offset, 0)
    if offset + length > file_size:
        raise UsageError(f"{os.fspath(path)} has {file_size} bytes; cannot read {length} bytes "
                         f"at offset {offset}")
    return length


def corrupt_blob_error(digest: str, got_hex: str, where: str) -> IntegrityError:
    """The error for stored bytes that no longer hash to their name."""
    return IntegrityError(f"blob {digest} is corrupt in the store: expected {digest}, got sha256:{got_hex}",
                          hint=f"delete it from {where} and push the bundle again")


def check_read_range(digest: str, offset: int, length: int) -> None:
    """``UsageError`` unless ``digest`` is well formed, ``offset >= 0`` and ``length >= 1``
    (the arguments of ``BlobStore.read_range``)."""
    validate_digest(digest)
    for name, value, least in (("offset", offset, 0), ("length", length, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise UsageError(f"invalid {name} {value!r} for a range of blob {digest}",
                             hint=f"an integer >= {least}")


def short_blob_error(digest: str, offset: int, length: int, where: str, size: int | None = None) -> IntegrityError:
    """The error for a ranged read past the end of a stored blob (``size`` bytes, when known):
    the stored pack is truncated, or not the blob that was recorded."""
    has = f"it has {size} bytes" if size is not None else "it ends before that"
    return IntegrityError(f"blob {digest} is too short in the store: asked for bytes {offset}-{offset + length - 1}, "
                          f"{has}", hint=f"delete it from {where} and push the bundle again")


class PwriteWriter:
    """Writes sequentially into ``fd`` from ``offset`` with ``os.pwrite``, never past
    ``offset + size`` (so several writers can share one file descriptor, one range each).

    Unseekable, like ``HashingWriter``: a concurrent downloader must deliver in order.
    """

    def __init__(self, fd: int, offset: int, size: int, digest: str) -> None:
        self._fd, self._pos, self._end, self._digest = fd, offset, offset + size, digest

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def write(self, data: bytes) -> int:
        if self._pos + len(data) > self._end:
            raise IntegrityError(f"blob {self._digest} is larger than the {self._end - self._pos} "
                                 f"bytes left for it", hint="the store holds the wrong content for it")
        pwrite_all(self._fd, data, self._pos)
        self._pos += len(data)
        return len(data)

    def flush(self) -> None:
        pass


def unique_parts(parts: Sequence[Part]) -> tuple[list[Part], int]:
    """The parts with each digest once (first occurrence), and the bytes of the repeats."""
    seen: set[str] = set()
    out, repeated = [], 0
    for part in parts:
        if part.digest in seen:
            repeated += part.size
        else:
            seen.add(part.digest)
            out.append(part)
    return out, repeated


@contextlib.contextmanager
def open_range(path: str | os.PathLike, offset: int, length: int | None) -> Iterator[tuple[BinaryIO, int]]:
    """The file opened at ``offset`` and the checked length of ``[offset, offset+length)``."""
    try:
        src = open(path, "rb")
    except FileNotFoundError as exc:
        raise NotFoundError(f"file {os.fspath(path)} not found", what="file", name=os.fspath(path)) from exc
    with src:
        length = checked_range(os.fstat(src.fileno()).st_size, offset, length, path)
        src.seek(offset)
        yield src, length


def range_error(path: str | os.PathLike, part: Part, got_hex: str) -> IntegrityError:
    """The error for a range of a local file that does not hash to the blob it should be."""
    return IntegrityError(f"{os.fspath(path)}: the chunk at offset {part.offset} does not match its digest "
                          f"{part.digest} (got sha256:{got_hex[:12]}...)",
                          hint="the file is damaged or was altered after it was built")


def check_range(path: str | os.PathLike, part: Part, *, fd: int | None = None,
                progress: ProgressFn | None = None) -> None:
    """Hash a range of a local file that is already stored under ``part.digest``: a push of a
    damaged file must fail even when the store needs none of its bytes. ``IntegrityError``.
    ``fd``: the file, already open (and its size checked)."""
    if fd is None:
        with open_range(path, part.offset, part.size) as (src, _n):
            return check_range(path, part, fd=src.fileno(), progress=progress)
    got = hash_copy([Segment(fd, part.offset, part.size)], progress=progress)
    if got.sha256 != part.digest[7:]:
        raise range_error(path, part, got.sha256)


def hash_parts(path: str | os.PathLike, fd: int, parts: Sequence[Part], *, concatenation: bool = True,
               out_fd: int | None = None, progress: ProgressFn | None = None) -> str | None:
    """Check each of ``parts`` (ranges of ``path``, open as ``fd``) against its own digest,
    reading neighbours a few MiB at a time; ``IntegrityError`` (``range_error``) for the first
    that does not match. With ``concatenation``, returns the sha256 hex of the parts' bytes one
    after the other (a pack's name; None without). With ``out_fd``, that concatenation is also
    written there from offset 0, in the same pass: every byte written is a byte just checked
    and hashed, whatever the file holds by then; the disk is asked to start writing as it goes
    (``start_writeback``: the caller syncs)."""
    h = hashlib.sha256() if concatenation else None
    out = Output(out_fd, writeback=True) if out_fd is not None else None
    scratch = thread_buffer()   # read into, not a new block of memory per read
    for block in part_blocks(parts):
        start = block[0].offset
        want = block[-1].offset + block[-1].size - start
        buf = scratch if want <= len(scratch) else memoryview(bytearray(want))
        data = buf[:os.preadv(fd, [buf[:want]], start)]
        if len(data) != want:
            cut = next(p for p in block if p.offset + p.size > start + len(data))
            raise IntegrityError(f"{os.fspath(path)} ended {want - len(data)} bytes early (at byte "
                                 f"{start + len(data)}), inside the chunk at offset {cut.offset} ({cut.digest})",
                                 hint="the file is damaged or was altered after it was built")
        for part in block:
            got = hashlib.sha256(data[part.offset - start:part.offset - start + part.size]).hexdigest()
            if got != part.digest[7:]:
                raise range_error(path, part, got)
        if h is not None:
            h.update(data)
        if out is not None:
            out.write(data)
        if progress is not None:
            progress(want)
    if out is not None:
        out.close()
    return h.hexdigest() if h is not None else None


def part_blocks(parts: Sequence[Part]) -> list[Sequence[Part]]:
    """``parts`` cut where they stop lying back to back, and every ``BATCH_BYTES``: each block
    is one read."""
    return [s[g.start:g.stop] for s in stretches(parts) for g in group_consecutive(list(map(_SIZE, s)), BATCH_BYTES)]


_OFFSET, _SIZE = operator.itemgetter(1), operator.itemgetter(2)   # a Part's offset, size


def stretches(parts: Sequence[Part]) -> list[Sequence[Part]]:
    """``parts`` (in order) cut wherever one does not start where the one before it ends: the
    stretches that lie back to back in their file (found by whole-list operations: a push of
    a 10,000-tensor program cuts 10,000 chunks).

    >>> [len(s) for s in stretches([Part("a", 0, 2), Part("b", 2, 3), Part("c", 9, 1)])]
    [2, 1]
    """
    if not parts:
        return []
    offsets = list(map(_OFFSET, parts))
    ends = map(operator.add, offsets, map(_SIZE, parts))
    cuts = [0, *itertools.compress(range(1, len(parts)), map(operator.ne, ends, offsets[1:])), len(parts)]
    return [parts[a:b] for a, b in zip(cuts, cuts[1:])]


@contextlib.contextmanager
def verified_into(out: BinaryIO, digest: str, where: str) -> Iterator[HashingWriter]:
    """A writer into ``out`` that checks, on leaving, that what went through hashes to ``digest``."""
    writer = HashingWriter(out)
    yield writer
    if "sha256:" + writer.hexdigest() != digest:
        raise corrupt_blob_error(digest, writer.hexdigest(), where)


@contextlib.contextmanager
def atomic_download(dest: str | os.PathLike, digest: str, where: str) -> Iterator[HashingWriter]:
    """Yield a writer into a new temp file beside ``dest`` (``.<name>.<random>.incomplete``,
    created exclusively, so concurrent downloads of one blob never share it and a planted
    symlink is never followed); on leaving, verify the digest, fsync and move it to ``dest``.
    On any failure the partial file is removed and ``dest`` is untouched.
    """
    with atomic_write(dest) as fp, verified_into(fp, digest, where) as writer:
        yield writer
