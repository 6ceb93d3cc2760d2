"""Hostile artifacts for security tests: pickles that would run a shell command if unpickled.

The payload only touches a marker file, so a test can prove it never ran.
"""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

from registry.archive.bundle import BundleFile, write_bundle
from registry.archive.zipsafe import open_entry, read_entries
from registry.archive.zipwrite import DeterministicZipWriter
from registry.digests import sha256_bytes
from registry.manifest import Manifest


def evil_pickle(marker: Path) -> bytes:
    """torch.save bytes whose unpickling runs ``touch marker`` (refused by weights_only=True)."""
    import torch

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    buf = io.BytesIO()
    torch.save((Evil(),), buf)
    return buf.getvalue()


def rewrite_pt2(src: Path, dest: Path, replace: dict[str, bytes]) -> Path:
    """Copy a .pt2 replacing members (names relative to the root folder)."""
    entries = read_entries(src)
    with open(dest, "wb") as out:
        w = DeterministicZipWriter(out)
        for name, entry in entries.items():
            rel = name.split("/", 1)[1]
            if rel in replace:
                w.write_bytes(name, replace[rel])
            else:
                with open_entry(src, entry) as f:
                    w.write_stream(name, f, entry.size)
        w.close()
    return dest


def pt2_with_evil_sample_inputs(src: Path, dest: Path, marker: Path) -> Path:
    return rewrite_pt2(src, dest, {"data/sample_inputs/model.pt": evil_pickle(marker)})


def pt2_with_pickled_weight(src: Path, dest: Path, marker: Path) -> Path:
    """Mark the first weight as pickled (``use_pickle``) and make it a malicious pickle."""
    entries = read_entries(src)
    root = next(iter(entries)).split("/", 1)[0]
    cfg_name = f"{root}/data/weights/model_weights_config.json"
    with open_entry(src, entries[cfg_name]) as f:
        cfg = json.loads(f.read())
    first = next(iter(cfg["config"].values()))
    first["use_pickle"] = True
    return rewrite_pt2(src, dest, {"data/weights/model_weights_config.json": json.dumps(cfg).encode(),
                                   f"data/weights/{first['path_name']}": evil_pickle(marker)})


def bundle_with_raw_member(good: Path, dest: Path, member: str, data: bytes) -> Path:
    """A well-formed bundle (all digests consistent) whose program member is ``data`` as is,
    i.e. not normalized by our bundler: what an attacker would hand over."""
    src = BundleFile.open(good)
    raw = src.manifest.to_json()
    for m in raw["members"]:
        if m["path"] == member:
            m.update(sha256=sha256_bytes(data), size=len(data))
            m.pop("chunks", None)
    manifest = Manifest.from_raw(raw)
    sources = {m.path: (lambda p=m.path: src.open_member(p)) for m in manifest.members}
    sources[member] = lambda: io.BytesIO(data)
    write_bundle(dest, manifest, sources)
    return dest
