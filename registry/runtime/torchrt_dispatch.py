"""Private torch APIs the target probe and the loader need, behind small functions.

The sibling of ``registry.runtime.torchrt``: the dispatcher (which ops exist, their schemas, which
dispatch keys have kernels), TorchBind classes, the serializer's schema version, AOTInductor's
CPU ISA naming, moving programs between devices and loading AOTInductor packages. torch is
imported lazily, so importing this module is free; a torch upgrade that moves one of these APIs
breaks this file only.

    >>> has_kernel("aten::add.Tensor", "CPU")                  # doctest: +SKIP
    True
"""
from __future__ import annotations

import os
import re
from typing import Any, Iterable

from ..errors import InputValidationError
from ..pt2.graph import BUILTIN_OP_NAMESPACES
from .torchrt import torch, torch_loading

__all__ = ["DISPATCH_KEYS", "serde_schema_version", "has_kernel", "registered_custom_ops",
           "torchbind_classes", "cpu_isa", "cuda_capability", "cuda_available", "hip_version",
           "move_to_device", "load_aoti", "bind_call", "to_device"]

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


def torchbind_classes() -> list[str]:
    """Qualified names (``__torch__.torch.classes.ns.Cls``) of registered TorchBind classes."""
    names: set[str] = set()
    for schema in torch()._C._jit_get_custom_class_schemas():  # private; methods take `self` first
        names.update(_CLASS_IN_SCHEMA.findall(str(schema)))
    return sorted(names)


def cpu_isa() -> str | None:
    """The vector ISA as AOTInductor records it in ``AOTI_CPU_ISA`` (e.g. ``"AVX512 AVX512_VNNI"``).

    Uses inductor's own detection so the strings compare exactly; it compiles a probe program
    once, so callers ask only when an AOTInductor CPU variant is in play. None when undetectable.
    """
    try:
        from torch._inductor.cpu_vec_isa import pick_vec_isa  # private

        isa = pick_vec_isa()
    except Exception:  # no compiler, exotic CPU: the ISA is then unknown, not an error
        return None
    return str(isa).upper() if isa else None


def cuda_available() -> bool:
    t = torch()
    return bool(t.cuda.is_available())


def cuda_capability(index: int | None) -> tuple[int, int]:
    major, minor = torch().cuda.get_device_capability(index)
    return int(major), int(minor)


def hip_version() -> str | None:
    return getattr(torch().version, "hip", None)


def move_to_device(ep: Any, device: str) -> Any:
    """Rewrite every device in an ExportedProgram (baked constants, weights) to ``device``."""
    torch()
    from torch.export.passes import move_to_device_pass

    return move_to_device_pass(ep, device)


def load_aoti(path: str | os.PathLike, model_name: str, device: str, label: str | None = None,
              program: str | None = None) -> Any:
    """Load one model of a verified AOTInductor package onto ``device`` (``cuda:1`` -> index 1).
    ``label`` names the package for the user in errors (never the cache blob at ``path``)."""
    torch()
    from torch._inductor.package import load_package  # private: pick a model by name

    _, _, index = device.partition(":")
    # A buffer, not the path: cache blobs have no `.pt2` suffix and torch warns on those.
    with torch_loading(f"AOTInductor model {program or model_name!r}" + (f" from {label}" if label else ""),
                       "the package is damaged or was compiled for another torch or machine",
                       hide=(path, label)), open(path, "rb") as f:
        return load_package(f, model_name, device_index=int(index) if index else -1)


def bind_call(args: tuple, kwargs: dict, in_spec: str | None,
              arg_names: list[str] | None = None) -> tuple[list[Any], tuple, dict]:
    """Match a call to the program's input treespec: (flat leaves, args, kwargs) in its order.

    Positional parameters passed by keyword (``model(x=t)``) are moved into place by name, and
    keyword arguments are reordered as exported. A structure that cannot match raises
    InputValidationError naming what the program takes.
    """
    from torch.utils._pytree import tree_flatten, treespec_loads  # private

    if not in_spec:
        return [*args, *kwargs.values()], tuple(args), dict(kwargs)
    spec = treespec_loads(in_spec)
    n_pos = spec.child(0).num_children
    want_kw = list(spec.child(1).context or [])
    args, kwargs = list(args), dict(kwargs)
    for pname in (arg_names or [])[len(args):n_pos]:
        if pname not in kwargs:
            break
        args.append(kwargs.pop(pname))
    positional = (arg_names or [])[:n_pos] if len(arg_names or []) >= n_pos else [f"{n_pos} positional"]
    expected = ", ".join([*positional, *want_kw])
    if len(args) != n_pos or set(kwargs) != set(want_kw):
        got = [f"{len(args)} positional", *sorted(kwargs)]
        raise InputValidationError(f"the program takes ({expected}), got ({', '.join(got)})")
    kwargs = {k: kwargs[k] for k in want_kw}
    flat, got_spec = tree_flatten((tuple(args), kwargs))
    if got_spec != spec:
        raise InputValidationError(f"the inputs' nesting does not match the program's: expected {spec}")
    return flat, tuple(args), kwargs


def to_device(value: Any, device: str) -> Any:
    """Every tensor in a (nested) value moved to ``device``."""
    from torch.utils._pytree import tree_map  # private

    t = torch()
    return tree_map(lambda v: v.to(device) if isinstance(v, t.Tensor) else v, value)
