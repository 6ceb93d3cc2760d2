"""Checked-in JSON data generated from the installed torch (the serde schema, the side-effect
operators): read once by the pure checkers, rewritten only by their generators."""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from ..atomic import atomic_write

__all__ = ["read_data_file", "write_data_file"]


@functools.cache
def read_data_file(path: Path) -> Any:
    """The parsed file (read once per process)."""
    return json.loads(path.read_text(encoding="utf-8"))


def write_data_file(path: Path, doc: Any) -> None:
    """Replace ``path`` atomically with ``doc`` as stable, diff-friendly JSON."""
    with atomic_write(path, mode=0o644) as f:
        f.write((json.dumps(doc, indent=1, sort_keys=True) + "\n").encode("utf-8"))
    read_data_file.cache_clear()
