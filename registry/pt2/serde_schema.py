"""torch's serde schema for ``models/<prog>.json``, checked in and validated without torch.

``serde_schema.json`` beside this file is generated from the installed torch's
``torch/_export/serde/schema.yaml`` (the source torch's own ``schema.py`` dataclasses are
generated from) by :func:`generate`; regenerate it with ``python -m registry.pt2.serde_schema``
after a torch upgrade (``tests/unit/test_program_validation.py`` fails until you do).

:func:`validate` walks a parsed graph JSON against it: an object for a struct holds only the
struct's declared fields (each without a default present) with the declared types; a union is an
object with exactly one declared key; enums are one of their declared integers; ints are JSON
integers (never booleans) within 64 bits; floats are numbers or torch's ``"Infinity"``,
``"-Infinity"``, ``"NaN"``; strings are strings. torch itself ignores unknown fields (forward
compatibility); a registry refuses them, so every byte of a graph is something it has read.

Field checks (``checks``) let the caller constrain values by where they are, e.g.
``"TensorArgument.name"`` or ``"Graph.tensor_values#key"`` (the keys of a dict field).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .datafiles import read_data_file, write_data_file

__all__ = ["SCHEMA_PATH", "generate", "load_schema", "validate", "SchemaError", "main", "torch_schema_yaml"]

SCHEMA_PATH = Path(__file__).with_name("serde_schema.json")
_PRIMITIVES = frozenset({"int", "float", "str", "bool"})
_FLOAT_WORDS = frozenset({"Infinity", "-Infinity", "NaN"})
_INT_BOUND = 1 << 64
MAX_STRING = 1 << 20


class SchemaError(ValueError):
    """The graph JSON is not a torch serde ``ExportedProgram``; the message names the field path."""


def _parse_type(text: str) -> Any:
    text = text.replace(" ", "")
    m = re.fullmatch(r"(List|Optional)\[(.*)\]", text)
    if m:
        return [m.group(1).lower(), _parse_type(m.group(2))]
    m = re.fullmatch(r"Dict\[str,(.*)\]", text)
    if m:
        return ["dict", _parse_type(m.group(1))]
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text):
        raise ValueError(f"unsupported schema type {text!r}")
    return text


def generate(schema_yaml: Mapping[str, Any], torch_version: str | None = None) -> dict[str, Any]:
    """The checked-in document from torch's parsed ``schema.yaml``."""
    types: dict[str, Any] = {}
    for name, spec in schema_yaml.items():
        if not isinstance(spec, dict) or "kind" not in spec:
            continue
        kind = spec["kind"]
        if kind == "enum":
            types[name] = {"kind": "enum", "values": {k: int(v) for k, v in spec["fields"].items()}}
        elif kind in ("struct", "union"):
            fields = {}
            for fname, fspec in spec["fields"].items():
                fields[fname] = {"type": _parse_type(fspec["type"]), "required": "default" not in fspec}
            types[name] = {"kind": kind, "fields": fields}
        else:
            raise ValueError(f"unknown kind {kind!r} for {name}")
    for name, spec in types.items():  # every referenced name is declared
        for f in spec.get("fields", {}).values():
            t = f["type"]
            while isinstance(t, list):
                t = t[1]
            if t not in _PRIMITIVES and t not in types:
                raise ValueError(f"{name} refers to undeclared type {t!r}")
    version = schema_yaml.get("SCHEMA_VERSION")
    return {
        "generated_by": "python -m registry.pt2.serde_schema (from torch/_export/serde/schema.yaml)",
        "torch_version": torch_version,
        "schema_version": list(version) if version else None,
        "treespec_version": schema_yaml.get("TREESPEC_VERSION"),
        "root": "ExportedProgram",
        "types": dict(sorted(types.items())),
    }


def load_schema() -> dict[str, Any]:
    """The checked-in schema (read once)."""
    return read_data_file(SCHEMA_PATH)


def _path_text(path: Any) -> str:
    parts: list[str] = []
    while path is not None:
        path, key = path
        parts.append(f"[{key}]" if isinstance(key, int) else (f"[{key!r}]" if not re.fullmatch(
            r"[A-Za-z_][A-Za-z0-9_]*", key) else f".{key}"))
    text = "".join(reversed(parts))
    return text[1:] if text.startswith(".") else text or "(top level)"


Check = Callable[[Any], "str | None"]


