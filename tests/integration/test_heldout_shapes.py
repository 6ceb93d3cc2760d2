"""Legitimate graphs a red team found mishandled, driven through the CLI: a dunder-named aten
operator (``a & b``), a ``Pow`` in an output size, an export guard that only holds for some
sizes, an input that must be even, and an int output."""
import json

import pytest
import torch

from tests.fixtures_pt2 import run_cli


def _cli_json(*args):
    r = run_cli(*args, "--json")
    return r, (json.loads(r.stdout) if r.stdout.strip().startswith("{") else None)


@pytest.fixture(scope="module")
def built(pt2_dir, tmp_path_factory):
    """Bundled in-process (the CLI path is exercised by the runs below)."""
    from registry.bundler import ProgramInput, SampleInput, build_bundle

    out = tmp_path_factory.mktemp("heldout")
    made = {}
    for name, sample in (("masked", "masked_inputs.pt"), ("flat", "flat_inputs.pt"),
                         ("guarded", "guarded_inputs.pt"), ("halves", None),
                         ("flagged", "flagged_inputs.pt")):
        dest = out / f"{name}.pt2b"
        build_bundle(dest, [ProgramInput(name, pt2_dir / f"{name}.pt2")],
                     samples=[SampleInput(name, pt2_dir / sample)] if sample else [])
        made[name] = dest
    return made


def test_dunder_operators_and_power_sizes_bundle_and_run(built):
    for name in ("masked", "flat"):
        r = run_cli("run", str(built[name]), "--samples")
        assert r.returncode == 0, (name, r.stderr)
    r, doc = _cli_json("inspect", str(built["flat"]))
    assert r.returncode == 0, r.stderr
    [out] = doc["programs"]["flat"]["outputs"]
    assert out["shape"][0]["expr"].endswith("**2") and out["shape"][0]["max"] == 64 ** 2, out


def test_export_guards_are_enforced_and_int_outputs_are_reported(built, pt2_dir, tmp_path):
    y = tmp_path / "y.pt"
    r, doc = _cli_json("run", str(built["guarded"]), "--inputs", str(pt2_dir / "guarded_inputs.pt"),
                       "--output", str(y))
    assert r.returncode == 0, r.stderr
    assert doc["outputs"][1] == {"index": 1, "dtype": "int", "shape": None, "value": 27}
    first, n = torch.load(y, weights_only=True)
    assert first.shape == (4, 2) and n == 27
    # 7 rows would give 4 rows from the graph (eager gives 3): torch's guard refuses them
    r = run_cli("run", str(built["guarded"]), "--inputs", str(pt2_dir / "guarded_bad_inputs.pt"))
    assert r.returncode == 4 and "Guard failed" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_an_input_not_of_its_derived_form_is_exit_4(built, pt2_dir):
    r = run_cli("run", str(built["halves"]), "--inputs", str(pt2_dir / "halves_odd_inputs.pt"))
    assert r.returncode == 4, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


@pytest.mark.slow
def test_arguments_export_baked_in_may_be_passed_or_left_out_but_not_changed(built, pt2_dir):
    r, doc = _cli_json("inspect", str(built["flagged"]))
    consts = doc["programs"]["flagged"]["constant_inputs"]
    assert [(c["name"], c["value"]) for c in consts] == [("flag", True), ("k", 2)], consts
    assert run_cli("run", str(built["flagged"]), "--samples").returncode == 0
    for inputs in ("flagged_inputs.pt", "flagged_tensor_only.pt"):
        r = run_cli("run", str(built["flagged"]), "--inputs", str(pt2_dir / inputs))
        assert r.returncode == 0, (inputs, r.stderr)
    r = run_cli("run", str(built["flagged"]), "--inputs", str(pt2_dir / "flagged_other_flag.pt"))
    assert r.returncode == 4 and "'flag' was fixed to True" in r.stderr, r.stderr
