"""Vetting verdicts: a program member that passed the canonical checks, remembered on this machine.

``open_pt2(canonical=True)`` (the zip layout, the exact member allowlist, canonical JSON, the
graph checks and the payload sizes) costs ~0.1 ms per tensor: about a second for a program of
10,000 tensors, on every bundle, push and load of the same bytes. A *verdict* records that a
member passed, in the client cache (``HOME/cache/vetted-programs/<hex>.json``), keyed by

* the member's identity, ``Member.digest``: the sha256 of its bytes, or for a chunked member
  the sha256 of its canonical chunk list (each chunk's sha256 and size, tiling the member);
* the kind the manifest gives it (``exported_program`` or ``aoti``: the check differs);
* ``vetting_code()``: a digest of the code that vets (every file of ``registry/pt2``), so a
  new or changed check vets every member again.

It also keeps what the check found pickled (tensors, objects), which the loader needs.

A verdict is only as good as the bytes it is applied to: whoever skips the check on its
strength must know that the bytes it hands on hash to that identity. The loader reads members
from the verified cache; a push verifies every chunk it uploads (or finds stored) against its
digest, so what it publishes *is* the content the verdict was reached on. A verdict is never
taken from anyone else (the server never sees one): delete the directory to forget them all.

    >>> write_verdict(d, member.digest, "exported_program", (), ())   # doctest: +SKIP
    >>> read_verdict(d, member.digest, "exported_program")            # doctest: +SKIP
    ((), ())
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..atomic import atomic_write
from ..constants import VERSION
from ..digests import hex_of

__all__ = ["VERDICTS_DIR", "verdicts_dir", "vetting_code", "read_verdict", "write_verdict", "program_kinds",
           "pickled_of"]

#: the folder of the client cache (``Settings.cache_dir``) that holds the verdicts
VERDICTS_DIR = "vetted-programs"

Verdict = tuple[tuple[str, ...], tuple[str, ...]]  # (pickled tensors, pickled objects)


def verdicts_dir(cache_dir: str | os.PathLike) -> Path:
    """Where bundle, push and load keep verdicts for the client cache ``cache_dir``."""
    return Path(cache_dir) / VERDICTS_DIR


@lru_cache(maxsize=1)
def vetting_code() -> str:
    """A digest of the code that vets programs (``registry/pt2``: the reader, the graph checks
    and their checked-in grammars): a verdict holds only for the code that reached it."""
    h = hashlib.sha256(VERSION.encode())
    for f in sorted(Path(__file__).resolve().parent.iterdir()):
        if f.suffix in (".py", ".json"):
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _record(directory: str | os.PathLike | None, member_digest: str | None) -> Path | None:
    if directory is None or not member_digest:
        return None
    return Path(directory) / f"{hex_of(member_digest)}.json"


def read_verdict(directory: str | os.PathLike | None, member_digest: str | None, kind: str) -> Verdict | None:
    """(pickled tensors, pickled objects) of a member that passed as ``kind`` with this code,
    or None (no directory, no verdict, another code or kind, or an unreadable record)."""
    record = _record(directory, member_digest)
    if record is None:
        return None
    try:
        value = json.loads(record.read_text("utf-8"))
        if value["code"] != vetting_code() or value["kind"] != kind:
            return None
        return tuple(map(str, value["tensors"])), tuple(map(str, value["objects"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_verdict(directory: str | os.PathLike | None, member_digest: str | None, kind: str,
                  tensors: Sequence[str], objects: Sequence[str]) -> None:
    """Remember that the member passed ``open_pt2(canonical=True, kind=kind)`` with this code
    (atomically; a cache that cannot be written costs the next check, nothing more)."""
    record = _record(directory, member_digest)
    if record is None:
        return
    try:
        with atomic_write(record, fsync=False) as f:
            f.write(json.dumps({"code": vetting_code(), "kind": kind, "tensors": list(tensors),
                                "objects": list(objects)}).encode("utf-8"))
    except OSError:
        pass


def pickled_of(archive: Any) -> Verdict:
    """What a checked ``Pt2Archive`` would unpickle: (pickled tensors, pickled objects)."""
    objects = tuple(archive.pickled_objects)
    return tuple(m for m in archive.pickled if m not in objects), objects


def program_kinds(manifest: Any) -> dict[str, str]:
    """Member path -> the kind a program member is vetted as: its variant's kind, else by its
    role. The one mapping push and bundle key verdicts by (the loader uses the variant's)."""
    kinds = {v.member: v.kind for spec in manifest.programs.values() for v in spec.variants}
    return {m.path: kinds.get(m.path, "aoti" if m.role == "aoti" else "exported_program")
            for m in manifest.members if m.role in ("program", "aoti")}
