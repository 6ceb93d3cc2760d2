"""The bundle manifest: validation against ``schema/manifest.schema.json``, parsed once into
frozen, typed values.

Two stages, like pypa/packaging: raw JSON -> ``Manifest.from_raw``, which reports every problem
at once (schema errors plus cross-field checks) and then parses the JSON into ``ProgramSpec``,
``TensorSpec``, ``Dim``, ``RequiredOp``, ``Variant``, ``Member``, ``Sample``... Every layer reads
attributes; dicts exist only at the JSON edge: ``from_json`` here, and ``to_json()``, which
writes back exactly the JSON that was read (optional keys present as they were given), so the
canonical bytes and the digest (``sha256:`` of ``canonical_json(manifest.to_json())``) never
depend on the typed view. For example::

    m = Manifest.from_raw(json.loads(data))     # ManifestError listing every problem at once
    m.digest, [i.name for i in m.programs["encoder"].inputs]
"""
from __future__ import annotations

import copy
import json
import operator
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from importlib import resources
from itertools import accumulate
from types import MappingProxyType
from typing import Any

import orjson

from ..constants import BUNDLE_FORMAT, PACKAGE_PARENT
from ..digests import all_hex64, canonical_json, digest_of_bytes
from ..errors import ManifestError, UnsupportedFormatError, UsageError
from .packs import PackIndex, stored_with_packs

__all__ = ["Manifest", "ProgramSpec", "ProgramWindow", "TensorSpec", "Dim", "RequiredOp", "ConstantInput", "PytreeClass",
           "BakedDevice", "AotiTarget", "Variant", "Serialization", "Requirements", "Environment", "Member", "Sample",
           "BakedDeviceGroup", "baked_device_groups", "evolve", "load_schema", "validate_raw", "stored_blobs",
           "recorded_facts"]


@lru_cache(maxsize=1)
def load_schema() -> dict[str, Any]:
    """The manifest JSON Schema shipped with the package (``schema/`` in the repository)."""
    try:
        text = resources.files("registry._schema").joinpath("manifest.schema.json").read_text("utf-8")
    except (ModuleNotFoundError, FileNotFoundError):
        text = (PACKAGE_PARENT / "schema" / "manifest.schema.json").read_text("utf-8")
    return json.loads(text)


@lru_cache(maxsize=1)
def _validator() -> Any:
    import jsonschema

    schema = load_schema()
    cls = jsonschema.validators.validator_for(schema)
    # The schema ships with the package: tests/unit/test_manifest.py checks it against its
    # metaschema once, rather than every process (~50 ms of CPU per `pt2reg pull`/`push`).
    # JSON Schema calls 1.0 an integer; a manifest that says "format": 1.0 is not canonical
    # and is refused rather than read as 1.
    strict = jsonschema.validators.extend(cls, type_checker=cls.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: type(value) is int))
    return strict(schema)


@lru_cache(maxsize=1)
def _fast_check() -> Callable[[Any], bool] | None:
    """The schema compiled into a yes-or-no check (``format.schema_check``): valid manifests
    are told apart without importing ``jsonschema`` (~40 ms of every push and pull), which then
    only describes a manifest this refused. None if the schema needs a keyword it lacks."""
    from .schema_check import Unsupported, compile_schema

    try:
        return compile_schema(load_schema())
    except Unsupported:
        return None


def _schema_problems(raw: Any) -> list[str]:
    """What ``jsonschema`` finds wrong with ``raw`` (none when the fast check accepts it)."""
    fast = _fast_check()
    if fast is not None and fast(raw):
        return []
    return [f"{_path_of(e)}: {e.message}" for e in _validator().iter_errors(raw)]


def _path_of(err: Any) -> str:
    return "/".join(str(p) for p in err.absolute_path) or "(root)"


#: the schema's ``chunks`` array limit, checked by hand with its items (``_chunk_problems``)
MAX_CHUNKS = 1_000_000


