"""Dim names for file-based bundles: ``bundle --dim PROGRAM:SYMBOL=NAME`` and names carried to
other programs' inputs at the same position and range (``registry/dim_names.py``)."""
from __future__ import annotations

import json

import pytest

from registry.errors import UsageError
from registry.format.dim_names import name_dims, parse_dim_option
from registry.format.manifest import Dim, ProgramSpec, TensorSpec
from tests.cli_inprocess import refused


def _dims(view: dict, program: str, side: str = "inputs") -> list[list]:
    return [[d.get("dim", d.get("expr")) if isinstance(d, dict) else d for d in e["shape"]]
            for e in view["programs"][program][side]]


def test_named_once_carried_to_the_other_program(pt2reg, pt2_dir, tmp_path):
    out = tmp_path / "t.pt2b"
    r = pt2reg("bundle", f"encoder={pt2_dir / 'encoder.pt2'}", f"decoder={pt2_dir / 'decoder.pt2'}",
               "--dim", "encoder:tokens.0=batch", "--dim", "encoder:tokens[1]=seq", "-o", out, "--json")
    assert r.exit_code == 0, r.output
    notes = json.loads(r.stdout)["notes"]
    assert len(notes) == 2 and all("'decoder'" in n and "override with --dim decoder:" in n for n in notes)
    view = json.loads(pt2reg("inspect", out, "--json").stdout)
    assert _dims(view, "encoder") == [["batch", "seq"], ["batch", "seq + 1"]]
    assert _dims(view, "encoder", "outputs")[0] == ["batch", "seq", 8]
    assert _dims(view, "decoder") == [["batch", "seq", 8]]
    assert _dims(view, "decoder", "outputs") == [["batch", "seq", 100]]
    derived = [c for c in view["programs"]["encoder"]["range_constraints"] if c["expr"].endswith("+ 1")]
    assert derived and derived[0]["dim"] == "seq + 1"
    # given by symbol, the same names: the same digest
    enc_syms = [d["expr"] for d in view["programs"]["encoder"]["inputs"][0]["shape"]]
    again = tmp_path / "again.pt2b"
    r = pt2reg("bundle", f"encoder={pt2_dir / 'encoder.pt2'}", f"decoder={pt2_dir / 'decoder.pt2'}",
               "--dim", f"encoder:{enc_syms[0]}=batch", "--dim", f"encoder:{enc_syms[1]}=seq", "-o", again)
    assert r.exit_code == 0, r.output
    assert r.stdout.split()[-1] == view["digest"]
    # a name given to the decoder wins over the carried one; the rest is still carried
    other = tmp_path / "other.pt2b"
    r = pt2reg("bundle", f"encoder={pt2_dir / 'encoder.pt2'}", f"decoder={pt2_dir / 'decoder.pt2'}",
               "--dim", "encoder:tokens.0=batch", "--dim", "encoder:tokens.1=seq",
               "--dim", "decoder:hidden.1=src_len", "-o", other)
    assert r.exit_code == 0, r.output
    assert "named 'seq'" not in r.stderr and "named 'batch'" in r.stderr
    view = json.loads(pt2reg("inspect", other, "--json").stdout)
    assert _dims(view, "decoder") == [["batch", "src_len", 8]]


@pytest.mark.parametrize("dim, needle", [
    ("nope:tokens.0=batch", "unknown program 'nope'"),
    ("encoder:s99999=batch", "has no symbol 's99999'"),
    ("encoder:ids.0=batch", "has no input 'ids'"),
    ("decoder:hidden.2=width", "dimension 2 is static (8)"),
    ("encoder:mask.1=seq1", "not a plain symbol"),
    ("encoder:tokens.0=not-a-name", "invalid Dim name"),
    ("tokens.0=batch", "--dim without PROGRAM"),
    ("encoder:tokens.0", "expected PROGRAM:SYMBOL=NAME"),
])
def test_bad_dim_options_are_usage_errors(pt2reg, pt2_dir, tmp_path, dim, needle):
    r = pt2reg("bundle", f"encoder={pt2_dir / 'encoder.pt2'}", f"decoder={pt2_dir / 'decoder.pt2'}",
               "--dim", dim, "-o", tmp_path / "t.pt2b")
    refused(r, needle, code=2)
    assert not (tmp_path / "t.pt2b").exists()


