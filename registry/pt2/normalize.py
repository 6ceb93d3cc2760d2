"""Rewrite a `.pt2` into its canonical bytes.

The same program gives the same bytes whatever its original file name: the root folder becomes
``archive/`` (what torch writes for an in-memory save), timestamps and attributes are fixed, data
stays 64-byte aligned, the JSON members torch parses (graphs, payload configs) are re-serialized
canonically (sorted keys, no whitespace), torch's pickled example inputs are emptied (torch reads an empty member
as "no example inputs"; the bundle carries pickle-free golden samples instead) and the per-save
id is dropped.
"""
from __future__ import annotations

import os

from ..archive.zipsafe import open_entry
from ..atomic import atomic_write
from ..archive.zipwrite import DeterministicZipWriter
from ..constants import MAX_GRAPH_JSON_BYTES
from ..digests import canonical_json
from .reader import (CANONICAL_ROOT, DROPPED_MEMBERS, SAMPLE_INPUTS_DIR, Pt2Archive, is_json_member,
                     load_json_member)

__all__ = ["normalize_pt2", "CANONICAL_ROOT"]


def _kept(name: str) -> bool:
    return not any(name == d or (d.endswith("/") and name.startswith(d)) for d in DROPPED_MEMBERS)


def normalize_pt2(archive: Pt2Archive, dest: str | os.PathLike) -> None:
    """Write the canonical form of ``archive`` to ``dest`` atomically."""
    # a scratch file; the bundle write fsyncs
    with atomic_write(dest, fsync=False) as out, DeterministicZipWriter(out) as writer:
        for name, entry in archive.entries.items():
            if name.startswith(SAMPLE_INPUTS_DIR):
                writer.write_bytes(f"{CANONICAL_ROOT}/{name}", b"")
                continue
            if not _kept(name):
                continue
            if is_json_member(name) and any(archive.programs):
                value = load_json_member(archive.path, entry, where=archive.path, max_size=MAX_GRAPH_JSON_BYTES)
                writer.write_bytes(f"{CANONICAL_ROOT}/{name}", canonical_json(value))
                continue
            with open_entry(archive.path, entry) as src:
                writer.write_stream(f"{CANONICAL_ROOT}/{name}", src, entry.size)