def _chunks_elided(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with each member's chunk list cut to its first item: a program of 10,000 tensors
    has 10,000 chunks, which the generic validator takes half a second to walk. The schema
    still sees the list and one item; ``_chunk_problems`` checks every item by the same rules."""
    members = raw.get("members")
    if not isinstance(members, list):
        return raw
    cut = [{**m, "chunks": m["chunks"][:1]} if isinstance(m, dict) and isinstance(m.get("chunks"), list) else m
           for m in members]
    return {**raw, "members": cut}


#: a well-formed chunk list's two columns (sha256 hexes, sizes), by member index
_Columns = dict[int, tuple[list[str], list[int]]]


def _chunk_problems(raw: dict[str, Any], columns: _Columns) -> list[str]:
    """The schema's rules for ``members/*/chunks/*`` past the first item (each an object with
    exactly ``sha256``, 64 lowercase hex, and ``size``, an integer >= 0), and its ``maxItems``;
    the columns of each well-formed list go into ``columns`` (read once, used by the rest of
    the parse)."""
    problems = []
    members = raw.get("members")
    for i, m in enumerate(members if isinstance(members, list) else ()):
        chunks = m.get("chunks") if isinstance(m, dict) else None
        if not isinstance(chunks, list):
            continue
        if len(chunks) > MAX_CHUNKS:
            problems.append(f"members/{i}/chunks: more than {MAX_CHUNKS} chunks")
        well_formed = _chunk_columns(chunks)
        if well_formed is not None:
            columns[i] = well_formed
            continue
        for j, c in enumerate(chunks[1:], 1):
            if not (isinstance(c, dict) and c.keys() == {"sha256", "size"}):
                problems.append(f"members/{i}/chunks/{j}: not an object of exactly 'sha256' and 'size'")
            elif not all_hex64([c["sha256"]]):
                problems.append(f"members/{i}/chunks/{j}/sha256: {c['sha256']!r} is not 64 lowercase hex digits")
            elif type(c["size"]) is not int or c["size"] < 0:
                problems.append(f"members/{i}/chunks/{j}/size: {c['size']!r} is not an integer >= 0")
    return problems


_SHA256, _SIZE = operator.itemgetter("sha256"), operator.itemgetter("size")
_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)


def _chunk_columns(chunks: list[Any]) -> tuple[list[str], list[int]] | None:
    """A chunk list's (sha256 hexes, sizes) when every item follows the schema's rules, else
    None (``_chunk_problems``' quick path: whole-list operations, no Python loop per chunk; the
    slow loop then says what is wrong)."""
    if set(map(type, chunks)) - {dict} or set(map(len, chunks)) - {2}:
        return None
    try:  # two keys each, and both of them there: exactly these two
        hexes, sizes = list(map(_SHA256, chunks)), list(map(_SIZE, chunks))
    except KeyError:
        return None
    if all_hex64(hexes) and set(map(type, sizes)) <= {int} and min(sizes, default=0) >= 0:
        return hexes, sizes
    return None


def validate_raw(raw: Any) -> list[str]:
    """Every problem with a raw manifest, as human-readable strings (empty when valid)."""
    return _validate(raw, {})


def _validate(raw: Any, columns: _Columns) -> list[str]:
    """``validate_raw``, the columns of the chunk lists left in ``columns``."""
    if not isinstance(raw, dict):
        return ["manifest is not a JSON object"]
    fmt = raw.get("format")
    if isinstance(fmt, int) and not isinstance(fmt, bool) and fmt > BUNDLE_FORMAT:
        raise UnsupportedFormatError(
            f"bundle format {fmt} is newer than this pt2-registry understands (format {BUNDLE_FORMAT})",
            hint="upgrade pt2-registry to read it")
    problems = sorted(_schema_problems(_chunks_elided(raw)) + _chunk_problems(raw, columns))
    if problems:
        return problems
    members = {m["path"]: m for m in raw["members"]}
    for i, m in enumerate(raw["members"]):  # a chunked member's integrity is its chunk list: it must tile the member
        if "chunks" not in m:
            continue
        sizes = columns[i][1]   # no problem so far: every chunk list was well formed
        if sum(sizes) != m["size"]:
            problems.append(f"members/{m['path']}: chunks do not tile the member (their sizes add up to "
                            f"{sum(sizes)}, the member has {m['size']} bytes)")
        if raw["format"] >= 2:
            if "sha256" in m:
                problems.append(f"members/{m['path']}: a chunked member has no whole-file sha256 in format 2")
            if 0 in sizes:
                problems.append(f"members/{m['path']}: empty chunk")
    if len(members) != len(raw["members"]):
        problems.append("members: duplicate paths")
    if [m["path"] for m in raw["members"]] != sorted(members):
        problems.append("members: not sorted by path")
    order = raw.get("program_order")
    if order is not None and sorted(order) != sorted(raw["programs"]):
        problems.append("program_order: not the program names, each once")
    for name, prog in raw["programs"].items():
        ids = [v["id"] for v in prog["variants"]]
        if len(set(ids)) != len(ids):
            problems.append(f"programs/{name}/variants: duplicate variant ids")
        for v in prog["variants"]:
            role = "program" if v["kind"] == "exported_program" else "aoti"
            m = members.get(v["member"])
            if m is None:
                problems.append(f"programs/{name}: variant {v['id']!r} member {v['member']!r} is not listed")
            elif m["role"] != role:
                problems.append(f"programs/{name}: member {v['member']!r} has role {m['role']!r}, expected {role!r}")
    names = set()
    for s in raw["samples"]:
        if s["name"] in names:
            problems.append(f"samples: duplicate sample name {s['name']!r}")
        names.add(s["name"])
        if s["program"] not in raw["programs"]:
            problems.append(f"samples/{s['name']}: unknown program {s['program']!r}")
        if s["member"] not in members or members[s["member"]]["role"] != "sample":
            problems.append(f"samples/{s['name']}: member {s['member']!r} is not a listed sample")
    return problems


def stored_blobs(manifest_json: str, packs: PackIndex | str | None = None) -> set[tuple[str, int]]:
    """Every blob (digest, size) a version stored as a manifest's text: one per chunk of a
    chunked member, one per other member, and the manifest itself; with the version's pack
    index (``format.packs``, parsed or its JSON text), each chunk it places in a pack is
    replaced by that pack. Cheap (no schema check): gc and the audit derive what a version
    needs from its manifest, not only from the ``version_blobs`` rows, so deleting those rows
    cannot make gc drop a live version's data. ``ManifestError`` (an ``IntegrityError``) when
    the manifest is unreadable or a stored index does not fit it; ``UsageError`` when a parsed
    ``PackIndex`` does not (the server's check of a pushed one)."""
    data = manifest_json.encode("utf-8")
    whole = {(digest_of_bytes(data), len(data))}
    chunks: set[tuple[str, int]] = set()
    try:
        raw = json.loads(manifest_json)
        members = raw.get("members", []) if isinstance(raw, dict) else []
        for m in members:
            if m.get("chunks"):
                chunks.update((f"sha256:{c['sha256']}", int(c["size"])) for c in m["chunks"])
            else:
                whole.add((f"sha256:{m['sha256']}", int(m["size"])))  # unchunked: stored whole
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ManifestError(f"a stored manifest is unreadable ({exc})",
                            hint="the metadata database was altered") from exc
    if isinstance(packs, PackIndex):
        return stored_with_packs(chunks, packs, whole=whole)
    try:
        return stored_with_packs(chunks, PackIndex.from_json(packs), whole=whole)
    except UsageError as exc:
        raise ManifestError(f"a stored pack index does not fit its manifest: {exc.message}",
                            hint="the metadata database was altered") from exc


def recorded_facts(manifest_json: str) -> tuple[int, dict[str, Any]]:
    """What a version of this manifest records beside it, as a function of it: its size (every
    member's bytes and the manifest's own, ``Manifest.total_size`` of its canonical text) and
    its metadata. Cheap (no schema check), as ``stored_blobs``: the audit checks every stored
    version against it, and a server records nothing else. ``ManifestError`` when unreadable.

    >>> recorded_facts('{"members": [{"size": 5}], "metadata": {"stage": "dev"}}')
    (61, {'stage': 'dev'})
    """
    try:
        raw = json.loads(manifest_json)
        members = raw.get("members", []) if isinstance(raw, dict) else []
        size = sum(int(m["size"]) for m in members) + len(manifest_json.encode("utf-8"))
        metadata = raw.get("metadata", {}) if isinstance(raw, dict) else {}
        if not isinstance(metadata, dict):
            raise TypeError("metadata is not an object")
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ManifestError(f"a stored manifest is unreadable ({exc})",
                            hint="the metadata database was altered") from exc
    return size, dict(metadata)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


# ------------------------------------------------------------------------------- the typed view
#
# Each class parses its JSON object in ``from_json`` and writes it back in ``to_json``. A key the
# schema makes optional is written back only when it was given (``present``: the optional keys
# the JSON had; None for a value made in code, where a key is written when its value is set),
# so ``to_json()`` gives back the JSON that was read, byte for byte once canonical.

def _present(raw: Mapping[str, Any], optional: Iterable[str]) -> frozenset[str]:
    return frozenset(k for k in optional if k in raw)


def evolve(value: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` that also marks the optional keys it sets as given (written by
    ``to_json`` even when None), for the bundler, which completes what the reader described."""
    present = getattr(value, "present", None)
    if present is not None:
        changes["present"] = present | {k for k in changes if k in type(value)._OPTIONAL}
    return replace(value, **changes)


def _emit(out: dict[str, Any], present: frozenset[str] | None, key: str, value: Any, json_value: Any = None) -> None:
    if (key in present) if present is not None else (value is not None and value != ()):
        out[key] = value if json_value is None else json_value


@dataclass(frozen=True)
class Dim:
    """A symbolic dimension (or a range constraint): ``min..max`` (max None: unbounded), the
    size expression torch printed (``s27``, ``s27 + 1``) and the user's ``Dim`` name, if known."""

    min: int
    max: int | None
    expr: str
    dim: str | None = None

    @property
    def label(self) -> str:
        """The user's name when known, else the expression."""
        return self.dim or self.expr or "?"

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Dim:
        return cls(raw["min"], raw["max"], raw["expr"], raw.get("dim"))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"min": self.min, "max": self.max, "expr": self.expr}
        if self.dim is not None:
            out["dim"] = self.dim
        return out


#: One dimension of a tensor: a static size or a symbolic ``Dim``.
Size = int | Dim


def _size_from_json(d: Any) -> Size:
    return d if isinstance(d, int) else Dim.from_json(d)


def _size_to_json(d: Size) -> Any:
    return d if isinstance(d, int) else d.to_json()


@dataclass(frozen=True)
class TensorSpec:
    """A program input or output: a tensor (``shape`` a tuple of static sizes and ``Dim``s) or,
    with ``shape`` None, a non-tensor value (``dtype`` int/float/bool/str/none/torchbind/...;
    ``value`` the constant it had at export when ``has_value``)."""

    name: str
    dtype: str
    shape: tuple[Size, ...] | None
    device: str | None = None
    kind: str | None = None          # "positional" | "keyword" (inputs)
    path: str | None = None          # where in the call (``args[0]``) or the output (``out[1]``)
    value: Any = None
    class_fqn: str | None = None     # TorchBind objects
    present: frozenset[str] | None = field(default=None, repr=False, compare=False)

    _OPTIONAL = ("device", "kind", "path", "value", "class_fqn")

    @property
    def has_value(self) -> bool:
        return "value" in self.present if self.present is not None else self.value is not None

    @property
    def dims(self) -> tuple[Dim, ...]:
        """The symbolic dimensions of the shape."""
        return tuple(d for d in self.shape or () if isinstance(d, Dim))

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> TensorSpec:
        shape = raw["shape"]
        return cls(raw["name"], raw["dtype"], None if shape is None else tuple(_size_from_json(d) for d in shape),
                   raw.get("device"), raw.get("kind"), raw.get("path"), copy.deepcopy(raw.get("value")),
                   raw.get("class_fqn"), _present(raw, cls._OPTIONAL))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "dtype": self.dtype,
                               "shape": None if self.shape is None else [_size_to_json(d) for d in self.shape]}
        for key in self._OPTIONAL:
            _emit(out, self.present, key, getattr(self, key),
                  copy.deepcopy(self.value) if key == "value" else None)
        return out


@dataclass(frozen=True)
class ConstantInput:
    """An argument export baked in (a bool, int, float, str or None passed at export): ``leaf``
    is its position among the leaves of the input treespec."""

    name: str
    value: Any
    leaf: int
    kind: str
    path: str

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ConstantInput:
        return cls(raw["name"], raw["value"], raw["leaf"], raw["kind"], raw["path"])

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "leaf": self.leaf, "kind": self.kind, "path": self.path}


@dataclass(frozen=True)
class PytreeClass:
    """A library pytree class of the treespecs, by serialized name; ``fields`` None when the
    treespec does not list them (the class must then be registered to load the program)."""

    type: str
    fields: tuple[str, ...] | None

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> PytreeClass:
        fields = raw["fields"]
        return cls(raw["type"], None if fields is None else tuple(fields))

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "fields": None if self.fields is None else list(self.fields)}


@dataclass(frozen=True)
class RequiredOp:
    """A custom (non-aten) operator the graph calls; ``schema`` as registered at bundle time."""

    name: str          # "ns::op"
    overload: str
    target: str        # "torch.ops.ns.op.default"
    schema: str | None

    @property
    def dispatcher_name(self) -> str:
        """The name torch's dispatcher knows it by: ``ns::op`` or ``ns::op.overload``."""
        return self.name if self.overload in ("default", "") else f"{self.name}.{self.overload}"

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> RequiredOp:
        return cls(raw["name"], raw["overload"], raw["target"], raw["schema"])

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "overload": self.overload, "target": self.target, "schema": self.schema}


@dataclass(frozen=True)
class BakedDevice:
    """A device hard-coded at export: an op's device argument (``arg``), or a weight's device
    (``op`` "weight", ``arg`` its name); ``source``/``code`` the user's line, when recorded."""

    op: str
    device: str
    arg: str | None = None
    source: str | None = None
    code: str | None = None
    present: frozenset[str] | None = field(default=None, repr=False, compare=False)

    _OPTIONAL = ("arg", "source", "code")

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> BakedDevice:
        return cls(raw["op"], raw["device"], raw.get("arg"), raw.get("source"), raw.get("code"),
                   _present(raw, cls._OPTIONAL))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op, "device": self.device}
        for key in self._OPTIONAL:
            _emit(out, self.present, key, getattr(self, key))
        return out


@dataclass(frozen=True)
class AotiTarget:
    """What an AOTInductor variant was compiled for (exact-match requirements)."""

    device_key: str | None = None
    compute_capability: str | None = None
    platform: str | None = None
    machine: str | None = None
    cpu_isa: str | None = None
    #: the torch that compiled it (its runtime must be the same major.minor) and whether that
    #: torch used libstdc++'s C++11 ABI (the package's C++ must match); None: not recorded
    torch_version: str | None = None
    cxx11_abi: bool | None = None
    present: frozenset[str] | None = field(default=None, repr=False, compare=False)

    _OPTIONAL = ("device_key", "compute_capability", "platform", "machine", "cpu_isa", "torch_version", "cxx11_abi")

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> AotiTarget:
        return cls(*(raw.get(k) for k in cls._OPTIONAL), present=_present(raw, cls._OPTIONAL))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in self._OPTIONAL:
            _emit(out, self.present, key, getattr(self, key))
        return out


@dataclass(frozen=True)
class Variant:
    id: str
    kind: str               # "exported_program" | "aoti"
    member: str
    archive_name: str
    target: AotiTarget | None = None

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Variant:
        target = raw.get("target")
        return cls(raw["id"], raw["kind"], raw["member"], raw["archive_name"],
                   None if target is None else AotiTarget.from_json(target))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "kind": self.kind, "member": self.member,
                               "archive_name": self.archive_name}
        if self.target is not None:
            out["target"] = self.target.to_json()
        return out


@dataclass(frozen=True)
class ProgramWindow:
    """The oldest supported torch release that reads a program (``torch``, ``major.minor``),
    the serde schema that release reads (``schema``), and what set it (``features``: each
    ``"<element> (torch X.Y)"``): computed from the program by ``registry.pt2.window``."""

    torch: str
    schema: tuple[int, int]
    features: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"torch": self.torch, "schema": list(self.schema), "features": list(self.features)}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ProgramWindow:
        return cls(str(raw["torch"]), (int(raw["schema"][0]), int(raw["schema"][1])), tuple(raw.get("features", ())))


@dataclass(frozen=True)
class Serialization:
    """How the program was serialized: torch version, serde schema (major, minor), opsets, and
    the window of torch releases that read it (``registry.pt2.window``; None in bundles made
    before it was recorded)."""

    torch_version: str
    schema_version: tuple[int, int]
    opset_version: Mapping[str, int]
    archive_version: str | None = None
    window: ProgramWindow | None = None
    present: frozenset[str] | None = field(default=None, repr=False, compare=False)

    _OPTIONAL = ("archive_version", "window")

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Serialization:
        major, minor = raw["schema_version"]
        window = ProgramWindow.from_json(raw["window"]) if raw.get("window") is not None else None
        return cls(raw["torch_version"], (major, minor), MappingProxyType(dict(raw["opset_version"])),
                   raw.get("archive_version"), window, _present(raw, cls._OPTIONAL))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"torch_version": self.torch_version, "schema_version": list(self.schema_version),
                               "opset_version": dict(self.opset_version)}
        _emit(out, self.present, "archive_version", self.archive_version)
        _emit(out, self.present, "window", self.window, self.window.to_json() if self.window else None)
        return out


@dataclass(frozen=True)
class ProgramSpec:
    """One program of the bundle: its variants and its signature, as the manifest records it."""

    name: str
    variants: tuple[Variant, ...]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    range_constraints: tuple[Dim, ...]
    required_ops: tuple[RequiredOp, ...]
    torchbind_classes: tuple[str, ...]
    baked_devices: tuple[BakedDevice, ...]
    dtypes: tuple[str, ...]
    serialization: Serialization
    in_spec: str | None = None                    # torch's serialized input treespec
    out_spec: str | None = None
    forward_arg_names: tuple[str, ...] = ()
    constant_inputs: tuple[ConstantInput, ...] = ()
    #: as recorded at bundle time (empty for bundles made before they were); the runtime reads
    #: them from the treespecs themselves (``registry.runtime.compat.pytree_classes_of``)
    pytree_classes: tuple[PytreeClass, ...] = ()
    #: torch's own operators the graph calls, with their schemas at bundle time (empty in
    #: bundles made before they were recorded)
    operators: tuple[RequiredOp, ...] = ()
    present: frozenset[str] | None = field(default=None, repr=False, compare=False)

    _OPTIONAL = ("in_spec", "out_spec", "forward_arg_names", "constant_inputs", "pytree_classes", "operators")

    @property
    def portable(self) -> Variant | None:
        return next((v for v in self.variants if v.kind == "exported_program"), None)

    def variant(self, variant_id: str | None) -> Variant | None:
        return next((v for v in self.variants if v.id == variant_id), None)

    @classmethod
    def from_json(cls, name: str, raw: Mapping[str, Any]) -> ProgramSpec:
        return cls(
            name=name,
            variants=tuple(Variant.from_json(v) for v in raw["variants"]),
            inputs=tuple(TensorSpec.from_json(i) for i in raw["inputs"]),
            outputs=tuple(TensorSpec.from_json(o) for o in raw["outputs"]),
            range_constraints=tuple(Dim.from_json(c) for c in raw["range_constraints"]),
            required_ops=tuple(RequiredOp.from_json(op) for op in raw["required_ops"]),
            torchbind_classes=tuple(raw["torchbind_classes"]),
            baked_devices=tuple(BakedDevice.from_json(b) for b in raw["baked_devices"]),
            dtypes=tuple(raw["dtypes"]),
            serialization=Serialization.from_json(raw["serialization"]),
            in_spec=raw.get("in_spec"),
            out_spec=raw.get("out_spec"),
            forward_arg_names=tuple(raw.get("forward_arg_names") or ()),
            constant_inputs=tuple(ConstantInput.from_json(c) for c in raw.get("constant_inputs") or ()),
            pytree_classes=tuple(PytreeClass.from_json(c) for c in raw.get("pytree_classes") or ()),
            operators=tuple(RequiredOp.from_json(op) for op in raw.get("operators") or ()),
            present=_present(raw, cls._OPTIONAL))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "variants": [v.to_json() for v in self.variants],
            "inputs": [i.to_json() for i in self.inputs],
            "outputs": [o.to_json() for o in self.outputs],
            "range_constraints": [c.to_json() for c in self.range_constraints],
            "required_ops": [op.to_json() for op in self.required_ops],
            "torchbind_classes": list(self.torchbind_classes),
            "baked_devices": [b.to_json() for b in self.baked_devices],
            "dtypes": list(self.dtypes),
            "serialization": self.serialization.to_json(),
        }
        _emit(out, self.present, "in_spec", self.in_spec)
        _emit(out, self.present, "out_spec", self.out_spec)
        _emit(out, self.present, "forward_arg_names", self.forward_arg_names, list(self.forward_arg_names))
        _emit(out, self.present, "constant_inputs", self.constant_inputs,
              [c.to_json() for c in self.constant_inputs])
        _emit(out, self.present, "pytree_classes", self.pytree_classes,
              [c.to_json() for c in self.pytree_classes])
        _emit(out, self.present, "operators", self.operators, [op.to_json() for op in self.operators])
        return out


def chunk_list_json(chunks: tuple[tuple[str, int], ...]) -> bytes:
    """The canonical JSON of a chunk list (``[{"sha256": hex, "size": n}, ...]``, what a chunked
    member's identity hashes), written directly: ``canonical_json`` of 10,000 dicts takes 15 ms.
    Falls back to ``canonical_json`` unless every hash is 64 lowercase hex digits and every size an int.

    >>> chunk_list_json((("ab" * 32, 3),)) == canonical_json([{"sha256": "ab" * 32, "size": 3}])
    True
    """
    if all_hex64(list(map(_FIRST, chunks))) and set(map(type, map(_SECOND, chunks))) <= {int}:
        return ("[" + ",".join(['{"sha256":"%s","size":%d}' % c for c in chunks]) + "]").encode("ascii")  # noqa: UP031
    return canonical_json([{"sha256": h, "size": n} for h, n in chunks])


@dataclass(frozen=True)
class _ChunkList:
    """A long chunk list as ``_canonical`` read it: the (sha256 hex, size) pairs and their
    canonical JSON (what the member's identity hashes), made once per parse."""

    chunks: tuple[tuple[str, int], ...]
    text: bytes


def _canonical(raw: dict[str, Any], columns: _Columns) -> tuple[bytes, dict[int, _ChunkList]]:
    """``canonical_json(raw)`` of a manifest ``validate_raw`` accepted, its long chunk lists
    written by orjson (each item is exactly ``{"sha256": hex, "size": int}``, which it writes
    in canonical form; ``chunk_list_json`` past 64 bits): the generic encoder takes 12 ms for
    10,000 of them, at every pull.
    Each list stands in the encoded text as a string no manifest can hold (a random nonce),
    replaced once; anything unexpected falls back to the generic encoder. With the text, the
    long lists by member index (``Member`` keeps them: its identity is their hash)."""
    members = raw["members"]
    if not any(len(m.get("chunks", ())) > 64 for m in members):
        return canonical_json(raw), {}
    nonce = secrets.token_hex(16)
    lists: dict[str, str] = {}
    parsed: dict[int, _ChunkList] = {}
    cut = []
    for i, m in enumerate(members):
        if len(m.get("chunks", ())) > 64:
            mark = f"\x00chunks {nonce} {i}\x00"
            chunks = tuple(zip(*columns[i]))
            try:   # each item is exactly {"sha256": hex, "size": int}: orjson writes it the same, 5x faster
                text_ = orjson.dumps(m["chunks"], option=orjson.OPT_SORT_KEYS)
            except TypeError:   # an integer past 64 bits (not in a valid manifest: members are <= 1 TiB)
                text_ = chunk_list_json(chunks)
            parsed[i] = _ChunkList(chunks, text_)
            lists[json.dumps(mark)] = parsed[i].text.decode("ascii")
            m = {**m, "chunks": mark}
        cut.append(m)
    text = canonical_json({**raw, "members": cut}).decode("utf-8")
    for quoted, listing in lists.items():
        if text.count(quoted) != 1:
            return canonical_json(raw), parsed
        text = text.replace(quoted, listing)
    return text.encode("utf-8"), parsed


@dataclass(frozen=True)
class Member:
    """One file of the bundle. A chunked member's integrity is its chunk list: every chunk's
    sha256, with sizes that tile the member exactly (``sha256`` is None from format 2 on; a
    format-1 manifest still carries the whole-file sha256, which nothing needs to check)."""

    path: str
    sha256: str | None
    size: int
    role: str                                  # "program" | "aoti" | "sample" | "library"
    chunks: tuple[tuple[str, int], ...] = ()   # (sha256 hex, size), covering the member in order
    present: frozenset[str] | None = field(default=None, repr=False, compare=False)
    #: ``chunks`` and their canonical JSON, when the parser wrote it already (``_canonical``)
    listing: _ChunkList | None = field(default=None, repr=False, compare=False)

    @cached_property
    def digest(self) -> str:
        """The member's identity: the sha256 of its bytes, or for a chunked member the sha256 of
        its canonical chunk list (what the client cache files it under)."""
        if self.chunks:
            listing = self.listing   # the parser's, unless these chunks are not the ones it read
            return digest_of_bytes(listing.text if listing is not None and listing.chunks is self.chunks
                                   else chunk_list_json(self.chunks))
        assert self.sha256 is not None  # the schema requires one or the other
        return "sha256:" + self.sha256

    @cached_property
    def chunk_columns(self) -> tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]]:
        """The chunks as three columns, in order: sha256 hexes, sizes, and offsets in the
        member (made once, in C: a pull reads them for its large chunks and again to plan its
        pack reads)."""
        if not self.chunks:
            return (), (), ()
        shas, sizes = zip(*self.chunks)
        return shas, sizes, tuple(accumulate(sizes, initial=0))[:-1]

    def chunk_spans(self) -> list[tuple[str, int, int]]:
        """(sha256 hex, offset in the member, size) of each chunk, in order."""
        shas, sizes, offsets = self.chunk_columns
        return list(zip(shas, offsets, sizes))

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], parsed: _ChunkList | None = None) -> Member:
        """``parsed``: its chunk list as ``_canonical`` read it (not read again)."""
        chunks = parsed.chunks if parsed is not None else \
            tuple(zip(map(_SHA256, raw.get("chunks", ())), map(_SIZE, raw.get("chunks", ()))))
        return cls(raw["path"], raw.get("sha256"), raw["size"], raw["role"], chunks, _present(raw, ("chunks",)), parsed)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "size": self.size, "role": self.role}
        if self.sha256 is not None:
            out["sha256"] = self.sha256
        _emit(out, self.present, "chunks", self.chunks, [{"sha256": h, "size": n} for h, n in self.chunks])
        return out


@dataclass(frozen=True)
class Sample:
    """A golden sample: ``member`` holds tensors ``inputs`` and the ``outputs`` expected within
    ``rtol``/``atol`` (numbers as written: an int tolerance stays an int in the JSON)."""

    name: str
    program: str
    member: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    rtol: float
    atol: float
    device: str | None = None
    present: frozenset[str] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Sample:
        return cls(raw["name"], raw["program"], raw["member"], tuple(raw["inputs"]), tuple(raw["outputs"]),
                   raw["rtol"], raw["atol"], raw.get("device"), _present(raw, ("device",)))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "program": self.program, "member": self.member,
                               "inputs": list(self.inputs), "outputs": list(self.outputs),
                               "rtol": self.rtol, "atol": self.atol}
        _emit(out, self.present, "device", self.device)
        return out


@dataclass(frozen=True)
class Requirements:
    """Where the bundle may run: a PEP 440 torch specifier, device types (None: any), dtypes that
    need hardware support, and a minimum CUDA compute capability."""

    torch: str | None
    device_types: tuple[str, ...] | None
    hardware_dtypes: tuple[str, ...]
    min_compute_capability: tuple[int, int] | None = None
    present: frozenset[str] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Requirements:
        devices, cc = raw["device_types"], raw.get("min_compute_capability")
        return cls(raw["torch"], None if devices is None else tuple(devices), tuple(raw["hardware_dtypes"]),
                   None if cc is None else (cc[0], cc[1]), _present(raw, ("min_compute_capability",)))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"torch": self.torch,
                               "device_types": None if self.device_types is None else list(self.device_types),
                               "hardware_dtypes": list(self.hardware_dtypes)}
        _emit(out, self.present, "min_compute_capability", self.min_compute_capability,
              None if self.min_compute_capability is None else list(self.min_compute_capability))
        return out


@dataclass(frozen=True)
class Environment:
    """What built the bundle: Python, torch and platform, the CUDA version when there was one,
    and any other facts recorded (``others``, names to strings)."""

    python: str | None
    torch: str | None
    platform: str | None
    cuda: str | None = None
    others: Mapping[str, str | None] = field(default_factory=lambda: MappingProxyType({}))
    present: frozenset[str] | None = field(default=None, repr=False, compare=False)

    _OPTIONAL = ("cuda",)
    _NAMED = ("python", "torch", "platform", "cuda")

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Environment:
        return cls(raw["python"], raw["torch"], raw["platform"], raw.get("cuda"),
                   MappingProxyType({k: v for k, v in raw.items() if k not in cls._NAMED}),
                   _present(raw, cls._OPTIONAL))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"python": self.python, "torch": self.torch, "platform": self.platform}
        _emit(out, self.present, "cuda", self.cuda)
        out.update(self.others)
        return out


# --------------------------------------------------------------------------- baked-device groups

_MAX_OP_NAMES = 6


def _short_op(op: str) -> str:
    """``torch.ops.aten.arange.start`` -> ``arange``; a custom op keeps its namespace."""
    parts = op.split(".")
    if len(parts) == 5 and parts[:2] == ["torch", "ops"]:
        return parts[3] if parts[2] == "aten" else f"{parts[2]}::{parts[3]}"
    return op


def _quoted(code: str) -> str:
    """The source line as torch recorded it, whole; torch records the first line of a statement
    only, so a statement that goes on (open brackets, a trailing backslash) is marked `...`."""
    import io
    import tokenize

    try:
        for _ in tokenize.generate_tokens(io.StringIO(code + "\n").readline):
            pass
    except tokenize.TokenError:  # EOF in a multi-line statement or string
        return code + " ..."
    except (SyntaxError, ValueError):
        return code
    return code + " ..." if code.rstrip().endswith("\\") else code


@dataclass(frozen=True)
class BakedDeviceGroup:
    """Baked-device entries of one program that share a device and a source line. ``text``
    reads ``device 'cpu' baked into 12 ops at model.py:33 (arange, ones): <the line>``."""

    device: str
    source: str | None
    code: str | None
    ops: tuple[str, ...]       # op names (weight names for weights), each once
    count: int
    head: str                  # the text without the quoted line
    quote: str | None          # the source line, marked ``...`` when the statement goes on

    @property
    def text(self) -> str:
        return self.head + (f": {self.quote}" if self.quote else "")

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "source": self.source, "code": self.code, "ops": list(self.ops),
                "count": self.count, "head": self.head, "quote": self.quote, "text": self.text}


def baked_device_groups(baked: Iterable[BakedDevice]) -> list[BakedDeviceGroup]:
    """Baked-device entries of one program grouped by device and source line, first seen first."""
    groups: dict[tuple[str, Any, Any], tuple[list[str], list[int], bool]] = {}
    firsts: dict[tuple[str, Any, Any], BakedDevice] = {}
    for b in baked:
        weight = b.op == "weight"
        key = (b.device, b.source, "weight" if weight else b.code)
        names, count, _ = groups.setdefault(key, ([], [0], weight))
        firsts.setdefault(key, b)
        count[0] += 1
        name = str(b.arg) if weight else _short_op(str(b.op))
        if name not in names:
            names.append(name)
    out = []
    for key, (names, count, weights) in groups.items():
        first = firsts[key]
        noun = ("weight" if weights else "op") + ("" if count[0] == 1 else "s")
        shown = ", ".join(names[:_MAX_OP_NAMES]) + (", ..." if len(names) > _MAX_OP_NAMES else "")
        where = f" at {first.source}" if first.source else ""
        out.append(BakedDeviceGroup(
            first.device, first.source, first.code, tuple(names), count[0],
            f"device {first.device!r} baked into {count[0]} {noun}{where} ({shown})",
            _quoted(first.code) if first.code else None))
    return out


# ------------------------------------------------------------------------------------ manifest

@dataclass(frozen=True)
class Manifest:
    """A validated manifest, parsed once into typed values. ``canonical``: the canonical JSON it
    was read from (its sha256 is the bundle digest); ``to_json()`` gives the same JSON back."""

    format: int
    kind: str
    programs: Mapping[str, ProgramSpec]        # in ``program_order``
    members: tuple[Member, ...]
    samples: tuple[Sample, ...]
    requirements: Requirements
    metadata: Mapping[str, str]
    environment: Environment
    canonical: bytes = field(repr=False)
    order_given: bool = field(default=False, repr=False)   # "program_order" written in the JSON

    @classmethod
    def from_raw(cls, raw: Any) -> Manifest:
        columns: _Columns = {}
        problems = _validate(raw, columns)
        if problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            raise ManifestError(f"invalid manifest: {problems[0]}{more}", problems=problems)
        order = raw.get("program_order") or sorted(raw["programs"])
        try:
            canonical, chunk_lists = _canonical(raw, columns)
        except UnicodeEncodeError:  # "\ud800" parses as JSON but is no Unicode text
            problem = "it holds a lone surrogate (a \\ud800-\\udfff escape alone), which is not Unicode text"
            raise ManifestError(f"invalid manifest: {problem}", problems=[problem]) from None
        return cls(
            format=raw["format"], kind=raw["kind"],
            programs=MappingProxyType({name: ProgramSpec.from_json(name, raw["programs"][name]) for name in order}),
            members=tuple(Member.from_json(m, chunk_lists.get(i)) for i, m in enumerate(raw["members"])),
            samples=tuple(Sample.from_json(s) for s in raw["samples"]),
            requirements=Requirements.from_json(raw["requirements"]),
            metadata=MappingProxyType(dict(raw["metadata"])),
            environment=Environment.from_json(raw["environment"]),
            canonical=canonical, order_given="program_order" in raw)

    @classmethod
    def from_bytes(cls, data: bytes, digest: str | None = None) -> Manifest:
        """Parse and validate a manifest's JSON text (``ManifestError`` saying what is wrong).

        ``digest``: the digest the caller expects it to have (a version's). The text is then
        parsed by orjson first (6.6 -> 2.7 ms for a 10,000-tensor program, at every pull), and
        again by the standard library unless that gave a valid manifest of that digest (whose
        canonical bytes hash to it: the manifest of that digest, whatever the text's spelling).
        orjson reads integers past 64 bits as floats, which changes the canonical form, so such
        a manifest takes the standard library's path; a text that is wrong gets the standard
        library's verdict and message."""
        if digest is not None:
            try:
                fast = cls.from_raw(orjson.loads(data))
            except Exception:   # noqa: BLE001 -- anything: the standard library decides (below)
                fast = None
            if fast is not None and fast.digest == digest:
                return fast
        try:
            raw = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
        except RecursionError as exc:
            raise ManifestError("manifest.json is nested too deeply") from exc
        except (UnicodeDecodeError, ValueError) as exc:
            raise ManifestError(f"manifest.json is not valid JSON ({exc})") from exc
        try:
            return cls.from_raw(raw)
        except RecursionError as exc:
            raise ManifestError("manifest.json is nested too deeply") from exc

    @cached_property
    def digest(self) -> str:
        """``sha256:`` of ``canonical`` (hashed once: a pull asks for it at five places, 0.55 ms
        each for a 10,000-tensor program)."""
        return digest_of_bytes(self.canonical)

    @property
    def total_size(self) -> int:
        return sum(m.size for m in self.members) + len(self.canonical)

    @cached_property
    def _members_by_path(self) -> Mapping[str, Member]:
        return MappingProxyType({m.path: m for m in self.members})

    def member(self, path: str) -> Member | None:
        """The member at ``path``, or None when the manifest lists none there."""
        return self._members_by_path.get(path)

    def warnings(self) -> list[str]:
        """What a user should know before running it: devices baked in at export (one line per
        device and source line) and custom ops whose schema was unknown at bundle time."""
        out = []
        for name, prog in self.programs.items():
            for g in baked_device_groups(prog.baked_devices):  # each op: programs.*.baked_devices
                out.append(f"program {name!r}: {g.text}")
            for op in prog.required_ops:
                if not op.schema:
                    out.append(f"program {name!r}: custom op {op.name} is required; its schema was not "
                               f"known at bundle time")
        return out

    def to_json(self) -> dict[str, Any]:
        """The manifest as JSON values, written from the typed view: the JSON it was read from
        (``canonical_json(m.to_json()) == m.canonical``), its ``programs`` in ``program_order``."""
        out: dict[str, Any] = {
            "format": self.format, "kind": self.kind,
            "programs": {name: prog.to_json() for name, prog in self.programs.items()},
            "members": [m.to_json() for m in self.members],
            "samples": [s.to_json() for s in self.samples],
            "requirements": self.requirements.to_json(),
            "metadata": dict(self.metadata),
            "environment": self.environment.to_json(),
        }
        if self.order_given:
            out["program_order"] = list(self.programs)
        return out
