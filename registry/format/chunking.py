"""Weight-level chunking of program members, for dedup in the store.

A `.pt2` stores every weight as its own uncompressed, aligned zip entry. A member is split at
entry boundaries: each entry of at least ``MIN_CHUNK`` bytes becomes its own chunk, and the
bytes between them (zip headers, small JSON, the central directory) coalesce into glue chunks.
The chunks cover the member exactly, in order, so concatenating them rebuilds it byte for byte.
A fine-tune that changes one layer shares every other chunk with its parent, and a weight
shared by two programs of a bundle is one chunk.

    >>> plan_chunks([(100, 1 << 20)], total=(1 << 20) + 400)
    [(0, 100), (100, 1048576), (1048676, 300)]
"""
from __future__ import annotations

import hashlib
import os
from typing import Iterable

from ..digests import pump

__all__ = ["MIN_CHUNK", "MIN_MEMBER", "plan_chunks", "hash_chunks"]

#: entries at least this large get a chunk of their own
MIN_CHUNK = 64 * 1024
#: members smaller than this are stored whole
MIN_MEMBER = 1024 * 1024


def plan_chunks(spans: Iterable[tuple[int, int]], total: int, *, min_chunk: int = MIN_CHUNK
                ) -> list[tuple[int, int]]:
    """(start, length) chunks covering [0, total): one per span >= min_chunk, glue between."""
    chunks: list[tuple[int, int]] = []
    pos = 0
    for start, length in sorted(spans):
        if length < min_chunk or start < pos or start + length > total:
            continue
        if start > pos:
            chunks.append((pos, start - pos))
        chunks.append((start, length))
        pos = start + length
    if pos < total:
        chunks.append((pos, total - pos))
    return chunks


def hash_chunks(path: str | os.PathLike, chunks: list[tuple[int, int]], *, offset: int = 0
                ) -> tuple[str, list[tuple[str, int]]]:
    """One read pass: (sha256 of the whole range, [(sha256, size) per chunk])."""
    whole = hashlib.sha256()
    out = []
    with open(path, "rb") as f:
        f.seek(offset + (chunks[0][0] if chunks else 0))
        for _start, length in chunks:
            h = hashlib.sha256()
            if pump(f, h.update, whole.update, size=length) != length:
                raise OSError(f"{path} ended early while hashing chunks")
            out.append((h.hexdigest(), length))
    return whole.hexdigest(), out
