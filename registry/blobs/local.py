"""The local-directory blob store (``file:///abs/dir`` or a plain path).

Layout under the root directory::

    blobs/sha256/ab/abcdef...   one read-only file per blob, named by its sha256
    tmp/                        uploads in progress (same filesystem, so the final rename is atomic)
    tmp/held-*/                 ... of a push that has not claimed them yet, locked while it lives

For example::

    store = LocalBlobStore("/srv/pt2reg")
    store.put_file("model.pt2", "sha256:" + "ab" * 32)   # IntegrityError unless it hashes so
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import io
import os
import secrets
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from ..atomic import sync_filesystem
from ..digests import VerifyingReader, pump, sha256_bytes, sha256_stream
from ..errors import IntegrityError, NotFoundError, StoreError, UsageError
from ..parallel import WORKERS, Segment, hash_copy, locked_progress, preallocate, run_calls, run_parallel, thread_buffer
from .base import (
    BLOBS_DIR,
    BlobInfo,
    Part,
    ProgressFn,
    RangeSink,
    atomic_download,
    blob_relpath,
    check_range,
    check_read_range,
    checked_range,
    corrupt_blob_error,
    digest_from_relpath,
    hash_parts,
    open_range,
    range_error,
    short_blob_error,
    unique_parts,
)
from .inplace import InPlaceFile, in_place_file

__all__ = ["LocalBlobStore", "COMMIT_BYTES"]

#: put_parts syncs the filesystem every this many bytes its writers wrote (on a thread of its
#: own, while the copies go on), then renames into place the temp files finished before that
#: sync began: a killed push keeps every batch it committed. Syncing as the bytes come,
#: finished files or not, keeps the disk flushing while the copies run, but each ``syncfs``
#: also commits the journal and stalls the writers behind the pages it writes back. How often
#: pays depends on the disk: where a sync cost ~1 ms per MiB written since the last (a slower
#: virtio disk), a 207 MiB push of 10,000 tensors took 0.44-0.47 s with a sync per 16 MiB,
#: 0.48 s per 64 MiB, 0.60 s with one at the end. On this project's machines since
#: 2026-11-29 (``cp + sync`` of 2 GiB in 1.2-1.4 s, 2-3x faster), medians of 8 interleaved:
#: 2 GiB push 2.22 s per 16 MiB, 1.68 s per 64 MiB, 1.47 s per 128 MiB (``cp + sync`` 1.45 s);
#: the 207 MiB push 0.373 / 0.352 / 0.354 s (benchmarks/README.md, "Fewer syncs").
COMMIT_BYTES = 128 * 1024 * 1024
#: ... or every this many blobs, whichever comes first
COMMIT_BLOBS = 4096
#: ``tmp/`` directories of blobs copied before they are claimed (``put_parts_held``)
HELD_PREFIX = "held-"


class LocalBlobStore:
    """Blobs as read-only files in a directory tree; every write is tmp file + fsync + rename.

    The constructor does no IO: directories are created by the first put.
    """

    #: ranged reads of packs run at once (``blobs.packed``): reading the page cache is CPU work
    read_workers = WORKERS
    #: declared capabilities (``BlobStore``): files here, packs named as written, no presigned URLs
    maps_in_place = True
    writes_packs = True
    presigns = False

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).expanduser().absolute()
        self.url = self.root.as_uri()

    @classmethod
    def from_url(cls, url: str) -> LocalBlobStore:
        """``file:///abs/dir`` (or ``file://localhost/abs/dir``) to a store."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "file" or parts.netloc not in ("", "localhost") or not parts.path \
                or parts.query or parts.fragment:
            raise UsageError(f"invalid file store URL {url!r}", hint="use file:///ABSOLUTE/DIR")
        return cls(urllib.parse.unquote(parts.path))

    def __repr__(self) -> str:
        return f"LocalBlobStore({str(self.root)!r})"

    # -- writing -------------------------------------------------------------------------------

    def put_file(self, path: str | os.PathLike, digest: str, *, offset: int = 0,
                 length: int | None = None, progress: ProgressFn | None = None) -> bool:
        """Store bytes ``[offset, offset+length)`` of ``path``, hashing them in the same pass.

        Returns False (and reads nothing of ``path``) when the blob is already stored intact:
        a stored file is trusted only after it hashes to its name, else it is replaced.
        """
        with open_range(path, offset, length) as (src, length):
            if self._intact(digest, length):
                return False
            return self._write(VerifyingReader(src, digest, size=length), digest, progress)

    def put_stream(self, fp: BinaryIO, digest: str, *, size: int | None = None,
                   progress: ProgressFn | None = None) -> bool:
        """Store ``size`` bytes of ``fp`` (or all of it), hashing while writing (a stored copy
        is kept only when it hashes to ``digest``)."""
        if self._intact(digest, size):
            return False
        return self._write(VerifyingReader(fp, digest, size=size), digest, progress)

    def put_bytes(self, data: bytes, digest: str) -> bool:
        """Store ``data`` under ``digest``."""
        return self.put_stream(io.BytesIO(data), digest, size=len(data))

    def put_parts(self, path: str | os.PathLike, parts: Sequence[Part], *,
                  progress: ProgressFn | None = None, unrecorded: Collection[str] = ()) -> tuple[int, int]:
        """Store ranges of ``path`` on every core: each worker hashes exactly the bytes it
        writes into a temp file. A committer thread makes finished temp files durable together
        (one ``syncfs`` per ``COMMIT_BYTES`` or so, not one ``fsync`` per blob, overlapping
        with the copies still running) and then renames them into place, so a blob is never
        visible before its bytes are on disk, and a push killed half-way keeps what it
        committed. Returns (bytes written, bytes already stored). A blob in ``unrecorded`` is
        written without first reading a stored copy (one that is there is replaced)."""
        written, stored, _packs = self._put(path, parts, (), progress=progress, unrecorded=unrecorded)
        return written, stored

    def put_packs(self, path: str | os.PathLike, parts: Sequence[Part], packs: Sequence[Sequence[Part]], *,
                  tag: str, claim: Callable[[list[tuple[str, int]]], None], progress: ProgressFn | None = None,
                  unrecorded: Collection[str] = ()) -> tuple[int, int, list[tuple[str, int]]]:
        """``put_parts`` of ``parts``, and each of ``packs`` (ranges of ``path``) stored as one
        new blob: the ranges one after the other, each checked against its own digest, the
        whole named by its sha256, all in the one pass that copies them (a store that cannot
        rename lacks this method: a push then hashes its packs before uploading them).

        A pack's name is known only once it is written, and gc spares only claimed blobs: so
        its temp file is named by ``tag`` (a digest the caller claimed for this upload, so
        ``abort_stale_uploads`` spares it), and ``claim(packs)`` is called with every pack's
        (digest, size) once all are written, before any is renamed into place (the caller
        claims them; an error there discards them). Returns (bytes written, bytes already
        stored, the packs' (digest, size) in order). A pack already stored is replaced by the
        same bytes."""
        return self._put(path, parts, packs, progress=progress, unrecorded=unrecorded, tag=tag, claim=claim)

    def put_parts_held(self, path: str | os.PathLike, parts: Sequence[Part], *, claimed: Callable[[], object],
                       progress: ProgressFn | None = None) -> tuple[int, int]:
        """``put_parts`` begun before the caller claimed the blobs: every blob is copied into a
        temp file and made durable, but renamed into place only once ``claimed()`` returns
        (it waits for the caller's claim of every digest of ``parts``, and raises when there
        is none: then every temp file is removed). A blob found stored before the claim is
        looked for again after it (gc may have deleted it meanwhile) and written if gone."""
        written, stored, _packs = self._put(path, parts, (), progress=progress, unrecorded=(), claimed=claimed)
        return written, stored

    def _put(self, path: str | os.PathLike, parts: Sequence[Part], packs: Sequence[Sequence[Part]], *,
             progress: ProgressFn | None, unrecorded: Collection[str], tag: str | None = None,
             claim: Callable[[list[tuple[str, int]]], None] | None = None,
             claimed: Callable[[], object] | None = None) -> tuple[int, int, list[tuple[str, int]]]:
        progress = locked_progress(progress)
        todo, repeated = unique_parts(parts)
        if progress is not None and repeated:
            progress(repeated)
        if not todo and not packs:
            return 0, repeated, []
        staged: list[tuple[str, str, int] | None] = [None] * len(packs)   # (tmp, digest, size) of each pack
        with open_range(path, 0, None) as (src, file_size), \
                self._held_dir() if claimed is not None else contextlib.nullcontext(None) as where:
            for part in [*todo, *(p for pack in packs for p in pack)]:
                checked_range(file_size, part.offset, part.size, path)
            src_fd = src.fileno()
            committer = _Committer(self)
            wrote = committer.counting(progress)

            def one(item: Part | int) -> tuple[int, int]:
                if isinstance(item, int):   # a pack: made durable with the others, renamed once claimed
                    assert tag is not None
                    tmp, digest, size = staged[item] = self._write_pack_tmp(src_fd, packs[item], path, wrote, tag)
                    _handed(committer, tmp, Part(digest, 0, size), held=True)
                    return size, 0
                if item.digest not in unrecorded and self._intact(item.digest, item.size):
                    # already stored; the source is still checked: a push of a damaged file fails
                    check_range(path, item, fd=src_fd, progress=progress)
                    if claimed is not None:
                        found.append(item)
                    return 0, item.size
                _handed(committer, self._write_tmp(src_fd, item, path, wrote, where), item, held=claimed is not None)
                return item.size, 0

            found: list[Part] = []   # stored before the claim (``claimed``)
            try:
                # the packs first, in bundle order (largest first made the first syncs start later
                # and the push slower: 0.53 s against 0.48); all are claimed once everything is written
                done = run_parallel(one, [*range(len(packs)), *todo], WORKERS)
                named = [(digest, size) for _tmp, digest, size in filter(None, staged)]
                if claimed is not None:
                    claimed()
                    # claimed now, so gc spares them; one it deleted before is written again
                    gone = [p for p in found if not self._path(p.digest).exists()]
                    for part in gone:
                        _handed(committer, self._write_tmp(src_fd, part, path, committer.counting(None), where), part)
                    done.append((sum(p.size for p in gone), -sum(p.size for p in gone)))
                if packs:
                    assert claim is not None
                    claim(named)
                if packs or claimed is not None:
                    committer.release()
            except BaseException:
                committer.abort()   # removes every temp file not renamed, the packs' too
                raise
            committer.finish()
        return sum(w for w, _ in done), sum(s for _, s in done) + repeated, named

    def _write_tmp(self, src_fd: int, part: Part, path: str | os.PathLike,
                   progress: ProgressFn | None, where: Path | None = None) -> str:
        """Copy one range into a new temp file (in ``tmp/``, or the directory ``where``),
        hashing it; ``IntegrityError`` when it does not match."""
        def fill(fd: int) -> None:
            got = hash_copy([Segment(src_fd, part.offset, part.size)], out_fd=fd, progress=progress, writeback=True)
            if got.sha256 != part.digest[7:]:
                raise range_error(path, part, got.sha256)

        return self._fill_temp(part.digest, f"blob {part.digest}", part.size, fill, where)

    def _write_pack_tmp(self, src_fd: int, parts: Sequence[Part], path: str | os.PathLike,
                        progress: ProgressFn | None, tag: str) -> tuple[str, str, int]:
        """Copy ``parts`` one after the other into a new temp file named by ``tag``, each checked
        against its digest (``hash_parts``); (temp path, the pack's digest, its size)."""
        size = sum(p.size for p in parts)
        got: list[str | None] = []
        tmp = self._fill_temp(tag, "a pack", size,
                              lambda fd: got.append(hash_parts(path, src_fd, parts, out_fd=fd, progress=progress)))
        return tmp, f"sha256:{got[0]}", size

    def _fill_temp(self, named: str, what: str, size: int, fill: Callable[[int], None],
                   where: Path | None = None) -> str:
        """A new temp file in ``tmp/`` (or ``where``) named by the digest ``named`` (so gc can
        tell whose upload a leftover belonged to), ``size`` bytes reserved, written by
        ``fill(fd)`` and made read-only; removed when anything fails (an ``OSError`` of ours
        becomes a ``StoreError`` about writing ``what``)."""
        tmpdir = where or self.root / "tmp"
        try:
            tmpdir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=tmpdir, prefix=named[7:] + ".", suffix=".tmp")
        except OSError as exc:
            raise StoreError(f"cannot write {what} to {self.url}: {_oneline(exc)}") from exc
        try:
            try:
                preallocate(fd, size)
                fill(fd)
            finally:
                os.close(fd)
            os.chmod(tmp, 0o444)
        except BaseException as exc:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
                raise StoreError(f"cannot write {what} to {self.url}: {_oneline(exc)}") from exc
            raise
        return tmp

    @contextlib.contextmanager
    def _held_dir(self) -> Iterator[Path]:
        """A directory of ``tmp/`` for blobs written before they are claimed (``put_parts_held``),
        locked (``flock``) from before it takes its name until it is removed, empty, when the
        block ends: gc leaves such a directory alone while its lock is held, and the lock dies
        with the process (``abort_stale_uploads``). It is made as ``.held-*``, locked, then
        renamed, so gc never sees one of these names unlocked while its writer lives."""
        tmpdir = self.root / "tmp"
        name = f"{HELD_PREFIX}{secrets.token_hex(8)}"
        try:
            tmpdir.mkdir(parents=True, exist_ok=True)
            os.mkdir(tmpdir / f".{name}")
            fd = os.open(tmpdir / f".{name}", os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise StoreError(f"cannot write blobs to {self.url}: {_oneline(exc)}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.rename(tmpdir / f".{name}", tmpdir / name)
            try:
                yield tmpdir / name
            finally:
                _remove_dir(tmpdir / name)
        except BaseException:
            _remove_dir(tmpdir / f".{name}")   # not renamed (an error right there)
            raise
        finally:
            os.close(fd)

    def get_parts(self, fd: int, parts: Sequence[Part], *, progress: ProgressFn | None = None,
                  on_done: Callable[[int], None] | None = None) -> None:
        """Copy blobs into ranges of the open file ``fd`` on every core, verifying each in the
        pass that copies it."""
        run_calls(self.part_fetches(fd, parts, progress=progress, on_done=on_done), WORKERS)

    def part_fetches(self, fd: int, parts: Sequence[Part], *, progress: ProgressFn | None = None,
                     on_done: Callable[[int], None] | None = None) -> list[Callable[[], None]]:
        """One call per part: its blob copied into its range of ``fd``, verified in the pass
        that copies it (``get_parts``)."""
        progress = locked_progress(progress)

        def one(i: int) -> None:
            part = parts[i]
            with self.open(part.digest) as src:
                size = os.fstat(src.fileno()).st_size
                if size != part.size:
                    raise IntegrityError(f"blob {part.digest} has {size} bytes, expected {part.size}",
                                         hint="the version's manifest does not match the store")
                got = hash_copy([Segment(src.fileno(), 0, size)], out_fd=fd, out_offset=part.offset,
                                progress=progress)
            if got.sha256 != part.digest[7:]:
                raise corrupt_blob_error(part.digest, got.sha256, self.url)
            if on_done is not None:
                on_done(i)

        return [functools.partial(one, i) for i in range(len(parts))]

    def _write(self, reader: VerifyingReader, digest: str, progress: ProgressFn | None) -> bool:
        final = self._path(digest)
        tmp = None
        reading = False

        def write(chunk: bytes) -> None:  # an OSError here is ours; one while reading is the source's
            nonlocal reading
            reading = False
            out.write(chunk)
            reading = True

        try:
            tmpdir = self.root / "tmp"
            tmpdir.mkdir(parents=True, exist_ok=True)
            # named by the full digest, so gc can tell whose upload a leftover belonged to
            fd, tmp = tempfile.mkstemp(dir=tmpdir, prefix=digest[7:] + ".", suffix=".tmp")
            with os.fdopen(fd, "wb") as out:
                reading = True
                pump(reader, write, progress=progress)
                reading = False
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, 0o444)
            new_fan = not final.parent.is_dir()
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, final)
            tmp = None
            _fsync_dir(final.parent)
            if new_fan:
                _fsync_dir(final.parent.parent)
        except OSError as exc:
            if reading:  # the caller's source failed: not ours to translate
                raise
            raise StoreError(f"cannot write blob {digest} to {self.url}: {_oneline(exc)}") from exc
        finally:
            if tmp is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        return True

    # -- reading -------------------------------------------------------------------------------

    def exists(self, digest: str) -> bool:
        """True when the blob is stored."""
        return self._path(digest).is_file()

    def _intact(self, digest: str, size: int | None = None) -> bool:
        """True when the blob is stored with ``size`` bytes (if given) that hash to ``digest``:
        what a push may skip. Costs one read of the stored file."""
        try:
            with open(self._path(digest), "rb") as f:
                if size is not None and os.fstat(f.fileno()).st_size != size:
                    return False
                got, _n = sha256_stream(f)
        except (FileNotFoundError, IsADirectoryError):
            return False
        return got == digest.split(":", 1)[1]

    def stat(self, digest: str) -> BlobInfo:
        """Size and mtime; ``NotFoundError`` if missing."""
        try:
            st = self._path(digest).stat()
        except FileNotFoundError as exc:
            raise self._missing(digest) from exc
        return BlobInfo(digest=digest, size=st.st_size, mtime=st.st_mtime)

    def get_file(self, digest: str, dest: str | os.PathLike, *,
                 progress: ProgressFn | None = None) -> None:
        """Copy the blob to ``dest`` via ``dest.incomplete``, verifying its digest on the way."""
        with self.open(digest) as src, atomic_download(dest, digest, self.url) as out:
            pump(src, out.write, progress=progress)

    def in_place(self, digest: str, size: int | None = None) -> InPlaceFile | None:
        """The blob's file, if its bytes may be read and mapped where they lie (this user's own
        file that nobody else may write: ``blobs.inplace``), else None (copy it)."""
        return in_place_file(self._path(digest), size=size)

    def local_file(self, digest: str, size: int | None = None) -> Path:
        """The blob's file (the caller hashes what it reads); ``NotFoundError`` if missing or
        not ``size`` bytes."""
        path = self._path(digest)
        try:
            st = path.stat()
        except FileNotFoundError as exc:
            raise self._missing(digest) from exc
        if size is not None and st.st_size != size:
            raise NotFoundError(f"blob {digest} in {self.url} has {st.st_size} bytes, not {size}: damaged",
                                what="blob", name=digest, hint="run `pt2reg audit --verify`")
        return path

    def open(self, digest: str) -> BinaryIO:
        """The raw, unverified file; ``NotFoundError`` if missing."""
        try:
            return open(self._path(digest), "rb")
        except FileNotFoundError as exc:
            raise self._missing(digest) from exc

    def read_range(self, digest: str, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset+length)`` of the blob file, raw and unverified (``pread``,
        nothing else of the file is read); ``NotFoundError`` if missing, ``IntegrityError``
        when the file is shorter than ``offset + length``."""
        pieces: list[bytes] = []

        def read(fd: int, want: int, at: int) -> int:
            pieces.append(os.pread(fd, want, at))
            return len(pieces[-1])

        self._read_range(digest, offset, length, read)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def read_range_into(self, digest: str, offset: int, length: int, out: RangeSink) -> None:
        """``read_range``'s bytes written to ``out`` in order, through this thread's one buffer
        (``parallel.thread_buffer``: a few MiB at a time; 512 KiB pieces took as long)."""
        buf = thread_buffer()

        def piece(fd: int, want: int, at: int) -> int:
            n = os.preadv(fd, [buf[:want]], at)
            if n:
                out.write(buf[:n])
            return n

        self._read_range(digest, offset, length, piece, len(buf))

    def _read_range(self, digest: str, offset: int, length: int, read: Callable[[int, int, int], int],
                    piece: int | None = None) -> None:
        """``read(fd, n, at)`` (bytes read, 0 at the end) over ``[offset, offset+length)`` of the
        blob, at most ``piece`` bytes a call, until every byte is read."""
        check_read_range(digest, offset, length)
        try:
            fd = os.open(self._path(digest), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError as exc:
            raise self._missing(digest) from exc
        try:
            size = os.fstat(fd).st_size
            if offset + length > size:
                raise short_blob_error(digest, offset, length, self.url, size)
            got = 0
            while got < length:
                want = length - got if piece is None else min(piece, length - got)
                n = read(fd, want, offset + got)
                if not n:  # shrank under us
                    raise short_blob_error(digest, offset, length, self.url, offset + got)
                got += n
        finally:
            os.close(fd)

    def read_bytes(self, digest: str, *, max_size: int) -> bytes:
        """The verified content; ``IntegrityError`` when it is larger than ``max_size``."""
        with self.open(digest) as fp:
            data = fp.read(max_size + 1)
        if len(data) > max_size:
            raise IntegrityError(f"blob {digest} is larger than the limit of {max_size} bytes")
        got = sha256_bytes(data)
        if got != digest[7:]:
            raise corrupt_blob_error(digest, got, self.url)
        return data

    def delete(self, digest: str) -> None:
        """Remove the blob; a missing blob is fine."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(digest))

    def list(self) -> Iterator[BlobInfo]:
        """Every stored blob, in digest order; stray files and ``tmp/`` are ignored."""
        top = self.root / BLOBS_DIR
        for fan in _sorted_names(top):
            for name in _sorted_names(top / fan):
                digest = digest_from_relpath(fan, name)
                if digest is None:
                    continue
                try:
                    st = (top / fan / name).stat()
                except FileNotFoundError:  # deleted while listing
                    continue
                yield BlobInfo(digest=digest, size=st.st_size, mtime=st.st_mtime)

    def abort_stale_uploads(self, older_than_seconds: float = 0.0, *,
                            keep: Iterable[str] | Callable[[], Iterable[str]] = (),
                            dry_run: bool = False) -> list[str]:
        """Remove uploads abandoned by killed writers: ``tmp/`` files untouched for
        ``older_than_seconds`` whose blob is not in ``keep`` (the digests live pushes claim).
        Returns the digests whose leftovers were (or, with ``dry_run``, would be) removed.

        ``keep`` may be a callable: it is then called after the listing, so a push that claims
        its blobs before it starts writing (as ``Registry.push`` does) is always spared. A live
        writer also touches its file with every chunk, so its mtime stays fresh. A directory
        of blobs written before their claim (``_held_dir``) is left alone while its writer
        holds its lock; once the lock is free (the writer died), its files go the same way
        and the directory with them.
        """
        tmpdir = self.root / "tmp"
        now = time.time()
        candidates: list[tuple[Path, str]] = []   # (file, its digest)
        held: list[tuple[Path, int]] = []         # the abandoned held directories, locked by us
        try:
            for name in _sorted_names(tmpdir):
                if name.startswith((HELD_PREFIX, f".{HELD_PREFIX}")):
                    lock = _abandoned(tmpdir / name, made_before=now - 60 if name.startswith(".") else None)
                    if lock is not None:
                        held.append((tmpdir / name, lock))
                        candidates += [(tmpdir / name / f, f) for f in _sorted_names(tmpdir / name)]
                    continue
                candidates.append((tmpdir / name, name))
            spared = set(keep() if callable(keep) else keep)
            removed = []
            for file, name in candidates:
                try:
                    age = now - file.stat().st_mtime
                except FileNotFoundError:  # finished (renamed) or removed meanwhile
                    continue
                digest = "sha256:" + name.split(".", 1)[0]
                if age < older_than_seconds or digest in spared:
                    continue
                if not dry_run:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(file)
                removed.append(digest)
            if not dry_run:
                for directory, _fd in held:
                    with contextlib.suppress(OSError):   # not empty: a file it still keeps
                        os.rmdir(directory)
        finally:
            for _directory, fd in held:
                os.close(fd)
        return removed

    # -- internals -----------------------------------------------------------------------------

    def _path(self, digest: str) -> Path:
        return self.root / blob_relpath(digest)

    def _missing(self, digest: str) -> NotFoundError:
        return NotFoundError(f"blob {digest} not found in {self.url}", what="blob", name=digest)


