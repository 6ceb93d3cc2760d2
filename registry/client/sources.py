"""Bundles made local: every member a verified file in the client cache, keyed by digest.

``open_source`` is the one way from what a user typed (a bundle file or a registry ref) to a
local, verified bundle; ``verify``, ``run``, ``inspect`` and ``registry.load`` all go through it
(``parse_source`` alone when the metadata is enough).

The cache (``HOME/cache/blobs/sha256/ab/<hex>``, the same layout as a local blob store) holds
only bytes whose sha256 was checked while they were written, so a cached, pinned version is
served with no network and no database round trip. Each verified file gets a stamp
(``HOME/cache/verified/ab/<hex>``: inode, size, mtime and ctime). A file whose stat still
matches its stamp is used as is (one ``stat``, no re-hash: warm loads stay at
``torch.export.load`` speed). One that changed, even by a byte written in place (any write or
``chmod`` moves ctime, which no user call can set back), is re-hashed before use, and evicted
when it no longer matches its digest, so it is fetched again instead of being loaded. Beside
the blobs, ``cache/signatures/<hex>.json`` and ``cache/names/<hex>.json`` keep what the
database said about a digest, so a cached pin can be served with its signatures. For example::

    with Registry() as reg:
        src = open_source("team/bert@prod", registry=reg)     # or "model.pt2b"
    src.member_file("programs/encoder.pt2")
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ..atomic import atomic_write
from ..blobs.base import blob_relpath
from ..digests import digest_of_bytes, hex_of, sha256_stream
from ..errors import IntegrityError, NotFoundError, UsageError
from ..format.bundle import BundleFile, FileRange, copy_member
from ..format.manifest import Manifest, Member
from ..format.packs import PackIndex
from ..format.times import iso_utc
from ..oci.reference import OciReference, looks_like_oci
from ..refs import Ref

if TYPE_CHECKING:  # the facade imports this module: only its type is named here
    from .api import Registry

__all__ = ["MaterializedBundle", "PinnedManifest", "BlobCache", "AuditSpool", "materialize_file", "looks_like_file",
           "parse_source", "open_source", "BUNDLE_SUFFIXES", "FILE_PREFIX"]


def _boot_id() -> str:
    """This boot of the machine (Linux), so a stamp written before a crash is not trusted after it."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return "-"


_BOOT_ID = _boot_id()


