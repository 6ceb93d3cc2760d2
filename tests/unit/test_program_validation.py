"""Issue 14, classes 1, 5 and 7(b): the whole serialized program is validated before torch reads it.

Each hostile variant below is a real exported graph (``models/model.json`` of the test models)
with one field rewritten; ``unsafe_in_graph`` (what the reader runs at bundle, push, verify, run
and load) must name the offending field. Pure: no torch import except in the regeneration tests.
"""
from __future__ import annotations

import copy
import json
import time

import pytest

from registry.pt2.guards import GuardError, GuardFailure, check_guards, compile_guards, parse_guard
from registry.pt2.safety import unsafe_in_graph
from tests.hostile import graph_of as _g
from tests.hostile import node_of as _node
from tests.hostile import read_json_member, set_kwargs_key
from tests.hostile import sym_srepr as _sym

PAYLOAD = "__import__('os').system('touch /tmp/PWNED')"


@pytest.fixture(scope="module")
def models(pt2_dir):
    return {name: read_json_member(pt2_dir / f"{name}.pt2", "models/model.json")
            for name in ("decoder", "encoder", "guarded", "halves", "flat", "masked", "custom_op", "flagged")}


def test_every_test_model_is_accepted(models):
    for name, model in models.items():
        assert unsafe_in_graph(model) is None, name


def _mutated(model, fn):
    m = copy.deepcopy(model)
    fn(m)
    return unsafe_in_graph(m)


def _first_tensor_arg(m):
    return next(a for a in _g(m)["inputs"] if "as_tensor" in a)["as_tensor"]


def _rename_input(new):
    def fn(m):
        _first_tensor_arg(m)["name"] = new
    return fn


# ------------------------------------------------------------------- torch's serde schema (item 2)
SCHEMA_ATTACKS = {
    "unknown_top_level": (lambda m: m.update(evil=PAYLOAD), "evil: unknown field"),
    "unknown_node_field": (lambda m: _node(m).update(code=PAYLOAD), "graph_module.graph.nodes[0].code: unknown field"),
    "unknown_graph_field": (lambda m: _g(m).update(hooks=[]), "graph_module.graph.hooks: unknown field"),
    "union_two_keys": (lambda m: _g(m)["inputs"][0].update(as_int=1), "graph_module.graph.inputs[0]: a Argument"),
    "union_unknown_key": (lambda m: _g(m)["inputs"].append({"as_python": PAYLOAD}), "as_python: unknown field"),
    "enum_out_of_range": (lambda m: next(iter(_g(m)["tensor_values"].values())).update(dtype=999),
                          "is not a ScalarType value"),
    "bool_as_int": (lambda m: next(iter(_g(m)["tensor_values"].values())).update(requires_grad=1),
                    "expected a boolean"),
    "int_as_bool": (lambda m: m["opset_version"].update(aten=True), "opset_version.aten: expected a 64-bit integer"),
    "string_as_list": (lambda m: m.update(torch_version=["2.13"]), "torch_version: expected a string"),
    "missing_required": (lambda m: _node(m).pop("inputs"), "Node lacks required field 'inputs'"),
    "huge_int": (lambda m: m["opset_version"].update(aten=10 ** 30), "expected a 64-bit integer"),
    "not_an_object": (lambda m: m["graph_module"].update(signature=[]), "graph_module.signature: expected a GraphSignature"),
}


@pytest.mark.parametrize("attack", sorted(SCHEMA_ATTACKS))
def test_anything_outside_torchs_schema_is_refused(models, attack):
    fn, needle = SCHEMA_ATTACKS[attack]
    reason = _mutated(models["decoder"], fn)
    assert reason and needle in reason, reason


def test_schema_walk_of_a_real_graph_is_fast(models):
    big = copy.deepcopy(models["encoder"])
    nodes = _g(big)["nodes"]
    for _i in range(40):  # ~ a few thousand nodes' worth of JSON
        nodes.extend(copy.deepcopy(nodes[:50]))
    start = time.perf_counter()
    assert unsafe_in_graph(big) is None
    assert time.perf_counter() - start < 10.0   # a blow-up, not a slow machine (~0.2 s here)


