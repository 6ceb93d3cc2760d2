"""Path-free stack traces, grouped baked-device findings, program order, torch vs user op
namespaces, user-file modes (issue 15, items 3-5). Pure and fast: no export, no torch."""
from __future__ import annotations

import json
import os
import stat

import pytest
from hypothesis import given
from hypothesis import strategies as st

from registry.atomic import USER_FILE, atomic_write, current_umask
from registry.errors import ManifestError
from registry.format.manifest import BakedDevice, Manifest, baked_device_groups
from registry.pt2.normalize import _scrub_paths, portable_source_path, portable_stack_trace
from registry.pt2.safety import _metadata_value
from registry.runtime.target import Target, is_torch_namespace
from tests.unit.test_manifest import minimal


@pytest.mark.parametrize("path, expected", [
    ("/home/alice/.venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", "torch/nn/modules/linear.py"),
    ("/usr/lib/python3/dist-packages/transformers/models/t5/modeling_t5.py",
     "transformers/models/t5/modeling_t5.py"),
    ("C:\\Users\\bob\\venv\\Lib\\site-packages\\torch\\functional.py", "torch/functional.py"),
    ("/home/alice/src/project/model.py", "model.py"),
    ("C:\\work\\model.py", "model.py"),
    ("~/model.py", "model.py"),
    ("../other/model.py", "model.py"),
    ("./model.py", "model.py"),
    ("pkg/model.py", "pkg/model.py"),
    ("torch/nn/modules/linear.py", "torch/nn/modules/linear.py"),
    ("<eval_with_key>.3", "<eval_with_key>.3"),
    ("model.py", "model.py"),
])
def test_portable_source_path(path, expected):
    assert portable_source_path(path) == expected
    assert portable_source_path(expected) == expected  # idempotent


@given(st.one_of(st.text(alphabet="/\\.~:_-abcAZ09 <>", max_size=40),
                 st.builds("".join, st.lists(st.sampled_from(["/", "\\", "site-packages", "dist-packages", "..", ".",
                                                              "~", "C:", "a", "b.py", "<x>"]), max_size=10))))
def test_portable_source_path_is_idempotent_and_never_absolute(path):
    once = portable_source_path(path)
    assert portable_source_path(once) == once
    if path.startswith(("/", "\\", "~")) and "site-packages" not in path and "dist-packages" not in path:
        assert "/" not in once and "\\" not in once  # an absolute path keeps its file name only
    assert not once.startswith(("/", "\\"))


TRACE = ('File "/home/alice/proj/model.py", line 33, in forward\n'
         '    pos = torch.arange(x.shape[1],\n'
         '  File "/home/alice/.venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", line 134, '
         'in forward\n    return F.linear(input, self.weight, self.bias)')


def test_stack_trace_keeps_lines_and_code_and_stays_valid():
    out = portable_stack_trace(TRACE)
    assert out == TRACE.replace("/home/alice/proj/", "").replace(
        "/home/alice/.venv/lib/python3.11/site-packages/", "")
    assert "/home" not in out and _metadata_value("stack_trace", out) is None
    graph = {"graph_module": {"graph": {"nodes": [{"metadata": {"stack_trace": TRACE, "custom": "{}"}},
                                                  {"inputs": [{"arg": {"as_graph": {"graph": {"nodes": [
                                                      {"metadata": {"stack_trace": TRACE}}]}}}}]}]}}}
    scrubbed = str(_scrub_paths(graph))
    assert "/home" not in scrubbed and scrubbed.count("model.py") == 2


def test_from_node_graph_ids_are_numbered_in_order_of_appearance():
    def node(gid, inner):
        return json.dumps([{"name": "a", "target": "aten.add.Tensor", "graph_id": gid, "pass_name": "p",
                            "action": "create", "from_node": [{"name": "a", "graph_id": inner, "from_node": []}]}])
    graph = {"nodes": [{"metadata": {"from_node": node(140398986896464, 140398990915088)}},
                       {"metadata": {"from_node": node(140398986896464, 77)}}]}
    once = _scrub_paths(graph)
    ids = [json.loads(n["metadata"]["from_node"]) for n in once["nodes"]]
    assert [(x[0]["graph_id"], x[0]["from_node"][0]["graph_id"]) for x in ids] == [(0, 1), (0, 2)]
    assert _scrub_paths(once) == once
    assert _metadata_value("from_node", once["nodes"][0]["metadata"]["from_node"]) is None
    assert _scrub_paths({"from_node": "not json"}) == {"from_node": "not json"}


