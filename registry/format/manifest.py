"""The bundle manifest: validation against ``schema/manifest.schema.json`` and typed views.

Two stages, like pypa/packaging: raw JSON -> ``Manifest.from_raw`` which reports every problem
at once (schema errors plus cross-field checks) -> a frozen object. The digest of a bundle is
``sha256:`` of ``canonical_json(manifest.raw)``.

    >>> m = Manifest.from_raw(json.loads(data))          # doctest: +SKIP
    >>> m.digest, list(m.programs)
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from ..constants import BUNDLE_FORMAT
from ..digests import canonical_json, digest_of_bytes
from ..errors import ManifestError, UnsupportedFormatError

__all__ = ["Manifest", "ProgramSpec", "Member", "Sample", "Variant", "load_schema", "validate_raw"]


@lru_cache(maxsize=1)
def load_schema() -> dict[str, Any]:
    """The manifest JSON Schema shipped with the package (``schema/`` in the repository)."""
    try:
        text = resources.files("registry._schema").joinpath("manifest.schema.json").read_text("utf-8")
    except (ModuleNotFoundError, FileNotFoundError):
        text = (Path(__file__).resolve().parent.parent / "schema" / "manifest.schema.json").read_text("utf-8")
    return json.loads(text)


@lru_cache(maxsize=1)
def _validator() -> Any:
    import jsonschema

    schema = load_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    # JSON Schema calls 1.0 an integer; a manifest that says "format": 1.0 is not canonical
    # and is refused rather than read as 1.
    strict = jsonschema.validators.extend(cls, type_checker=cls.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: type(value) is int))
    return strict(schema)


def _path_of(err: Any) -> str:
    return "/".join(str(p) for p in err.absolute_path) or "(root)"


def validate_raw(raw: Any) -> list[str]:
    """Every problem with a raw manifest, as human-readable strings (empty when valid)."""
    if not isinstance(raw, dict):
        return ["manifest is not a JSON object"]
    fmt = raw.get("format")
    if isinstance(fmt, int) and not isinstance(fmt, bool) and fmt > BUNDLE_FORMAT:
        raise UnsupportedFormatError(
            f"bundle format {fmt} is newer than this pt2-registry understands (format {BUNDLE_FORMAT})",
            hint="upgrade pt2-registry to read it")
    problems = sorted(f"{_path_of(e)}: {e.message}" for e in _validator().iter_errors(raw))
    if problems:
        return problems
    members = {m["path"]: m for m in raw["members"]}
    for m in raw["members"]:
        if "chunks" in m and sum(c["size"] for c in m["chunks"]) != m["size"]:
            problems.append(f"members/{m['path']}: chunk sizes do not add up to the member size")
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


def stored_blobs(manifest_json: str) -> set[tuple[str, int]]:
    """Every blob (digest, size) a version stored as a manifest's text: one per chunk of a
    chunked member, one per other member, and the manifest itself. Cheap (no schema check):
    gc and the audit derive what a version needs from its manifest, not only from the
    ``version_blobs`` rows, so deleting those rows cannot make gc drop a live version's data."""
    data = manifest_json.encode("utf-8")
    out = {(digest_of_bytes(data), len(data))}
    try:
        raw = json.loads(manifest_json)
        members = raw.get("members", []) if isinstance(raw, dict) else []
        for m in members:
            if m.get("chunks"):
                out.update((f"sha256:{c['sha256']}", int(c["size"])) for c in m["chunks"])
            else:
                out.add((f"sha256:{m['sha256']}", int(m["size"])))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ManifestError(f"a stored manifest is unreadable ({exc})",
                            hint="the metadata database was altered") from exc
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


@dataclass(frozen=True)
class Member:
    path: str
    sha256: str
    size: int
    role: str
    chunks: tuple[tuple[str, int], ...] = ()   # (sha256 hex, size), covering the member in order

    @property
    def digest(self) -> str:
        return "sha256:" + self.sha256


@dataclass(frozen=True)
class Variant:
    id: str
    kind: str               # "exported_program" | "aoti"
    member: str
    archive_name: str
    target: Mapping[str, Any]


