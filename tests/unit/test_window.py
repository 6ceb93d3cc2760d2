"""Issue 42: the torch window of a serialized program, computed from what it uses (pure)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

from registry.errors import IncompatibleError
from registry.pt2.window import FLOOR, RELEASES, program_window, release_for_schema, schema_of_release

ROOT = Path(__file__).resolve().parents[2]


def model(*nodes: dict, tensors: dict | None = None, **extra) -> dict:
    """A models/<name>.json as torch writes it, cut down to what the window reads."""
    return {"graph_module": {"graph": {"nodes": list(nodes), "tensor_values": tensors or {}},
                             "signature": {}, "module_call_graph": []},
            "schema_version": {"major": 8, "minor": 20}, "torch_version": "2.13.0+cpu", **extra}


def node(target: str, *args: dict) -> dict:
    return {"target": target, "inputs": [{"name": f"a{i}", "arg": a, "kind": 1} for i, a in enumerate(args)],
            "outputs": [], "metadata": {}, "name": "n"}


def tensor(dtype: int) -> dict:
    return {"dtype": dtype, "sizes": [{"as_int": 2}], "requires_grad": False, "device": {"type": "cpu"},
            "strides": [{"as_int": 1}], "storage_offset": {"as_int": 0}, "layout": 1}


def test_a_program_using_nothing_new_reads_on_the_floor():
    w = program_window(model(node("torch.ops.aten.add.Tensor", {"as_tensor": {"name": "x"}}),
                             tensors={"x": tensor(7)}))
    assert (w.torch, w.schema, w.features) == (FLOOR, RELEASES[FLOOR], ())


@pytest.mark.parametrize("build, release, feature", [
    (lambda: model(node("torch.ops.aten.cat.default", {"as_nested_tensors": [[]]})), "2.11",
     "Argument.as_nested_tensors"),
    (lambda: model(node("torch.ops.aten.x.default", {"as_float_lists": [[1.0]]})), "2.12", "Argument.as_float_lists"),
    (lambda: model(tensors={"x": tensor(34)}), "2.12", "ScalarType.UINT32"),
    (lambda: model(node("torch.ops.aten.empty.memory_format", {"as_scalar_type": 35})), "2.12", "ScalarType.UINT64"),
    (lambda: model(node("_operator.lshift", {"as_sym_int": {"as_name": "s0"}})), "2.11", "node target _operator.lshift"),
    (lambda: model(node("torch._C._set_grad_enabled", {"as_bool": False})), "2.13",
     "node target torch._C._set_grad_enabled"),
])
def test_each_newer_construct_raises_the_window_to_the_release_that_reads_it(build, release, feature):
    w = program_window(build())
    assert w.torch == release and w.schema == RELEASES[release]
    assert w.features == (f"{feature} (torch {release})",)


def test_the_newest_construct_sets_the_window_and_all_are_listed():
    m = model(node("torch.ops.aten.cat.default", {"as_nested_tensors": [[]]}), tensors={"x": tensor(33)})
    w = program_window(m)
    assert w.torch == "2.12"
    assert w.features == ("Argument.as_nested_tensors (torch 2.11)", "ScalarType.FLOAT8E8M0FNU (torch 2.12)")


def test_payload_configs_count_and_opaque_constants_need_2_13():
    weights = {"config": {"w": {"path_name": "weight_0", "tensor_meta": tensor(34)}}}
    assert program_window(model(), weights_config=weights).torch == "2.12"
    consts = {"config": {"opaque_obj_0": {"path_name": "opaque_obj_0"}}}
    assert program_window(model(), constants_config=consts).torch == "2.13"


def test_values_that_only_look_alike_do_not_raise_it():
    """An int 34 that is not a dtype, a tag-named key of a multi-key dict, unknown struct
    fields older readers drop (``Node.name``): none of them needs a newer torch."""
    m = model(node("torch.ops.aten.add.Scalar", {"as_int": 34}), tensors={"x": tensor(7)})
    m["graph_module"]["graph"]["nodes"][0]["inputs"].append({"name": "as_float_lists", "arg": {"as_int": 1},
                                                            "kind": 1})
    assert program_window(m).torch == FLOOR


def test_release_and_schema_lookups():
    assert schema_of_release("2.13.0+cpu") == (8, 20) and schema_of_release("2.11.0+cu130") == (8, 17)
    assert schema_of_release("2.9.1") is None
    assert release_for_schema((8, 16)) == "2.11" and release_for_schema((8, 20)) == "2.12"
    assert release_for_schema((8, 21)) is None and release_for_schema((9, 0)) is None


def test_this_torchs_release_is_in_the_table_with_the_schema_it_reads():
    """Fails on a torch whose release is missing from ``RELEASES`` or reads another schema:
    add it (from its schema.yaml) before supporting it."""
    from registry.runtime.torchrt import serde_schema_version, torch

    assert schema_of_release(str(torch().__version__)) == serde_schema_version()


def test_pyproject_declares_the_floor():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_dep = next(d for d in deps if re.match(r"^torch\b", d))
    assert torch_dep == f"torch>={FLOOR}"


@pytest.mark.parametrize("version", ["2.9.1", "2.6.0+cu124", "1.13.1"])
def test_a_torch_older_than_the_floor_is_refused_in_one_line(version):
    from registry.runtime.torchrt import check_torch_version

    with pytest.raises(IncompatibleError) as info:
        check_torch_version(version)
    assert f"torch {version} is older than pt2-registry supports (torch {FLOOR} to " in str(info.value)
    assert f"pip install 'torch>={FLOOR}'" in info.value.hint


@pytest.mark.parametrize("version", ["2.10.0", "2.11.0+cu130", "2.14.1", "2.16.0a0+git1234", "unknown"])
def test_supported_and_newer_torches_are_allowed(version):
    from registry.runtime.torchrt import check_torch_version

    check_torch_version(version)