def _baked(op, source, code="x = f(", device="cpu"):
    return BakedDevice.from_json({"op": f"torch.ops.aten.{op}.default", "arg": "device", "device": device,
                                  "source": source, "code": code})


def test_baked_devices_group_per_device_and_line():
    baked = [_baked("arange", "model.py:33"), _baked("ones", "model.py:33"), _baked("arange", "model.py:33"),
             _baked("zeros", "model.py:40", code="y = torch.zeros(3, device='cpu')"),
             _baked("zeros", "model.py:40", code="y = torch.zeros(3, device='cpu')", device="cuda:0"),
             BakedDevice("weight", "cuda:0", "lin.weight")]
    groups = baked_device_groups(baked)
    assert [g.text for g in groups] == [
        "device 'cpu' baked into 3 ops at model.py:33 (arange, ones): x = f( ...",
        "device 'cpu' baked into 1 op at model.py:40 (zeros): y = torch.zeros(3, device='cpu')",
        "device 'cuda:0' baked into 1 op at model.py:40 (zeros): y = torch.zeros(3, device='cpu')",
        "device 'cuda:0' baked into 1 weight (lin.weight)",
    ]
    assert groups[0].ops == ("arange", "ones") and groups[0].count == 3
    assert groups[3].to_json()["text"] == "device 'cuda:0' baked into 1 weight (lin.weight)"
    many = baked_device_groups([_baked(f"op{i}", "m.py:1") for i in range(9)])
    assert many[0].head.endswith("(op0, op1, op2, op3, op4, op5, ...)")


def test_program_order_is_optional_and_checked():
    raw = minimal()
    raw["programs"]["a_first"] = raw["programs"]["model"]
    assert list(Manifest.from_raw(raw).programs) == ["a_first", "model"]  # old bundles: by name
    raw["program_order"] = ["model", "a_first"]
    m = Manifest.from_raw(raw)
    assert list(m.programs) == ["model", "a_first"] and list(m.to_json()["programs"]) == ["model", "a_first"]
    for bad in (["model"], ["model", "a_first", "model"], ["model", "zzz"], []):
        raw["program_order"] = bad
        with pytest.raises(ManifestError):
            Manifest.from_raw(raw)


def test_target_separates_torch_namespaces_from_user_ops():
    ops = {f"{ns}::op{i}": {"schema": None, "dispatch_keys": []}
           for ns, n in (("quantized", 3), ("_c10d_functional", 2), ("mylib", 2), ("team_ops", 1)) for i in range(n)}
    t = Target.from_json({"torch_version": "2.13.0", "serde_schema": [8, 20], "device_type": "cpu",
                          "custom_ops": ops})
    assert t.op_namespaces() == {"torch": {"quantized": 3, "_c10d_functional": 2},
                                 "user": {"mylib": 2, "team_ops": 1}}
    s = t.summary()
    assert (s["custom_ops"], s["torch_ops"], s["user_ops"], s["user_op_namespaces"]) == (8, 5, 3, ["mylib", "team_ops"])
    assert is_torch_namespace("aten") and is_torch_namespace("symm_mem") and not is_torch_namespace("pt2reg_mylib")


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_user_file_mode_follows_umask_and_private_stays_private(tmp_path, umask):
    old = os.umask(umask)
    try:
        assert current_umask() == umask
        with atomic_write(tmp_path / "user.bin", mode=USER_FILE) as f:
            f.write(b"x")
        with atomic_write(tmp_path / "cache.bin") as f:
            f.write(b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "user.bin").stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE((tmp_path / "cache.bin").stat().st_mode) == 0o600
