"""A runtime described as data: what a machine can load and run.

A ``Target`` is what the compatibility rules (``registry.runtime.compat``) check a bundle against.
``registry.runtime.probe.probe()`` reads the live machine; ``pt2reg target --json`` prints it, so
an inference box can be captured once and every candidate bundle checked against that file from
CI (``pt2reg verify BUNDLE --target box.json``). A hand-written file for a machine we do not have
needs only ``torch_version``, ``serde_schema`` and ``device_type``::

    {"torch_version": "2.13.0", "serde_schema": [8, 20], "device_type": "cuda",
     "compute_capability": [9, 0],
     "custom_ops": {"mylib::myop": {"schema": "mylib::myop(Tensor x) -> Tensor",
                                    "dispatch_keys": ["CPU"]}}}

``custom_ops`` is keyed by the dispatcher's operator name: ``ns::op`` for the default overload,
``ns::op.overload`` otherwise (a manifest op's ``RequiredOp.dispatcher_name``). It lists every registered operator outside
torch's built-in namespaces with its schema and the dispatch keys that have a kernel.
``op_schemas`` (optional) maps every registered operator's dispatcher name, torch's own
included, to ``schema_digest`` of its schema: what the operator rule compares a program's
``operators`` with (``pt2reg target --json`` records all of them; a live probe those a bundle
needs). ``cxx11_abi``: whether its torch uses libstdc++'s C++11 ABI (AOTInductor packages).

Pure: no torch, no IO except ``Target.load``.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..errors import UsageError

__all__ = ["Target", "OpInfo", "TARGET_FORMAT", "TORCH_OP_NAMESPACES", "is_torch_namespace", "schema_digest"]

#: Operator namespaces torch registers itself (its C++ libraries and its own Python modules:
#: quantization, distributed, inductor, export, ONNX, ...), beyond the built-in ones the op table
#: leaves out. They are listed in the table (a program may use them) but are not the user's
#: custom ops. Names under these prefixes count as torch's too (``_c10d_functional_autograd``).
TORCH_OP_NAMESPACES = frozenset({
    "aten", "prims", "higher_order", "rngprims", "debugprims", "profiler",
    "quantized", "_quantized", "quantization", "sparse", "mkl", "mkldnn", "mkldnn_prepacked", "onednn",
    "static_runtime", "c10d", "c10d_functional", "_c10d_functional", "_c10d_functional_autograd", "_dtensor",
    "symm_mem", "fsdp", "inductor", "inductor_prims", "_inductor_test", "flex_lib", "export", "onnx",
    "onnx_symbolic", "streams", "debug_mode_ops", "_native", "_test", "cuda", "xpu", "mps", "_nvshmem",
    "nvshmem", "_cudnn", "cudnn", "_fbgemm", "_caffe2", "_aoti", "prepacked",
})
_TORCH_NS_PREFIXES = ("_c10d", "c10d", "_dtensor", "symm_mem", "_symm_mem", "inductor", "_inductor", "mkldnn",
                      "onnx", "_quantized", "quantized", "prims")


def is_torch_namespace(ns: str) -> bool:
    """True for an operator namespace torch registers itself, False for a user-registered one."""
    return ns in TORCH_OP_NAMESPACES or ns.startswith(_TORCH_NS_PREFIXES)

#: Version of the target JSON this code writes and the highest it reads.
TARGET_FORMAT = 1
_DEVICE_TYPE = re.compile(r"^[a-z_][a-z0-9_]{0,31}$")
_OP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")
_OPTIONAL_STR = ("cuda_version", "rocm_version", "platform", "machine", "cpu_isa")
_KNOWN_KEYS = {"format", "kind", "torch_version", "serde_schema", "device_type", "compute_capability",
               "custom_ops", "torchbind_classes", "op_schemas", "cxx11_abi", *_OPTIONAL_STR}
_DIGEST16 = re.compile(r"^[0-9a-f]{16}$")


def schema_digest(schema: str) -> str:
    """16 hex digits of sha256 over an operator schema with its whitespace normalized: how a
    target records a schema (a full table is ~4,400 operators)."""
    import hashlib

    return hashlib.sha256(" ".join(schema.split()).encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class OpInfo:
    """One registered operator: its schema string and the dispatch keys that have a kernel."""

    schema: str | None
    dispatch_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Target:
    """A runtime: torch, serializer, device and the custom ops/classes it has registered.

    >>> t = Target(torch_version="2.13.0", serde_schema=(8, 20), device_type="cuda",
    ...            compute_capability=(9, 0))
    >>> Target.from_json(t.to_json()) == t
    True
    """

    torch_version: str
    serde_schema: tuple[int, int]
    device_type: str
    compute_capability: tuple[int, int] | None = None
    cuda_version: str | None = None
    rocm_version: str | None = None
    platform: str | None = None
    machine: str | None = None
    cpu_isa: str | None = None
    custom_ops: Mapping[str, OpInfo] = field(default_factory=dict, hash=False)
    torchbind_classes: tuple[str, ...] = ()
    #: dispatcher name -> ``schema_digest`` of its schema; empty: not recorded (not checked)
    op_schemas: Mapping[str, str] = field(default_factory=dict, hash=False)
    cxx11_abi: bool | None = None

    def __post_init__(self) -> None:
        # A frozen value must not share a mutable dict with its caller.
        object.__setattr__(self, "custom_ops", MappingProxyType(dict(self.custom_ops)))
        object.__setattr__(self, "torchbind_classes", tuple(self.torchbind_classes))
        object.__setattr__(self, "op_schemas", MappingProxyType(dict(self.op_schemas)))

    @property
    def compute_capability_str(self) -> str | None:
        """``"90"`` for (9, 0): the form AOTInductor records in ``AOTI_COMPUTE_CAPABILITY``."""
        cc = self.compute_capability
        return f"{cc[0]}{cc[1]}" if cc else None

    def op_namespaces(self) -> dict[str, dict[str, int]]:
        """Registered ops counted per namespace: ``{"torch": {"quantized": 174, ...},
        "user": {"mylib": 2}}``, each by descending count, then name."""
        counts: dict[str, int] = {}
        for op in self.custom_ops:
            ns = op.split("::", 1)[0]
            counts[ns] = counts.get(ns, 0) + 1
        out: dict[str, dict[str, int]] = {"torch": {}, "user": {}}
        for ns, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            out["torch" if is_torch_namespace(ns) else "user"][ns] = n
        return out

    def summary(self) -> dict[str, Any]:
        """``to_json()`` without the (long) op table: for reports."""
        out = self.to_json()
        out["custom_ops"] = len(self.custom_ops)
        out["op_schemas"] = len(self.op_schemas)
        spaces = self.op_namespaces()
        out["torch_ops"] = sum(spaces["torch"].values())
        out["user_ops"] = sum(spaces["user"].values())
        out["user_op_namespaces"] = sorted(spaces["user"])
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "format": TARGET_FORMAT,
            "kind": "pt2-target",
            "torch_version": self.torch_version,
            "serde_schema": list(self.serde_schema),
            "device_type": self.device_type,
            "compute_capability": list(self.compute_capability) if self.compute_capability else None,
            **{k: getattr(self, k) for k in _OPTIONAL_STR},
            "custom_ops": {k: {"schema": v.schema, "dispatch_keys": list(v.dispatch_keys)}
                           for k, v in sorted(self.custom_ops.items())},
            "torchbind_classes": sorted(self.torchbind_classes),
            **({"op_schemas": dict(sorted(self.op_schemas.items()))} if self.op_schemas else {}),
            **({"cxx11_abi": self.cxx11_abi} if self.cxx11_abi is not None else {}),
        }

    @classmethod
    def from_json(cls, raw: Any, *, where: str = "target") -> Target:
        """Validate a target document, reporting every bad field in one line (UsageError)."""
        problems: list[str] = []
        if not isinstance(raw, dict):
            raise UsageError(f"{where} is not a JSON object", hint="produce one with `pt2reg target --json`")
        fmt = raw.get("format", TARGET_FORMAT)
        if not _is_int(fmt) or fmt < 1:
            problems.append(f"format must be a positive integer, got {fmt!r}")
        elif fmt > TARGET_FORMAT:
            raise UsageError(f"{where} has format {fmt}, newer than this pt2-registry reads "
                             f"(format {TARGET_FORMAT})", hint="upgrade pt2-registry")
        if raw.get("kind", "pt2-target") != "pt2-target":
            problems.append(f"kind must be 'pt2-target', got {raw.get('kind')!r}")
        unknown = sorted(set(raw) - _KNOWN_KEYS)
        if unknown:
            problems.append(f"unknown field {unknown[0]!r}" + (f" (+{len(unknown) - 1} more)" if len(unknown) > 1 else ""))
        torch_version = raw.get("torch_version")
        if not isinstance(torch_version, str) or not torch_version:
            problems.append("torch_version must be a non-empty string like '2.13.0'")
        serde = _pair(raw.get("serde_schema"), "serde_schema", problems, required=True)
        device_type = raw.get("device_type")
        if not isinstance(device_type, str) or not _DEVICE_TYPE.match(device_type):
            problems.append(f"device_type must be a device type like 'cpu' or 'cuda' (no index), got {device_type!r}")
        cc = _pair(raw.get("compute_capability"), "compute_capability", problems, required=False)
        optional = {}
        for key in _OPTIONAL_STR:
            value = raw.get(key)
            if value is not None and not isinstance(value, str):
                problems.append(f"{key} must be a string or null, got {value!r}")
            optional[key] = value
        ops = _custom_ops(raw.get("custom_ops", {}), problems)
        classes = raw.get("torchbind_classes", [])
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            problems.append("torchbind_classes must be a list of class names")
            classes = []
        schemas = raw.get("op_schemas", {})
        if not isinstance(schemas, dict) or not all(isinstance(k, str) and _OP_NAME.match(k) and isinstance(v, str)
                                                     and _DIGEST16.match(v) for k, v in schemas.items()):
            problems.append("op_schemas must map operator names to 16 hex digits (schema_digest)")
            schemas = {}
        abi = raw.get("cxx11_abi")
        if abi is not None and not isinstance(abi, bool):
            problems.append("cxx11_abi must be true, false or null")
            abi = None
        if problems:
            more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
            raise UsageError(f"{where} is invalid: {'; '.join(problems[:3])}{more}",
                             hint="produce one with `pt2reg target --json`")
        return cls(torch_version=torch_version, serde_schema=serde, device_type=device_type,  # type: ignore[arg-type]
                   compute_capability=cc, custom_ops=ops, torchbind_classes=tuple(classes), op_schemas=schemas,
                   cxx11_abi=abi, **optional)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Target:
        """Read a target file written by ``pt2reg target --json`` (or by hand).

        >>> Target.load("inference-box.json").device_type          # doctest: +SKIP
        'cuda'
        """
        where = os.fspath(path)
        try:
            with open(where, "rb") as f:
                data = f.read(64 * 1024 * 1024)
        except FileNotFoundError as exc:
            raise UsageError(f"target file {where} not found") from exc
        except OSError as exc:
            raise UsageError(f"cannot read target file {where}: {exc.strerror or exc}") from exc
        try:
            raw = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise UsageError(f"target file {where} is not valid JSON ({exc})",
                             hint="produce one with `pt2reg target --json`") from exc
        return cls.from_json(raw, where=f"target file {where}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _pair(value: Any, name: str, problems: list[str], *, required: bool) -> tuple[int, int] | None:
    if value is None and not required:
        return None
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(_is_int(v) and v >= 0 for v in value):
        return int(value[0]), int(value[1])
    problems.append(f"{name} must be [major, minor]{'' if required else ' or null'}, got {value!r}")
    return None


def _custom_ops(value: Any, problems: list[str]) -> dict[str, OpInfo]:
    if not isinstance(value, dict):
        problems.append("custom_ops must be an object {\"ns::op\": {\"schema\", \"dispatch_keys\"}}")
        return {}
    out: dict[str, OpInfo] = {}
    for name, info in value.items():
        if not _OP_NAME.match(name):
            problems.append(f"custom_ops key {name!r} is not an operator name like 'ns::op' or 'ns::op.overload'")
            continue
        if not isinstance(info, dict):
            problems.append(f"custom_ops[{name!r}] must be an object")
            continue
        schema = info.get("schema")
        keys = info.get("dispatch_keys", [])
        if schema is not None and not isinstance(schema, str):
            problems.append(f"custom_ops[{name!r}].schema must be a string or null")
        elif not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            problems.append(f"custom_ops[{name!r}].dispatch_keys must be a list of strings")
        else:
            out[name] = OpInfo(schema, tuple(keys))
    return out
