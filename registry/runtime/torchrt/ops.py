"""The dispatcher: which ops exist, their schemas, which dispatch keys have kernels, TorchBind
classes, every registered schema (``registry.pt2.op_effects``), the serde schema version."""
from __future__ import annotations

import importlib
import json
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...pt2.graph import BUILTIN_OP_NAMESPACES
from ...pt2.op_effects import OpSchema
from .version import installation_key, torch

if TYPE_CHECKING:
    pass


__all__ = ['op_schema', 'op_schemas', 'DISPATCH_KEYS', 'serde_schema_version', 'has_kernel', 'registered_custom_ops', 'all_op_schemas', 'op_schema_digests', 'torchbind_classes']


def op_schema(target: str) -> str | None:
    """The schema string of a registered op (``torch.ops.ns.op.overload``), else None."""
    if "torch" not in sys.modules:
        return None
    parts = target.split(".")
    if len(parts) != 5:
        return None
    try:
        packet = getattr(getattr(torch().ops, parts[2]), parts[3])
        return str(getattr(packet, parts[4])._schema)
    except (AttributeError, RuntimeError):
        return None


def op_schemas(targets: Iterable[str], memo_dir: str | os.PathLike[str] | None = None) -> dict[str, str | None]:
    """``op_schema`` of each op target, torch imported for it unless ``memo_dir`` answers them all.

    ``memo_dir`` (the client cache's ``op-schemas``) keeps the schemas of torch's built-in
    operators per torch installation, named by its files' identity (found without importing
    it: ``installation_key``), so a ``pt2reg bundle`` of a program whose every op was seen on
    this machine with this torch needs no ``import torch`` (~1.2 s of the command). A custom op
    (any other namespace) and a target not registered are always asked of torch: their schemas
    depend on the libraries this process loaded. A memo that does not parse is rebuilt."""
    wanted = list(dict.fromkeys(targets))
    key = installation_key() if memo_dir is not None else None
    memo = Path(memo_dir) / f"{key}.json" if memo_dir is not None and key is not None else None
    known: dict[str, str] = {}
    if memo is not None:
        try:
            raw = json.loads(memo.read_text("utf-8"))
            known = {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}
        except (OSError, ValueError, AttributeError):
            known = {}
        if "torch" not in sys.modules and all(t in known for t in wanted):
            return {t: known[t] for t in wanted}
    torch()
    out = {t: op_schema(t) for t in wanted}
    new = {t: s for t, s in out.items() if s is not None and known.get(t) != s and _builtin_target(t)}
    if memo is not None and new:
        from ...atomic import atomic_write

        with atomic_write(memo, fsync=False) as f:
            f.write(json.dumps({**known, **new}, sort_keys=True).encode("utf-8"))
    return out


def _builtin_target(target: str) -> bool:
    parts = target.split(".")
    return len(parts) == 5 and parts[2] in BUILTIN_OP_NAMESPACES


# -- the dispatcher, devices and AOTInductor ------------------------------------------------------

#: Dispatch keys recorded per op in a Target: backends plus the composite keys that serve all.
DISPATCH_KEYS = ("CPU", "CUDA", "HIP", "MPS", "XPU", "Meta", "QuantizedCPU", "QuantizedCUDA",
                 "SparseCPU", "SparseCUDA", "CompositeImplicitAutograd", "CompositeExplicitAutograd",
                 "CompositeExplicitAutogradNonFunctional")
_CLASS_IN_SCHEMA = re.compile(r"(__torch__\.torch\.classes\.[A-Za-z0-9_]+\.[A-Za-z0-9_]+)")


def serde_schema_version() -> tuple[int, int]:
    """(major, minor) of the serializer this torch writes and reads (private constant)."""
    torch()
    from torch._export.serde.schema import SCHEMA_VERSION  # private

    return int(SCHEMA_VERSION[0]), int(SCHEMA_VERSION[1])


def has_kernel(op: str, dispatch_key: str) -> bool:
    """Whether ``op`` (``ns::op`` or ``ns::op.overload``) has a kernel for ``dispatch_key``."""
    try:
        return bool(torch()._C._dispatch_has_kernel_for_dispatch_key(op, dispatch_key))  # private
    except RuntimeError:
        return False


def _schema(op: str) -> str | None:
    name, _, overload = op.partition(".")
    try:
        return str(torch()._C._get_schema(name, overload))  # private
    except RuntimeError:
        return None


#: torch modules that register operators from Python when imported (``streams::`` by dynamo,
#: collectives by distributed, ...): imported before every schema is listed, so theirs count.
_REGISTERING_MODULES = (
    "torch._dynamo", "torch._higher_order_ops", "torch._prims", "torch._refs", "torch.export",
    "torch._export.serde.serialize", "torch.distributed", "torch.distributed._functional_collectives",
    "torch.distributed.tensor", "torch._inductor.lowering", "torch.ao.quantization", "torch._library",
)


def all_op_schemas() -> list[OpSchema]:
    """The schema of every operator registered in this process, after importing the parts of
    torch that register operators from Python (for :func:`registry.pt2.op_effects.compute`)."""
    t = torch()  # registers every built-in C++ operator
    for name in _REGISTERING_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an optional part of torch (no distributed build ...)
            pass
    return [OpSchema(name=s.name, overload=s.overload_name,
                     args=tuple((a.name, str(a.type), bool(a.alias_info is not None and a.alias_info.is_write))
                                for a in s.arguments),
                     returns=tuple(str(r.type) for r in s.returns))
            for s in t._C._jit_get_all_schemas()]  # private, stable since 1.x


def registered_custom_ops(only: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """Registered ops outside torch's built-in namespaces (or just those named in ``only``):
    schema and the dispatch keys that have kernels. ``only`` keeps a load's probe cheap: a
    full scan asks the dispatcher about every op and key (~4,600 calls)."""
    out: dict[str, dict[str, Any]] = {}
    names = torch()._C._dispatch_get_all_op_names()  # private
    if only is not None:
        names = set(names) & set(only)
    for op in names:
        if op.split("::", 1)[0] in BUILTIN_OP_NAMESPACES:
            continue
        out[op] = {"schema": _schema(op), "dispatch_keys": [k for k in DISPATCH_KEYS if has_kernel(op, k)]}
    return out


def op_schema_digests(only: Iterable[str] | None = None) -> dict[str, str]:
    """``schema_digest`` of the schema of every registered operator (or just those named in
    ``only``, dispatcher names ``ns::op[.overload]``; absent ones are left out), keyed by
    dispatcher name: what a target records for the operator rule (~4,400 operators, ~30 ms)."""
    from ..target import schema_digest

    t = torch()
    if only is not None:
        found = ((op, _schema(op)) for op in only)
        return {op: schema_digest(s) for op, s in found if s is not None}
    return {s.name + (f".{s.overload_name}" if s.overload_name else ""): schema_digest(str(s))
            for s in t._C._jit_get_all_schemas()}  # private, stable since 1.x


def torchbind_classes() -> list[str]:
    """Qualified names (``__torch__.torch.classes.ns.Cls``) of registered TorchBind classes."""
    names: set[str] = set()
    for schema in torch()._C._jit_get_custom_class_schemas():  # private; methods take `self` first
        names.update(_CLASS_IN_SCHEMA.findall(str(schema)))
    return sorted(names)
