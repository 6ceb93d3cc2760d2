"""A runtime described as data: what a machine can load and run.

A ``Target`` is what the compatibility rules (``registry.compat``) check a bundle against.
``registry.target_probe.probe()`` reads the live machine; ``pt2reg target --json`` prints it, so
an inference box can be captured once and every candidate bundle checked against that file from
CI (``pt2reg verify BUNDLE --target box.json``). A hand-written file for a machine we do not have
needs only ``torch_version``, ``serde_schema`` and ``device_type``::

    {"torch_version": "2.13.0", "serde_schema": [8, 20], "device_type": "cuda",
     "compute_capability": [9, 0],
     "custom_ops": {"mylib::myop": {"schema": "mylib::myop(Tensor x) -> Tensor",
                                    "dispatch_keys": ["CPU"]}}}

``custom_ops`` is keyed by the dispatcher's operator name: ``ns::op`` for the default overload,
``ns::op.overload`` otherwise (see ``op_key``). It lists every registered operator outside
torch's built-in namespaces with its schema and the dispatch keys that have a kernel.

Pure: no torch, no IO except ``Target.load``.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from .errors import UsageError

__all__ = ["Target", "OpInfo", "TARGET_FORMAT", "op_key"]

#: Version of the target JSON this code writes and the highest it reads.
TARGET_FORMAT = 1
_DEVICE_TYPE = re.compile(r"^[a-z_][a-z0-9_]{0,31}$")
_OP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")
_OPTIONAL_STR = ("cuda_version", "rocm_version", "platform", "machine", "cpu_isa")
_KNOWN_KEYS = {"format", "kind", "torch_version", "serde_schema", "device_type", "compute_capability",
               "custom_ops", "torchbind_classes", *_OPTIONAL_STR}


def op_key(name: str, overload: str) -> str:
    """The dispatcher name of a manifest op: ``op_key("mylib::f", "default") == "mylib::f"``."""
    return name if overload in ("default", "") else f"{name}.{overload}"


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

    def __post_init__(self) -> None:
        # A frozen value must not share a mutable dict with its caller.
        object.__setattr__(self, "custom_ops", MappingProxyType(dict(self.custom_ops)))
        object.__setattr__(self, "torchbind_classes", tuple(self.torchbind_classes))

    @property
    def compute_capability_str(self) -> str | None:
        """``"90"`` for (9, 0): the form AOTInductor records in ``AOTI_COMPUTE_CAPABILITY``."""
        cc = self.compute_capability
        return f"{cc[0]}{cc[1]}" if cc else None

    def summary(self) -> dict[str, Any]:
        """``to_json()`` without the (long) op table: for reports."""
        out = self.to_json()
        out["custom_ops"] = len(self.custom_ops)
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
        }

    @classmethod
    def from_json(cls, raw: Any, *, where: str = "target") -> "Target":
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
        if problems:
            more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
            raise UsageError(f"{where} is invalid: {'; '.join(problems[:3])}{more}",
                             hint="produce one with `pt2reg target --json`")
        return cls(torch_version=torch_version, serde_schema=serde, device_type=device_type,  # type: ignore[arg-type]
                   compute_capability=cc, custom_ops=ops, torchbind_classes=tuple(classes), **optional)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Target":
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