# ---------------------------------------------------------------- names torch.fx pastes (class 1)
NAME_ATTACKS = {
    "input_injection": (_rename_input(f"x=({PAYLOAD})"), "graph_module.graph.inputs"),
    "input_newline": (_rename_input("x\nimport os"), "is not an identifier"),
    "input_keyword": (_rename_input("lambda"), "Python keyword"),
    "input_reserved": (_rename_input("torch"), "would shadow"),
    "input_unicode": (_rename_input("x\u00a0"), "is not an identifier"),
    "input_long": (_rename_input("x" * 300), "is not an identifier"),
    "node_name": (lambda m: _node(m).update(name="a; import os"), "nodes[0].name"),
    "tensor_values_key": (lambda m: _g(m)["tensor_values"].update({"a b": next(iter(_g(m)["tensor_values"].values()))}),
                          "tensor_values['a b']"),
    "kwarg_name": (lambda m: _node(m)["inputs"][0].update(name=f"x=({PAYLOAD}),y"), "inputs[0].name"),
    "parameter_fqn": (lambda m: next(s for s in m["graph_module"]["signature"]["input_specs"] if "parameter" in s)
                      ["parameter"].update(parameter_name='lin")+os.system("id'), "parameter_name"),
    "forward_arg_names": (lambda m: m["graph_module"]["module_call_graph"][0]["signature"].update(
        forward_arg_names=["x):\n    import os#"]), "forward_arg_names[0]"),
    "module_fqn": (lambda m: m["graph_module"]["module_call_graph"].append({"fqn": "a['b']", "signature": None}),
                   "].fqn: attribute path"),
    "kwargs_key_in_spec": (lambda m: set_kwargs_key(m, "k':__import__('os').system('id'),'"), "in_spec: keyword input"),
    "treespec_type": (lambda m: _set_spec_type(m, "os.system('id')"), "treespec type"),
    "verifier": (lambda m: m.update(verifiers=["ATEN; import os"]), "verifiers[0]"),
    "device_type": (lambda m: _device(m).update(type="cpu'); import os; ('"), "device type"),
    "class_fqn": (lambda m: _g(m)["inputs"].append({"as_custom_obj": {"name": "obj", "class_fqn": "a b"}}), "class_fqn"),
}


def _set_spec_type(m, typ):
    sig = m["graph_module"]["module_call_graph"][0]["signature"]
    spec = json.loads(sig["out_spec"])
    spec[1]["type"] = typ
    sig["out_spec"] = json.dumps(spec)


def _device(m):
    return next(iter(_g(m)["tensor_values"].values()))["device"]


@pytest.mark.parametrize("attack", sorted(NAME_ATTACKS))
def test_names_outside_the_identifier_grammar_are_refused(models, attack):
    fn, needle = NAME_ATTACKS[attack]
    reason = _mutated(models["decoder"], fn)
    assert reason and needle in reason, reason


# ------------------------------------------------------------------------- node metadata (class 1)
META_ATTACKS = {
    "unknown_key": ({"code": PAYLOAD}, "node metadata key"),
    "stack_trace_cr": ({"stack_trace": "File \"a.py\", line 1, in f\r    import os"}, "stack trace"),
    "stack_trace_huge": ({"stack_trace": "x" * (64 * 1024 + 1)}, "stack trace"),
    "nn_module_stack": ({"nn_module_stack": "L__self__,,x.Y;a,b"}, "module stack entry"),
    "nn_module_stack_code": ({"nn_module_stack": "k,path,os.system('id')"}, "module stack entry"),
    "source_fn_dunder": ({"source_fn_stack": "f,torch.__builtins__.eval"}, "dunder"),
    "source_fn_code": ({"source_fn_stack": "f,torch.os.system('id')"}, "source function entry"),
    "torch_fn": ({"torch_fn": "a;b;c"}, "torch_fn"),
    "custom_not_json": ({"custom": "{not json"}, "not JSON"),
    "custom_deep": ({"custom": "[" * 70 + "]" * 70}, "nested too deeply"),
    "from_node_keys": ({"from_node": json.dumps([{"name": "a", "__reduce__": "x"}])}, "from_node entry"),
    "from_node_type": ({"from_node": json.dumps({"a": 1})}, "from_node is not a list"),
}


@pytest.mark.parametrize("attack", sorted(META_ATTACKS))
def test_node_metadata_outside_what_torch_writes_is_refused(models, attack):
    meta, needle = META_ATTACKS[attack]
    reason = _mutated(models["decoder"], lambda m: _node(m)["metadata"].update(meta))
    assert reason and needle in reason and "metadata" in reason, reason


