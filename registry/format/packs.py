"""Pack indexes: where a version's small chunks are stored, inside pack blobs.

Every tensor of a program is its own chunk (``format.chunking``), the unit of dedup. Storing
each of 10,000 tiny chunks as a blob of its own would cost 10,000 files, PUTs and rows per
push, so a push stores the small chunks (under ``PACK_BELOW`` bytes) it must upload
concatenated in *packs*: ordinary content-addressed blobs (named by the sha256 of their bytes,
verified on the way in like every blob) of up to ``PACK_BYTES``. A version records its **pack
index**: for each pack it uses, the pack's digest and size and where each of its chunks lies in
it. The index is storage, not format: the bundle and its digest are the same however its chunks
are stored, and a chunk's integrity is still its own sha256, checked on every read.

A version's stored blobs (what gc keeps, what the audit checks, what a pull may fetch) are then
its manifest's blobs with the packed chunks replaced by their packs (``stored_with_packs``).
The canonical JSON form (``PackIndex.to_json``) is what the metadata store keeps::

    {"packs": [{"digest": "sha256:<hex>", "size": 1234,
                "chunks": [["<chunk sha256 hex>", <offset in the pack>, <size>], ...]}, ...]}

>>> e = PackEntry("sha256:" + "a" * 64, 0, 10)
>>> index = PackIndex((Pack.of("sha256:" + "b" * 64, 10, [e]),))
>>> PackIndex.from_json(index.to_json()) == index
True
>>> index.locations()[e.chunk].pack == "sha256:" + "b" * 64
True
"""
from __future__ import annotations

import json
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from itertools import repeat
from typing import Any, NamedTuple

import orjson

from ..digests import all_hex64, canonical_json
from ..errors import IntegrityError, UsageError
from ..refs import validate_digest
from .chunking import MIN_CHUNK

__all__ = ["PACK_BELOW", "PACK_BYTES", "MAX_PACK_ENTRIES", "PackEntry", "Pack", "PackIndex", "ChunkLocation",
           "stored_with_packs", "pack_blobs"]


#: chunks smaller than this are stored in packs (the tensors ``format.chunking`` used to coalesce)
PACK_BELOW = MIN_CHUNK
#: a pack holds at most this many bytes (one PUT, one file, one row)
PACK_BYTES = 64 * 1024 * 1024
#: an index lists at most this many chunks (a manifest lists at most a million per member)
MAX_PACK_ENTRIES = 4_000_000


class PackEntry(NamedTuple):
    """One chunk (``sha256:<hex>``) stored at ``offset`` of its pack, ``size`` bytes (a named
    tuple: an index holds one per small tensor, ten thousand of them for some programs)."""

    chunk: str
    offset: int
    size: int