class BlobCache:
    """A write-once, verify-on-write directory of blobs addressed by sha256.

    Member files are written without ``fsync``: a process that dies leaves the page cache
    intact (and the temp-file-then-rename write leaves no partial file), and only a crash of
    the machine can lose unsynced bytes. A stamp names the boot it was written in, so after a
    reboot every cached file is re-hashed once before use (and fetched again if it lost
    bytes): a cold load costs a copy in memory, not a wait for the disk."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    def path(self, digest: str) -> Path:
        return self.root / blob_relpath(digest)

    def has(self, digest: str) -> bool:
        """The blob is cached (not checked: see ``usable``)."""
        return self.path(digest).is_file()

    def _stamp_path(self, digest: str) -> Path:
        return self.root / blob_relpath(digest, under="verified")

    @staticmethod
    def _stat_line(path: str | os.PathLike[str]) -> str | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return f"{st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {_BOOT_ID}\n"

    def stamp(self, digest: str) -> None:
        """Record that the cached file for ``digest`` was just verified, as it is now."""
        self._stamp(self.path(digest), digest)

    def _stamp(self, path: Path, digest: str) -> None:
        line = self._stat_line(path)
        if line is not None:
            with atomic_write(self._stamp_path(digest), fsync=False) as f:
                f.write(line.encode("ascii"))

    def usable(self, digest: str) -> bool:
        """True when the blob is cached and intact: its stat matches the stamp written when it
        was verified, or else it re-hashes to ``digest`` (and is stamped again). A cached file
        that does not match is removed, so the caller fetches it again. Never raises for a
        damaged cache entry."""
        return self._usable(self.path(digest), digest, lambda: self.verify(digest))

    def _usable(self, path: Path, digest: str, verify: Callable[[], bool]) -> bool:
        line = self._stat_line(path)
        if line is None:
            return False
        try:
            if self._stamp_path(digest).read_text("ascii") == line:
                return True
        except (OSError, UnicodeDecodeError):
            pass
        try:
            good = verify()
        except OSError:
            good = False
        if good:
            self._stamp(path, digest)
            return True
        self._evict(path, digest)
        return False

    def evict(self, digest: str) -> None:
        self._evict(self.path(digest), digest)

    def _evict(self, path: Path, digest: str) -> None:
        for p in (path, self._stamp_path(digest)):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass

    # -- members: a chunked member is one file, filed under its chunk list's digest -----------
    def member_path(self, member: Member) -> Path:
        """Where a member's file is cached: a chunked member under ``members/`` (its bytes do not
        hash to its name: its chunks do), any other member as the blob it is."""
        if member.chunks:
            return self.root / blob_relpath(member.digest, under="members")
        return self.path(member.digest)

    def usable_member(self, member: Member) -> bool:
        """``usable`` for a member: a chunked one is re-checked chunk by chunk, on every core."""
        if not member.chunks:
            return self.usable(member.digest)
        return self._usable(self.member_path(member), member.digest, lambda: self._verify_member(member))

    def stamp_member(self, member: Member) -> None:
        self._stamp(self.member_path(member), member.digest)

    # -- members verified where they lie in a local store (``blobs.inplace``) ------------------
    def _in_place_stamp(self, member: Member) -> Path:
        return self.root / blob_relpath(member.digest, under="verified-in-place")

    @staticmethod
    def _in_place_line(segments: Iterable[Any]) -> str:
        """One line naming every segment and its file as it is now (identity: inode, size,
        mtime, ctime), and this boot."""
        text = "\n".join(" ".join(map(str, (s.offset, s.size, s.path, s.file_offset, *s.identity)))
                         for s in segments)
        return f"{digest_of_bytes(text.encode('utf-8', 'surrogateescape'))} {_BOOT_ID}\n"

    def verified_in_place(self, member: Member, segments: Iterable[Any]) -> bool:
        """Whether ``segments`` (``InPlaceSegment``: a member's chunks in a local store's files)
        were all verified before, their files unchanged since (a stamp names each file's identity:
        any write or ``chmod`` moves its ctime); ``stamp_in_place`` wrote it."""
        try:
            return self._in_place_stamp(member).read_text("ascii") == self._in_place_line(segments)
        except (OSError, UnicodeDecodeError):
            return False

    def stamp_in_place(self, member: Member, segments: Iterable[Any]) -> None:
        with atomic_write(self._in_place_stamp(member), fsync=False) as f:
            f.write(self._in_place_line(segments).encode("ascii"))

    # -- members verified inside a bundle file a pull wrote (``client.pull.pull_direct``) -------
    def _in_bundle_stamp(self, member: Member) -> Path:
        return self.root / blob_relpath(member.digest, under="verified-in-bundle")

    def remember_bundle(self, path: str | os.PathLike[str], manifest: Manifest) -> None:
        """Record that every member of ``manifest`` lies verified in the bundle file ``path`` (one
        a pull just wrote, each chunk checked against its sha256 as it was written) as that file
        is now (its identity: inode, size, mtime, ctime, and this boot), so a pinned ref pulled
        again is served from it with no network and no database (``member_in_bundle``) although
        the pull wrote every byte once, into the bundle, not into the cache as well. Only the
        zip's directory is read back, for where each member starts (the manifest is known)."""
        from ..format.zipsafe import read_entries

        identity = self._stat_line(path)   # ends with a newline; the file's path follows it
        if identity is None:
            return
        entries = read_entries(path)
        where = os.fsencode(os.path.abspath(path))
        for m in manifest.members:
            e = entries[m.path]
            with atomic_write(self._in_bundle_stamp(m), fsync=False) as f:
                f.write(f"{e.data_offset} {e.size} {identity}".encode("ascii") + where)

    def member_in_bundle(self, member: Member) -> FileRange | None:
        """Where ``member`` lies verified in a bundle file a pull wrote (``remember_bundle``), if
        that file is still as it was then (any write, ``chmod``, rename or replacement moves its
        ctime or inode; a reboot voids it); None otherwise."""
        try:
            head, _, where = self._in_bundle_stamp(member).read_bytes().partition(b"\n")
            offset, size, identity = head.decode("ascii").split(" ", 2)
            path = Path(os.fsdecode(where))
            at, n = int(offset), int(size)
        except (OSError, ValueError, UnicodeDecodeError):
            return None
        if n != member.size or self._stat_line(path) != identity + "\n":
            return None
        return FileRange(path, at, n)

    def member_source(self, member: Member) -> FileRange | None:
        """Where a verified copy of ``member`` lies on this machine: its cache file
        (``usable_member``) or its range of a bundle a pull wrote (``member_in_bundle``)."""
        if self.usable_member(member):
            return FileRange(self.member_path(member), 0, member.size)
        return self.member_in_bundle(member)

    def _verify_member(self, member: Member) -> bool:
        path = self.member_path(member)
        if os.path.getsize(path) != member.size:
            return False
        try:
            copy_member(member, (FileRange(path, 0, member.size),), None)
        except IntegrityError:
            return False
        return True

    def put_member(self, member: Member, source: FileRange, progress: Callable[[int], None] | None = None,
                   label: str | None = None) -> Path:
        """Copy a member's bytes (a range of a local file) into the cache, checked on the way:
        chunk by chunk on every core for a chunked member."""
        if not member.chunks:
            with open(source.path, "rb") as f:
                f.seek(source.offset)
                return self.put_stream(member.digest, f, member.size, progress, label)
        dest = self.member_path(member)
        if self.usable_member(member):
            return dest
        with atomic_write(dest, mode=0o444, fsync=False) as out:
            out.flush()
            copy_member(member, (source,), out.fileno(), progress=progress, where=f"{label}: " if label else "")
        self.stamp_member(member)
        return dest

    def put_stream(self, digest: str, src: IO[bytes], size: int | None = None,
                   progress: Callable[[int], None] | None = None, label: str | None = None) -> Path:
        """Copy ``src`` into the cache, checking its sha256; ``label`` names the source for the
        user (``model.pt2b: member programs/encoder.pt2``) when it does not match."""
        dest = self.path(digest)
        if self.usable(digest):
            return dest
        with atomic_write(dest, mode=0o444, fsync=False) as out:
            got, _n = sha256_stream(src, size, out=out, progress=progress)
            if got != hex_of(digest):
                what = label or f"blob {digest}"
                raise IntegrityError(f"{what} is corrupt: expected {digest}, got sha256:{got}",
                                     hint="the source is damaged; nothing was cached")
        self.stamp(digest)
        return dest

    def put_manifest(self, manifest: Manifest) -> Path:
        """Cache a manifest's canonical bytes under its digest, unless cached already; not
        hashed again (``Manifest.digest`` is the hash of those very bytes, taken in this
        process: 0.8 ms of every pull of a 10,000-tensor program)."""
        dest = self.path(manifest.digest)
        if not self.has(manifest.digest):
            with atomic_write(dest, mode=0o444, fsync=False) as out:
                out.write(manifest.canonical)
            self.stamp(manifest.digest)
        return dest

    def verify(self, digest: str) -> bool:
        """Re-hash a cached blob (used when a cached file is suspected)."""
        with open(self.path(digest), "rb") as f:
            return sha256_stream(f)[0] == hex_of(digest)

    def pinned(self, ref: Ref) -> Manifest | None:
        """The cached manifest of a digest-pinned ref the database resolved under this model name
        on this machine before; None otherwise (the database decides)."""
        if ref.digest is None or not self.has(ref.digest) or ref.name not in self.names(ref.digest):
            return None  # not cached, or never resolved under this model name here: the database decides
        data = self.path(ref.digest).read_bytes()
        if digest_of_bytes(data) != ref.digest:
            self.evict(ref.digest)
            return None
        return Manifest.from_bytes(data)

    def pinned_bundle(self, ref: Ref, manifest: Manifest) -> MaterializedBundle | None:
        """A digest-pinned ref whose ``manifest`` (``pinned`` returned it) and members are all
        cached intact, or verified in a bundle file a pull wrote (``ranges``): no DB, no store."""
        files: dict[str, Path] = {}
        ranges: dict[str, FileRange] = {}
        for m in manifest.members:
            if self.usable_member(m):  # a damaged entry is evicted: fetched again
                files[m.path] = self.member_path(m)
                continue
            found = self.member_in_bundle(m)   # a pull wrote it into a bundle file, not the cache
            if found is None:
                return None
            ranges[m.path] = found

        def complete(path: str) -> Path:   # a member wanted as a file: copied in, checked on the way
            member = manifest.member(path)
            assert member is not None
            return self.put_member(member, ranges[path], label=f"{ranges[path].path}: member {path}")

        return MaterializedBundle(manifest, files, self.signatures(ref.digest), label=str(ref), name=ref.name,
                                  ranges=ranges, complete=complete if ranges else None)

    def pinned_manifest(self, ref: Ref, manifest: Manifest, store: str) -> PinnedManifest | None:
        """For a digest pin ``pinned_bundle`` cannot serve (some member not cached, e.g. its
        weights used in place in a local store): its cached ``manifest`` (``pinned``) with the
        signatures and the pack index the database gave with it for the blob store ``store`` (a
        URL); None when no such index was kept or it does not parse (then removed): the
        database decides."""
        assert ref.digest is not None
        path = self._doc_path("packs", ref.digest)
        try:
            packs = json.loads(path.read_text("utf-8"))
            if not isinstance(packs, dict) or packs.get("store") != store:
                return None
            kept = packs.get("index")
            if isinstance(kept, dict):   # the index itself (what remember_packs writes)
                index = PackIndex.from_raw(kept)
            elif isinstance(kept, (str, type(None))):   # its text, as a string (written before)
                index = PackIndex.from_json(kept)
            else:
                raise ValueError("not an index")
        except (OSError, ValueError, UsageError):
            path.unlink(missing_ok=True)  # damaged: the database gives it again
            return None
        return PinnedManifest(manifest, self.signatures(ref.digest), index)

    def remember_packs(self, digest: str, packs_json: str | None, store: str) -> None:
        """Keep a version's pack index (its stored JSON, None for none, a text
        ``PackIndex.from_stored`` read), as the database gave it for the blob store ``store``
        (a URL), beside its manifest. The index is written in as the JSON it is, not quoted as
        a string: 0.8 MB for a 10,000-tensor program, whose quoting cost 2 ms of every pull. (A
        text that is no JSON after all makes the document unreadable: ``pinned_manifest`` then
        removes it, and the database decides.)"""
        with atomic_write(self._doc_path("packs", digest), fsync=False) as f:
            f.write(b'{"index":' + (packs_json or "null").encode("utf-8") + b',"store":'
                    + json.dumps(store).encode("utf-8") + b"}")

    # -- what the database said about a digest, kept beside its blobs ---------------------------
    def _doc_path(self, kind: str, digest: str) -> Path:
        return self.root / kind / f"{hex_of(digest)}.json"

    def _read_list(self, kind: str, digest: str) -> list[Any]:
        try:
            value = json.loads(self._doc_path(kind, digest).read_text("utf-8"))
        except (OSError, ValueError):
            return []
        return value if isinstance(value, list) else []

    def _write_doc(self, kind: str, digest: str, value: Any) -> None:
        with atomic_write(self._doc_path(kind, digest), fsync=False) as f:
            f.write(json.dumps(value).encode("utf-8"))

    def signatures(self, digest: str) -> list[dict[str, Any]]:
        """Signatures seen for a digest (they are verified cryptographically when required)."""
        return [s for s in self._read_list("signatures", digest) if isinstance(s, dict)]

    def remember_signatures(self, digest: str, sigs: list[dict[str, Any]]) -> None:
        self._write_doc("signatures", digest, sigs)

    def names(self, digest: str) -> set[str]:
        """Model names the database resolved this digest under on this machine."""
        return {n for n in self._read_list("names", digest) if isinstance(n, str)}

    def remember_name(self, digest: str, name: str) -> None:
        names = self.names(digest)
        if name not in names:
            self._write_doc("names", digest, sorted(names | {name}))


