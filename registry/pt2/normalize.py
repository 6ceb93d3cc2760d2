"""Rewrite a `.pt2` into its canonical bytes.

The same program gives the same bytes whatever its original file name: the root folder becomes
``archive/`` (what torch writes for an in-memory save), timestamps and attributes are fixed, data
stays 64-byte aligned, the JSON members torch parses (graphs, payload configs) are re-serialized
canonically (sorted keys, no whitespace), torch's pickled example inputs are emptied (torch reads an empty member
as "no example inputs"; the bundle carries pickle-free golden samples instead) and the per-save
id is dropped.

Machine paths are removed from graph metadata (``portable_source_path``): every ``File "..."``
of a node's ``stack_trace`` becomes package-relative (``torch/nn/modules/linear.py``, the part
after ``site-packages/`` or ``dist-packages/``) or, for any other absolute path, its file name
(``model.py``), so one program exported from two checkouts or virtualenvs gets one digest and a
bundle never carries the exporter's home directory; ``from_node`` graph ids (torch writes the
``id()`` of a Python object) are numbered in order of first appearance. Both are idempotent.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..atomic import atomic_write
from ..constants import MAX_GRAPH_JSON_BYTES
from ..digests import canonical_json
from ..format.bundle import FileRange
from ..format.chunking import MIN_CHUNK
from ..format.zipsafe import open_entry
from ..format.zipwrite import DeterministicZipWriter
from ..parallel import pwrite_all
from .reader import CANONICAL_ROOT, DROPPED_MEMBERS, SAMPLE_INPUTS_DIR, Pt2Archive, is_json_member, load_json_member

__all__ = ["normalize_pt2", "fill_holes", "CANONICAL_ROOT", "portable_source_path", "portable_stack_trace"]

_TRACE_FILE = re.compile(r'File "([^"\n]*)"')
_PACKAGES_ROOT = re.compile(r"^.*[/\\](?:site|dist)-packages[/\\]")
_SEP = re.compile(r"[/\\]+")
_MAX_DEPTH = 200  # graph JSON nesting (subgraphs in node arguments); the reader caps it lower


def portable_source_path(path: str) -> str:
    """A source path without the machine's directories (idempotent).

    ``.../site-packages/torch/nn/modules/linear.py`` -> ``torch/nn/modules/linear.py``; any other
    absolute path (or one with ``.``/``..``/``~`` parts) -> its file name; a plain relative path
    or a pseudo-file (``<eval_with_key>.3``) is kept.
    """
    m = _PACKAGES_ROOT.match(path)
    if m:  # the last such folder: what follows names no other
        path = path[m.end():].lstrip("/\\")
        relative = True
    else:
        relative = not (path.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:", path))
    parts = _SEP.split(path)
    if len(parts) == 1:
        return path
    if relative and not any(p in ("", ".", "..") or p.startswith("~") or ":" in p for p in parts):
        return "/".join(parts)
    return parts[-1]


def portable_stack_trace(trace: str) -> str:
    """``trace`` with every frame's file made path-free (``portable_source_path``)."""
    return _TRACE_FILE.sub(lambda m: f'File "{portable_source_path(m.group(1))}"', trace)


def _scrub_paths(value: Any, depth: int = 0, graph_ids: dict[Any, int] | None = None) -> Any:
    """Rewrite every ``stack_trace`` string in a graph JSON (nested graphs included), and every
    ``from_node`` ``graph_id`` (torch writes the ``id()`` of a graph object: a memory address
    that differs on every run) as the graph's number in order of first appearance."""
    if graph_ids is None:
        graph_ids = {}
    if depth > _MAX_DEPTH:
        return value
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == "stack_trace" and isinstance(v, str):
                out[k] = portable_stack_trace(v)
            elif k == "from_node" and isinstance(v, str):
                out[k] = _renumber_from_node(v, graph_ids)
            else:
                out[k] = _scrub_paths(v, depth + 1, graph_ids)
        return out
    if isinstance(value, list):
        return [_scrub_paths(v, depth + 1, graph_ids) for v in value]
    return value