def test_one_name_for_two_symbols_of_a_program_is_refused(pt2reg, pt2_dir, tmp_path):
    r = pt2reg("bundle", f"encoder={pt2_dir / 'encoder.pt2'}", "--dim", "encoder:tokens.0=n",
               "--dim", "encoder:tokens.1=n", "-o", tmp_path / "t.pt2b")
    refused(r, "Dim name 'n' given to both", code=2)


def test_without_program_when_the_bundle_has_one(pt2reg, pt2_dir, tmp_path):
    out = tmp_path / "t.pt2b"
    r = pt2reg("bundle", f"decoder={pt2_dir / 'decoder.pt2'}", "--dim", "hidden.0=batch", "-o", out)
    assert r.exit_code == 0, r.output
    assert _dims(json.loads(pt2reg("inspect", out, "--json").stdout), "decoder")[0][0] == "batch"


# ------------------------------------------------------------------- the carry-over rule, pure

def _prog(*inputs: list, ranges: dict, outputs: tuple[dict, ...] = ()) -> ProgramSpec:
    shape = lambda dims: [d if isinstance(d, int) else {"expr": d, "min": ranges[d][0], "max": ranges[d][1]}  # noqa: E731
                          for d in dims]
    return ProgramSpec.from_json("p", {
        "variants": [], "inputs": [{"name": f"x{i}", "dtype": "float32", "shape": shape(dims)}
                                   for i, dims in enumerate(inputs)],
        "outputs": list(outputs), "range_constraints": [{"expr": k, "min": lo, "max": hi} for k, (lo, hi) in ranges.items()],
        "required_ops": [], "torchbind_classes": [], "baked_devices": [], "dtypes": [],
        "serialization": {"torch_version": "2.13.0", "schema_version": [8, 20], "opset_version": {}}})


def _names(spec: TensorSpec) -> list:
    return [d.dim if isinstance(d, Dim) else None for d in spec.shape]


def test_carried_only_when_the_range_matches():
    progs = {"a": _prog(["s1", "s2"], ranges={"s1": (1, 8), "s2": (2, 16)}),
             "b": _prog(["s7", "s9"], ranges={"s7": (1, 8), "s9": (2, 32)})}
    notes = name_dims(progs, {"a": {"s1": "batch", "s2": "seq"}})
    assert len(notes) == 1 and "s7" in notes[0]
    assert _names(progs["b"].inputs[0]) == ["batch", None]


def test_never_guesses_between_two_names_or_two_symbols():
    # two names reach b's s7 (from a and from c): it stays unnamed
    progs = {"a": _prog(["s1"], ranges={"s1": (1, 8)}), "b": _prog(["s7"], ranges={"s7": (1, 8)}),
             "c": _prog(["s3"], ranges={"s3": (1, 8)})}
    assert name_dims(progs, {"a": {"s1": "batch"}, "c": {"s3": "rows"}}) == []
    assert _names(progs["b"].inputs[0]) == [None]
    # one name would reach two symbols of b: neither is named
    progs = {"a": _prog(["s1"], ["s1"], ranges={"s1": (1, 8)}),
             "b": _prog(["s7"], ["s8"], ranges={"s7": (1, 8), "s8": (1, 8)})}
    assert name_dims(progs, {"a": {"s1": "batch"}}) == []


def test_names_render_every_expression_over_named_symbols():
    outputs = ({"name": "y", "dtype": "float32", "shape": [{"expr": "2*s1", "min": 2, "max": 16},
                                                           {"expr": "Max(s1, s2)", "min": 2, "max": 16},
                                                           {"expr": "s1 + s3", "min": 2, "max": None}]},)
    progs = {"a": _prog(["s1", "s2"], ranges={"s1": (1, 8), "s2": (2, 16)}, outputs=outputs)}
    before = dict(progs)
    name_dims(progs, {"a": {"s1": "batch", "s2": "seq"}})
    assert _names(progs["a"].outputs[0]) == ["2*batch", "Max(batch, seq)", None]
    assert [c.dim for c in progs["a"].range_constraints] == ["batch", "seq"]
    assert name_dims(before, {}) == [] and "dim" not in json.dumps(before["a"].to_json())


def test_parse_dim_option():
    assert parse_dim_option("encoder:s31=batch") == ("encoder", "s31", "batch")
    assert parse_dim_option("tokens.0=batch") == (None, "tokens.0", "batch")
    for bad in ("encoder:s31", ":s31=batch", "encoder:=batch", "encoder:s31=1x"):
        with pytest.raises(UsageError):
            parse_dim_option(bad)