class AuditSpool:
    """Audit events of pulls served from the cache without the database (``HOME/audit-spool.jsonl``);
    they are appended to the shared audit log at the next database contact."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def append(self, action: str, *, actor: str, host: str, **fields: Any) -> None:
        event = {"action": action, "actor": actor, "host": host,
                 "at": iso_utc(datetime.now(timezone.utc)), **fields}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps(event, sort_keys=True) + "\n").encode("utf-8"))
        finally:
            os.close(fd)

    def flush(self, record: Callable[[dict[str, Any]], None]) -> None:
        """Hand every spooled event to ``record`` once (another process flushing it at the same
        time gets none of them), then forget them; a torn last line is skipped, an event whose
        version is gone (NotFoundError) dropped. When ``record`` is refused otherwise (a
        server's rate limit, the database down), that event and the rest go back to the spool
        for the next contact: flushing never fails the command that triggered it."""
        from ..errors import RegistryError

        if not self.path.exists():
            return
        claimed = self.path.with_name(f"{self.path.name}.{os.getpid()}.flushing")
        try:
            os.replace(self.path, claimed)
        except FileNotFoundError:
            return  # another process is flushing it
        lines = claimed.read_text("utf-8").splitlines()
        for i, line in enumerate(lines):
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a torn last line from a killed process: nothing to record
            try:
                record(event)
            except (NotFoundError, KeyError, TypeError):
                continue  # a version since deleted, or an event the spool never wrote
            except (RegistryError, OSError):
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, "".join(ln + "\n" for ln in lines[i:]).encode("utf-8"))
                finally:
                    os.close(fd)
                break
        claimed.unlink()


@dataclass(frozen=True)
class PinnedManifest:
    """What the cache kept of a version: its manifest, signatures and pack index (parsed)."""

    manifest: Manifest
    signatures: list[dict[str, Any]]
    packs: PackIndex


@dataclass(frozen=True)
class MaterializedBundle:
    """A bundle whose members are verified local files."""

    manifest: Manifest
    files: dict[str, Path]
    signatures: list[dict[str, Any]] = field(default_factory=list)
    label: str = ""
    name: str | None = None
    version: int | None = None
    #: key ids of trusted keys (the trust policy's, or ``--require-signature``) whose signature
    #: over this digest verified; non-empty allows AOTInductor variants and skips the sandbox.
    trusted_signers: tuple[str, ...] = ()
    #: members still being fetched (a cold load, ``client.fetch.DeferredMembers``): their
    #: files are verified except in the records ``pending.unverified`` names; see ``settled``
    pending: Any = field(default=None, compare=False)
    #: makes a member a complete, verified file in the cache on demand (``member_file``): a cold
    #: load from a local store verifies some members' weights where they lie, leaving no file
    complete: Callable[[str], Path] | None = field(default=None, compare=False)
    #: where it was read from when that is not this registry: ``HOST/REPOSITORY`` of an OCI
    #: artifact (what a trust rule's ``oci`` globs match; the artifact cannot choose it)
    location: str | None = None
    #: members verified where they lie in a bundle file a pull wrote (``BlobCache.member_in_bundle``),
    #: not in ``files``: ``member_file`` copies one into the cache when a file is wanted
    ranges: dict[str, FileRange] = field(default_factory=dict, compare=False)

    @property
    def digest(self) -> str:
        return self.manifest.digest

    def settled(self) -> MaterializedBundle:
        """This bundle with every member complete and verified (waits for a pending fetch;
        its error, e.g. ``IntegrityError``, if a chunk did not match)."""
        if self.pending is None:
            return self
        return dataclasses.replace(self, files=self.pending.wait(), pending=None)

    def unverified(self, path: str) -> frozenset[str]:
        """Records of member ``path`` whose bytes are not verified yet (raw weights torch maps)."""
        return self.pending.unverified.get(path, frozenset()) if self.pending is not None else frozenset()

    def in_place(self, path: str) -> tuple[Any, ...]:
        """Records of member ``path`` torch maps from a local store's files (``blobs.inplace``
        segments) while this bundle is pending: not in ``member_file``'s file."""
        return self.pending.in_place.get(path, ()) if self.pending is not None else ()

    def member_sources(self) -> dict[str, FileRange]:
        """Where each member's verified bytes lie (its file, or its range of a pulled bundle),
        for a writer that copies them (``rebuild_bundle``): nothing is copied into the cache."""
        out = {}
        for m in self.manifest.members:
            found = self.ranges.get(m.path) if m.path not in self.files else None
            out[m.path] = found if found is not None else FileRange(self.member_file(m.path), 0, m.size)
        return out

    def member_file(self, path: str) -> Path:
        """The verified file of member ``path`` (while pending: see ``unverified`` and
        ``in_place``); one verified where it lies in a local store is copied into the cache first."""
        if path not in self.files and self.complete is not None and self.manifest.member(path) is not None:
            self.files[path] = self.complete(path)
        try:
            return self.files[path]
        except KeyError as exc:
            raise IntegrityError(f"{self.label}: bundle has no member {path!r}", member=path) from exc