def test_graph_module_metadata_is_allowlisted(models):
    reason = _mutated(models["decoder"], lambda m: m["graph_module"]["metadata"].update(evil="1"))
    assert reason and "graph module metadata key" in reason
    assert _mutated(models["decoder"], lambda m: m["graph_module"]["metadata"].update(custom='{"a": 1}')) is None


# -------------------------------------------------------------------------- guards_code (class 1)
GUARD_ATTACKS = [
    PAYLOAD, f"L['x'].size()[0] == 1 or {PAYLOAD}", "(lambda: 1)()", "L['x'].__class__",
    "open('/etc/passwd').read() == ''", f"L['x'].size()[0] if True else {PAYLOAD}",
    "L['x'].size()[0] == 1; import os", "L['x'].size()[0] == 1\nimport os", "[c for c in ()]",
    "L['x'].size()[0] == getattr(L['x'], 'data')", "math.__loader__", "torch.load('x') == 1",
    "L['x'].size().__class__", "L.__dict__", "f'{1}' == '1'", "L['x'].size()[0] == 1 " + "+ 1" * 600,
    "", "   ", 7, None,
]


@pytest.mark.parametrize("guard", GUARD_ATTACKS, ids=range(len(GUARD_ATTACKS)))
def test_guards_outside_the_grammar_are_refused(models, guard):
    with pytest.raises(GuardError):
        parse_guard(guard)
    reason = _mutated(models["guarded"], lambda m: m["guards_code"].append(guard))
    assert reason and "guards_code" in reason, reason


def test_real_guards_are_evaluated_by_the_registry(models):
    import torch

    guards = compile_guards(models["guarded"]["guards_code"])
    check_guards(guards, {"x": torch.zeros(9, 2)})
    with pytest.raises(GuardFailure, match=r"Guard failed: math.trunc\(0.5\*torch.sym_float\(x.size\(\)\[0\]\)\) == 4"):
        check_guards(guards, {"x": torch.zeros(7, 2)})
    halves = compile_guards(models["halves"]["guards_code"])
    check_guards(halves, {"y": torch.zeros(8)})
    with pytest.raises(GuardFailure):
        check_guards(halves, {"y": torch.zeros(13)})
    enc = compile_guards(models["encoder"]["guards_code"])
    check_guards(enc, {"tokens": torch.zeros(2, 4, dtype=torch.long), "mask": torch.zeros(2, 5)})
    with pytest.raises(GuardFailure):
        check_guards(enc, {"tokens": torch.zeros(2, 4, dtype=torch.long), "mask": torch.zeros(3, 5)})
    with pytest.raises(GuardFailure, match="does not have"):  # an input the call lacks
        check_guards(guards, {"y": torch.zeros(9, 2)})
    with pytest.raises(GuardFailure, match="too large"):  # no exponent bomb in our evaluator
        check_guards(compile_guards(["L['x'].size()[0] ** 2 ** 2 ** 2 ** 2 ** 2 == 1"]), {"x": torch.zeros(3)})


def test_too_many_guards_are_refused(models):
    reason = _mutated(models["guarded"], lambda m: m.update(guards_code=["L['x'].size()[0] >= 4"] * 5000))
    assert reason and "guards_code entries" in reason


# ------------------------------------------------------------- operators with side effects (class 5)
OP_ATTACKS = {
    "from_file": "torch.ops.aten.from_file.default",
    "save": "torch.ops.aten.save.default",
    "print": "torch.ops.aten._print.default",
    "manual_seed": "torch.ops.aten.manual_seed.default",
    "c10d": "torch.ops.c10d.broadcast_.default",
    "functional_collective": "torch.ops._c10d_functional.all_reduce.default",
    "profiler": "torch.ops.profiler._record_function_enter_new.default",
    "torchscript_prim": "torch.ops.prim.Print.default",
    "symm_mem": "torch.ops.symm_mem._rendezvous.default",
    "debugprims": "torch.ops.debugprims.load_tensor.default",
}


