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
from ..constants import MAX_GRAPH_JSON_BYTES, MAX_JSON_CONTAINERS, MAX_JSON_DEPTH, MAX_JSON_ITEMS
from ..errors import UnsafeArchiveError
from .graph import GraphFormatError, describe_program
from .safety import unsafe_in_graph

__all__ = ["Pt2Archive", "open_pt2", "SAMPLE_INPUTS_DIR", "DROPPED_MEMBERS"]

SAMPLE_INPUTS_DIR = "data/sample_inputs/"
#: members the normalizer removes (sample inputs are kept but emptied).
DROPPED_MEMBERS = (".data/serialization_id",)
_SMALL_JSON = 64 * 1024 * 1024
#: folders and files torch looks members up in. Its zip reader (miniz) matches names without
#: regard to case, so a member must not match one of these only case-insensitively.
_TORCH_PREFIXES = ("models/", "data/", "extra/", "archive_format", "archive_version", "byteorder",
                   ".data/")
#: whole state dicts of old archives; torch.load falls back to weights_only=False on them.
_LEGACY_PICKLES = ("data/weights/{}.pt", "data/constants/{}.pt")


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
    containers, items = data.count(b"{") + data.count(b"["), data.count(b",")
    if containers > MAX_JSON_CONTAINERS or items > MAX_JSON_ITEMS:
        raise UnsafeArchiveError(f"{where}: member {entry.name!r} holds {containers} objects and {items} "
                                 f"values, over the limits ({MAX_JSON_CONTAINERS}, {MAX_JSON_ITEMS})",
                                 member=entry.name, hint="parsing it would take many GB of memory")
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


def _check_layout(rel: dict[str, ZipEntry], where: str) -> None:
    """Refuse names torch would read other than as this reader does: names that differ only in
    case, names that match a torch folder only case-insensitively, and members under
    ``models/`` that are not ``models/<program>.json`` (torch loads every one as a program)."""
    seen: dict[str, str] = {}
    for name in rel:
        folded = name.casefold()
        if folded in seen:
            raise UnsafeArchiveError(f"{where}: members {seen[folded]!r} and {name!r} differ only in case",
                                     member=name, hint="torch's zip reader does not tell them apart")
        seen[folded] = name
        for prefix in _TORCH_PREFIXES:
            if folded.startswith(prefix) and not name.startswith(prefix):
                raise UnsafeArchiveError(f"{where}: member {name!r} would be read by torch as {prefix!r}",
                                         member=name, hint="torch's zip reader ignores case")
        if name.startswith("models/") and (name.count("/") != 1 or not name.endswith(".json")
                                           or len(name) <= len("models/.json")):
            raise UnsafeArchiveError(f"{where}: unexpected member {name!r} (torch loads every member "
                                     f"of models/ as a program)", member=name)


class _JsonMembers:
    """Small JSON members (weights and constants configs), each parsed at most once."""

    def __init__(self, path: str, rel: dict[str, ZipEntry], where: str) -> None:
        self.path, self.rel, self.where = path, rel, where
        self._parsed: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        """The parsed member, or None when the archive has no such member."""
        if name not in self._parsed:
            entry = self.rel.get(name)
            self._parsed[name] = load_json_member(self.path, entry, where=self.where) if entry else None
        return self._parsed[name]


def _config_items(configs: _JsonMembers, name: str) -> list[dict[str, Any]]:
    cfg = configs.get(name)
    items = (cfg or {}).get("config") if isinstance(cfg, dict) else None
    return [v for v in items.values() if isinstance(v, dict)] if isinstance(items, dict) else []


def _pickled_members(rel: dict[str, ZipEntry], configs: _JsonMembers, programs: list[str]) -> list[str]:
    """Members torch.export.load would unpickle: pickled weights and constants (tensor
    subclasses, TorchBind and opaque objects), legacy whole-state-dict files, sample inputs.

    This follows ``torch/export/pt2_archive/_package.py``: a weight is unpickled when its config
    says ``use_pickle``; a constant unless its path is ``tensor_*`` without ``use_pickle``.
    """
    out: set[str] = set()
    config_names = {n for n in rel if n.endswith(("_weights_config.json", "_constants_config.json"))}
    for name in config_names:
        folder = name.rsplit("/", 1)[0]
        constants = name.endswith("_constants_config.json")
        for item in _config_items(configs, name):
            member = f"{folder}/{item.get('path_name')}"
            plain_tensor = str(item.get("path_name", "")).startswith("tensor_") or not constants
            if item.get("use_pickle") or not plain_tensor:
                out.add(member)
    for prog in programs:
        out.update(n for n in (p.format(prog) for p in _LEGACY_PICKLES) if n in rel and rel[n].size > 0)
    for name, entry in rel.items():
        if "/custom_obj_" in "/" + name or "/opaque_obj_" in "/" + name:
            out.add(name)
        elif name.startswith(SAMPLE_INPUTS_DIR) and entry.size > 0:
            out.add(name)
        elif name.endswith((".pkl", ".pickle")):
            out.add(name)
    return sorted(out)


def open_pt2(path: str | os.PathLike, *, where: str | None = None,
             dim_names: dict[str, dict[str, str]] | None = None) -> Pt2Archive:
    """Validate and describe a `.pt2` file. ``dim_names``: program -> {symbol: Dim name}."""
    path = os.fspath(path)
    where = where or path
    root, rel = _split_root(read_entries(path, where=where), where)
    _check_layout(rel, where)
    configs = _JsonMembers(path, rel, where)
    programs: dict[str, dict[str, Any]] = {}
    for name, entry in rel.items():
        if name.startswith("models/") and name.endswith(".json") and name.count("/") == 1:
            prog = name[len("models/"):-len(".json")]
            model = load_json_member(path, entry, where=where, max_size=MAX_GRAPH_JSON_BYTES)
            unsafe = unsafe_in_graph(model)
            if unsafe:
                raise UnsafeArchiveError(f"{where}: program {prog!r} would run code while loading: {unsafe}",
                                         member=name, hint="the graph was not written by torch.export; "
                                         "do not load this file")
            try:
                programs[prog] = describe_program(
                    model,
                    weights_config=configs.get(f"data/weights/{prog}_weights_config.json"),
                    constants_config=configs.get(f"data/constants/{prog}_constants_config.json"),
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
        pickled=_pickled_members(rel, configs, list(programs)),
        archive_format=read_entry_bytes(path, fmt, max_size=64, where=where).decode("utf-8", "replace").strip() if fmt else None,
        archive_version=read_entry_bytes(path, ver, max_size=64, where=where).decode("utf-8", "replace").strip() if ver else None,
    )
