"""Atomic file writes: a temp file beside the destination, fsync, then rename.

A reader (or a process that dies half-way) never sees a partial file: either the old content,
or none, or the complete new one.

    >>> with atomic_write("out.pt2b") as f:                    # doctest: +SKIP
    ...     f.write(data)
"""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

__all__ = ["atomic_write"]


@contextmanager
def atomic_write(dest: str | os.PathLike, *, mode: int | None = None, fsync: bool = True
                 ) -> Iterator[IO[bytes]]:
    """Yield a binary file that becomes ``dest`` only when the block completes without error."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".incomplete", dir=dest.parent)
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
