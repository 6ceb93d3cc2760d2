"""The `.pt2b` bundle file, formats 1 and 2.

Layout (a zip; every member stored uncompressed, data 64-byte aligned, fixed timestamps)::

    manifest.json            canonical JSON; sha256 of these bytes is the bundle digest
    <member paths>           every file the manifest lists (``Manifest.members``), in that (sorted) order
    build.json               optional, informational: when/who/where it was built (not signed)
    signatures.json          optional: Ed25519 signatures over the digest

Reading never trusts the zip: structure is validated first (see ``zipsafe``), the manifest is
validated against the schema, every member must be listed with the right size, and
``verify()`` checks every chunk of a chunked member (its chunk list is its integrity: format 2
records no whole-member sha256, and a format-1 one is not needed) and every other member's
sha256, on every core. Writing places every member first and fills them in parallel, each
chunk hashed in the pass that copies it; the manifest, which leads the file, is written last.
"""
from __future__ import annotations

import bisect
import itertools
import json
import os
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..atomic import USER_FILE, atomic_write
from ..constants import BUILD_MEMBER, MANIFEST_MEMBER, MAX_ENVELOPE_BYTES, MAX_MANIFEST_BYTES, SIGNATURES_MEMBER
from ..digests import canonical_json
from ..errors import IntegrityError, ManifestError, UnsafeArchiveError
from ..parallel import (
    Flusher,
    Hashed,
    Job,
    Segment,
    crc32,
    crc32_combine,
    crc32_later,
    hash_ranges,
    preallocate,
    pwrite_all,
)
from .manifest import Manifest, Member
from .zipsafe import ZipEntry, open_entry, read_entries, read_entry_bytes
from .zipwrite import DeterministicZipWriter

__all__ = ["BundleFile", "write_bundle", "write_bundle_filled", "MemberSource", "FileRange", "ENVELOPE_MEMBERS", "PLACEHOLDER",
           "member_jobs", "copy_member"]

ENVELOPE_MEMBERS = (BUILD_MEMBER, SIGNATURES_MEMBER)
#: the digest a draft manifest carries where ``write_bundle(fill_digests=True)`` computes one
#: (same length as any sha256 hex, so the manifest's size is known before its digests)
PLACEHOLDER = "0" * 64


@dataclass(frozen=True)
class FileRange:
    """``size`` bytes at ``offset`` of a local file: a member's bytes, or a run of them.
    ``crc32``: what the file's own zip directory says these bytes sum to (a weight copied
    verbatim from a `.pt2`), checked as they are copied; None (or 0: written without) for none."""

    path: Path
    offset: int
    size: int
    crc32: int | None = None


#: A member's bytes for ``write_bundle``: a function opening a stream positioned at them
#: (copied in order), or the file ranges they are made of, in order (copied on every core).
MemberSource = Callable[[], IO[bytes]] | FileRange | Sequence[FileRange]


class _Files:
    """Read-only descriptors of the files member sources live in, each opened once."""

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}

    def fd(self, path: Path) -> int:
        if path not in self._fds:
            self._fds[path] = os.open(path, os.O_RDONLY)
        return self._fds[path]

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class _Concat:
    """The concatenation of ``ranges``: where each span of it lies (a binary search over the
    ranges' starts, so a member of thousands of ranges costs O(log n) per chunk)."""

    def __init__(self, ranges: Sequence[FileRange]) -> None:
        self.ranges = tuple(ranges)
        self.starts = list(itertools.accumulate((r.size for r in self.ranges), initial=0))

    def overlaps(self, start: int, size: int) -> list[tuple[int, int, int]]:
        """(index of the range, offset in it, length) of each piece of ``[start, start+size)``,
        in order."""
        out = []
        i = max(0, bisect.bisect_right(self.starts, start) - 1)
        end = start + size
        while i < len(self.ranges) and self.starts[i] < end:
            pos = self.starts[i]
            lo, hi = max(start, pos), min(end, pos + self.ranges[i].size)
            if lo < hi:
                out.append((i, lo - pos, hi - lo))
            i += 1
        return out


def _slice(concat: _Concat, files: _Files, start: int, size: int) -> tuple[Segment, ...]:
    """The segments holding bytes ``[start, start+size)`` of the concatenation."""
    return tuple(Segment(files.fd(concat.ranges[i].path), concat.ranges[i].offset + off, n)
                 for i, off, n in concat.overlaps(start, size))