@dataclass(frozen=True)
class Pack:
    """A pack blob (``digest``, ``size`` bytes) and where each chunk a version reads from it
    lies, as three columns in offset order (``of`` sorts them, ``PackIndex.from_json`` checks
    them; a pull reads them in that order): ``chunks`` (sha256 hex), ``offsets`` and ``sizes``.
    An index of a 10,000-tensor program has 10,000 of them, read at every pull: columns are
    made and read in C (``zip``, ``map``); ``entries`` gives them one ``PackEntry`` each."""

    digest: str
    size: int
    chunks: tuple[str, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @classmethod
    def of(cls, digest: str, size: int, entries: Iterable[PackEntry]) -> Pack:
        """A pack of ``entries`` (in any order)."""
        ordered = sorted(entries, key=_OFFSET)
        return cls(digest, size, tuple(e.chunk[7:] for e in ordered), tuple(e.offset for e in ordered),
                   tuple(e.size for e in ordered))

    @cached_property
    def entries(self) -> tuple[PackEntry, ...]:
        """The chunks as ``PackEntry`` values (``sha256:<hex>``, offset, size), in offset order."""
        return tuple(map(tuple.__new__, repeat(PackEntry), zip(map("sha256:".__add__, self.chunks),
                                                               self.offsets, self.sizes)))


class ChunkLocation(NamedTuple):
    """Where a chunk can be read: ``size`` bytes at ``offset`` of pack ``pack`` (``pack_size`` bytes)."""

    pack: str
    pack_size: int
    offset: int
    size: int


_OFFSET = operator.itemgetter(1)   # a PackEntry's offset


def _bad(message: str) -> UsageError:
    return UsageError(f"invalid pack index: {message}",
                      hint="a pack index lists packs with their digest, size and chunks [sha256 hex, offset, size]")


def _int(value: Any, what: str, minimum: int) -> int:
    if type(value) is not int or value < minimum:
        raise _bad(f"{what} is {value!r}, not an integer >= {minimum}")
    return value


@dataclass(frozen=True)
class PackIndex:
    """The packs a version reads chunks from, each with its entries (see the module docstring)."""

    packs: tuple[Pack, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.packs)

    def locations(self) -> dict[str, ChunkLocation]:
        """``chunk digest -> ChunkLocation`` for every entry (built by ``map`` in C: a pull of a
        10,000-tensor program asks for 10,000 of them)."""
        out: dict[str, ChunkLocation] = {}
        for p in self.packs:
            out.update(zip(map("sha256:".__add__, p.chunks), map(tuple.__new__, repeat(ChunkLocation),
                                                                  zip(repeat(p.digest), repeat(p.size), p.offsets,
                                                                      p.sizes))))
        return out

    def blobs(self) -> set[tuple[str, int]]:
        """(digest, size) of every pack."""
        return {(p.digest, p.size) for p in self.packs}

    def to_json(self) -> str:
        """The canonical JSON text (packs by digest, entries by offset); written once per index
        (11 ms for 10,000 entries: a push prepares it while its last bytes are flushed)."""
        return self._json

    @cached_property
    def _json(self) -> str:
        return canonical_json({"packs": [
            {"digest": p.digest, "size": p.size, "chunks": list(map(list, zip(p.chunks, p.offsets, p.sizes)))}
            for p in sorted(self.packs, key=lambda p: p.digest)]}).decode("utf-8")

    @classmethod
    def from_locations(cls, used: Mapping[str, ChunkLocation]) -> PackIndex:
        """The index of the chunks ``used`` (``chunk digest -> location``), grouped by pack."""
        packs: dict[tuple[str, int], list[PackEntry]] = {}
        for chunk, (pack, pack_size, offset, size) in used.items():
            packs.setdefault((pack, pack_size), []).append(PackEntry(chunk, offset, size))
        return cls(tuple(Pack.of(d, n, es) for (d, n), es in sorted(packs.items())))

    @classmethod
    def from_stored(cls, text: str | None, where: str = "a version") -> PackIndex:
        """A recorded index (``from_json``): ``IntegrityError`` (exit 5) naming ``where`` when
        the metadata store holds one that does not parse."""
        try:
            return cls.from_json(text)
        except UsageError as exc:
            raise IntegrityError(f"{where}: its stored pack index is invalid ({exc.message})",
                                 hint="the metadata database was altered: run `pt2reg audit --verify`") from None

    @classmethod
    def from_json(cls, text: str | None) -> PackIndex:
        """Parse and check an index (``UsageError`` naming the first problem): digests well formed,
        no pack over ``PACK_BYTES`` or without entries, every entry under ``PACK_BELOW`` bytes and
        inside its pack, no two entries of a pack overlapping, each chunk listed once.

        Parsed by orjson (4.6 -> 2.6 ms for 10,000 entries, at every pull); a text it refuses, or
        whose index does not hold (orjson reads integers past 64 bits as floats), is parsed again
        by the standard library, whose verdict and message stand."""
        if not text:
            return cls()
        try:
            return cls.from_raw(orjson.loads(text))
        except (orjson.JSONDecodeError, UsageError):
            pass
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise _bad(f"not JSON ({exc})") from None
        return cls.from_raw(raw)

    @classmethod
    def from_raw(cls, raw: Any) -> PackIndex:
        """``from_json`` of the parsed JSON value."""
        if not isinstance(raw, dict) or set(raw) != {"packs"} or not isinstance(raw["packs"], list):
            raise _bad('not an object {"packs": [...]}')
        packs: list[Pack] = []
        seen: set[str] = set()
        count = 0
        for i, p in enumerate(raw["packs"]):
            if not isinstance(p, dict) or set(p) != {"digest", "size", "chunks"} or not isinstance(p["chunks"], list):
                raise _bad(f"packs/{i} is not an object of digest, size and chunks")
            try:
                digest = validate_digest(p["digest"]) if isinstance(p["digest"], str) else None
            except UsageError:
                digest = None
            if digest is None:
                raise _bad(f"packs/{i}/digest {p['digest']!r} is not sha256:<64 hex>")
            size = _int(p["size"], f"packs/{i}/size", 1)
            if size > PACK_BYTES or not p["chunks"]:
                raise _bad(f"packs/{i} has {size} bytes and {len(p['chunks'])} chunks (a pack holds 1 chunk or "
                           f"more, {PACK_BYTES} bytes at most)")
            count += len(p["chunks"])
            if count > MAX_PACK_ENTRIES:
                raise _bad(f"more than {MAX_PACK_ENTRIES} chunks")
            columns = _entries_checked(p["chunks"], size)
            if columns is not None:
                new = set(columns[0])
                if len(new) == len(columns[0]) and seen.isdisjoint(new):
                    seen |= new
                    packs.append(Pack(digest, size, *columns))
                    continue
            # something is wrong: walk the entries one by one for the first problem's message
            entries_ = []
            for j, c in enumerate(p["chunks"]):
                where = f"packs/{i}/chunks/{j}"
                if not (isinstance(c, list) and len(c) == 3 and isinstance(c[0], str) and len(c[0]) == 64):
                    raise _bad(f"{where} is not [sha256 hex, offset, size]")
                if not all_hex64([c[0]]):
                    raise _bad(f"{where}: {c[0]!r} is not 64 lowercase hex digits")
                offset, n = _int(c[1], f"{where} offset", 0), _int(c[2], f"{where} size", 1)
                if n >= PACK_BELOW:
                    raise _bad(f"{where} has {n} bytes: only chunks under {PACK_BELOW} bytes are packed")
                if offset + n > size:
                    raise _bad(f"{where} ends at byte {offset + n}, past the pack's {size} bytes")
                if c[0] in seen:
                    raise _bad(f"chunk sha256:{c[0]} is listed twice")
                seen.add(c[0])
                chunk = "sha256:" + c[0]
                entries_.append(PackEntry(chunk, offset, n))
            entries_.sort(key=lambda e: e.offset)
            for a, b in zip(entries_, entries_[1:]):
                if a.offset + a.size > b.offset:
                    raise _bad(f"packs/{i}: chunks at offsets {a.offset} and {b.offset} overlap")
            raise _bad(f"packs/{i}: its chunks are not well formed")  # pragma: no cover (the walk names it)
        if len({p.digest for p in packs}) != len(packs):
            raise _bad("a pack is listed twice")
        return cls(tuple(packs))


def _entries_checked(chunks: list[Any], size: int) -> tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]] | None:
    """A pack's ``[hex, offset, size]`` entries as ``Pack`` columns (hexes, offsets, sizes),
    sorted by offset, when every rule of ``PackIndex.from_json`` holds for them (but "each chunk
    once", checked across packs); None otherwise (the caller walks them one by one to say what is
    wrong). Whole-list operations, no Python loop per entry: a version of a 10,000-tensor program
    has 10,000 entries, read at every pull."""
    if set(map(type, chunks)) != {list} or set(map(len, chunks)) != {3}:
        return None
    hexes, offsets, sizes = zip(*chunks)
    if not all_hex64(hexes):
        return None
    if set(map(type, offsets)) != {int} or set(map(type, sizes)) != {int}:
        return None
    ends = list(map(operator.add, offsets, sizes))
    if min(offsets) < 0 or min(sizes) < 1 or max(sizes) >= PACK_BELOW or max(ends) > size:
        return None
    if all(map(operator.le, ends[:-1], offsets[1:])):   # in offset order (as stored), none overlapping
        return hexes, offsets, sizes
    order = sorted(range(len(chunks)), key=offsets.__getitem__)
    if not all(map(operator.le, [ends[k] for k in order[:-1]], [offsets[k] for k in order[1:]])):
        return None
    return tuple(hexes[k] for k in order), tuple(offsets[k] for k in order), tuple(sizes[k] for k in order)


