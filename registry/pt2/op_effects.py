"""Operators with effects outside tensor memory, derived from torch's operator schemas.

A node target that is an operator (``torch.ops.ns.op.overload``) is resolved and *called* when
the program runs, with arguments from the graph. Most operators only read and write tensors;
some reach the file system, other processes, the network or process-wide state
(``aten::from_file(str filename, bool? shared, ...)`` maps a user's file into a tensor that a
later ``copy_`` overwrites; ``aten::save``; collectives; the profiler). The rule that says which
is written once, over the schemas of every registered operator (:func:`effect_reason`), and
its result is frozen into ``side_effect_ops.json`` beside this file, which the pure graph checker
(``registry.pt2.safety``) reads. ``python -m registry.pt2.op_effects`` regenerates the file from
the installed torch; ``tests/unit/test_op_effects.py`` recomputes the rule and fails when torch
has gained such an operator that the frozen list lacks.

The rule, for an operator schema:

1. its namespace is one of collectives / remote calls / symmetric memory / distributed tensors /
   profiler / debug I/O / TorchScript interpreter primitives (``_NAMESPACE`` below);
2. it has a string argument named like a file, path, URL, directory, host, address, library,
   module or command (``_PATH_ARG``);
3. an argument or return is a future, awaitable, remote reference, stream or event
   (asynchronous or cross-process work);
4. it returns nothing and writes no argument (so its only effect is outside tensor memory:
   printing, warnings, seeding, global switches, saving), unless its name says it is a check
   that can only raise (``assert``/``check``/``validate``/``constrain``) or export's
   effect-token sink.

Custom (user) namespaces are not in this list: they are declared required ops the user installs.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable

from .datafiles import read_data_file, write_data_file

__all__ = ["effect_reason", "compute", "load_frozen", "FROZEN_PATH", "main"]

FROZEN_PATH = Path(__file__).with_name("side_effect_ops.json")

_NAMESPACE = re.compile(r"(?:^|_)(?:c10d|dist|distributed|rpc|symm_mem|dtensor|profiler|debugprims|"
                        r"debug_mode_ops)(?:_|$)|^prim$|^static_runtime$")
_PATH_ARG = re.compile(r"file|path|url|uri|dir|host|addr|port|librar|module|command|cmd", re.I)
_ASYNC_TYPE = re.compile(r"\b(?:Future|Await|RRef|Stream|Event)\b")
_CHECK_NAME = re.compile(r"assert|check|validate|constrain|_sink_tokens")
_STR_TYPES = re.compile(r"^(?:Optional\[)?(?:List\[)?str\]?\]?$|^str\??(?:\[\])?$")


def effect_reason(namespace: str, name: str, args: Iterable[tuple[str, str, bool]],
                  returns: Iterable[str]) -> str | None:
    """Why operator ``namespace::name`` acts outside tensor memory, or None.

    ``args``: (name, type, is_written) per argument; ``returns``: return types."""
    args = list(args)
    returns = list(returns)
    if _NAMESPACE.search(namespace):
        return f"namespace {namespace!r} (collectives, remote calls, profiler or debug I/O)"
    for arg_name, typ, _ in args:
        if _STR_TYPES.match(typ.replace(" ", "")) and _PATH_ARG.search(arg_name):
            return f"string argument {arg_name!r} names a file, path, address or library"
    for typ in [t for _, t, _ in args] + returns:
        if _ASYNC_TYPE.search(typ):
            return f"works asynchronously or across processes ({typ})"
    if not returns and not any(w for _, _, w in args) and not _CHECK_NAME.search(name):
        return "returns nothing and writes no tensor: its only effect is outside tensor memory"
    return None


#: torch modules that register operators from Python when imported (``streams::`` by dynamo,
#: collectives by distributed, ...): imported before the rule runs so their ops are covered.
_REGISTERING_MODULES = (
    "torch._dynamo", "torch._higher_order_ops", "torch._prims", "torch._refs", "torch.export",
    "torch._export.serde.serialize", "torch.distributed", "torch.distributed._functional_collectives",
    "torch.distributed.tensor", "torch._inductor.lowering", "torch.ao.quantization", "torch._library",
)


def _schemas() -> Iterable[Any]:
    import importlib

    import torch  # registers every built-in C++ operator

    for name in _REGISTERING_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an optional part of torch (no distributed build ...)
            pass
    return torch._C._jit_get_all_schemas()  # private, stable since 1.x


def compute() -> dict[str, Any]:
    """The frozen document, from the operators registered in this process."""
    import torch

    ops: dict[str, str] = {}
    namespaces: set[str] = set()
    for s in _schemas():
        ns, _, name = s.name.partition("::")
        args = [(a.name, str(a.type), bool(a.alias_info is not None and a.alias_info.is_write))
                for a in s.arguments]
        reason = effect_reason(ns, name, args, [str(r.type) for r in s.returns])
        if reason is None:
            continue
        if _NAMESPACE.search(ns):
            namespaces.add(ns)
            continue
        ops[f"{ns}::{name}.{s.overload_name or 'default'}"] = reason
    return {
        "generated_by": "python -m registry.pt2.op_effects",
        "torch_version": str(torch.__version__),
        "namespaces": sorted(namespaces),
        "namespace_pattern": _NAMESPACE.pattern,
        "ops": dict(sorted(ops.items())),
    }


def load_frozen() -> dict[str, Any]:
    """The checked-in list (read once)."""
    return read_data_file(FROZEN_PATH)


def refused(namespace: str, op: str, overload: str) -> str | None:
    """Why ``torch.ops.<namespace>.<op>.<overload>`` is refused, or None (pure lookup)."""
    frozen = load_frozen()
    if namespace in frozen["namespaces"] or _NAMESPACE.search(namespace):
        return f"operator namespace {namespace!r} acts outside tensor memory (collectives, remote calls, " \
               f"profiler or debug I/O)"
    reason = frozen["ops"].get(f"{namespace}::{op}.{overload}")
    if reason:
        return f"operator {namespace}::{op}.{overload} acts outside tensor memory: {reason}"
    return None


def main() -> None:
    doc = compute()
    write_data_file(FROZEN_PATH, doc)
    print(f"{FROZEN_PATH}: {len(doc['ops'])} operators, namespaces {', '.join(doc['namespaces'])}")


if __name__ == "__main__":
    main()
