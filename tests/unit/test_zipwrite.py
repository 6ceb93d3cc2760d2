"""The deterministic zip writer: members reserved first and filled later (in parallel, at their
offsets) give the same bytes as members written in order, and archives past zipfile's zip64
limit (2 GiB) are still in the canonical layout the program reader accepts."""
from __future__ import annotations

import io
import os
import zipfile
import zlib
from pathlib import Path

from registry.format.zipsafe import read_canonical_entries
from registry.format.zipwrite import DeterministicZipWriter

MEMBERS = [("archive/a.json", b"{}" * 10), ("archive/data/weights/w0", os.urandom(300_000)),
           ("archive/data/weights/w1", b""), ("archive/x", os.urandom(77))]


def test_reserved_then_filled_members_are_the_bytes_of_members_written_in_order(tmp_path: Path):
    in_order = io.BytesIO()
    with DeterministicZipWriter(in_order) as w:
        for name, data in MEMBERS:
            w.write_bytes(name, data)
    path = tmp_path / "filled.zip"
    with open(path, "wb") as f, DeterministicZipWriter(f) as w:
        offsets = {name: w.reserve(name, len(data)) for name, data in MEMBERS}
        f.flush()
        for name, data in reversed(MEMBERS):        # any order, straight to the file descriptor
            os.pwrite(f.fileno(), data, offsets[name])
            w.set_crc(name, zlib.crc32(data))
    assert path.read_bytes() == in_order.getvalue()
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None and [z.read(n) for n, _ in MEMBERS] == [d for _, d in MEMBERS]
    assert list(read_canonical_entries(path)) == [n for n, _ in MEMBERS]


def test_an_archive_past_two_gib_is_canonical(tmp_path: Path):
    """zipfile adds zip64 end records from 2 GiB on while the plain record still holds the real
    offsets; the canonical reader follows the locator (a sparse file: no 2 GiB written)."""
    big = (1 << 31) + 4096
    path = tmp_path / "big.zip"
    with open(path, "wb") as f, DeterministicZipWriter(f) as w:
        w.write_bytes("archive/a.json", b"{}")
        w.reserve("archive/data/weights/big", big)
        w.set_crc("archive/data/weights/big", 0)
        w.write_bytes("archive/b", b"tail")
    entries = read_canonical_entries(path)
    assert entries["archive/data/weights/big"].size == big
    assert entries["archive/b"].data_offset > big
    with zipfile.ZipFile(path) as z:
        assert z.read("archive/b") == b"tail"


def test_a_zip64_extra_too_short_for_its_sentinels_is_refused_in_one_line():
    """A central-directory entry whose sizes say "see the zip64 extra" and whose extra holds
    fewer values than that: refused as not canonical (UnsafeArchiveError), not an IndexError."""
    import struct

    import pytest

    from registry.errors import UnsafeArchiveError
    from registry.format.zipsafe import _zip64_sizes

    full = struct.pack("<HH3Q", 1, 24, 10, 10, 7)
    assert _zip64_sizes(full, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, "m", "w") == (10, 10, 7)
    for short in (struct.pack("<HHQ", 1, 8, 10), struct.pack("<HH", 1, 0), b""):
        with pytest.raises(UnsafeArchiveError, match="lacks its zip64 sizes"):
            _zip64_sizes(short, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, "m", "w")
