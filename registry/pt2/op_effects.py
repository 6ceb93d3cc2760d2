"""Operators with effects outside tensor memory, derived from torch's operator schemas.

A node target that is an operator (``torch.ops.ns.op.overload``) is resolved and *called* when
the program runs, with arguments from the graph. Most operators only read and write tensors;
some reach the file system, other processes, the network or process-wide state
(``aten::from_file(str filename, bool? shared, ...)`` maps a user's file into a tensor that a
later ``copy_`` overwrites; ``aten::save``; collectives; the profiler). The rule that says which
is written once, over the schemas of every registered operator (:func:`effect_reason`), and
its result is frozen into ``side_effect_ops.json`` beside this file, which the pure graph checker
(``registry.pt2.safety``) reads. The file is the union (:func:`union`) over every torch of the
matrix CI tests, CPU and CUDA builds (a CUDA build registers more operators: ``cuda::``,
``mempool::``), and names them (``torch_versions``). ``python scripts/update_op_effects.py``
regenerates it, running each venv's torch in its own process (the schemas come from
``registry.runtime.torchrt.all_op_schemas``, the one module touching torch's private APIs; this
one stays pure); a test in ``tests/unit/test_program_validation.py`` recomputes the rule on the
running torch and fails when it has such an operator that the frozen list lacks.

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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .datafiles import read_data_file, write_data_file

__all__ = ["OpSchema", "effect_reason", "compute", "union", "load_frozen", "write_frozen", "FROZEN_PATH",
           "GENERATED_BY"]

GENERATED_BY = "python scripts/update_op_effects.py"

FROZEN_PATH = Path(__file__).with_name("side_effect_ops.json")

_NAMESPACE = re.compile(r"(?:^|_)(?:c10d|dist|distributed|rpc|symm_mem|dtensor|profiler|debugprims|"
                        r"debug_mode_ops)(?:_|$)|^prim$|^static_runtime$")
_PATH_ARG = re.compile(r"file|path|url|uri|dir|host|addr|port|librar|module|command|cmd", re.I)
_ASYNC_TYPE = re.compile(r"\b(?:Future|Await|RRef|Stream|Event)\b")
_CHECK_NAME = re.compile(r"assert|check|validate|constrain|_sink_tokens")
_STR_TYPES = re.compile(r"^(?:Optional\[)?(?:List\[)?str\]?\]?$|^str\??(?:\[\])?$")


@dataclass(frozen=True)
class OpSchema:
    """One registered operator's schema, as the rule reads it: ``name`` is ``ns::op``; ``args``
    are (name, type, is_written) per argument; ``returns`` the return types."""

    name: str
    overload: str
    args: tuple[tuple[str, str, bool], ...]
    returns: tuple[str, ...]


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


def compute(schemas: Iterable[OpSchema], torch_version: str) -> dict[str, Any]:
    """The frozen document, from the schemas of every operator one torch (``torch_version``,
    its ``__version__``: ``2.14.1+cu130``) registers."""
    ops: dict[str, str] = {}
    namespaces: set[str] = set()
    for s in schemas:
        ns, _, name = s.name.partition("::")
        reason = effect_reason(ns, name, s.args, s.returns)
        if reason is None:
            continue
        if _NAMESPACE.search(ns):
            namespaces.add(ns)
            continue
        ops[f"{ns}::{name}.{s.overload or 'default'}"] = reason
    return {
        "generated_by": GENERATED_BY,
        "torch_versions": [torch_version] if torch_version else [],
        "namespaces": sorted(namespaces),
        "namespace_pattern": _NAMESPACE.pattern,
        "ops": dict(sorted(ops.items())),
    }


def union(docs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One document from :func:`compute`'s documents of several torches: every operator and
    namespace any of them refuses (an operator's reason is the first document's that has it).

    >>> union([{"torch_versions": ["2.13.0+cpu"], "namespaces": ["prim"], "ops": {"a::x.default": "r"}},
    ...        {"torch_versions": ["2.14.1+cu130"], "namespaces": [], "ops": {"cuda::y.default": "s"}}])["ops"]
    {'a::x.default': 'r', 'cuda::y.default': 's'}
    """
    ops: dict[str, str] = {}
    namespaces: set[str] = set()
    versions: set[str] = set()
    for doc in docs:
        for op, reason in doc["ops"].items():
            ops.setdefault(op, reason)
        namespaces.update(doc["namespaces"])
        versions.update(doc["torch_versions"])
    return {
        "generated_by": GENERATED_BY,
        "torch_versions": sorted(versions),
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


def write_frozen(doc: dict[str, Any]) -> None:
    """Check in a document made by :func:`compute`."""
    write_data_file(FROZEN_PATH, doc)
