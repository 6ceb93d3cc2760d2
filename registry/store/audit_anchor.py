"""Anchors: what this machine last saw of a registry's audit log, kept outside the database.

The hash chain shows any edit, deletion or reordering *unless* the whole chain from that point
on is recomputed, which anyone with write access to the database can do. So each successful
``audit --verify`` records the newest event's ``(seq, hash)`` in ``HOME/audit-anchors.json``
(one entry per database URL), and the next verification first checks that the anchored event
still carries that hash. A rewrite of anything this machine already verified, or a deletion of
events up to its anchor, then fails with exit 5 naming the anchored event.

Pure checks here; the file is read and written by ``Registry.verify_audit``.

    >>> check({"seq": 4, "hash": "ab" * 32, "at": "2026-11-22T10:00:00Z"}, {4: "ab" * 32}, "anchors.json")
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .audit_chain import ChainVerdict

__all__ = ["ANCHOR_FILE", "anchor_key", "check", "load", "save"]

ANCHOR_FILE = "audit-anchors.json"


def anchor_key(db_url: str) -> str:
    """The database URL without its password (anchors are keyed by it, and the file is not secret)."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(db_url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - an odd URL still gets its own entry
        return db_url


def check(anchor: Mapping[str, Any] | None, found: Mapping[int, str], where: str) -> ChainVerdict | None:
    """None when the anchored event is still there with its hash; else the failing verdict."""
    if not anchor:
        return None
    seq, expected = int(anchor["seq"]), anchor["hash"]
    got = found.get(seq)
    if got == expected:
        return None
    what = "is gone" if got is None else "has a different hash"
    return ChainVerdict(False, seq, f"event {seq} {what} since this machine verified the log at "
                                    f"{anchor.get('at', '?')}: the log was rewritten (if the database was "
                                    f"replaced on purpose, delete {where})")


def load(path: Path) -> dict[str, Any]:
    """The anchors file, or {} when there is none; an unreadable one is an error, not a reset."""
    from ..errors import IntegrityError

    try:
        data = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise IntegrityError(f"cannot read the audit anchors {path}: {exc}",
                             hint="restore it, or delete it to trust the log as it is now") from exc
    if not isinstance(data, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("seq"), int) and isinstance(v.get("hash"), str)
            for v in data.values()):
        raise IntegrityError(f"cannot read the audit anchors {path}: not a JSON object of "
                             f"{{url: {{seq, hash, at}}}}",
                             hint="restore it, or delete it to trust the log as it is now")
    return data


def save(path: Path, anchors: dict[str, Any], key: str, head: tuple[int, str]) -> None:
    from ..atomic import atomic_write

    anchors[key] = {"seq": head[0], "hash": head[1],
                    "at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    with atomic_write(path, mode=0o600, fsync=False) as f:
        f.write(json.dumps(anchors, indent=1, sort_keys=True).encode("utf-8"))
    os.chmod(path, 0o600)