def _check_range_crcs(member: Member, concat: _Concat, jobs: Sequence[Job], done: Sequence[Hashed]) -> None:
    """Each range that names its CRC-32 sums to it (from the CRC of every piece of it, in order)."""
    ranges = concat.ranges
    if not any(r.crc32 for r in ranges):
        return
    sums = [0] * len(ranges)
    for job, result in zip(jobs, done):
        start = job.out_offset - jobs[0].out_offset
        for (i, _off, n), crc in zip(concat.overlaps(start, sum(s.size for s in job.segments)),
                                     result.segment_crcs):
            sums[i] = crc32_combine(sums[i], crc, n)
    for r, got in zip(ranges, sums):
        if r.crc32 and got != r.crc32:
            raise IntegrityError(f"{r.path}: the {r.size} bytes at offset {r.offset} do not match the CRC-32 "
                                 f"its zip directory records for them: the file is damaged", member=member.path,
                                 hint="export the program again (or copy it again from where it was written)")


def member_jobs(member: Member, segments: Callable[[int, int], tuple[Segment, ...]], *,
                out_fd: int | None = None, out_offset: int = 0, check: bool = True) -> list[Job]:
    """One job per chunk of ``member`` (one for the whole of an unchunked member), reading its
    bytes from ``segments(start, size)``, written at ``out_offset`` + its place when ``out_fd``
    is given, checked against the manifest when ``check``."""
    if member.chunks:
        return [Job(segments(off, n), out_fd, out_offset + off, sha if check else None)
                for sha, off, n in member.chunk_spans()]
    return [Job(segments(0, member.size), out_fd, out_offset, member.sha256 if check else None)]


def _mismatch(member: Member, where: str) -> Callable[[int, str], IntegrityError]:
    def error(i: int, got: str) -> IntegrityError:
        what = f"chunk {i} of member {member.path!r}" if member.chunks else f"member {member.path!r}"
        return IntegrityError(f"{where}{what} is corrupt: it does not match its sha256 in the manifest "
                              f"(got {got[:12]}...)", member=member.path,
                              hint="the file was modified or damaged in transit, or its manifest altered")
    return error


def _run_member_jobs(plan: Sequence[tuple[Member, list[Job]]], where: str, *, crc: bool = False,
                     progress: Callable[[int], None] | None = None, writeback: bool = False
                     ) -> list[list[Hashed]]:
    """Every job of every member on all cores, in one batch; the results grouped by member."""
    flat = [(m, k, j) for m, jobs in plan for k, j in enumerate(jobs)]

    def mismatch(i: int, got: str) -> IntegrityError:
        member, k, _job = flat[i]
        return _mismatch(member, where)(k, got)

    results = hash_ranges([j for _m, _k, j in flat], crc=crc, progress=progress, mismatch=mismatch,
                          writeback=writeback)
    grouped, pos = [], 0
    for _m, jobs in plan:
        grouped.append(results[pos:pos + len(jobs)])
        pos += len(jobs)
    return grouped


def _combined_crc(results: Sequence[Hashed]) -> int:
    crc = 0
    for r in results:
        crc = crc32_combine(crc, r.crc32, r.size)
    return crc