def _renumber_from_node(text: str, graph_ids: dict[Any, int]) -> str:
    """``from_node`` JSON with each ``graph_id`` replaced by its first-appearance number
    (idempotent); text that is not such JSON is left for the safety checks to judge."""
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):  # hostile nesting: refused by the safety checks
        return text
    stack, budget = [parsed], 100_000
    while stack and budget:
        budget -= 1
        v = stack.pop()  # the end of the stack is visited next: document order
        if isinstance(v, list):
            stack.extend(reversed(v))
        elif isinstance(v, dict):
            if "graph_id" in v and isinstance(v["graph_id"], (int, str)) and not isinstance(v["graph_id"], bool):
                v["graph_id"] = graph_ids.setdefault(v["graph_id"], len(graph_ids))
            if isinstance(v.get("from_node"), list):
                stack.append(v["from_node"])
    return json.dumps(parsed) if not stack else text


def _kept(name: str) -> bool:
    return not any(name == d or (d.endswith("/") and name.startswith(d)) for d in DROPPED_MEMBERS)


def normalize_pt2(archive: Pt2Archive, dest: str | os.PathLike, *, holes: bool = False) -> tuple[FileRange, ...]:
    """Write the canonical form of ``archive`` to ``dest`` atomically; returns where its bytes are.

    With ``holes``, the bulk entries (``MIN_CHUNK`` bytes or more, copied verbatim: the weights)
    are not copied: ``dest`` keeps a hole of their size (and the CRC-32 the source's zip
    directory records for them), and the canonical bytes are the returned ranges, read from
    ``dest`` and from the source file in turn. The bundle writer then copies each weight once,
    straight from the user's `.pt2` into the bundle, checking that CRC on the way;
    ``fill_holes`` writes them into ``dest`` when a step needs the whole file (running samples).
    Without ``holes``, one range: all of ``dest``.
    """
    bulk: list[tuple[int, Any]] = []  # (data offset in dest, source entry)
    # a scratch file; the bundle write fsyncs
    with atomic_write(dest, fsync=False) as out, DeterministicZipWriter(out) as writer:
        for name, entry in archive.entries.items():
            if name.startswith(SAMPLE_INPUTS_DIR):
                writer.write_bytes(f"{CANONICAL_ROOT}/{name}", b"")
                continue
            if not _kept(name):
                continue
            if is_json_member(name) and archive.programs:
                value = load_json_member(archive.path, entry, where=archive.path, max_size=MAX_GRAPH_JSON_BYTES)
                if name.startswith("models/"):
                    value = _scrub_paths(value)
                writer.write_bytes(f"{CANONICAL_ROOT}/{name}", canonical_json(value))
                continue
            if holes and entry.size >= MIN_CHUNK:
                at = writer.reserve(f"{CANONICAL_ROOT}/{name}", entry.size)
                writer.set_crc(f"{CANONICAL_ROOT}/{name}", entry.crc)
                bulk.append((at, entry))
                continue
            with open_entry(archive.path, entry) as src:
                writer.write_stream(f"{CANONICAL_ROOT}/{name}", src, entry.size)
    dest = Path(dest)
    total = dest.stat().st_size
    ranges: list[FileRange] = []
    pos = 0
    for at, entry in sorted(bulk, key=lambda b: b[0]):
        if at > pos:
            ranges.append(FileRange(dest, pos, at - pos))
        ranges.append(FileRange(Path(archive.path), entry.data_offset, entry.size, entry.crc))
        pos = at + entry.size
    if pos < total:
        ranges.append(FileRange(dest, pos, total - pos))
    return tuple(ranges)


def fill_holes(dest: str | os.PathLike, ranges: Sequence[FileRange]) -> None:
    """Copy into ``dest`` the parts of ``ranges`` that ``normalize_pt2(holes=True)`` left in
    the source file, so ``dest`` alone holds the canonical bytes."""
    dest = Path(dest)
    fd = os.open(dest, os.O_WRONLY)
    try:
        pos = 0
        for r in ranges:
            if Path(r.path) != dest:
                with open(r.path, "rb") as src:
                    _copy_range(src.fileno(), r.offset, fd, pos, r.size)
            pos += r.size
    finally:
        os.close(fd)


def _copy_range(src: int, src_at: int, dst: int, dst_at: int, size: int) -> None:
    while size > 0:
        try:
            n = os.copy_file_range(src, dst, size, src_at, dst_at)
        except OSError:  # not supported here (other filesystems, old kernels): copy in userspace
            data = os.pread(src, min(size, 8 << 20), src_at)
            pwrite_all(dst, data, dst_at)   # in WRITE_PIECE pieces, as every other copy
            n = len(data)
        if n <= 0:
            raise OSError(f"file ended {size} bytes early")
        src_at, dst_at, size = src_at + n, dst_at + n, size - n
