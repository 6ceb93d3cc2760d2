"""Failed writes name their path, remove their temp file and leave no half-finished zip behind
for a finalizer to trip over."""
import errno
import gc
import hashlib
import io
import sys

import pytest

from registry.blobs.base import atomic_download
from registry.cli._core import os_error_line
from registry.format.bundle import write_bundle
from registry.format.manifest import Manifest


class _DiskFull(io.RawIOBase):
    """A member source that fails half-way like a write to a full disk."""

    def __init__(self) -> None:
        self.sent = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self.sent:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.sent = 1
        return b"x" * 5  # the member is 10 bytes: the next read fails


def test_a_bundle_write_failing_half_way_names_the_file_and_leaves_nothing(tmp_path, monkeypatch):
    from tests.unit.test_manifest import minimal  # a valid one-member manifest (10 bytes)

    manifest = Manifest.from_raw(minimal())
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    dest = tmp_path / "b.pt2b"
    sources = {m.path: _DiskFull for m in manifest.members}
    with pytest.raises(OSError) as info:
        write_bundle(dest, manifest, sources)
    gc.collect()
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(dest)
    assert list(tmp_path.iterdir()) == []
    assert unraisable == []


def test_a_download_failing_half_way_names_the_file_and_leaves_nothing(tmp_path):
    dest = tmp_path / "blob"
    digest = "sha256:" + hashlib.sha256(b"").hexdigest()
    with pytest.raises(OSError) as info:
        with atomic_download(dest, digest, "test") as w:
            w.write(b"abc")
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
    assert info.value.filename == str(dest)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("code, words", [(errno.ENOSPC, "free some space"), (errno.EFBIG, "ulimit"),
                                         (errno.EACCES, "permissions"), (errno.ENOENT, None)])
def test_os_errors_are_one_line_with_the_path_and_what_to_do(code, words):
    line = os_error_line(OSError(code, "Some failure", "/data/out.pt2b"))
    assert line.startswith("Some failure: /data/out.pt2b") and "\n" not in line
    assert (words in line) if words else (";" not in line)