def materialize_file(path: str | os.PathLike, cache_dir: str | os.PathLike,
                     progress: Callable[[int], None] | None = None) -> MaterializedBundle:
    """Open a `.pt2b`, verify it and copy its members into the cache (hash checked on write)."""
    bundle = BundleFile.open(path)
    cache = BlobCache(cache_dir)
    files = {}
    for m in bundle.manifest.members:
        offset, size = bundle.member_span(m.path)
        files[m.path] = cache.put_member(m, FileRange(bundle.path, offset, size), progress,
                                         label=f"{path}: member {m.path}")
    return MaterializedBundle(bundle.manifest, files, list(bundle.signatures), label=str(path))


#: what a bundle file's name ends with; a model name never does (``refs.validate_name``)
BUNDLE_SUFFIXES = (".pt2b", ".pt2", ".zip")
FILE_PREFIX = "file:"


def looks_like_file(source: str) -> bool:
    """Whether what the user typed names a file: it says so (``file:PATH``), starts like a
    path (``./``, ``../``, ``/``, ``~``), or ends in a bundle suffix (``.pt2b``, ``.pt2``,
    ``.zip``), which no model name does. Decided from the text alone: what exists on disk never
    changes the meaning of a string (a file named ``team/m@1`` does not make ``team/m@1`` a file)."""
    return (source.startswith((FILE_PREFIX, "./", "../", "/", "~")) or source.endswith(BUNDLE_SUFFIXES)
            or (os.sep != "/" and source.startswith((".\\", "..\\"))))


