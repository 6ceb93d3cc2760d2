"""Open a `.pt2` (torch.export archive or AOTInductor package) as untrusted bytes and describe it.

Nothing here imports torch or unpickles: the graph is read from ``models/<name>.json``, weights
are only listed, and pickled members are reported so the caller can refuse them.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from ..archive.zipsafe import ZipEntry, read_entries, read_entry_bytes
from ..constants import MAX_GRAPH_JSON_BYTES, MAX_JSON_DEPTH
from ..errors import UnsafeArchiveError
from .graph import GraphFormatError, describe_program

__all__ = ["Pt2Archive", "open_pt2", "SAMPLE_INPUTS_DIR", "DROPPED_MEMBERS"]

SAMPLE_INPUTS_DIR = "data/sample_inputs/"
#: members the normalizer removes (sample inputs are kept but emptied).
DROPPED_MEMBERS = (".data/serialization_id",)
_SMALL_JSON = 64 * 1024 * 1024


@dataclass(frozen=True)
class Pt2Archive:
    """What a `.pt2` holds, by relative member path (without the root folder)."""

    path: str
    root: str
    entries: dict[str, ZipEntry]          # relative name -> entry
    programs: dict[str, dict[str, Any]]   # program name -> manifest description
    aoti: dict[str, dict[str, Any]]       # AOTI model name -> {"metadata": {...}, "libraries": [...]}
    pickled: list[str] = field(default_factory=list)   # members torch would unpickle
    archive_format: str | None = None
    archive_version: str | None = None

    @property
    def is_aoti(self) -> bool:
        return bool(self.aoti)


def _json_depth_ok(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    stack = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if d > limit * 4:
            return False
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return True


def load_json_member(path: str, entry: ZipEntry, *, where: str, max_size: int = _SMALL_JSON) -> Any:
    data = read_entry_bytes(path, entry, max_size=max_size, where=where)
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise UnsafeArchiveError(f"{where}: member {entry.name!r} is not valid JSON ({exc})",
                                 member=entry.name) from exc
    if not _json_depth_ok(value):
        raise UnsafeArchiveError(f"{where}: member {entry.name!r} is nested too deeply", member=entry.name)
    return value


def _split_root(entries: dict[str, ZipEntry], where: str) -> tuple[str, dict[str, ZipEntry]]:
    roots = {name.split("/", 1)[0] for name in entries}
    if len(roots) != 1 or any("/" not in n for n in entries):
        raise UnsafeArchiveError(f"{where}: not a torch.export archive (members must share one root folder)",
                                 hint="expected a file written by torch.export.save or aoti_compile_and_package")
    root = roots.pop()
    return root, {name.split("/", 1)[1]: e for name, e in entries.items()}


def _pickled_members(path: str, rel: dict[str, ZipEntry], where: str) -> list[str]:
    """Members torch.export.load would unpickle (tensor subclasses, TorchBind, sample inputs)."""
    out: set[str] = set()
    for name, entry in rel.items():
        if name.endswith(("_weights_config.json", "_constants_config.json")):
            cfg = load_json_member(path, entry, where=where)
            folder = name.rsplit("/", 1)[0]
            for item in ((cfg or {}).get("config") or {}).values() if isinstance(cfg, dict) else []:
                if isinstance(item, dict) and item.get("use_pickle"):
                    out.add(f"{folder}/{item.get('path_name')}")
        elif "/custom_obj_" in "/" + name or name.startswith("data/constants/custom_obj"):
            out.add(name)
        elif name.startswith(SAMPLE_INPUTS_DIR) and entry.size > 0:
            out.add(name)
        elif name.endswith(".pkl") or name.endswith(".pickle"):
            out.add(name)
    return sorted(out)


def open_pt2(path: str | os.PathLike, *, where: str | None = None,
             dim_names: dict[str, dict[str, str]] | None = None) -> Pt2Archive:
    """Validate and describe a `.pt2` file. ``dim_names``: program -> {symbol: Dim name}."""
    path = os.fspath(path)
    where = where or path
    root, rel = _split_root(read_entries(path, where=where), where)
    programs: dict[str, dict[str, Any]] = {}
    for name, entry in rel.items():
        if name.startswith("models/") and name.endswith(".json") and name.count("/") == 1:
            prog = name[len("models/"):-len(".json")]
            model = load_json_member(path, entry, where=where, max_size=MAX_GRAPH_JSON_BYTES)
            wcfg = rel.get(f"data/weights/{prog}_weights_config.json")
            ccfg = rel.get(f"data/constants/{prog}_constants_config.json")
            try:
                programs[prog] = describe_program(
                    model,
                    weights_config=load_json_member(path, wcfg, where=where) if wcfg else None,
                    constants_config=load_json_member(path, ccfg, where=where) if ccfg else None,
                    dim_names=(dim_names or {}).get(prog),
                )
            except (GraphFormatError, KeyError, TypeError, AttributeError, ValueError) as exc:
                raise UnsafeArchiveError(f"{where}: program {prog!r} has an unreadable graph ({exc})",
                                         member=name) from exc
    aoti: dict[str, dict[str, Any]] = {}
    for name, entry in rel.items():
        if name.startswith("data/aotinductor/"):
            parts = name.split("/")
            if len(parts) < 4:
                continue
            info = aoti.setdefault(parts[2], {"metadata": {}, "libraries": []})
            if name.endswith("_metadata.json"):
                meta = load_json_member(path, entry, where=where)
                if isinstance(meta, dict):
                    info["metadata"] = {str(k): str(v) for k, v in meta.items()}
            elif name.endswith(".so"):
                info["libraries"].append(name)
    fmt = rel.get("archive_format")
    ver = rel.get("archive_version")
    if not programs and not aoti:
        raise UnsafeArchiveError(f"{where}: no program found (no models/*.json and no AOTInductor model)",
                                 hint="expected a file written by torch.export.save")
    return Pt2Archive(
        path=path, root=root, entries=rel, programs=programs, aoti=aoti,
        pickled=_pickled_members(path, rel, where),
        archive_format=read_entry_bytes(path, fmt, max_size=64, where=where).decode("utf-8", "replace").strip() if fmt else None,
        archive_version=read_entry_bytes(path, ver, max_size=64, where=where).decode("utf-8", "replace").strip() if ver else None,
    )
