"""``atomic_write`` / ``new_temp``: a process killed mid-write (no ``finally`` runs) leaves its
``.<name>.<random>.incomplete`` temp file; the next write of the same destination removes such
files once nobody has written them for ``STALE_TEMP_SECONDS``, and touches nothing else."""
from __future__ import annotations

import os
import time
from pathlib import Path

from registry.atomic import STALE_TEMP_SECONDS, atomic_write, new_temp


def _aged(path: Path, seconds: float) -> Path:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)
    return path


def test_the_next_write_of_a_destination_removes_only_its_stale_temp_files(tmp_path: Path) -> None:
    dest = tmp_path / "model.pt2b"
    made = {}
    for key, name, age in (("stale", ".model.pt2b.k1ll3d.incomplete", STALE_TEMP_SECONDS + 60),
                           ("live", ".model.pt2b.wr1t1ng.incomplete", 5),
                           ("other", ".other.pt2b.k1ll3d.incomplete", 10 * STALE_TEMP_SECONDS),
                           ("user", "model.pt2b.incomplete", 10 * STALE_TEMP_SECONDS),
                           ("dir", ".model.pt2b.d1r.incomplete", 10 * STALE_TEMP_SECONDS)):
        path = tmp_path / name
        path.mkdir() if key == "dir" else path.write_bytes(b"partial")
        made[key] = _aged(path, age)
    target = tmp_path / "elsewhere.bin"
    target.write_bytes(b"keep")
    link = tmp_path / ".model.pt2b.l1nk.incomplete"
    link.symlink_to(target)
    _aged(link, 10 * STALE_TEMP_SECONDS)

    with atomic_write(dest) as f:
        f.write(b"new")
    assert dest.read_bytes() == b"new"
    assert not made["stale"].exists()
    assert all(made[k].exists() for k in ("live", "other", "user", "dir"))   # young, another file's, not ours
    assert link.is_symlink() and target.read_bytes() == b"keep"              # never followed or removed


def test_new_temp_is_private_exclusive_and_beside_the_destination(tmp_path: Path) -> None:
    dest = tmp_path / "sub" / "blob"
    dest.parent.mkdir()
    fds = [new_temp(dest) for _ in range(2)]
    try:
        paths = [Path(p) for _fd, p in fds]
        assert paths[0] != paths[1] and all(p.parent == dest.parent for p in paths)
        assert all(p.name.startswith(".blob.") and p.name.endswith(".incomplete") for p in paths)
        assert all(p.stat().st_mode & 0o777 == 0o600 for p in paths)
    finally:
        for fd, p in fds:
            os.close(fd)
            os.unlink(p)