@dataclass(frozen=True)
class Sample:
    name: str
    program: str
    member: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    rtol: float
    atol: float


@dataclass(frozen=True)
class ProgramSpec:
    name: str
    raw: Mapping[str, Any]

    @property
    def variants(self) -> tuple[Variant, ...]:
        return tuple(Variant(v["id"], v["kind"], v["member"], v["archive_name"],
                             MappingProxyType(dict(v.get("target") or {})))
                     for v in self.raw["variants"])

    @property
    def portable(self) -> Variant | None:
        return next((v for v in self.variants if v.kind == "exported_program"), None)

    @property
    def inputs(self) -> list[dict[str, Any]]:
        return self.raw["inputs"]

    @property
    def constant_inputs(self) -> list[dict[str, Any]]:
        """Arguments export baked in: each with its ``value`` and ``leaf`` in the input treespec."""
        return list(self.raw.get("constant_inputs") or [])

    @property
    def pytree_classes(self) -> list[dict[str, Any]]:
        """Library pytree classes of the input/output treespecs (``type``, ``fields``, ``style``),
        read from the specs themselves so bundles written before ``pytree_classes`` have them too."""
        from ..pt2.treespec import TreeSpecError, pytree_classes

        found: dict[str, dict[str, Any]] = {}
        for key in ("in_spec", "out_spec"):
            try:
                for c in pytree_classes(self.raw.get(key)):
                    found.setdefault(c["type"], c)
            except TreeSpecError:
                continue
        return list(found.values())

    @property
    def outputs(self) -> list[dict[str, Any]]:
        return self.raw["outputs"]

    @property
    def required_ops(self) -> list[dict[str, Any]]:
        return self.raw["required_ops"]

    @property
    def baked_devices(self) -> list[dict[str, Any]]:
        return self.raw["baked_devices"]


@dataclass(frozen=True)
class Manifest:
    """A validated manifest. ``raw`` is a private deep copy: mutate nothing you get from it."""

    raw: Mapping[str, Any]
    canonical: bytes

    @classmethod
    def from_raw(cls, raw: Any) -> "Manifest":
        problems = validate_raw(raw)
        if problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            raise ManifestError(f"invalid manifest: {problems[0]}{more}", problems=problems)
        raw = copy.deepcopy(raw)
        return cls(raw=raw, canonical=canonical_json(raw))

    @classmethod
    def from_bytes(cls, data: bytes) -> "Manifest":
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

    @property
    def digest(self) -> str:
        return digest_of_bytes(self.canonical)

    @property
    def program_order(self) -> list[str]:
        """Program names in the order they were given at bundle time (by name for old bundles)."""
        return list(self.raw.get("program_order") or sorted(self.raw["programs"]))

    @property
    def programs(self) -> dict[str, ProgramSpec]:
        """Every program, in ``program_order``."""
        progs = self.raw["programs"]
        return {name: ProgramSpec(name, progs[name]) for name in self.program_order}

    @property
    def members(self) -> list[Member]:
        return [Member(m["path"], m["sha256"], m["size"], m["role"],
                       tuple((c["sha256"], c["size"]) for c in m.get("chunks", ())))
                for m in self.raw["members"]]

    @property
    def samples(self) -> list[Sample]:
        return [Sample(s["name"], s["program"], s["member"], tuple(s["inputs"]), tuple(s["outputs"]),
                       float(s["rtol"]), float(s["atol"])) for s in self.raw["samples"]]

    @property
    def requirements(self) -> Mapping[str, Any]:
        return self.raw["requirements"]

    @property
    def metadata(self) -> Mapping[str, str]:
        return self.raw["metadata"]

    @property
    def environment(self) -> Mapping[str, Any]:
        return self.raw["environment"]

    @property
    def total_size(self) -> int:
        return sum(m["size"] for m in self.raw["members"]) + len(self.canonical)

    def to_json(self) -> dict[str, Any]:
        """A deep copy of the raw manifest, its ``programs`` object in ``program_order``."""
        raw = copy.deepcopy(dict(self.raw))  # type: ignore[arg-type]
        raw["programs"] = {name: raw["programs"][name] for name in self.program_order}
        return raw