@pytest.mark.parametrize("attack", sorted(OP_ATTACKS))
def test_operators_acting_outside_tensor_memory_are_refused(models, attack):
    target = OP_ATTACKS[attack]
    reason = _mutated(models["decoder"], lambda m: _node(m).update(target=target))
    assert reason and "outside tensor memory" in reason and target in reason, reason


@pytest.mark.parametrize("operator", ["torch.os.system", "torch.ops.load_library", "torch.ops.aten.from_file.default",
                                      "builtins.eval", "torch.ops.c10d.broadcast_.default"])
def test_operator_arguments_are_vetted_like_targets(models, operator):
    """``as_operator`` arguments (auto_functionalized, with_effects ...) are resolved by the same
    getattr chains as node targets."""
    def fn(m):
        _node(m)["inputs"].append({"name": "op", "arg": {"as_operator": operator}, "kind": 1})
    reason = _mutated(models["decoder"], fn)
    assert reason and operator in reason, reason


def test_custom_op_namespaces_stay_allowed(models):
    assert unsafe_in_graph(models["custom_op"]) is None
    assert _mutated(models["decoder"], lambda m: _node(m).update(target="torch.ops.mylib.fancy.default")) is None


# ------------------------------------------------------------------- size-expression bombs (7b)
def _with_exprs(exprs):
    def fn(m):
        tv = _g(m)["tensor_values"]
        first = next(iter(tv.values()))
        first["strides"] = [{"as_expr": {"expr_str": e, "hint": None}} for e in exprs]
    return fn


EXPR_ATTACKS = {
    "max_16_symbols": ([f"Max({', '.join(_sym(i) for i in range(16))})"], "Max() with 16 arguments"),
    "mul_7_symbols": ([f"Mul({', '.join(_sym(i) for i in range(7))})"], "Mul() with 7 arguments"),
    "nested_symbols": (["Add(" + ", ".join(f"Mul({_sym(2 * i)}, {_sym(2 * i + 1)})" for i in range(4)) + ")"],
                       "over 8 symbols"),
    "too_many_terms": (["Add(" + ", ".join("Add(" + ", ".join(f"Add(Integer({j}), Mul(Integer(2), {_sym(0)}))"
                                                              for j in range(6)) + ")" for _ in range(6)) + ")"],
                       "terms"),
    "many_distinct": ([f"FloorDiv(Add({', '.join(f'Mul(Integer({k + 2}), {_sym(6 * k + j)})' for j in range(6))}), "
                       f"Integer({k + 2}))" for k in range(40)], "too costly"),
    "max_repeats": ([f"Max(Add({_sym(0)}, Integer(1)), Add({_sym(1)}, Integer(2)), {_sym(2)}, {_sym(3)})"] * 200,
                    "Max/Min size expressions"),
    "many_symbols": ([_sym(i) for i in range(1100)], "too costly"),
    "occurrences": ([f"Mul({_sym(0)}, {_sym(1)})"] * 40_000, "symbol uses"),
}


@pytest.mark.parametrize("attack", sorted(EXPR_ATTACKS))
def test_size_expression_bombs_are_refused_before_sympy(models, attack):
    exprs, needle = EXPR_ATTACKS[attack]
    start = time.perf_counter()
    reason = _mutated(models["decoder"], _with_exprs(exprs))
    assert reason and needle in reason, reason
    assert time.perf_counter() - start < 10.0   # a blow-up, not a slow machine


# ---------------------------------------------------------------- regenerated from installed torch
def test_checked_in_serde_schema_matches_installed_torch():
    """The running torch's serde schema is the checked-in one: the same types and versions (which
    torch generated the file is a label, not content: 2.13.0 and 2.14.1 share schema 8.20 byte for
    byte, and every torch of the matrix runs this test); an older minor (the floor's) is contained
    in it. Fails after a torch upgrade that changes the schema until ``python -m
    registry.pt2.serde_schema`` is re-run."""
    import torch._export.serde.schema as torch_schema

    from registry.pt2.serde_schema import generate_installed, load_schema

    def content(doc):
        return {k: v for k, v in doc.items() if k not in ("generated_by", "torch_version")}

    fresh, frozen = content(generate_installed()), content(load_schema())
    assert fresh["schema_version"] == [torch_schema.SCHEMA_VERSION[0], torch_schema.SCHEMA_VERSION[1]]
    if fresh["schema_version"][0] == frozen["schema_version"][0] and \
            fresh["schema_version"][1] < frozen["schema_version"][1]:
        # an older torch of the matrix (the floor, 2.10: schema 8.15): everything it writes must
        # be what the checked-in (newer) schema accepts, each field with the same type
        lost = _not_contained(fresh["types"], frozen["types"])
        assert not lost, f"torch {torch_schema.SCHEMA_VERSION} writes what the checked-in schema refuses: {lost}"
        return
    changed = sorted(n for n in fresh["types"].keys() | frozen["types"].keys()
                     if fresh["types"].get(n) != frozen["types"].get(n))
    assert fresh == frozen, f"torch's serde schema changed (types {changed}; schema_version " \
        f"{fresh['schema_version']} here, {frozen['schema_version']} checked in): run python -m registry.pt2.serde_schema"


