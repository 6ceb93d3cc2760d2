"""The `.pt2b` bundle file, format 1.

Layout (a zip; every member stored uncompressed, data 64-byte aligned, fixed timestamps)::

    manifest.json            canonical JSON; sha256 of these bytes is the bundle digest
    <member paths>           every file the manifest lists (``Manifest.members``), in that (sorted) order
    build.json               optional, informational: when/who/where it was built (not signed)
    signatures.json          optional: Ed25519 signatures over the digest

Reading never trusts the zip: structure is validated first (see ``zipsafe``), the manifest is
validated against the schema, every member must be listed with the right size, and
``verify()`` checks each member's sha256 while streaming it.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable

from .chunking import hash_chunks
from ..constants import (BUILD_MEMBER, MANIFEST_MEMBER, MAX_ENVELOPE_BYTES,
                         MAX_MANIFEST_BYTES, SIGNATURES_MEMBER)
from ..digests import VerifyingReader, canonical_json, sha256_stream
from ..errors import IntegrityError, ManifestError, UnsafeArchiveError
from ..atomic import USER_FILE, atomic_write
from .manifest import Manifest, Member
from .zipsafe import ZipEntry, open_entry, read_entries, read_entry_bytes
from .zipwrite import DeterministicZipWriter

__all__ = ["BundleFile", "write_bundle", "MemberSource", "ENVELOPE_MEMBERS"]

ENVELOPE_MEMBERS = (BUILD_MEMBER, SIGNATURES_MEMBER)

#: Opens a member's bytes for writing: returns a readable stream positioned at the member.
MemberSource = Callable[[], IO[bytes]]


def write_bundle(dest: str | os.PathLike, manifest: Manifest, sources: dict[str, MemberSource], *,
                 build: dict[str, Any] | None = None, signatures: list[dict[str, Any]] | None = None,
                 progress: Callable[[int], None] | None = None) -> Path:
    """Write a bundle atomically: a temp file beside ``dest``, fsync, then rename.

    ``sources`` maps each manifest member path to a function opening its bytes. Each member is
    hashed while it is copied and the write fails (leaving nothing behind) on any mismatch.
    """
    with atomic_write(dest, mode=USER_FILE) as out, DeterministicZipWriter(out) as writer:  # the user's file
        writer.write_bytes(MANIFEST_MEMBER, manifest.canonical)
        for member in manifest.members:
            if member.path not in sources:
                raise IntegrityError(f"no data for bundle member {member.path!r}", member=member.path)
            with sources[member.path]() as src:
                writer.write_stream(member.path, _verifying(src, member, progress), member.size)
        if build:
            writer.write_bytes(BUILD_MEMBER, canonical_json(build))
        if signatures:
            writer.write_bytes(SIGNATURES_MEMBER, canonical_json({"signatures": signatures}))
    return Path(dest)


def _verifying(src: IO[bytes], member: Member, progress: Callable[[int], None] | None) -> VerifyingReader:
    """Read-through hashing; raises at the member's end when the bytes are not the manifest's."""
    return VerifyingReader(src, member.digest, size=member.size, progress=progress, mismatch=lambda _got: IntegrityError(
        f"member {member.path!r} does not match its sha256 in the manifest", member=member.path))


@dataclass(frozen=True)
class BundleFile:
    """An opened, structurally validated bundle. Call ``verify()`` before trusting member bytes.

    >>> b = BundleFile.open("model.pt2b"); b.verify(); b.manifest.digest   # doctest: +SKIP
    """

    path: Path
    manifest: Manifest
    entries: dict[str, ZipEntry]
    build: dict[str, Any] | None
    signatures: list[dict[str, Any]]

    @classmethod
    def open(cls, path: str | os.PathLike) -> "BundleFile":
        path = Path(path)
        where = str(path)
        entries = read_entries(path, where=where)
        if MANIFEST_MEMBER not in entries:
            raise UnsafeArchiveError(f"{where}: not a pt2 bundle (no manifest.json)",
                                     hint="create bundles with `pt2reg bundle`")
        raw = read_entry_bytes(path, entries[MANIFEST_MEMBER], max_size=MAX_MANIFEST_BYTES, where=where)
        try:
            manifest = Manifest.from_bytes(raw)
        except ManifestError as exc:
            raise ManifestError(f"{where}: {exc.message}", problems=exc.problems) from exc
        if manifest.canonical != raw:
            raise ManifestError(f"{where}: manifest.json is not in canonical form",
                                hint="the bundle was edited by hand; rebuild it with `pt2reg bundle`")
        listed = {m.path: m for m in manifest.members}
        for name, entry in entries.items():
            if name == MANIFEST_MEMBER or name in ENVELOPE_MEMBERS:
                continue
            member = listed.get(name)
            if member is None:
                raise UnsafeArchiveError(f"{where}: member {name!r} is not listed in the manifest", member=name)
            if member.size != entry.size:
                raise IntegrityError(f"{where}: member {name!r} is {entry.size} bytes, the manifest says "
                                     f"{member.size}", member=name)
        missing = sorted(set(listed) - set(entries))
        if missing:
            raise IntegrityError(f"{where}: member {missing[0]!r} listed in the manifest is missing",
                                 member=missing[0])
        build = _envelope(path, entries, BUILD_MEMBER, where)
        sigs = _envelope(path, entries, SIGNATURES_MEMBER, where)
        signatures = sigs.get("signatures", []) if isinstance(sigs, dict) else []
        if not isinstance(signatures, list) or not all(isinstance(s, dict) for s in signatures):
            raise UnsafeArchiveError(f"{where}: signatures.json is malformed", member=SIGNATURES_MEMBER)
        return cls(path, manifest, entries, build if isinstance(build, dict) else None, signatures)

    @property
    def digest(self) -> str:
        return self.manifest.digest

    def member(self, path: str) -> Member:
        member = self.manifest.member(path)
        if member is None:
            raise IntegrityError(f"{self.path}: no member {path!r}", member=path)
        return member

    def open_member(self, path: str) -> IO[bytes]:
        """Raw stream of a member's stored bytes (unverified)."""
        return open_entry(self.path, self.entries[path])

    def member_span(self, path: str) -> tuple[int, int]:
        """(offset, size) of a member's bytes inside the bundle file, for ranged copies."""
        e = self.entries[path]
        return e.data_offset, e.size

    def verify_member(self, member: Member, progress: Callable[[int], None] | None = None) -> None:
        """Check a member's sha256 (and its chunks' when it has them) in one streamed pass."""
        if member.chunks:
            offset, _size = self.member_span(member.path)
            spans, pos = [], 0
            for _sha, n in member.chunks:
                spans.append((pos, n))
                pos += n
            whole, hashed = hash_chunks(self.path, spans, offset=offset)
            if progress:
                progress(member.size)
            bad = next((i for i, (got, want) in enumerate(zip(hashed, member.chunks)) if got[0] != want[0]), None)
            if bad is not None and whole == member.sha256:
                raise IntegrityError(f"{self.path}: member {member.path!r} chunk {bad} does not match the "
                                     f"manifest", member=member.path, hint="the manifest was altered")
            if whole != member.sha256:
                raise IntegrityError(
                    f"{self.path}: member {member.path!r} is corrupt (sha256 {whole[:12]}..., "
                    f"manifest says {member.sha256[:12]}...)", member=member.path,
                    hint="the file was modified or damaged in transit; fetch it again")
            return
        with self.open_member(member.path) as fp:
            got, _n = sha256_stream(fp, progress=progress)
        if got != member.sha256:
            raise IntegrityError(
                f"{self.path}: member {member.path!r} is corrupt (sha256 {got[:12]}..., "
                f"manifest says {member.sha256[:12]}...)", member=member.path,
                hint="the file was modified or damaged in transit; fetch it again")

    def verify(self, progress: Callable[[int], None] | None = None) -> None:
        """Check every member's sha256 against the manifest (streamed, bounded memory)."""
        for member in self.manifest.members:
            self.verify_member(member, progress)

    def extract_member(self, path: str, dest: str | os.PathLike) -> Path:
        """Copy one member to ``dest`` atomically, verifying its sha256 on the way."""
        member = self.member(path)
        with atomic_write(dest) as out, self.open_member(path) as fp:
            if sha256_stream(fp, out=out)[0] != member.sha256:
                raise IntegrityError(f"{self.path}: member {path!r} is corrupt", member=path)
        return Path(dest)


def _envelope(path: Path, entries: dict[str, ZipEntry], name: str, where: str) -> Any:
    entry = entries.get(name)
    if entry is None:
        return None
    data = read_entry_bytes(path, entry, max_size=MAX_ENVELOPE_BYTES, where=where)
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise UnsafeArchiveError(f"{where}: {name} is not valid JSON", member=name) from exc
