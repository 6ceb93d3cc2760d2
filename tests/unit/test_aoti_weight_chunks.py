"""An AOTInductor package compiled with its weights in a ``*_weights.blob`` (not in the `.so`)
is chunked at the portable program's weights, so its variant dedups against them.

The real round trip (compile with ``package_constants_on_disk_format="binary_blob"``, bundle,
run with ``--trust-native``) takes ~50 s of compiling and was measured by hand (docs/decisions.md,
"AOTInductor variants that share the portable program's weights"); this checks the chunk plan on
synthetic archives in milliseconds."""
from __future__ import annotations

import os
import zipfile
from pathlib import Path

from registry.bundler import _weights_in_blobs
from registry.format.chunking import plan_chunks
from registry.format.zipsafe import read_entries
from registry.parallel import Segment, hash_ranges


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _chunks(path: Path, extra=()) -> set[str]:
    spans = [(e.data_offset, e.size) for e in read_entries(path).values()
             if not any(e.data_offset <= x < e.data_offset + e.size for x, _ in extra)] + list(extra)
    fd = os.open(path, os.O_RDONLY)
    try:
        hashed = hash_ranges([[Segment(fd, a, n)] for a, n in plan_chunks(spans, path.stat().st_size)])
    finally:
        os.close(fd)
    return {h.sha256 for h in hashed}


def test_weights_inside_a_blob_become_the_portable_programs_chunks(tmp_path):
    w0, w1, small = os.urandom(100_000), os.urandom(70_000), os.urandom(1_000)
    portable = _zip(tmp_path / "p.pt2", {"archive/models/model.json": b"{}",
                                         "archive/data/weights/weight_0": w0,
                                         "archive/data/weights/weight_1": small,
                                         "archive/data/weights/weight_2": w1})
    blob = bytes(192) + w0 + small + bytes(24) + w1 + bytes(64)
    package = _zip(tmp_path / "a.pt2", {"archive/data/aotinductor/model/x.wrapper.so": b"\x7fELF",
                                        "archive/data/aotinductor/model/x.wrapper_weights.blob": blob})
    spans = _weights_in_blobs(package, portable)
    assert sorted(n for _, n in spans) == [70_000, 100_000]
    shared = _chunks(package, spans) & _chunks(portable)
    assert len(shared) == 2  # both large weights: stored once for both members
    assert not _chunks(package) & _chunks(portable)  # without the split, nothing is shared


def test_a_package_with_weights_in_its_library_has_nothing_to_split(tmp_path):
    portable = _zip(tmp_path / "p.pt2", {"archive/data/weights/weight_0": os.urandom(100_000)})
    package = _zip(tmp_path / "a.pt2", {"archive/data/aotinductor/model/x.wrapper.so": os.urandom(200_000)})
    assert _weights_in_blobs(package, portable) == []
