"""Issue 14, classes 1, 5 and 7(b), end to end: hostile graphs are refused at every door.

Each variant rewrites the decoder's ``models/model.json`` (one field) and is tried at
``pt2reg bundle`` (a .pt2 the user hands over), at ``push``, at ``verify``/``run`` of the bundle
file, at ``verify``/``run`` of a registry ref that a client skipping the checks published, and at
``registry.load`` of both. Every path ends with exit 5 (``UnsafeArchiveError``), one line naming
the program and the offending field, nothing loaded; the marker file a payload would create
never appears and the victim file a side-effecting operator would overwrite is unchanged.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from registry.errors import UnsafeArchiveError
from tests.cli_inprocess import push_unchecked, refused
from tests.hostile import bundle_with_raw_member, read_json_member, rewrite_pt2, set_kwargs_key
from tests.hostile import graph_of as _g
from tests.hostile import node_of as _node
from tests.hostile import sym_srepr as _sym

MEMBER = "programs/decoder.pt2"
VICTIM_BYTES = b"the user's precious data\n" * 4


def _touch(marker: Path) -> str:
    return f"__import__('os').system('touch {marker}')"


def _rename_user_input(m, new):
    """Rename the first user input everywhere torch reads its name (graph inputs, signature)."""
    sig = m["graph_module"]["signature"]["input_specs"]
    spec = next(s for s in sig if "user_input" in s)["user_input"]["arg"]["as_tensor"]
    old = spec["name"]
    spec["name"] = new
    for a in _g(m)["inputs"]:
        if a.get("as_tensor", {}).get("name") == old:
            a["as_tensor"]["name"] = new
    tv = _g(m)["tensor_values"]
    tv[new] = tv.pop(old)


def _from_file(m, victim):
    """``aten.from_file(victim, shared=True)`` then the graph writes into it (issue 14, class 5)."""
    node = _node(m)
    node["target"] = "torch.ops.aten.from_file.default"
    node["inputs"] = [{"name": "filename", "arg": {"as_string": str(victim)}, "kind": 1},
                      {"name": "shared", "arg": {"as_bool": True}, "kind": 1},
                      {"name": "size", "arg": {"as_int": len(VICTIM_BYTES)}, "kind": 1}]


def _strides(m, exprs):
    tv = _g(m)["tensor_values"]
    next(iter(tv.values()))["strides"] = [{"as_expr": {"expr_str": e, "hint": None}} for e in exprs]


#: variant -> (rewrite(model, marker, victim), words the one-line error must hold)
VARIANTS = {
    # class 1: strings torch turns into code
    "guards_code": (lambda m, mk, v: m["guards_code"].append(f"{_touch(mk)} == 0"), "guards_code"),
    "guards_code_hidden": (lambda m, mk, v: m["guards_code"].append(
        f"L['x'].size()[0] >= 0 or ({_touch(mk)} == 0)"), "guards_code"),
    "input_name": (lambda m, mk, v: _rename_user_input(m, f"x=({_touch(mk)})"), "not an identifier"),
    "node_name": (lambda m, mk, v: _node(m).update(name=f"y = {_touch(mk)}"), "nodes[0].name"),
    "kwargs_in_spec": (lambda m, mk, v: set_kwargs_key(m, f"k':{_touch(mk)},'"), "in_spec"),
    "stack_trace": (lambda m, mk, v: _node(m)["metadata"].update(
        stack_trace=f'File "a.py", line 1, in f\r{_touch(mk)}'), "stack_trace"),
    "metadata_key": (lambda m, mk, v: _node(m)["metadata"].update(exec=_touch(mk)), "node metadata key"),
    "unknown_field": (lambda m, mk, v: m.update(extra_code=_touch(mk)), "extra_code: unknown field"),
    # class 5: operators with effects outside tensor memory
    "from_file": (lambda m, mk, v: _from_file(m, v), "aten::from_file.default"),
    "collective": (lambda m, mk, v: _node(m).update(target="torch.ops._c10d_functional.broadcast.default"),
                   "_c10d_functional"),
    "as_operator": (lambda m, mk, v: _node(m)["inputs"].append(
        {"name": "op", "arg": {"as_operator": "torch.os.system"}, "kind": 1}), "torch.os.system"),
    # class 7(b): size expressions that keep sympy busy
    "max_bomb": (lambda m, mk, v: _strides(m, [f"Max({', '.join(_sym(j + i) for j in range(16))})"
                                               for i in range(30)]), "Max() with 16 arguments"),
    "distinct_bomb": (lambda m, mk, v: _strides(m, [
        f"FloorDiv(Add({', '.join(f'Mul(Integer({k + 2}), {_sym(6 * k + j)})' for j in range(6))}), Integer(3))"
        for k in range(60)]), "too costly"),
}


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.bin"
    path.write_bytes(VICTIM_BYTES)
    yield path
    assert path.read_bytes() == VICTIM_BYTES, "a graph operator wrote into a user's file"


def _craft(pt2_dir: Path, tmp_path: Path, variant: str, marker: Path, victim: Path) -> Path:
    rewrite, _ = VARIANTS[variant]
    model = read_json_member(pt2_dir / "decoder.pt2", "models/model.json")
    rewrite(model, marker, victim)
    return rewrite_pt2(pt2_dir / "decoder.pt2", tmp_path / f"{variant}.pt2",
                       {"models/model.json": json.dumps(model).encode()})


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_hostile_graph_is_refused_at_every_door(pt2reg, pt2_dir, bundles, tmp_path, marker, victim, monkeypatch,
                                                 variant):
    import registry
    import registry.runtime.torchrt as torchrt

    _, words = VARIANTS[variant]
    evil = _craft(pt2_dir, tmp_path, variant, marker, victim)
    deserialized: list[str | None] = []  # the programs torch was handed, whoever asked
    real = torchrt.load_exported_program

    def recording(*args, **kwargs):
        deserialized.append(kwargs.get("program"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torchrt, "load_exported_program", recording)
    out = tmp_path / "x.pt2b"
    refused(pt2reg("bundle", f"decoder={evil}", "--sample", f"decoder={pt2_dir / 'decoder_inputs.pt'}",
                    "-o", out), evil.name, "program 'model'", words)  # the archive's own program name
    assert not out.exists()

    crafted = bundle_with_raw_member(bundles["ed"], tmp_path / "crafted.pt2b", MEMBER, evil.read_bytes())
    refused(pt2reg("push", crafted, "--name", "team/crafted"), "decoder", words)
    for args in (("verify", crafted), ("run", crafted, "--samples"),
                 ("run", crafted, "--trust-pickle", "--program", "decoder", "--inputs",
                  pt2_dir / "decoder_inputs.pt", "--output", tmp_path / "y.pt")):
        refused(pt2reg(*args), "decoder", words)
    push_unchecked(pt2reg.home, crafted, "team/crafted", monkeypatch)
    for args in (("verify", "team/crafted@1"), ("run", "team/crafted@1", "--samples")):
        refused(pt2reg(*args), "decoder", words)
    monkeypatch.setenv("PT2REG_HOME", str(pt2reg.home))
    for source in ("team/crafted@1", crafted):
        with pytest.raises(UnsafeArchiveError) as info:
            registry.load(source, cache_dir=tmp_path / "cache")
        assert "decoder" in str(info.value) and words in str(info.value)
    assert not (tmp_path / "y.pt").exists()
    # refused before torch read the graph, so sympy never saw its sizes (a bomb costs minutes there):
    # checked by what was called, not by how long it took, which a busy machine changes
    assert "decoder" not in deserialized, deserialized


def test_guards_are_enforced_without_torch_executing_them(pt2_dir, tmp_path, monkeypatch):
    """A legitimate guard still refuses inputs the program was never valid for (exit 4), and
    torch never compiles guard code: its guard function builder is not called at all."""
    import torch
    import torch.export._unlift as unlift

    import registry
    from registry.bundler import ProgramInput, build_bundle
    from registry.errors import InputValidationError

    def boom(*a, **k):
        raise AssertionError("torch was handed guards_code to exec()")

    monkeypatch.setattr(unlift, "_convert_guards_code_to_fn", boom)
    out = tmp_path / "guarded.pt2b"
    build_bundle(out, [ProgramInput("guarded", pt2_dir / "guarded.pt2")])
    model = registry.load(out, cache_dir=tmp_path / "cache")
    first, n = model["guarded"](torch.randn(9, 2))
    assert first.shape == (4, 2) and n == 27
    with pytest.raises(InputValidationError, match=r"Guard failed: .*x.size\(\)\[0\].* == 4"):
        model["guarded"](torch.randn(7, 2))
