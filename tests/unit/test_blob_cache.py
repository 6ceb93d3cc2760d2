"""The client cache writes member files without fsync and trusts a stamp only within the boot
it was written in: after a crash of the machine (a new boot) every cached file is re-hashed
once, so bytes the crash lost are caught, and fetched again."""
from __future__ import annotations

import hashlib
import io
import os

from registry.client.sources import BlobCache


def test_a_stamp_from_another_boot_is_rehashed_once(tmp_path, monkeypatch):
    cache = BlobCache(tmp_path)
    data = os.urandom(1000)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    cache.put_stream(digest, io.BytesIO(data), len(data))
    checked = []
    monkeypatch.setattr(cache, "verify", lambda d: checked.append(d) or True)
    assert cache.usable(digest) and checked == []          # same boot: the stamp is enough
    monkeypatch.setattr("registry.client.sources._BOOT_ID", "a-later-boot")
    assert cache.usable(digest) and checked == [digest]    # after a reboot: re-hashed
    assert cache.usable(digest) and checked == [digest]    # and stamped again


def test_bytes_lost_in_a_crash_are_evicted_after_the_reboot(tmp_path, monkeypatch):
    cache = BlobCache(tmp_path)
    data = os.urandom(1000)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    path = cache.put_stream(digest, io.BytesIO(data), len(data))
    # what a power loss can leave: the rename and the stamp survived, the data did not
    st = os.stat(path)
    os.chmod(path, 0o644)
    path.write_bytes(b"\0" * len(data))
    os.chmod(path, 0o444)
    stamp = cache._stamp_path(digest)
    stamp.write_text(stamp.read_text().replace(str(st.st_ctime_ns), str(os.stat(path).st_ctime_ns))
                     .replace(str(st.st_mtime_ns), str(os.stat(path).st_mtime_ns)))
    assert cache.usable(digest)                            # this boot: the stamp is believed
    monkeypatch.setattr("registry.client.sources._BOOT_ID", "a-later-boot")
    assert not cache.usable(digest) and not path.exists()  # next boot: re-hashed, evicted
