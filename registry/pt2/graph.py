"""Facts about one exported program, read from its serialized graph JSON (``models/<name>.json``).

Pure functions over parsed JSON: no torch, so a program whose custom op is not registered in
this process can still be described, and nothing is ever unpickled. The output is the manifest's
program entry (plain JSON values).
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from .exprs import INF, ExprError, parse_srepr
from .treespec import TreeSpecError, input_label, leaf_paths, pytree_classes
from .window import program_window

__all__ = ["describe_program", "GraphFormatError", "SCALAR_TYPES", "BUILTIN_OP_NAMESPACES",
           "HARDWARE_DTYPES", "parse_op_target"]

# torch._export.serde.schema.ScalarType (serde schema major 8); stable within a schema major.
SCALAR_TYPES = {
    0: "unknown", 1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float16",
    7: "float32", 8: "float64", 9: "complex32", 10: "complex64", 11: "complex128", 12: "bool",
    13: "bfloat16", 28: "uint16", 29: "float8_e4m3fn", 30: "float8_e5m2", 31: "float8_e4m3fnuz",
    32: "float8_e5m2fnuz", 33: "float8_e8m0fnu", 34: "uint32", 35: "uint64",
}
#: dtypes whose kernels need specific GPU generations (see compat rules).
HARDWARE_DTYPES = {"bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                   "float8_e8m0fnu"}
#: namespaces every torch build registers; anything else is a custom op the target must provide.
BUILTIN_OP_NAMESPACES = {"aten", "prims", "higher_order", "rngprims", "debugprims", "profiler"}
_OP_TARGET = re.compile(r"^torch\.ops\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)$")
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<fn>[^\n]+))?(?:\n\s*(?P<code>[^\n]*))?')
_MAX_NODES = 2_000_000
_MAX_DEPTH = 32


class GraphFormatError(ValueError):
    """The graph JSON does not have the shape this reader understands."""


def parse_op_target(target: str) -> tuple[str, str, str] | None:
    """``torch.ops.ns.op.overload`` -> (ns, op, overload), or None for non-op targets."""
    m = _OP_TARGET.match(target or "")
    return (m.group(1), m.group(2), m.group(3)) if m else None


def _dtype(code: Any) -> str:
    return SCALAR_TYPES.get(code, f"unknown({code})") if isinstance(code, int) else "unknown"


def _num(v: Any) -> int | None:
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        if v == INF or v >= 2 ** 62:
            return None
        return int(v)
    return None


def _range_table(model: dict[str, Any]) -> dict[str, tuple[int, int | None]]:
    out: dict[str, tuple[int, int | None]] = {}
    for key, rng in (model.get("range_constraints") or {}).items():
        if not isinstance(rng, dict):
            raise GraphFormatError(f"range constraint {key!r} is not an object")
        lo = _num(rng.get("min_val"))
        out[str(key)] = (lo if lo is not None else 0, _num(rng.get("max_val")))
    return out


class _Shapes:
    """Turns serialized sizes into manifest dims, using range constraints and Dim names."""

    def __init__(self, ranges: dict[str, tuple[int, int | None]], dim_names: dict[str, str]):
        self.ranges = ranges
        self.dim_names = dim_names
        self.sym_bounds = {k: (lo, INF if hi is None else hi) for k, (lo, hi) in ranges.items()}
        self.named: dict[str, str] = {}  # printed expr -> expression over Dim names

    def dim(self, size: Any) -> int | dict[str, Any]:
        if not isinstance(size, dict):
            raise GraphFormatError("size entry is not an object")
        if "as_int" in size:
            return int(size["as_int"])
        expr_str = (size.get("as_expr") or {}).get("expr_str")
        try:
            expr = parse_srepr(expr_str)
        except ExprError as exc:
            raise GraphFormatError(f"unreadable symbolic size {expr_str!r}: {exc}") from exc
        printed = expr.render()
        if printed in self.ranges:
            lo, hi = self.ranges[printed]
        else:
            blo, bhi = expr.bounds(self.sym_bounds)
            lo, hi = int(blo) if blo != -INF else 0, (None if bhi == INF else int(bhi))
        out: dict[str, Any] = {"min": lo, "max": hi, "expr": printed}
        syms = expr.symbols()
        if syms and all(s in self.dim_names for s in syms):
            out["dim"] = self.named[printed] = expr.render(self.dim_names)
        return out

    def tensor(self, meta: dict[str, Any]) -> dict[str, Any]:
        dev = meta.get("device") or {}
        return {
            "dtype": _dtype(meta.get("dtype")),
            "shape": [self.dim(s) for s in meta.get("sizes") or []],
            "device": _device_str(dev) if dev else None,
        }


def _constant_value(value: Any) -> Any:
    """The plain value of a constant input (export bakes a bool/int/float/str/None argument in)."""
    if not isinstance(value, dict) or not value:
        return None
    key, val = next(iter(value.items()))
    if key in ("as_bool", "as_int", "as_float", "as_string") and isinstance(val, (bool, int, float, str)):
        return val
    return None


def _device_str(dev: dict[str, Any]) -> str:
    typ = str(dev.get("type", "?"))
    idx = dev.get("index")
    return f"{typ}:{idx}" if idx is not None else typ


def _arg_value(arg: dict[str, Any], shapes: _Shapes, tensors: dict[str, Any]) -> dict[str, Any]:
    """Describe one user input/output argument of the graph signature."""
    if "as_tensor" in arg:
        name = arg["as_tensor"]["name"]
        meta = tensors.get(name)
        if not isinstance(meta, dict):
            raise GraphFormatError(f"tensor {name!r} has no metadata")
        return {"name": name, **shapes.tensor(meta)}
    for key, typ in (("as_int", "int"), ("as_float", "float"), ("as_bool", "bool"),
                     ("as_string", "str"), ("as_sym_int", "symint"), ("as_sym_float", "symfloat"),
                     ("as_sym_bool", "symbool")):
        if key in arg:
            val = arg[key]
            name = val.get("as_name") if isinstance(val, dict) else None
            out: dict[str, Any] = {"name": name or typ, "dtype": typ, "shape": None}
            if not isinstance(val, dict):
                out["value"] = val
            return out
    if "as_none" in arg:
        return {"name": "none", "dtype": "none", "shape": None}
    if "as_custom_obj" in arg:
        obj = arg["as_custom_obj"]
        return {"name": obj.get("name", "obj"), "dtype": "torchbind", "shape": None,
                "class_fqn": obj.get("class_fqn")}
    return {"name": "unknown", "dtype": "unknown", "shape": None}


def _walk_nodes(graph: dict[str, Any], depth: int = 0) -> Iterator[dict[str, Any]]:
    """Every node of a graph and of the subgraphs its higher-order ops carry."""
    if depth > _MAX_DEPTH:
        raise GraphFormatError("graph nesting is too deep")
    nodes = graph.get("nodes") or []
    if not isinstance(nodes, list) or len(nodes) > _MAX_NODES:
        raise GraphFormatError("graph nodes are malformed or too many")
    for node in nodes:
        if not isinstance(node, dict):
            raise GraphFormatError("graph node is not an object")
        yield node
        for sub in _subgraphs(node.get("inputs") or [], 0):
            yield from _walk_nodes(sub, depth + 1)


def _subgraphs(value: Any, depth: int) -> Iterator[dict[str, Any]]:
    if depth > _MAX_DEPTH:
        return
    if isinstance(value, dict):
        if "as_graph" in value and isinstance(value["as_graph"], dict):
            g = value["as_graph"].get("graph")
            if isinstance(g, dict):
                yield g
            return
        for v in value.values():
            yield from _subgraphs(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _subgraphs(v, depth + 1)


def _find_key(value: Any, key: str, depth: int = 0) -> Iterator[Any]:
    if depth > _MAX_DEPTH:
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if k == key:
                yield v
            else:
                yield from _find_key(v, key, depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _find_key(v, key, depth + 1)


def _source(meta: dict[str, Any]) -> tuple[str | None, str | None]:
    trace = meta.get("stack_trace") if isinstance(meta, dict) else None
    if not isinstance(trace, str):
        return None, None
    frames = list(_FRAME.finditer(trace))
    if not frames:
        return None, None
    last = frames[-1]
    return f"{last.group('file')}:{last.group('line')}", (last.group("code") or "").strip() or None


def _ops_devices_classes(graph: dict[str, Any]) -> tuple[list, list, list, list]:
    """(custom ops, baked devices, TorchBind classes, torch's own ops) the graph uses."""
    ops: dict[str, dict[str, Any]] = {}
    builtin: dict[str, dict[str, Any]] = {}
    baked: list[dict[str, Any]] = []
    classes: set[str] = set()
    for node in _walk_nodes(graph):
        target = str(node.get("target", ""))
        parsed = parse_op_target(target)
        if parsed:
            ns, op, overload = parsed
            into = ops if ns not in BUILTIN_OP_NAMESPACES else builtin
            into.setdefault(target, {"name": f"{ns}::{op}", "overload": overload, "target": target,
                                     "schema": None})
        inputs = node.get("inputs") or []
        for inp in inputs if isinstance(inputs, list) else []:
            arg = inp.get("arg") if isinstance(inp, dict) else None
            if isinstance(arg, dict) and isinstance(arg.get("as_device"), dict):
                src, code = _source(node.get("metadata") or {})
                baked.append({"op": target, "arg": inp.get("name"),
                              "device": _device_str(arg["as_device"]), "source": src, "code": code})
        for fqn in _find_key(node, "class_fqn"):
            if isinstance(fqn, str):
                classes.add(fqn)
    return (sorted(ops.values(), key=lambda o: o["target"]), baked, sorted(classes),
            sorted(builtin.values(), key=lambda o: o["target"]))


def _signature_args(sig: dict[str, Any], spec_key: str, kind: str) -> list[dict[str, Any]]:
    out = []
    for spec in sig.get(spec_key) or []:
        if isinstance(spec, dict) and kind in spec:
            out.append(spec[kind].get("arg") or {})
    return out


_LAST_KEY = re.compile(r"\['([A-Za-z_][A-Za-z0-9_]*)'\]$")


def _last_key(path: str) -> str | None:
    """``out['logits']`` -> ``logits``; ``out[0]`` or ``out['a'][1]`` -> None."""
    m = _LAST_KEY.search(path)
    return m.group(1) if m else None


def describe_program(model: dict[str, Any], *, weights_config: dict[str, Any] | None = None,
                     constants_config: dict[str, Any] | None = None,
                     dim_names: dict[str, str] | None = None) -> dict[str, Any]:
    """The manifest description of one serialized program (``models/<name>.json`` parsed).

    ``dim_names`` maps graph symbols (``s27``) to the user's ``Dim`` names when known.
    Raises GraphFormatError when the JSON is not an exported-program graph.
    """
    if not isinstance(model, dict) or not isinstance(model.get("graph_module"), dict):
        raise GraphFormatError("not an exported-program graph (no graph_module)")
    gm = model["graph_module"]
    graph = gm.get("graph")
    sig = gm.get("signature")
    if not isinstance(graph, dict) or not isinstance(sig, dict):
        raise GraphFormatError("graph_module lacks graph or signature")
    ranges = _range_table(model)
    shapes = _Shapes(ranges, dict(dim_names or {}))
    tensors = graph.get("tensor_values") or {}

    calls = gm.get("module_call_graph") or []
    root_sig = (calls[0].get("signature") or {}) if calls and isinstance(calls[0], dict) else {}
    try:
        in_paths = leaf_paths(root_sig.get("in_spec"))
        out_paths = leaf_paths(root_sig.get("out_spec"))
    except TreeSpecError as exc:
        raise GraphFormatError(str(exc)) from exc

    inputs, constant_inputs = [], []
    leaf = 0  # user and constant inputs both take a leaf of the input treespec, in order
    for spec in sig.get("input_specs") or []:
        if not isinstance(spec, dict) or not ({"user_input", "constant_input"} & set(spec)):
            continue
        kind, path = input_label(in_paths[leaf]) if leaf < len(in_paths) else ("positional", f"args[{leaf}]")
        if "user_input" in spec:
            entry = _arg_value(spec["user_input"].get("arg") or {}, shapes, tensors)
            entry.update({"kind": kind, "path": path})
            inputs.append(entry)
        else:
            const = spec["constant_input"] or {}
            constant_inputs.append({"name": str(const.get("name")), "value": _constant_value(const.get("value")),
                                    "leaf": leaf, "kind": kind, "path": path})
        leaf += 1
    outputs = []
    for i, arg in enumerate(_signature_args(sig, "output_specs", "user_output")):
        entry = _arg_value(arg, shapes, tensors)
        entry["path"] = ("out" + out_paths[i]) if i < len(out_paths) else f"out[{i}]"
        key = _last_key(entry["path"])
        if key:  # out['logits'] is named "logits", not after the graph node that computed it
            entry["name"] = key
        outputs.append(entry)
    try:
        py_classes = list({c["type"]: {"type": c["type"], "fields": c["fields"]} for spec in ("in_spec", "out_spec")
                        for c in pytree_classes(root_sig.get(spec))}.values())
    except TreeSpecError as exc:
        raise GraphFormatError(str(exc)) from exc

    constraints = []
    for expr_text, (lo, hi) in ranges.items():
        item: dict[str, Any] = {"expr": expr_text, "min": lo, "max": hi}
        named = shapes.named.get(expr_text) or shapes.dim_names.get(expr_text)
        if named:
            item["dim"] = named
        constraints.append(item)

    ops, baked, classes, operators = _ops_devices_classes(graph)
    dtypes = {_dtype(m.get("dtype")) for m in tensors.values() if isinstance(m, dict)}
    for entry in ((weights_config or {}).get("config") or {}).values():
        meta = entry.get("tensor_meta") if isinstance(entry, dict) else None
        if isinstance(meta, dict):
            dtypes.add(_dtype(meta.get("dtype")))
            dev = meta.get("device") or {}
            if dev and dev.get("type") not in (None, "cpu", "meta"):
                baked.append({"op": "weight", "arg": entry.get("path_name"), "device": _device_str(dev),
                              "source": None, "code": None})
    dtypes.discard("unknown")
    schema = model.get("schema_version") or {}
    described: dict[str, Any] = {
        "inputs": inputs,
        "outputs": outputs,
        "in_spec": root_sig.get("in_spec"),
        "out_spec": root_sig.get("out_spec"),
        "forward_arg_names": list(root_sig.get("forward_arg_names") or []),
        "range_constraints": constraints,
        "required_ops": ops,
        "torchbind_classes": classes,
        "baked_devices": baked,
        "dtypes": sorted(dtypes),
        "serialization": {
            "torch_version": str(model.get("torch_version") or "unknown"),
            "schema_version": [int(schema.get("major", 0)), int(schema.get("minor", 0))],
            "opset_version": {str(k): int(v) for k, v in (model.get("opset_version") or {}).items()},
            # the oldest torch that reads it: from what it uses, not from who wrote it
            "window": program_window(model, weights_config=weights_config,
                                     constants_config=constants_config).to_json(),
        },
        "operators": operators,
    }
    if constant_inputs:  # only when present: other programs describe (and hash) as before
        described["constant_inputs"] = constant_inputs
    if py_classes:  # only when present: library output classes (ModelOutput, dataclasses)
        described["pytree_classes"] = py_classes
    return described