def _not_contained(older: dict, newer: dict) -> list[str]:
    """What of an older schema's types the newer lacks or changed: a type, its kind, a struct
    field or union tag (with its type; optional then required counts), an enum value."""
    lost = []
    for name, t in older.items():
        n = newer.get(name)
        if n is None or n["kind"] != t["kind"]:
            lost.append(f"{name} ({t['kind']})")
            continue
        for key in ("fields", "values"):
            for item, spec in (t.get(key) or {}).items():
                now = (n.get(key) or {}).get(item)
                if now is None or (key == "values" and now != spec) or (key == "fields" and (
                        now["type"] != spec["type"] or (now.get("required") and not spec.get("required")))):
                    lost.append(f"{name}.{item}")
    return lost


def test_no_registered_operator_with_effects_is_missing_from_the_frozen_list():
    """Recomputes the rule over every operator the running torch registers (every torch of the
    matrix runs this test: the frozen list is their union, CPU and CUDA builds); a new
    file/process/network op in a torch upgrade fails here until ``python
    scripts/update_op_effects.py`` is re-run over the matrix's venvs."""
    import subprocess
    import sys
    from pathlib import Path

    import torch

    from registry.pt2.op_effects import load_frozen

    # a fresh process: ops other tests register (custom namespaces) must not count
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", "import json; from registry.pt2.op_effects import compute; "
                          "from registry.runtime import torchrt; "
                          "print(json.dumps(compute(torchrt.all_op_schemas(), '')))"], capture_output=True, text=True, cwd=root,
                         check=True, timeout=300)
    fresh, frozen = json.loads(out.stdout), load_frozen()
    missing = sorted(set(fresh["ops"]) - set(frozen["ops"]))
    assert not missing, f"operators with effects outside tensor memory in torch {torch.__version__} not in " \
        f"side_effect_ops.json (made from torch {', '.join(frozen['torch_versions'])}): {missing}"
    assert set(fresh["namespaces"]) <= set(frozen["namespaces"])
    assert "aten::from_file.default" in frozen["ops"] and "aten::save.default" in frozen["ops"]
    assert "aten::copy_.default" not in frozen["ops"] and "aten::_assert_scalar.default" not in frozen["ops"]
    # made with a CUDA build too, whatever this torch is: a CPU build lacks these operators
    assert {"cuda::synchronize.default", "mempool::begin.default"} <= set(frozen["ops"]), frozen["torch_versions"]


def test_random_type_swaps_are_refused_not_crashed(models):
    """Every value of a real graph swapped for another JSON type: always a reason, never an
    exception (an exception would surface as exit 1 instead of a one-line exit 5)."""
    import random

    rnd = random.Random(14)
    base = models["encoder"]
    paths = []

    def collect(v, path):
        paths.append(path)
        if isinstance(v, dict):
            for k, x in v.items():
                collect(x, path + (k,))
        elif isinstance(v, list):
            for i, x in enumerate(v):
                collect(x, path + (i,))

    collect(base, ())
    replacements = [None, 1, -1, 1.5, True, "", "x y", [], {}, [1], {"a": 1}, 2 ** 70]
    for path in rnd.sample(paths[1:], 400):
        m = copy.deepcopy(base)
        parent = m
        for k in path[:-1]:
            parent = parent[k]
        new = rnd.choice(replacements)
        if type(new) is type(parent[path[-1]]) and new == parent[path[-1]]:
            continue
        parent[path[-1]] = new
        reason = unsafe_in_graph(m)  # must not raise
        assert reason is None or isinstance(reason, str)