def write_bundle(dest: str | os.PathLike, manifest: Manifest, sources: Mapping[str, MemberSource], *,
                 build: dict[str, Any] | None = None, signatures: list[dict[str, Any]] | None = None,
                 progress: Callable[[int], None] | None = None, fill_digests: bool = False) -> Manifest:
    """Write a bundle atomically: a temp file beside ``dest``, fsync, then rename.

    ``sources`` maps each manifest member path to its bytes (``MemberSource``). File ranges are
    copied on every core, one chunk per worker, each chunk hashed in the pass that writes it;
    the write fails (leaving nothing behind) when a chunk does not match the manifest. With
    ``fill_digests`` the manifest is a draft whose member and chunk sha256s are ``PLACEHOLDER``
    (sizes and chunk sizes exact): they are computed in that same pass, and the manifest,
    placed first, is written last. Returns the manifest written.
    """
    check = not fill_digests
    with atomic_write(dest, mode=USER_FILE) as out, DeterministicZipWriter(out) as writer:
        for member in manifest.members:
            if member.path not in sources:
                raise IntegrityError(f"no data for bundle member {member.path!r}", member=member.path)
        manifest_at, places = _lay_out(out, writer, manifest, build, signatures)
        fd = out.fileno()
        files = _Files()
        try:
            plan, planned = [], []
            results: dict[str, list[Hashed]] = {}
            for member in manifest.members:
                src = sources[member.path]
                if callable(src):
                    with src() as stream:
                        results[member.path] = _copy_stream(stream, member, fd, places[member.path], check, progress)
                    continue
                concat = _Concat((src,) if isinstance(src, FileRange) else tuple(src))
                if concat.starts[-1] != member.size:
                    raise IntegrityError(f"the data for member {member.path!r} is not {member.size} bytes",
                                         member=member.path)
                plan.append((member, member_jobs(member, lambda a, n, r=concat: _slice(r, files, a, n),
                                                 out_fd=fd, out_offset=places[member.path], check=check)))
                planned.append(concat)
            with Flusher(fd) as flusher:   # durable as it goes: the final fsync finds little to do
                def wrote(n: int) -> None:
                    flusher.wrote(n)
                    if progress is not None:
                        progress(n)

                copied = _run_member_jobs(plan, "", crc=True, progress=wrote, writeback=True)
            for (member, jobs), concat, done in zip(plan, planned, copied):
                _check_range_crcs(member, concat, jobs, done)
                results[member.path] = done
        finally:
            files.close()
        for member in manifest.members:
            writer.set_crc(member.path, _combined_crc(results[member.path]))
        if fill_digests:
            manifest = _filled(manifest, results)
        pwrite_all(fd, manifest.canonical, manifest_at)
        writer.set_crc(MANIFEST_MEMBER, zlib.crc32(manifest.canonical))
    return manifest


def _lay_out(out: IO[bytes], writer: DeterministicZipWriter, manifest: Manifest, build: dict[str, Any] | None,
             signatures: list[dict[str, Any]] | None) -> tuple[int, dict[str, int]]:
    """A bundle's zip laid out (the manifest first, every member reserved in manifest order,
    then the build record and signatures written) and the file preallocated to its end:
    (where the manifest goes, where each member goes)."""
    manifest_at = writer.reserve(MANIFEST_MEMBER, len(manifest.canonical))
    places = {m.path: writer.reserve(m.path, m.size) for m in manifest.members}
    if build:
        writer.write_bytes(BUILD_MEMBER, canonical_json(build))
    if signatures:
        writer.write_bytes(SIGNATURES_MEMBER, canonical_json({"signatures": signatures}))
    out.flush()
    preallocate(out.fileno(), writer.end)
    return manifest_at, places


def write_bundle_filled(dest: str | os.PathLike, manifest: Manifest, fill: Callable[[int, Mapping[str, int]], None],
                        *, build: dict[str, Any] | None = None,
                        signatures: list[dict[str, Any]] | None = None) -> Manifest:
    """``write_bundle`` (the same bytes) whose members are written by ``fill(fd, places)``: each
    member's bytes at ``places[path]`` of the open file, written and verified by the caller (a
    pull fetches each chunk into its place, hashed against its sha256 as it streams, instead of
    into a cache and then copying it). The zip's CRC-32s are then read back from the file (the
    page cache), one range per chunk on every core. Atomic as ``write_bundle``."""
    with atomic_write(dest, mode=USER_FILE) as out, DeterministicZipWriter(out) as writer:
        manifest_at, places = _lay_out(out, writer, manifest, build, signatures)
        fd = out.fileno()
        fill(fd, places)
        for member, crc in zip(manifest.members, _crcs(fd, manifest, places)):
            writer.set_crc(member.path, crc)
        pwrite_all(fd, manifest.canonical, manifest_at)
        writer.set_crc(MANIFEST_MEMBER, zlib.crc32(manifest.canonical))
    return manifest


def _crcs(fd: int, manifest: Manifest, places: Mapping[str, int]) -> list[int]:
    """The CRC-32 of each member as it lies in ``fd`` at ``places``, its chunks read on every core."""
    from ..parallel import WORKERS, run_parallel, thread_buffer

    spans = [(i, places[m.path] + off, n) for i, m in enumerate(manifest.members)
             for _sha, off, n in (m.chunk_spans() if m.chunks else [("", 0, m.size)])]

    def crc_of(span: tuple[int, int, int]) -> tuple[int, int, int]:
        i, at, n = span
        buf, crc, done = thread_buffer(), 0, 0
        while done < n:
            got = os.preadv(fd, [buf[:min(len(buf), n - done)]], at + done)
            if got <= 0:
                raise IntegrityError(f"the bundle being written ended at byte {at + done}")
            crc = crc32(buf[:got], crc)
            done += got
        return i, crc, n

    out = [0] * len(manifest.members)
    for i, crc, n in run_parallel(crc_of, spans, WORKERS):
        out[i] = crc32_combine(out[i], crc, n)
    return out


