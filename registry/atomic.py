"""Atomic file writes: a temp file beside the destination, fsync, then rename.

A reader (or a process that dies half-way) never sees a partial file: either the old content,
or none, or the complete new one.

    >>> with atomic_write("out.pt2b", mode=USER_FILE) as f:    # doctest: +SKIP
    ...     f.write(data)

The temp file is created private (0600). Files written for the user (``bundle -o``, ``pull -o``,
``run --output``) pass ``mode=USER_FILE`` and get the mode the user's umask gives a new file
(0644 under umask 022), as ``cp`` and ``torch.save`` do; caches and blobs stay private.
"""
from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

__all__ = ["atomic_write", "new_temp", "USER_FILE", "current_umask", "sync_filesystem"]

#: ``atomic_write(..., mode=USER_FILE)``: the mode ``open()`` would give a new file (0o666 & ~umask).
USER_FILE = "user"


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (/proc on Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o077)  # no way to read it but to set it: restore at once
    os.umask(old)
    return old


#: A temp file of an earlier write of the same destination that nobody has written for this
#: long was left by a process that died (SIGKILL, power loss: no ``finally`` ran); the next
#: write of that destination removes it. A live writer touches its file on every write.
STALE_TEMP_SECONDS = 24 * 3600


def new_temp(dest: Path) -> tuple[int, str]:
    """(fd, path) of a new private temp file beside ``dest``, ``.<name>.<random>.incomplete``
    (created exclusively: concurrent writers never share one, a planted symlink is never
    followed), after removing the stale temp files earlier writes of ``dest`` left behind."""
    _remove_stale_temps(dest)
    return tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".incomplete", dir=dest.parent)


def _remove_stale_temps(dest: Path) -> None:
    prefix, cutoff = f".{dest.name}.", time.time() - STALE_TEMP_SECONDS
    try:
        with os.scandir(dest.parent) as entries:
            stale = [e.path for e in entries if e.name.startswith(prefix) and e.name.endswith(".incomplete")
                     and e.is_file(follow_symlinks=False) and e.stat(follow_symlinks=False).st_mtime < cutoff]
    except OSError:  # unreadable directory, or an entry gone meanwhile: nothing is swept this time
        return
    for path in stale:
        try:
            os.unlink(path)
        except OSError:  # another writer swept it first
            pass


@contextmanager
def atomic_write(dest: str | os.PathLike, *, mode: int | str | None = None, fsync: bool = True
                 ) -> Iterator[IO[bytes]]:
    """Yield a binary file that becomes ``dest`` only when the block completes without error.

    ``mode``: None keeps the temp file's 0600; an int sets it; ``USER_FILE`` applies the umask.
    """
    if mode == USER_FILE:
        mode = 0o666 & ~current_umask()
    elif isinstance(mode, str):
        raise ValueError(f"mode {mode!r}: an int or USER_FILE expected")
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = new_temp(dest)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, dest)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = str(dest)  # a failed write (disk full, quota) names what was being written
        raise


def sync_filesystem(path: str | os.PathLike) -> None:
    """Make every write to the filesystem holding ``path`` durable, in one call (``syncfs(2)``
    on Linux; ``os.sync()`` elsewhere): what many files written together need before they are
    renamed into place, instead of one ``fsync`` (and one journal commit) per file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _syncfs is not None and _syncfs(fd) == 0:
            return
        os.sync()
    finally:
        os.close(fd)


def _load_syncfs():  # type: ignore[no-untyped-def]
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_syncfs = _load_syncfs()
