"""Moving a bundle's blobs to and from a store, several at once.

A chunked member (a program split at its weights, see ``format.chunking``) is stored as one
blob per chunk, and its chunk list is its integrity: the store verifies each chunk against its
own sha256 as it transfers it, and the chunks tile the member exactly (the manifest's schema
checks the sizes). So no step needs a sequential hash of a whole member, and every chunk moves
and hashes on its own core:

* push: ``put_parts`` reads each chunk's range of the bundle file, hashes it and stores it;
* pull: ``get_parts`` writes each chunk at its place in the member's file, verified as it
  arrives, and the file becomes visible (atomically) only once every chunk matched.
"""
from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Collection

from ..atomic import atomic_write
from ..blobs.base import BlobStore, Part, ProgressFn
from ..format.bundle import BundleFile
from ..format.manifest import Manifest, Member
from ..parallel import preallocate
from ..sources import BlobCache

__all__ = ["bundle_parts", "upload_bundle", "assemble_member", "fetch_members"]


def bundle_parts(bundle: BundleFile) -> list[Part]:
    """Every blob a bundle is stored as, where it sits in the bundle file: one per chunk of a
    chunked member, one per other member."""
    parts = []
    for m in bundle.manifest.members:
        offset, _size = bundle.member_span(m.path)
        if m.chunks:
            parts.extend(Part("sha256:" + sha, offset + at, size) for sha, at, size in m.chunk_spans())
        else:
            parts.append(Part(m.digest, offset, m.size))
    return parts


def upload_bundle(bundle: BundleFile, blobs: BlobStore, progress: ProgressFn | None, *,
                  unrecorded: Collection[str] = ()) -> tuple[int, int]:
    """Store every blob of an opened bundle file (several at once); returns (bytes uploaded,
    bytes already stored). ``IntegrityError`` (exit 5) when a chunk does not match its digest.
    ``unrecorded``: digests no version records (stored without asking the store first)."""
    return blobs.put_parts(bundle.path, bundle_parts(bundle), progress=progress, unrecorded=unrecorded)


def assemble_member(member: Member, blobs: BlobStore, dest: str | os.PathLike,
                    progress: ProgressFn | None) -> None:
    """Rebuild a chunked member at ``dest`` (atomically) from its chunk blobs, fetched several
    at once into their places, each verified; nothing is left behind on failure. Not fsynced:
    a cache file (see ``BlobCache``: re-hashed after a reboot)."""
    parts = [Part("sha256:" + sha, offset, size) for sha, offset, size in member.chunk_spans()]
    with atomic_write(Path(dest), fsync=False) as out:
        out.flush()
        preallocate(out.fileno(), member.size)
        blobs.get_parts(out.fileno(), parts, progress=progress)


def fetch_members(manifest: Manifest, blobs: BlobStore, cache: BlobCache, progress: ProgressFn | None
                  ) -> dict[str, Path]:
    """Every member of ``manifest`` as a verified file in ``cache`` (fetched from ``blobs``
    unless already cached intact), and the manifest itself cached; ``{member path: file}``."""
    files = {}
    for m in manifest.members:
        path = cache.member_path(m)
        if not cache.usable_member(m):
            path.parent.mkdir(parents=True, exist_ok=True)
            if m.chunks:
                assemble_member(m, blobs, path, progress)
            else:
                blobs.get_file(m.digest, path, progress=progress)
            os.chmod(path, 0o444)
            cache.stamp_member(m)
        elif progress:
            progress(m.size)
        files[m.path] = path
    if not cache.has(manifest.digest):
        cache.put_stream(manifest.digest, io.BytesIO(manifest.canonical))
    return files