def parse_source(source: str | os.PathLike[str]) -> Path | Ref | OciReference:
    """A bundle file (which must exist: NotFoundError, exit 3), an OCI artifact
    (``oci://HOST/REPO@sha256:...``) or a parsed ref (UsageError, exit 2, when it is none of
    them). A ``Path`` (any ``os.PathLike``) is a file; a string is a file only in the forms
    ``looks_like_file`` names, an OCI artifact only written ``oci://``, else it must be a ref. Nothing on disk is
    consulted to decide which; a string that is neither names both readings in its error.

    >>> parse_source("team/bert@prod").alias, parse_source("file:model.pt2b")    # doctest: +SKIP
    ('prod', PosixPath('model.pt2b'))
    """
    if isinstance(source, os.PathLike):
        return _existing(Path(os.fspath(source)))
    text = source
    if not isinstance(text, str):
        raise UsageError(f"expected a bundle file or a ref, got {type(source).__name__}")
    if looks_like_oci(text):
        return OciReference.parse(text)
    if looks_like_file(text):
        path = text[len(FILE_PREFIX):] if text.startswith(FILE_PREFIX) else text
        if path.startswith("//"):  # file:///abs/path (a URL): its path part
            from urllib.parse import unquote, urlsplit

            parts = urlsplit(text)
            if parts.netloc not in ("", "localhost"):
                raise UsageError(f"{text!r} names a file on another host ({parts.netloc})",
                                 hint="give a local path: file:PATH, ./PATH or /PATH")
            path = unquote(parts.path)
        if not path:
            raise UsageError(f"{text!r} names no file", hint="file:PATH, ./PATH or /PATH")
        return _existing(Path(path).expanduser(), text)
    try:
        return Ref.parse(text)
    except UsageError as exc:
        raise UsageError(f"{text!r} is neither a ref ({exc.message}) nor a bundle file name",
                         hint="a file: ./PATH, /PATH, file:PATH or a name ending in .pt2b; a ref: NAME[@N|@ALIAS|"
                              "@sha256:HEX]") from None