def _copy_stream(stream: IO[bytes], member: Member, fd: int, offset: int, check: bool,
                 progress: Callable[[int], None] | None) -> list[Hashed]:
    """A member from a stream, in order: each chunk hashed (and checked) as it is written."""
    import hashlib

    out = []
    spans = member.chunk_spans() if member.chunks else [(member.sha256, 0, member.size)]
    for i, (want, off, n) in enumerate(spans):
        h, crc, pos = hashlib.sha256(), 0, offset + off

        def sink(data: bytes) -> None:   # called by _pump_exact below, in this iteration
            nonlocal crc, pos
            summed = crc32_later(data, crc)   # on the CRC thread, meanwhile (as hash_copy)
            h.update(data)  # noqa: B023
            pwrite_all(fd, data, pos)
            crc = summed.result()
            pos += len(data)

        got = _pump_exact(stream, sink, n, member, progress)
        if check and h.hexdigest() != want:
            raise _mismatch(member, "")(i, h.hexdigest())
        out.append(Hashed(h.hexdigest(), crc, got))
    return out


def _pump_exact(stream: IO[bytes], sink: Callable[[bytes], None], n: int, member: Member,
                progress: Callable[[int], None] | None) -> int:
    from ..digests import pump

    got = pump(stream, sink, size=n, progress=progress)
    if got != n:
        raise IntegrityError(f"the data for member {member.path!r} ended {n - got} bytes early", member=member.path)
    return got


def _filled(draft: Manifest, results: Mapping[str, list[Hashed]]) -> Manifest:
    """The draft manifest with the sha256s computed while its members were written."""
    raw = draft.to_json()
    for m in raw["members"]:
        done = results[m["path"]]
        if "chunks" in m:
            m["chunks"] = [{"sha256": r.sha256, "size": r.size} for r in done]
        else:
            m["sha256"] = done[0].sha256
    final = Manifest.from_raw(raw)
    if len(final.canonical) != len(draft.canonical):  # digests are fixed-width: never happens
        raise ManifestError("the manifest changed size when its digests were filled in")
    return final


def copy_member(member: Member, source: Sequence[FileRange], dest_fd: int | None, *,
                progress: Callable[[int], None] | None = None, where: str = "", at: int = 0) -> None:
    """Copy a member's bytes into ``dest_fd`` (from offset ``at``) on every core, each chunk checked
    against the manifest in the pass that writes it: ``IntegrityError`` (discard the file)."""
    files = _Files()
    if dest_fd is not None and at == 0:
        preallocate(dest_fd, member.size)
    try:
        concat = _Concat(source)
        jobs = member_jobs(member, lambda a, n: _slice(concat, files, a, n), out_fd=dest_fd, out_offset=at)
        _run_member_jobs([(member, jobs)], where, progress=progress)
    finally:
        files.close()


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
    def open(cls, path: str | os.PathLike) -> BundleFile:
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

    def _range(self, member: Member) -> tuple[FileRange]:
        offset, _size = self.member_span(member.path)
        return (FileRange(self.path, offset, member.size),)

    def verify_members(self, members: Sequence[Member], progress: Callable[[int], None] | None = None) -> None:
        """Check members against the manifest on every core: each chunk's sha256 (a chunked
        member's chunk list is its integrity), or an unchunked member's sha256."""
        files = _Files()
        try:
            plan = [(m, member_jobs(m, lambda a, n, r=_Concat(self._range(m)): _slice(r, files, a, n))) for m in members]
            _run_member_jobs(plan, f"{self.path}: ", progress=progress)
        finally:
            files.close()

    def verify(self, progress: Callable[[int], None] | None = None) -> None:
        """Check every member against the manifest (all cores, bounded memory)."""
        self.verify_members(self.manifest.members, progress)

    def extract_member(self, path: str, dest: str | os.PathLike) -> Path:
        """Copy one member to ``dest`` atomically, verifying it on the way."""
        member = self.member(path)
        with atomic_write(dest) as out:
            out.flush()
            copy_member(member, self._range(member), out.fileno(), where=f"{self.path}: ")
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