def stored_with_packs(chunks: Iterable[tuple[str, int]], index: PackIndex, *,
                      whole: Iterable[tuple[str, int]] = ()) -> set[tuple[str, int]]:
    """The blobs a version stores: its ``whole`` blobs (unchunked members, the manifest) and
    its ``chunks`` (digest, size), each chunk the index places in a pack replaced by that pack
    (a chunk whose bytes are also a whole member stays a blob: the member is fetched as one).
    ``UsageError`` when the index lists something that is not a chunk of the manifest at that
    size (an index may only say where the version's own chunks are)."""
    whole = set(whole)
    out = set(chunks)
    sizes = dict(out)
    for p in index.packs:
        for e in p.entries:
            if sizes.get(e.chunk) != e.size:
                raise _bad(f"chunk {e.chunk} ({e.size} bytes) is not one the manifest names at that size")
            out.discard((e.chunk, e.size))
        out.add((p.digest, p.size))
    return out | whole


def pack_blobs(text: str | None) -> set[tuple[str, int]]:
    """(digest, size) of the packs a stored index names, read without checking its entries (gc
    under its lock reads every version's index; ``PackIndex.from_json`` checks them)."""
    if not text:
        return set()
    try:
        return {(str(p["digest"]), int(p["size"])) for p in json.loads(text)["packs"]}
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        raise _bad(f"unreadable ({exc})") from None