def _existing(path: Path, shown: str | None = None) -> Path:
    """``path``, which must exist; the error names it as the user wrote it (``shown``)."""
    if not path.exists():
        where = shown or str(path)
        raise NotFoundError(f"{where}: no such file", what="file", name=where)
    return path


def open_source(source: str | os.PathLike[str] | Ref | OciReference | MaterializedBundle, *, registry: Registry,
                progress: Callable[[int], None] | None = None,
                require_signature: Iterable[str] = (), defer_weights: bool = False,
                in_place: Callable[[MaterializedBundle], bool] | None = None) -> MaterializedBundle:
    """A bundle file or a registry ref, every member a verified local file (a ``Ref`` is a
    ref whatever its text; a string is read by ``parse_source``).

    The trust policy is enforced first (a ref is resolved once; SignatureError, exit 5, before
    any blob is fetched); ``require_signature`` (public key paths) must then have signed it,
    and its keys count as trusted. A ``MaterializedBundle`` is taken as is, the policy enforced.
    ``defer_weights``: a ref not cached may come back ``pending`` (``Registry.materialize``, and its
    ``in_place``).
    """
    keys = list(require_signature)
    if isinstance(source, MaterializedBundle):
        return registry.enforce_trust(source, require_signature=keys)
    where = source if isinstance(source, (Ref, OciReference)) else parse_source(source)
    if isinstance(where, OciReference):   # a digest pin: tags move (Registry.oci_open(..., allow_tag=True) takes one)
        return registry.oci_open(where, require_signature=keys, progress=progress).source
    if isinstance(where, Ref):
        return registry.materialize(where, progress=progress, require_signature=keys, defer_weights=defer_weights,
                                    in_place=in_place)
    return registry.open_file(where, progress=progress, require_signature=keys)
