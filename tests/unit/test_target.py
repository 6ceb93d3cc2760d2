"""Target: the JSON form round-trips and malformed files fail with one clear line."""
from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from registry.errors import UsageError
from registry.runtime.target import TARGET_FORMAT, OpInfo, Target

CUDA_BOX = {
    "torch_version": "2.13.0", "serde_schema": [8, 20], "device_type": "cuda", "compute_capability": [9, 0],
    "custom_ops": {"mylib::myop": {"schema": "mylib::myop(Tensor x) -> Tensor", "dispatch_keys": ["CPU"]}},
}


def test_minimal_hand_written_target():
    t = Target.from_json(CUDA_BOX)
    assert t.device_type == "cuda" and t.compute_capability == (9, 0)
    assert t.compute_capability_str == "90"
    assert t.custom_ops["mylib::myop"] == OpInfo("mylib::myop(Tensor x) -> Tensor", ("CPU",))
    assert t.platform is None and t.cpu_isa is None and t.torchbind_classes == ()


def test_round_trip_and_format_markers():
    t = Target.from_json(CUDA_BOX)
    doc = t.to_json()
    assert doc["format"] == TARGET_FORMAT and doc["kind"] == "pt2-target"
    assert Target.from_json(json.loads(json.dumps(doc))) == t
    assert t.summary()["custom_ops"] == 1


def test_target_is_immutable_and_hashable():
    ops = {"a::b": OpInfo(None, ("CPU",))}
    t = Target("2.13.0", (8, 20), "cpu", custom_ops=ops)
    ops["c::d"] = OpInfo(None)
    assert "c::d" not in t.custom_ops
    with pytest.raises(TypeError):
        t.custom_ops["x::y"] = OpInfo(None)  # type: ignore[index]
    assert hash(t) == hash(Target("2.13.0", (8, 20), "cpu", custom_ops={"a::b": OpInfo(None, ("CPU",))}))


@pytest.mark.parametrize("change, words", [
    ({"serde_schema": [8]}, "serde_schema must be [major, minor]"),
    ({"device_type": "cuda:0"}, "device_type must be a device type"),
    ({"compute_capability": "9.0"}, "compute_capability must be [major, minor] or null"),
    ({"torch_version": 2}, "torch_version must be a non-empty string"),
    ({"custom_ops": {"not an op": {}}}, "custom_ops key 'not an op'"),
    ({"custom_ops": {"a::b": {"dispatch_keys": "CPU"}}}, "dispatch_keys must be a list"),
    ({"compute_capabilty": [9, 0]}, "unknown field 'compute_capabilty'"),
    ({"kind": "pt2-bundle"}, "kind must be 'pt2-target'"),
    ({"torchbind_classes": "x"}, "torchbind_classes must be a list"),
    ({"platform": 3}, "platform must be a string or null"),
])
def test_malformed_fields_fail_with_one_line(change, words):
    with pytest.raises(UsageError) as exc:
        Target.from_json({**CUDA_BOX, **change}, where="box.json")
    line = exc.value.one_line()
    assert words in line and line.startswith("box.json is invalid") and "\n" not in line


def test_every_problem_is_reported_at_once():
    with pytest.raises(UsageError) as exc:
        Target.from_json({"serde_schema": "8.20"})
    msg = exc.value.one_line()
    assert "torch_version" in msg and "serde_schema" in msg and "device_type" in msg


def test_future_format_is_named():
    with pytest.raises(UsageError, match="format 2, newer than this pt2-registry reads"):
        Target.from_json({**CUDA_BOX, "format": 2})


def test_not_an_object():
    with pytest.raises(UsageError, match="is not a JSON object"):
        Target.from_json([1, 2])


def test_load_reads_files_and_reports_problems(tmp_path):
    good = tmp_path / "box.json"
    good.write_text(json.dumps(CUDA_BOX))
    assert Target.load(good).device_type == "cuda"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="is not valid JSON"):
        Target.load(bad)
    with pytest.raises(UsageError, match="not found"):
        Target.load(tmp_path / "missing.json")
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({**CUDA_BOX, "device_type": ""}))
    with pytest.raises(UsageError, match=f"target file {wrong} is invalid: device_type"):
        Target.load(wrong)


_names = st.from_regex(r"[a-z_][a-z0-9_]{0,8}::[a-z_][a-z0-9_]{0,8}(\.[a-z_]{1,5})?", fullmatch=True)
_opt = st.none() | st.text(min_size=1, max_size=12)


@given(torch_version=st.text(min_size=1, max_size=20),
       serde=st.tuples(st.integers(0, 99), st.integers(0, 99)),
       device=st.sampled_from(["cpu", "cuda", "mps", "xpu"]),
       cc=st.none() | st.tuples(st.integers(0, 12), st.integers(0, 9)),
       platform=_opt, machine=_opt, isa=_opt,
       ops=st.dictionaries(_names, st.tuples(st.none() | st.text(max_size=30),
                                             st.lists(st.sampled_from(["CPU", "CUDA", "Meta"]), unique=True)),
                           max_size=5),
       classes=st.lists(st.text(min_size=1, max_size=20), max_size=3, unique=True))
def test_round_trip_property(torch_version, serde, device, cc, platform, machine, isa, ops, classes):
    t = Target(torch_version, serde, device, cc, platform=platform, machine=machine, cpu_isa=isa,
               custom_ops={k: OpInfo(s, tuple(keys)) for k, (s, keys) in ops.items()},
               torchbind_classes=tuple(sorted(classes)))
    assert Target.from_json(json.loads(json.dumps(t.to_json()))) == t
