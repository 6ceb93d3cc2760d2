"""Open a `.pt2` (torch.export archive or AOTInductor package) as untrusted bytes and describe it.

Nothing here imports torch or unpickles: the graph is read from ``models/<name>.json``, weights
are only listed, and pickled members are reported so the caller can refuse them.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from ..constants import MAX_GRAPH_JSON_BYTES, MAX_JSON_CONTAINERS, MAX_JSON_DEPTH, MAX_JSON_ITEMS
from ..digests import canonical_json
from ..errors import IncompatibleError, UnsafeArchiveError, UsageError
from ..format.zipsafe import ZipEntry, read_canonical_entries, read_entries, read_entry_bytes
from .graph import GraphFormatError, describe_program
from .safety import unsafe_in_graph
from .verdicts import program_kinds, read_verdict

__all__ = ["Pt2Archive", "open_pt2", "SAMPLE_INPUTS_DIR", "DROPPED_MEMBERS", "CANONICAL_ROOT",
           "is_json_member"]

SAMPLE_INPUTS_DIR = "data/sample_inputs/"
#: members the normalizer removes (sample inputs are kept but emptied).
DROPPED_MEMBERS = (".data/serialization_id",)
_SMALL_JSON = 64 * 1024 * 1024
#: whole state dicts of old archives; torch.load falls back to weights_only=False on them.
_LEGACY_PICKLES = ("data/weights/{}.pt", "data/constants/{}.pt")
#: the root folder of every program member of a bundle (what torch writes for an in-memory save).
CANONICAL_ROOT = "archive"
#: folders and files torch looks members up in. Its zip reader (miniz) matches names without
#: regard to case, so a member must not match one of these only case-insensitively.
_TORCH_PREFIXES = ("models/", "data/", "extra/", "archive_format", "archive_version", "byteorder",
                   ".data/")
#: The exact member names a program archive may hold (relative to its root folder), in exact
#: case; anything else is refused, so nothing torch might read is left unvetted.
_ID = r"[A-Za-z_][A-Za-z0-9_]*"
_FILE = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}"
_FIXED_MEMBERS = frozenset({"archive_format", "archive_version", "byteorder", ".data/version",
                            ".data/serialization_id"})
_PORTABLE_MEMBER = re.compile(
    rf"models/(?P<model>{_ID})\.json|data/sample_inputs/(?P<sample>{_ID})\.pt"
    rf"|data/(?P<folder>weights|constants)/(?:(?P<config>{_ID})_(?:weights|constants)_config\.json|(?P<payload>{_FILE}))"
    rf"|extra/{_FILE}\Z")
_AOTI_MEMBER = re.compile(rf"data/aotinductor/{_ID}/{_FILE}|data/(?:weights|constants)/{_FILE}\Z")
#: payload names a weights/constants config may point at (torch joins them to the folder).
_PAYLOAD_NAME = re.compile(rf"{_FILE}\Z")
#: bytes per element of torch._export.serde.schema.ScalarType codes.
_ELEMENT_SIZE = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 2, 7: 4, 8: 8, 9: 4, 10: 8, 11: 16, 12: 1, 13: 2,
                 28: 2, 29: 1, 30: 1, 31: 1, 32: 1, 33: 1, 34: 4, 35: 8}
_NATIVE_SUFFIXES = (".so", ".dll", ".dylib", ".pyd", ".o", ".a")
#: constants torch unpickles as objects whatever the config says (TorchBind, opaque objects).
_OBJECT_PREFIXES = ("custom_obj_", "opaque_obj_")
_CONSTANT_PREFIXES = ("tensor_",) + _OBJECT_PREFIXES


def is_json_member(name: str) -> bool:
    """Members torch parses as JSON: graphs and payload configs (kept canonical in a bundle)."""
    return (name.startswith("models/") and name.endswith(".json")) or name.endswith(
        ("_weights_config.json", "_constants_config.json"))


@dataclass(frozen=True)
class Pt2Archive:
    """What a `.pt2` holds, by relative member path (without the root folder)."""

    path: str
    root: str
    entries: dict[str, ZipEntry]          # relative name -> entry
    programs: dict[str, dict[str, Any]]   # program name -> manifest description
    aoti: dict[str, dict[str, Any]]       # AOTI model name -> {"metadata": {...}, "libraries": [...]}
    pickled: list[str] = field(default_factory=list)   # members torch would unpickle
    pickled_objects: list[str] = field(default_factory=list)  # of those, the ones that are not tensors
    archive_version: str | None = None


def _json_depth_ok(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    stack = [(value, 0)] if isinstance(value, (dict, list)) else []
    while stack:
        v, d = stack.pop()
        if d > limit * 4:
            return False
        for x in (v.values() if isinstance(v, dict) else v):
            if isinstance(x, (dict, list)):
                stack.append((x, d + 1))
    return True


def load_json_member(path: str, entry: ZipEntry, *, where: str, max_size: int = _SMALL_JSON,
                     data: bytes | None = None) -> Any:
    if data is None:
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


#: what a ``torch.save`` file is, told apart from a program before anything else is said about it
#: a legacy ``torch.save`` file starts with its magic number pickled: LONG1, 10 bytes, little-endian
_LEGACY_TORCH_SAVE = b"\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little")
_TORCH_SAVE_HINT = ("save the program with torch.export.save(torch.export.export(model, args), PATH) "
                    "and bundle that file")


def _read_user_file(path: str, where: str) -> dict[str, ZipEntry]:
    """The zip entries of a ``.pt2`` a user named. A ``torch.save`` file is a zip too (one root
    folder holding ``data.pkl``), or a bare pickle in torch's legacy format: either is a
    pickled object, never a program, and is refused as a usage error (exit 2) that says so,
    before any member is read or anything is unpickled."""
    try:
        entries = read_entries(path, where=where)
    except UnsafeArchiveError:
        if _is_legacy_torch_save(path):
            raise UsageError(f"{where} is a torch.save file (a pickle), not a torch.export.save program",
                             hint=_TORCH_SAVE_HINT) from None
        raise
    names = {n.split("/", 1)[1] for n in entries if n.count("/") >= 1}
    if "data.pkl" in names and not any(n.startswith("models/") or n == "archive_format" for n in names):
        raise UsageError(f"{where} is a torch.save file (a pickle zip), not a torch.export.save program",
                         hint=_TORCH_SAVE_HINT)
    return entries


def _is_legacy_torch_save(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(len(_LEGACY_TORCH_SAVE) + 2)
    except OSError:  # a directory, unreadable: not this
        return False
    return head[:1] == b"\x80" and head[2:] == _LEGACY_TORCH_SAVE  # PROTO n, then torch's magic number


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


def _check_allowlist(rel: dict[str, ZipEntry], where: str) -> None:
    """Every member must be one torch.export.save or aoti_compile_and_package writes, named
    exactly (case included); a program archive never mixes a graph with native code."""
    portable = any(n.startswith("models/") for n in rel)
    native = [n for n in rel if n.startswith("data/aotinductor/") or n.endswith(_NATIVE_SUFFIXES)]
    if portable and native:
        raise UnsafeArchiveError(f"{where}: a portable program carries native code ({native[0]!r})",
                                 member=native[0], hint="torch would load it as an AOTInductor library; "
                                 "bundle an AOTInductor package as a separate variant (NAME=PKG.pt2)")
    pattern = _PORTABLE_MEMBER if portable else _AOTI_MEMBER
    for name in rel:
        if name not in _FIXED_MEMBERS and not pattern.match(name):
            raise UnsafeArchiveError(f"{where}: unexpected member {name!r} in a "
                                     f"{'program' if portable else 'AOTInductor package'}", member=name,
                                     hint="only the members torch.export writes are allowed, in exact case")
    if portable:
        models = {n[len("models/"):-len(".json")] for n in rel if n.startswith("models/")}
        for name in rel:
            m = _PORTABLE_MEMBER.match(name)
            owner = m and (m.group("sample") or m.group("config"))
            if owner and owner not in models:
                raise UnsafeArchiveError(f"{where}: member {name!r} belongs to no program in models/",
                                         member=name)


def _check_canonical_json(configs: _JsonMembers) -> None:
    """In a bundle, every JSON member torch parses is the canonical serialization of its value:
    no duplicate keys, whitespace or alternative spellings two parsers could read differently."""
    for name in configs.rel:
        if is_json_member(name):
            configs.get(name)


def _int_field(value: Any) -> int | None:
    if isinstance(value, dict) and set(value) == {"as_int"}:
        value = value["as_int"]
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _payload_bytes(meta: Any) -> tuple[int, int, int] | None:
    """(bytes a view needs from its storage, element count, element size) of a tensor_meta,
    or None when it is not a plain strided tensor description."""
    if not isinstance(meta, dict):
        return None
    elsize = _ELEMENT_SIZE.get(meta.get("dtype"))  # type: ignore[arg-type]
    sizes = [_int_field(v) for v in meta.get("sizes") or []] if isinstance(meta.get("sizes"), list) else None
    strides = [_int_field(v) for v in meta.get("strides") or []] if isinstance(meta.get("strides"), list) else None
    offset = _int_field(meta.get("storage_offset"))
    if elsize is None or sizes is None or strides is None or offset is None or len(sizes) != len(strides) \
            or any(v is None for v in sizes + strides):
        return None
    numel = 1
    for n in sizes:
        numel *= n  # type: ignore[operator]
    if numel == 0:
        return 0, 0, elsize
    extent = offset + 1 + sum((n - 1) * st for n, st in zip(sizes, strides))  # type: ignore[operator]
    return extent * elsize, numel, elsize


def _check_payloads(rel: dict[str, ZipEntry], configs: _JsonMembers, where: str) -> None:
    """Every weight and constant the configs declare must be backed by its stored bytes: torch
    allocates ``zeros(shape)`` for an empty member and views others with ``as_strided``, so a
    few KB declaring a huge shape would otherwise cost gigabytes."""
    referenced: set[str] = set()
    for cname in sorted(n for n in rel if n.endswith(("_weights_config.json", "_constants_config.json"))):
        folder = cname.rsplit("/", 1)[0]
        cfg = configs.get(cname)
        items = cfg.get("config") if isinstance(cfg, dict) else None
        if not isinstance(items, dict):
            raise UnsafeArchiveError(f"{where}: {cname!r} has no config table", member=cname)
        dtypes: dict[str, Any] = {}
        referenced.update(f"{folder}/{i.get('path_name')}" for i in items.values() if isinstance(i, dict))
        for fqn, item in items.items():
            pname = item.get("path_name") if isinstance(item, dict) else None
            if not isinstance(pname, str) or not _PAYLOAD_NAME.match(pname):
                raise UnsafeArchiveError(f"{where}: {cname!r} entry {str(fqn)[:80]!r} points at "
                                         f"{str(pname)[:80]!r}, not a file of {folder}/", member=cname)
            member = f"{folder}/{pname}"
            entry = rel.get(member)
            if entry is None:
                raise UnsafeArchiveError(f"{where}: {cname!r} entry {str(fqn)[:80]!r} needs missing member "
                                         f"{member!r}", member=cname)
            if folder == "data/constants" and not pname.startswith(_CONSTANT_PREFIXES):
                raise UnsafeArchiveError(f"{where}: constant {str(fqn)[:80]!r} is stored as {pname!r}, a kind "
                                         f"torch does not load", member=member)
            if item.get("use_pickle") or pname.startswith(_OBJECT_PREFIXES):
                continue  # pickled: classified (and refused) by _pickled_members
            need = _payload_bytes(item.get("tensor_meta"))
            if need is None:
                raise UnsafeArchiveError(f"{where}: {cname!r} entry {str(fqn)[:80]!r} has an unreadable "
                                         f"tensor description", member=cname)
            extent, numel, elsize = need
            dtype = (item.get("tensor_meta") or {}).get("dtype")
            if dtypes.setdefault(pname, dtype) != dtype:
                raise UnsafeArchiveError(f"{where}: {member!r} is read as two dtypes", member=member)
            if entry.size % elsize or (entry.size == 0 and numel) or extent > entry.size:
                raise UnsafeArchiveError(
                    f"{where}: {str(fqn)[:80]!r} declares {numel} elements ({extent} bytes) but {member!r} "
                    f"holds {entry.size} bytes", member=member,
                    hint="a tensor's declared shape must match its stored bytes")
    for name in rel:
        m = _PORTABLE_MEMBER.match(name)
        if m and m.group("payload") and name not in referenced:
            raise UnsafeArchiveError(f"{where}: member {name!r} is no weight or constant of any program",
                                     member=name, hint="torch would read it as a legacy pickled state dict")


class _JsonMembers:
    """JSON members (graphs, weights and constants configs), each read and parsed at most once.
    With ``canonical``, each must also be the canonical serialization of its value."""

    def __init__(self, path: str, rel: dict[str, ZipEntry], where: str, canonical: bool = False) -> None:
        self.path, self.rel, self.where, self.canonical = path, rel, where, canonical
        self._parsed: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        """The parsed member, or None when the archive has no such member."""
        if name not in self._parsed:
            entry = self.rel.get(name)
            self._parsed[name] = self._load(entry) if entry else None
        return self._parsed[name]

    def _load(self, entry: ZipEntry) -> Any:
        data = read_entry_bytes(self.path, entry, max_size=MAX_GRAPH_JSON_BYTES, where=self.where)
        value = load_json_member(self.path, entry, where=self.where, data=data)
        if self.canonical:
            try:
                ok = canonical_json(value) == data
            except ValueError:
                ok = False
            if not ok:
                raise UnsafeArchiveError(f"{self.where}: member {entry.name!r} is not canonical JSON",
                                         member=entry.name, hint="rebuild the bundle with `pt2reg bundle`")
        return value


def _config_items(configs: _JsonMembers, name: str) -> list[dict[str, Any]]:
    cfg = configs.get(name)
    items = (cfg or {}).get("config") if isinstance(cfg, dict) else None
    return [v for v in items.values() if isinstance(v, dict)] if isinstance(items, dict) else []


def _pickled_members(rel: dict[str, ZipEntry], configs: _JsonMembers, programs: list[str]
                     ) -> tuple[list[str], list[str]]:
    """Members torch.export.load would unpickle, as (pickled tensors, pickled objects).

    This follows ``torch/export/pt2_archive/_package.py``: a weight or a ``tensor_*`` constant
    whose config says ``use_pickle`` is a pickled tensor (a tensor subclass; ``torch.load`` with
    ``weights_only=False``); TorchBind ``custom_obj_*`` and ``opaque_obj_*`` constants, legacy
    whole-state-dict files and non-empty sample inputs are pickled objects.
    """
    tensors: set[str] = set()
    objects: set[str] = set()
    config_names = {n for n in rel if n.endswith(("_weights_config.json", "_constants_config.json"))}
    for name in config_names:
        folder = name.rsplit("/", 1)[0]
        for item in _config_items(configs, name):
            pname = str(item.get("path_name", ""))
            member = f"{folder}/{pname}"
            if pname.startswith(_OBJECT_PREFIXES):
                objects.add(member)
            elif item.get("use_pickle"):
                tensors.add(member)
    for prog in programs:
        objects.update(n for n in (p.format(prog) for p in _LEGACY_PICKLES) if n in rel and rel[n].size > 0)
    for name, entry in rel.items():
        if "/custom_obj_" in "/" + name or "/opaque_obj_" in "/" + name:
            objects.add(name)
        elif name.startswith(SAMPLE_INPUTS_DIR) and entry.size > 0:
            objects.add(name)
        elif name.endswith((".pkl", ".pickle")):
            objects.add(name)
    return sorted(tensors - objects), sorted(objects)


def open_pt2(path: str | os.PathLike, *, where: str | None = None,
             dim_names: dict[str, dict[str, str]] | None = None, canonical: bool = False,
             kind: str | None = None, span: tuple[int, int] | None = None, describe: bool = True) -> Pt2Archive:
    """Validate and describe a `.pt2` file. ``dim_names``: program -> {symbol: Dim name}.

    ``canonical``: the file is a program member of a bundle, so it must be byte for byte what
    the bundler writes (``read_canonical_entries``: the zip layout; root ``archive/``; every JSON
    member torch parses in canonical form). ``kind`` ("exported_program" or "aoti") is what the
    manifest says the member is; a member that is not that is refused. ``span``: (offset, size)
    of the archive inside ``path`` (a member read in place in its bundle). ``describe=False``
    checks only the zip structure, layout and allowlist and names the programs (their
    descriptions are left empty): what the bundler needs to normalize a file, which it then
    opens in full in its canonical form.
    """
    path = os.fspath(path)
    where = where or path
    if canonical:
        offset, size = span or (0, None)
        entries = read_canonical_entries(path, where=where, offset=offset, size=size)
    else:
        entries = _read_user_file(path, where)
    root, rel = _split_root(entries, where)
    _check_layout(rel, where)
    _check_allowlist(rel, where)
    portable = any(n.startswith("models/") for n in rel)
    if kind is not None and portable != (kind == "exported_program"):
        raise UnsafeArchiveError(f"{where}: the manifest says {kind!r} but the member is "
                                 f"{'a portable program' if portable else 'an AOTInductor package'}")
    if canonical:
        if root != CANONICAL_ROOT:
            raise UnsafeArchiveError(f"{where}: not a canonical program archive: root folder {root!r}")
        if ".data/serialization_id" in rel:
            raise UnsafeArchiveError(f"{where}: not a canonical program archive: it keeps torch's per-save id",
                                     member=".data/serialization_id")
    configs = _JsonMembers(path, rel, where, canonical=canonical)
    if canonical and portable and describe:
        _check_canonical_json(configs)
    if portable and describe:
        _check_payloads(rel, configs, where)
    programs: dict[str, dict[str, Any]] = {}
    for name, entry in rel.items():  # noqa: B007
        if name.startswith("models/") and name.endswith(".json") and name.count("/") == 1:
            prog = name[len("models/"):-len(".json")]
            if not describe:
                programs[prog] = {}
                continue
            model = configs.get(name)
            unsafe = unsafe_in_graph(model)
            if unsafe:
                _refuse_newer_schema(model, unsafe, where, prog)
                raise UnsafeArchiveError(f"{where}: program {prog!r} is refused before torch reads it: {unsafe}",
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
    if fmt:   # nothing reads it, but it is held to the same size limit as archive_version
        read_entry_bytes(path, fmt, max_size=64, where=where)
    if not programs and not aoti:
        raise UnsafeArchiveError(f"{where}: no program found (no models/*.json and no AOTInductor model)",
                                 hint="expected a file written by torch.export.save")
    tensors, objects = _pickled_members(rel, configs, list(programs)) if describe else ([], [])
    return Pt2Archive(
        path=path, root=root, entries=rel, programs=programs, aoti=aoti,
        pickled=sorted(tensors + objects), pickled_objects=objects,
        archive_version=read_entry_bytes(path, ver, max_size=64, where=where).decode("utf-8", "replace").strip() if ver else None,
    )


def check_bundle_programs(bundle: Any, *, vetted_dir: str | os.PathLike | None = None) -> None:
    """Vet every program member of an opened ``BundleFile`` in place, as the loader will
    (canonical layout, allowlist, graph, payload sizes): a bundle whose programs torch would
    read differently from us is refused at push, before anything is uploaded. Pickled tensors
    are left to the loader, which refuses them unless trusted.

    ``vetted_dir`` (``registry.pt2.verdicts``): a member with a verdict there for its identity
    (``Member.digest``), kind and this vetting code is not read. Only sound for a caller that
    then uses nothing of the member but bytes it checks against that identity (push: every
    chunk it stores is verified against the chunk list, see ``registry.client.push``). No
    verdict is written here: what this reads is the file, which need not be that identity (a
    file altered after bundling, or a chunk listed twice whose second copy no upload reads)."""
    kinds = program_kinds(bundle.manifest)
    for member in bundle.manifest.members:
        kind = kinds.get(member.path)
        if kind is None or read_verdict(vetted_dir, member.digest, kind) is not None:
            continue
        where = f"{bundle.path}: member {member.path}"
        open_pt2(bundle.path, where=where, canonical=True, span=bundle.member_span(member.path), kind=kind)


#: what the schema check says of a field, union tag or enum value it does not know
_NOVELTY = re.compile(r"unknown field \(not in torch's |is not a [A-Za-z_]+ value")


def _refuse_newer_schema(model: Any, reason: str, where: str, prog: str) -> None:
    """IncompatibleError (exit 4), not a tamper verdict, when a program fails the schema check
    only on something it may not know yet (a field, tag or enum value) and declares a serde
    schema newer than the one this pt2-registry reads: it was written by a newer torch. The
    program is refused either way; only the message and the exit code differ."""
    from .serde_schema import load_schema

    declared = model.get("schema_version") if isinstance(model, dict) else None
    try:
        have = (int(declared["major"]), int(declared["minor"])) if isinstance(declared, dict) else None
    except (KeyError, TypeError, ValueError):
        have = None
    ours = tuple(load_schema()["schema_version"] or (0, 0))
    if have is None or have <= ours or not _NOVELTY.search(reason):
        return
    raise IncompatibleError(
        f"{where}: program {prog!r} was written by a newer torch (schema {have[0]}.{have[1]}; this pt2-registry "
        f"reads up to {ours[0]}.{ours[1]}): {reason}",
        hint="run it where a newer torch and pt2-registry are installed, or re-export it with a supported torch "
             "(pt2reg target shows this machine's)")