def validate(model: Any, checks: Mapping[str, Check] | None = None, *, root: str | None = None) -> None:
    """Raise SchemaError (naming the field path) unless ``model`` is valid against the schema."""
    schema = load_schema()
    types = schema["types"]
    checks = checks or {}
    # stack items: (value, type, path, check key)
    stack: list[tuple[Any, Any, Any, str | None]] = [(model, root or schema["root"], None, None)]
    while stack:
        value, typ, path, ck = stack.pop()
        if isinstance(typ, list):
            kind, inner = typ
            if kind == "optional":
                if value is not None:
                    stack.append((value, inner, path, ck))
                continue
            if kind == "list":
                if not isinstance(value, list):
                    raise SchemaError(f"{_path_text(path)}: expected a list, found {_jtype(value)}")
                stack.extend((v, inner, (path, i), ck) for i, v in enumerate(value))
                continue
            if not isinstance(value, dict):  # dict
                raise SchemaError(f"{_path_text(path)}: expected an object, found {_jtype(value)}")
            key_check = checks.get(f"{ck}#key") if ck else None
            for k, v in value.items():
                if key_check is not None:
                    reason = key_check(k)
                    if reason:
                        raise SchemaError(f"{_path_text((path, k))}: {reason}")
                stack.append((v, inner, (path, k), ck))
            continue
        if typ in _PRIMITIVES:
            _primitive(value, typ, path)
            if ck is not None:
                check = checks.get(ck)
                if check is not None:
                    reason = check(value)
                    if reason:
                        raise SchemaError(f"{_path_text(path)}: {reason}")
            continue
        spec = types[typ]
        if spec["kind"] == "enum":
            if type(value) is not int or value not in spec["values"].values():
                raise SchemaError(f"{_path_text(path)}: {value!r} is not a {typ} value")
            continue
        if not isinstance(value, dict):
            raise SchemaError(f"{_path_text(path)}: expected a {typ} object, found {_jtype(value)}")
        fields = spec["fields"]
        if spec["kind"] == "union":
            if len(value) != 1:
                raise SchemaError(f"{_path_text(path)}: a {typ} has exactly one of its fields, found "
                                  f"{len(value)} ({', '.join(sorted(map(str, value))[:4])})")
        for k, v in value.items():
            f = fields.get(k)
            if f is None:
                raise SchemaError(f"{_path_text((path, k))}: unknown field (not in torch's {typ} schema)")
            stack.append((v, f["type"], (path, k), f"{typ}.{k}"))
        if spec["kind"] == "struct":
            missing = [k for k, f in fields.items() if f["required"] and k not in value]
            if missing:
                raise SchemaError(f"{_path_text(path)}: {typ} lacks required field {missing[0]!r}")
        check = checks.get(typ)
        if check is not None:
            reason = check(value)
            if reason:
                raise SchemaError(f"{_path_text(path)}: {reason}")


def _jtype(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(v), type(v).__name__)


def _primitive(value: Any, typ: str, path: Any) -> None:
    if typ == "str":
        if not isinstance(value, str):
            raise SchemaError(f"{_path_text(path)}: expected a string, found {_jtype(value)}")
        if len(value) > MAX_STRING:
            raise SchemaError(f"{_path_text(path)}: string of {len(value)} characters (limit {MAX_STRING})")
    elif typ == "bool":
        if type(value) is not bool:
            raise SchemaError(f"{_path_text(path)}: expected a boolean, found {_jtype(value)}")
    elif typ == "int":
        if type(value) is not int or not -_INT_BOUND < value < _INT_BOUND:
            raise SchemaError(f"{_path_text(path)}: expected a 64-bit integer, found {_jtype(value)}")
    elif typ == "float":
        if not (type(value) in (int, float) or (isinstance(value, str) and value in _FLOAT_WORDS)):
            raise SchemaError(f"{_path_text(path)}: expected a number, found {_jtype(value)}")
        if type(value) is int and not -_INT_BOUND < value < _INT_BOUND:
            raise SchemaError(f"{_path_text(path)}: number out of range")


def torch_schema_yaml() -> Path:
    """Path of the installed torch's schema.yaml (torch is located, not imported)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("torch is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "_export" / "serde" / "schema.yaml"


def _installed_torch_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:
        return None


def parse_schema_yaml(text: str) -> dict[str, Any]:
    """torch's generated ``schema.yaml`` (block mappings, ``- item`` lists, plain or single-quoted
    scalars: all that file uses), parsed without a YAML library."""
    lines = [(len(ln) - len(ln.lstrip(" ")), ln.strip()) for ln in text.splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]

    def block(i: int, indent: int) -> tuple[Any, int]:
        if lines[i][1].startswith("- "):
            items = []
            while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("- "):
                items.append(_scalar(lines[i][1][2:].strip()))
                i += 1
            return items, i
        out: dict[str, Any] = {}
        while i < len(lines) and lines[i][0] == indent and not lines[i][1].startswith("- "):
            key, _, value = lines[i][1].partition(":")
            i += 1
            if value.strip():
                out[key.strip()] = _scalar(value.strip())
            elif i < len(lines) and (lines[i][0] > indent or lines[i][1].startswith("- ")):
                out[key.strip()], i = block(i, lines[i][0])
            else:
                out[key.strip()] = None
        return out, i

    value, end = block(0, lines[0][0]) if lines else ({}, 0)
    if end != len(lines):
        raise ValueError(f"schema.yaml: unexpected line {lines[end][1]!r}")
    return value


def _scalar(text: str) -> Any:
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1].replace("''", "'")
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return text


def generate_installed() -> dict[str, Any]:
    """The document for the installed torch (located, not imported)."""
    return generate(parse_schema_yaml(torch_schema_yaml().read_text(encoding="utf-8")),
                    _installed_torch_version())


def main() -> None:
    doc = generate_installed()
    write_data_file(SCHEMA_PATH, doc)
    print(f"{SCHEMA_PATH}: {len(doc['types'])} types, schema {doc['schema_version']}")


if __name__ == "__main__":
    main()
