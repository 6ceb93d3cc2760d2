"""Fetching a version: a ref resolved once, its members made verified files in the local cache,
and the bundle file rebuilt from them. ``Registry.materialize`` and ``Registry.pull`` are the
public entry points; this module holds their bodies.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..blobs.base import ProgressFn
from ..errors import IntegrityError
from ..format.bundle import FileRange, write_bundle
from ..format.manifest import Manifest
from ..format.packs import PackIndex
from ..refs import Ref
from .fetch import IndexSource, fetch_members, fetch_members_deferred
from .ports import BlobStore, MetadataStore
from .sources import BlobCache, MaterializedBundle, PinnedManifest

if TYPE_CHECKING:
    from ..store.records import VersionRecord

__all__ = ["Located", "PullResult", "describe_version", "fetch_version", "fetch_pinned", "rebuild_bundle",
           "pull_direct", "fill_members", "local_sources"]


@dataclass(frozen=True)
class Located:
    """A ref resolved once (``Registry.locate``): the version the database names; or, for a
    digest pin this machine holds whole, the cached bundle; or, for one whose manifest it holds
    while its weights lie in a local store, what the cache kept of it (``pinned``). Neither of the
    last two contacts the database."""

    ref: Ref
    version: VersionRecord | None = None
    cached: MaterializedBundle | None = None
    #: a digest pin whose members are not all cached, served from a local store with what the
    #: cache kept of its manifest (``fetch_pinned``): no database contact either
    pinned: PinnedManifest | None = None

    @property
    def size(self) -> int:
        if self.version is not None:
            return self.version.size
        if self.pinned is not None:
            return self.pinned.manifest.total_size
        assert self.cached is not None
        return self.cached.manifest.total_size

    @property
    def label(self) -> str:
        return f"{self.version.name}@{self.version.number}" if self.version is not None else str(self.ref)


@dataclass(frozen=True)
class PullResult:
    path: Path
    version: VersionRecord
    source: MaterializedBundle
    warnings: tuple[str, ...] = ()


def describe_version(meta: MetadataStore, version: VersionRecord, *,
                     enforce_trust: Callable[[MaterializedBundle], MaterializedBundle]) -> MaterializedBundle:
    """``version``'s manifest (checked against its digest) and signatures, the trust policy
    enforced, no member fetched (``files`` empty): what ``fetch_version`` starts from, and all
    ``pt2reg verify --target FILE REF`` needs."""
    manifest = Manifest.from_bytes((version.manifest_json or "").encode("utf-8"), version.digest)
    if manifest.digest != version.digest:
        raise IntegrityError(f"{version.name}@{version.number}: stored manifest does not match "
                             f"its digest {version.digest}", hint="the metadata database was altered")
    sigs = [s.to_json() for s in meta.signatures(version.name, version.number)]
    return enforce_trust(MaterializedBundle(manifest, {}, sigs, label=f"{version.name}@{version.number}",
                                            name=version.name, version=version.number))


def fetch_version(meta: MetadataStore, blobs: BlobStore, cache: BlobCache, version: VersionRecord, *,
                  enforce_trust: Callable[[MaterializedBundle], MaterializedBundle],
                  progress: ProgressFn | None = None, defer_weights: bool = False,
                  in_place: Callable[[MaterializedBundle], bool] | None = None) -> MaterializedBundle:
    """Every member of ``version`` as a verified file in ``cache``. ``enforce_trust`` (the
    trust policy) sees the digest and signatures before any blob is fetched. ``defer_weights``:
    raw weight chunks may still be fetching when this returns (``src.pending``); ``in_place``
    (default: always) whether they may be verified where they lie in a local store."""
    src = describe_version(meta, version, enforce_trust=enforce_trust)
    sigs = src.signatures
    # parsed when a member needs it, its large chunks already under way (``fetch.assemble_member``)
    index = functools.cache(functools.partial(PackIndex.from_stored, version.packs_json,
                                              f"{version.name}@{version.number}"))
    src = _fetch_members_of(src, index, blobs, cache, progress=progress, defer_weights=defer_weights,
                            in_place=in_place)
    index()   # read by now unless every member was cached: a stored index that is not valid fails it all the same
    cache.remember_signatures(version.digest, sigs)   # what a later cached pin is served with
    cache.remember_name(version.digest, version.name)
    cache.remember_packs(version.digest, version.packs_json, blobs.url)
    return src


def fetch_pinned(pin: PinnedManifest, ref: Ref, blobs: BlobStore, cache: BlobCache, *,
                 enforce_trust: Callable[[MaterializedBundle], MaterializedBundle],
                 progress: ProgressFn | None = None, defer_weights: bool = False,
                 in_place: Callable[[MaterializedBundle], bool] | None = None) -> MaterializedBundle:
    """``fetch_version`` for a digest pin whose manifest, signatures and pack index the cache
    kept (``BlobCache.pinned_manifest``), from a local store: no database contact. What a load
    from a local store that left its weights in place (not in the cache) is served with."""
    src = enforce_trust(MaterializedBundle(pin.manifest, {}, pin.signatures, label=str(ref), name=ref.name))
    return _fetch_members_of(src, pin.packs, blobs, cache, progress=progress, defer_weights=defer_weights,
                             in_place=in_place)


def _fetch_members_of(src: MaterializedBundle, index: IndexSource, blobs: BlobStore,
                      cache: BlobCache, *,
                      progress: ProgressFn | None, defer_weights: bool,
                      in_place: Callable[[MaterializedBundle], bool] | None) -> MaterializedBundle:
    manifest = src.manifest
    pending, complete = None, None
    if defer_weights:
        files, pending = fetch_members_deferred(manifest, blobs, cache, progress, index,
                                                in_place=in_place is None or in_place(src))

        def copy_member(path: str) -> Path:  # a member verified in place, wanted as a file after all
            others = {m.path for m in manifest.members if m.path != path}
            return fetch_members(manifest, blobs, cache, None, skip=others, index=index)[path]

        complete = copy_member
    else:
        files = fetch_members(manifest, blobs, cache, progress, index=index)
    return dataclasses.replace(src, files=files, pending=pending, complete=complete)


def rebuild_bundle(src: MaterializedBundle, version: VersionRecord, out: str | os.PathLike[str],
                   build: dict | None) -> PullResult:
    """Write the bundle file of a materialized version at ``out`` (atomically), with its build
    record and signatures; a yanked or deprecated version says so in the warnings."""
    write_bundle(out, src.manifest, src.member_sources(), build=build, signatures=src.signatures or None)
    warnings = []
    if version.status in ("yanked", "deprecated"):
        warnings.append(f"{version.name}@{version.number} is {version.status}: {version.status_reason}")
    return PullResult(Path(out), version, src, tuple(warnings))


def fill_members(manifest: Manifest, blobs: BlobStore, cache: BlobCache, index: PackIndex | None,
                 progress: ProgressFn | None) -> Callable[[int, Mapping[str, int]], None]:
    """What ``format.bundle.write_bundle_filled`` calls to write a bundle's members: each member
    cached intact is copied from the cache, the others fetched from ``blobs`` chunk by chunk
    straight into their places (``client.fetch.fetch_parts``, each chunk verified against its
    sha256 as it arrives: a chunk that does not match is ``IntegrityError`` and nothing is left)."""
    from ..blobs.base import Part
    from ..format.bundle import copy_member
    from .fetch import fetch_parts, member_parts

    def fill(fd: int, places: Mapping[str, int]) -> None:
        for m in manifest.members:
            at = places[m.path]
            found = cache.member_source(m)
            if found is not None:
                copy_member(m, [found], fd, progress=progress, at=at)
            elif m.chunks:
                fetch_parts(blobs, fd, [p._replace(offset=p.offset + at) for p in member_parts(m, index)],
                            progress=progress)
            else:
                blobs.get_parts(fd, [Part(m.digest, at, m.size)], progress=progress)
    return fill


def local_sources(manifest: Manifest, blobs: BlobStore, cache: BlobCache,
                  index: PackIndex | None) -> dict[str, list[FileRange]] | None:
    """Where each member's bytes lie as local files (members verified on this machine where
    ``BlobCache.member_source`` finds them, the others chunk by chunk in a local store's blob
    and pack files), for ``write_bundle`` to copy in one pass, each chunk hashed against the
    manifest as it is written; None when the store's blobs are not local files (they are
    fetched: ``fill_members``)."""
    from ..blobs.packed import PackedPart
    from .fetch import member_parts

    out: dict[str, list[FileRange]] = {}
    for m in manifest.members:
        found = cache.member_source(m)
        if found is not None:
            out[m.path] = [found]
            continue
        ranges: list[FileRange] = []
        for p in (member_parts(m, index) if m.chunks else [None]):
            if p is None:
                path = blobs.local_file(m.digest, m.size)
                at, n = 0, m.size
            elif type(p) is PackedPart:
                path = blobs.local_file(p.pack)
                at, n = p.pack_offset, p.size
            else:
                path = blobs.local_file(p.digest, p.size)
                at, n = 0, p.size
            if path is None:
                return None
            ranges.append(FileRange(Path(path), at, n))
        out[m.path] = ranges
    return out


def pull_direct(meta: MetadataStore, blobs: BlobStore, cache: BlobCache, version: VersionRecord,
                out: str | os.PathLike[str], *, build: dict | None,
                enforce_trust: Callable[[MaterializedBundle], MaterializedBundle],
                progress: ProgressFn | None = None) -> PullResult:
    """``version``'s bundle file at ``out`` (atomically), every byte written once: the trust
    policy enforced on its manifest and signatures first, then every member written into its
    place (from a local store's files, or fetched chunk by chunk), each chunk hashed against
    the manifest as it is written. The cache is not given a second copy: it records where the
    members lie verified in ``out`` (``BlobCache.remember_bundle``) with the manifest, signatures,
    name and pack index, so a pinned ref pulled again is served from there without the
    database or the store, as long as ``out`` is unchanged."""
    from ..blobs.base import locked_progress
    from ..format.bundle import write_bundle_filled
    from ..parallel import gc_held

    src = describe_version(meta, version, enforce_trust=enforce_trust)
    label = f"{version.name}@{version.number}"
    index = PackIndex.from_stored(version.packs_json, label)
    with gc_held():
        local = local_sources(src.manifest, blobs, cache, index)
        written = False
        if local is not None:   # a local store: copied from its files as the bundle is written (one pass)
            try:
                write_bundle(out, src.manifest, local, build=build, signatures=src.signatures or None,
                             progress=progress)
                written = True
            except (IntegrityError, OSError):
                # a damaged store file (its bytes, or one cut short): nothing was written; the
                # fetch below reads each blob and pack within its bounds and names the one at fault
                pass
        if not written:
            write_bundle_filled(out, src.manifest, fill_members(src.manifest, blobs, cache, index,
                                                                locked_progress(progress)),
                                build=build, signatures=src.signatures or None)
    cache.put_manifest(src.manifest)
    cache.remember_signatures(version.digest, src.signatures)   # what a later cached pin is served with
    cache.remember_name(version.digest, version.name)
    cache.remember_packs(version.digest, version.packs_json, blobs.url)
    cache.remember_bundle(out, src.manifest)
    warnings = []
    if version.status in ("yanked", "deprecated"):
        warnings.append(f"{version.name}@{version.number} is {version.status}: {version.status_reason}")
    return PullResult(Path(out), version, src, tuple(warnings))
