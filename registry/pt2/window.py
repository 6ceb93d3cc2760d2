"""Which torch can read a serialized program: computed from what the program uses.

A program's JSON (``models/<name>.json``) records the serde schema of the torch that *wrote*
it, but an older torch reads it as long as it uses nothing that torch lacks: torch's reader
ignores unknown struct fields, compares only the schema *major*, and fails on a union tag, an
enum value or a node target it does not know. So the oldest torch that can read a program is
the newest release among those that introduced what it uses. The table below comes from the
``schema.yaml`` and ``serialize.py`` of each supported release (2.10.0 to 2.14.1, read on
2026-12-04; ``schema.yaml`` is byte-identical from 2.12.0 on)::

    window = program_window(model)          # model: the parsed models/<name>.json
    window.torch, window.schema, window.features
    # -> ('2.12', (8, 20), ('Argument.as_float_lists (torch 2.12)',))

Unknown struct fields a newer torch adds (``Node.name``, 2.11) are dropped by older readers
without harm, so they do not raise the window. Pure: no torch, no IO.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..format.manifest import ProgramWindow

__all__ = ["RELEASES", "FLOOR", "ProgramWindow", "program_window", "release_for_schema", "schema_of_release",
           "oldest_release"]

#: supported torch releases -> the serde schema (major, minor) each reads and writes
RELEASES: dict[str, tuple[int, int]] = {
    "2.10": (8, 15), "2.11": (8, 17), "2.12": (8, 20), "2.13": (8, 20), "2.14": (8, 20),
}
#: the oldest supported release (pyproject's ``torch>=``)
FLOOR = "2.10"

#: union tags (``Argument.<tag>``) by the release that can first read them
_TAGS = {"as_nested_tensors": "2.11", "as_float_lists": "2.12"}
#: ScalarType values (float8_e8m0fnu, uint32, uint64) first read by 2.12
_SCALAR_TYPES = {33: ("ScalarType.FLOAT8E8M0FNU", "2.12"), 34: ("ScalarType.UINT32", "2.12"),
                 35: ("ScalarType.UINT64", "2.12")}
#: node targets (``_operator.*``) first resolved by 2.11 (``_SYM_OPS`` gained them)
_OPERATOR_TARGETS = {"_operator.lshift": "2.11", "_operator.rshift": "2.11"}
#: plain-callable targets of pre-dispatch graphs: 2.13 added their ``callable(target)`` branch
_CALLABLE_TARGET_RELEASE = "2.13"
_CALLABLE_TARGETS = frozenset({"torch._C._set_grad_enabled", "torch.amp.autocast_mode._enter_autocast",
                               "torch.amp.autocast_mode._exit_autocast",
                               "torch._functorch.vmap.lazy_load_decompositions"})
#: a constant named ``opaque_obj_*`` (an opaque object): its loader arrived in 2.13
_OPAQUE_PREFIX = "opaque_obj_"


def _key(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split("."))


def schema_of_release(release: str) -> tuple[int, int] | None:
    """The serde schema a torch release (``2.13``, ``2.13.0+cpu``) reads, if it is supported."""
    return RELEASES.get(".".join(release.split("+")[0].split(".")[:2]))


def release_for_schema(schema: tuple[int, int]) -> str | None:
    """The oldest supported release that reads ``schema`` (same major, minor at least)."""
    found = [r for r, s in RELEASES.items() if s[0] == schema[0] and s[1] >= schema[1]]
    return min(found, key=_key) if found else None


def oldest_release(*releases: str) -> str:
    """The newest of ``releases`` (the oldest torch that has everything they each need)."""
    return max(releases, key=_key) if releases else FLOOR


def _walk(value: Any) -> Iterator[tuple[str | None, Any, Any]]:
    """(key, value, parent) of every entry of a parsed JSON value, iteratively."""
    stack: list[tuple[str | None, Any, Any]] = [(None, value, None)]
    while stack:
        key, v, parent = stack.pop()
        yield key, v, parent
        if isinstance(v, dict):
            stack.extend((k, x, v) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((key, x, v) for x in v)


def program_window(model: Any, *, weights_config: Any = None, constants_config: Any = None) -> ProgramWindow:
    """The window of one serialized program (and its payload configs, whose dtypes count)."""
    needs: dict[str, str] = {}   # feature -> release
    for key, value, parent in _walk([model, weights_config, constants_config]):
        if key in _TAGS and isinstance(parent, dict) and len(parent) == 1:
            needs[f"Argument.{key}"] = _TAGS[key]
        elif (key == "as_scalar_type" or (key == "dtype" and isinstance(parent, dict) and "sizes" in parent)) \
                and type(value) is int and value in _SCALAR_TYPES:  # a TensorMeta's dtype, a scalar-type argument
            name, release = _SCALAR_TYPES[value]
            needs[name] = release
        elif key == "target" and isinstance(value, str):
            if value in _OPERATOR_TARGETS:
                needs[f"node target {value}"] = _OPERATOR_TARGETS[value]
            elif value in _CALLABLE_TARGETS:
                needs[f"node target {value}"] = _CALLABLE_TARGET_RELEASE
    entries = constants_config.get("config") if isinstance(constants_config, dict) else None
    for name, meta in entries.items() if isinstance(entries, dict) else ():
        path = meta.get("path_name") if isinstance(meta, dict) else None
        if any(isinstance(n, str) and n.startswith(_OPAQUE_PREFIX) for n in (name, path)):
            needs[f"constant {name}"] = _CALLABLE_TARGET_RELEASE
    release = oldest_release(FLOOR, *needs.values())
    features = tuple(sorted(f"{f} (torch {r})" for f, r in needs.items() if _key(r) > _key(FLOOR)))
    return ProgramWindow(release, RELEASES[release], features)