class _Committer:
    """Renames finished temp files into place in batches, on its own thread: a batch is made
    durable (one ``syncfs``) before any of it is renamed, and ``finish`` makes the renames
    durable too. ``abort`` removes every temp file not renamed yet, and nothing else.

    A file added with ``held`` (a pack not claimed yet) is made durable with its batch (the
    sync overlaps the copies still running) but renamed only after ``release``."""

    def __init__(self, store: LocalBlobStore) -> None:
        self._store = store
        self._cond = threading.Condition()
        self._ready: list[tuple[str, str, int]] = []   # (tmp, digest, size) written, not renamed
        self._held: set[str] = set()                   # temp files not to be renamed yet
        self._synced_held: list[tuple[str, str, int]] = []
        self._written = 0                              # bytes written since the last sync began
        self._closing = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="pt2reg-commit", daemon=True)
        self._thread.start()

    def add(self, tmp: str, part: Part, *, held: bool = False) -> None:
        with self._cond:
            self._raise_error()
            self._ready.append((tmp, part.digest, part.size))
            if held:
                self._held.add(tmp)
            self._cond.notify()

    def release(self) -> None:
        """The held files may be renamed now (with the next batch)."""
        with self._cond:
            self._raise_error()
            self._held.clear()
            self._ready += self._synced_held
            self._synced_held = []
            self._cond.notify()

    def _raise_error(self) -> None:
        """The committer's failure, if any, an ``OSError`` as a ``StoreError`` (called holding
        ``_cond``)."""
        exc = self._error
        if exc is None:
            return
        if isinstance(exc, OSError):
            raise StoreError(f"cannot store blobs in {self._store.url}: {_oneline(exc)}") from exc
        raise exc

    def counting(self, progress: ProgressFn | None) -> Callable[[int], None]:
        """``progress``, also telling this committer how many bytes the writers wrote (a sync
        is due every ``COMMIT_BYTES`` written, finished files or not)."""
        def wrote(n: int) -> None:
            with self._cond:
                self._written += n
                if self._written >= COMMIT_BYTES:
                    self._cond.notify()
            if progress is not None:
                progress(n)
        return wrote

    def _take(self) -> list[tuple[str, str, int]] | None:
        """The files to rename after the next sync (perhaps none: a sync of files still being
        written is due, so that the last one finds little left to flush); None once closing
        and nothing is left."""
        with self._cond:
            while not self._closing and self._written < COMMIT_BYTES and len(self._ready) < COMMIT_BLOBS:
                self._cond.wait()
            if self._error is not None or (self._closing and not self._ready):
                return None   # aborted (what is ready is discarded, not renamed), or done
            batch, self._ready, self._written = self._ready, [], 0
            return batch

    def _run(self) -> None:
        batch: list[tuple[str, str, int]] = []
        try:
            while True:
                batch = self._take()
                if batch is None:
                    return
                sync_filesystem(self._store.root)
                while batch:
                    tmp, digest, _n = batch[0]
                    with self._cond:
                        if self._error is not None:   # aborted: the rest is discarded, not renamed
                            self._ready = batch + self._ready
                            return
                        if tmp in self._held:   # durable now; renamed once released
                            self._synced_held.append(batch.pop(0))
                            continue
                    final = self._store._path(digest)
                    final.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(tmp, final)
                    batch.pop(0)
        except BaseException as exc:
            with self._cond:
                self._error = exc
                self._closing = True
                self._ready = batch + self._ready  # not renamed: discarded by finish/abort

    def finish(self) -> None:
        """Commit what is left and wait; the renames are durable when this returns."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()
        with self._cond:   # never released (the caller failed before its claim): not to be renamed
            unreleased, self._synced_held = self._synced_held, []
        for tmp, _d, _n in unreleased:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if self._error is not None:
            self._discard()
            with self._cond:
                self._raise_error()
        try:
            sync_filesystem(self._store.root)
        except OSError as exc:
            raise StoreError(f"cannot store blobs in {self._store.url}: {_oneline(exc)}") from exc

    def abort(self) -> None:
        with self._cond:
            self._closing = True
            self._error = self._error or RuntimeError("aborted")
            self._cond.notify()
        self._thread.join()
        self._discard()

    def _discard(self) -> None:
        with self._cond:
            left, self._ready = self._ready + self._synced_held, []
            self._synced_held = []
        for tmp, _d, _n in left:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def _handed(committer: _Committer, tmp: str, part: Part, *, held: bool = False) -> None:
    """``committer.add``; the temp file is removed if the committer failed already."""
    try:
        committer.add(tmp, part, held=held)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _sorted_names(directory: Path) -> list[str]:
    try:
        return sorted(entry.name for entry in os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _oneline(exc: OSError) -> str:
    return " ".join(str(exc).split())


def _abandoned(directory: Path, *, made_before: float | None) -> int | None:
    """A held directory's descriptor, locked by us, when its writer is gone (its lock was
    free); None while a writer holds it (or it is gone). ``made_before``: a directory not yet
    renamed (``.held-*``) counts only when made before this time (its writer locks it right
    after making it, and this lock may be ours)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:   # removed meanwhile, or not a directory
        return None
    try:
        if made_before is not None and os.fstat(fd).st_mtime > made_before:
            os.close(fd)
            return None
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:   # BlockingIOError: its writer lives
        os.close(fd)
        return None
    return fd


def _remove_dir(directory: Path) -> None:
    """Remove ``directory`` and the files in it, whatever is gone already."""
    for name in _sorted_names(directory):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(directory / name)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(directory)
