"""Entry-level chunking of members, for dedup in the store and hashing on every core.

A `.pt2` stores every weight as its own uncompressed, aligned zip entry. A program member is
split at its entries (``entry_span``): a weight of at least ``MIN_CHUNK`` bytes is a chunk of
its own (its data alone, so it is the same chunk whatever its header says), and every smaller
entry is one chunk with its local header (the header holds the entry's CRC, so a changed tiny
tensor changes one chunk, not two). The bytes left between them (a big weight's header, the
central directory) are glue chunks. Every tensor is thus its own unit of dedup; the store packs
the small chunks it must upload into pack objects (``format.packs``), so ten thousand tiny
tensors cost a few blobs, not ten thousand. Any chunk larger than ``PIECE`` (one big embedding
table) is cut into ``PIECE``-sized pieces, counted from its own start, so a huge tensor is
hashed, uploaded and fetched in parallel too, a failed transfer resumes per piece, and a
fine-tune that changes another tensor still shares every piece of it. The chunks cover the
member exactly, in order (concatenated they rebuild it byte for byte), and they are its
integrity: no step needs a sequential hash of a whole member. Bundles made before entry-level
chunking coalesced the entries under ``MIN_CHUNK`` into glue chunks; they read, push and pull
as before (a reader accepts any tiling).

    >>> plan_chunks([(100, 1 << 20)], total=(1 << 20) + 400)
    [(0, 100), (100, 1048576), (1048676, 300)]
    >>> [n >> 20 for _, n in plan_chunks([(0, 150 << 20)], total=150 << 20)]
    [64, 64, 22]
"""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from typing import Protocol

__all__ = ["MIN_CHUNK", "MIN_MEMBER", "PIECE", "entry_span", "plan_chunks", "chunks_inside"]

#: entries at least this large get a chunk of their own
MIN_CHUNK = 64 * 1024
#: members smaller than this are stored whole
MIN_MEMBER = 1024 * 1024
#: no chunk is larger: bigger entries (and glue) are cut into pieces of this size
PIECE = 64 * 1024 * 1024


def _pieces(start: int, length: int, piece: int) -> list[tuple[int, int]]:
    return [(start + off, min(piece, length - off)) for off in range(0, length, piece)]


class _Entry(Protocol):
    header_offset: int
    data_offset: int
    size: int


def entry_span(entry: _Entry) -> tuple[int, int]:
    """(start, length) of the chunk a zip entry becomes: a weight of ``MIN_CHUNK`` bytes or more
    is its data alone; a smaller entry is its local header and data together.

    >>> from types import SimpleNamespace as E
    >>> entry_span(E(header_offset=0, data_offset=64, size=1 << 20)), entry_span(E(header_offset=0, data_offset=64, size=10))
    ((64, 1048576), (0, 74))
    """
    if entry.size >= MIN_CHUNK:
        return entry.data_offset, entry.size
    return entry.header_offset, entry.data_offset + entry.size - entry.header_offset


def plan_chunks(spans: Iterable[tuple[int, int]], total: int, *, min_chunk: int = MIN_CHUNK,
                piece: int | None = None) -> list[tuple[int, int]]:
    """(start, length) chunks covering [0, total): one per span >= min_chunk, glue between,
    each cut into pieces of at most ``piece`` bytes (``PIECE``, read when called)."""
    piece = piece or PIECE
    chunks: list[tuple[int, int]] = []
    pos = 0
    for start, length in sorted(spans):
        if length < min_chunk or start < pos or start + length > total:
            continue
        if start > pos:
            chunks.extend(_pieces(pos, start - pos, piece))
        chunks.extend(_pieces(start, length, piece))
        pos = start + length
    if pos < total:
        chunks.extend(_pieces(pos, total - pos, piece))
    return chunks


def chunks_inside(chunks: Sequence[tuple[int, int]], spans: Iterable[tuple[int, int]]) -> list[int]:
    """Indices of the (start, length) ``chunks`` that lie wholly inside one of ``spans``
    (start, length; not overlapping): the chunks holding nothing but the bytes of one span.

    >>> chunks_inside([(0, 100), (100, 50), (150, 50), (200, 10)], [(100, 100), (205, 10)])
    [1, 2]
    """
    ordered = sorted((s, s + n) for s, n in spans if n > 0)
    starts = [s for s, _ in ordered]
    out = []
    for i, (start, length) in enumerate(chunks):
        k = bisect_right(starts, start) - 1
        if length > 0 and k >= 0 and start + length <= ordered[k][1]:
            out.append(i)
    return out
