"""Bundles cross torch versions: made with this torch, verified and run with the matrix's other
torch, and the other way round (issue 42).

The matrix is the venvs ``scripts/setup-venv.sh`` makes: ``.venv`` (torch 2.13.0 CPU) and
``.venv-torch2.14`` (torch 2.14.1). Each test drives the other venv's interpreter as a
subprocess (``python -m tests.torch_matrix``: one interpreter start and torch import per
direction). Without a second venv the tests skip, saying how to make one; ``scripts/test.sh``
makes it and sets ``PT2REG_TORCH_MATRIX=required``, under which a missing venv fails instead,
so CI never skips them.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from tests.cli_inprocess import run_in_process
from tests.torch_matrix import ROOT, bundle_exports, check, make_uint32, matrix_pythons


def _release(version: str) -> str:
    """``2.14.1`` of ``2.14.1+cu130``: a venv's dist-info names the one, ``torch.__version__`` the other."""
    return version.partition("+")[0]


HERE = str(torch.__version__)
OTHERS = {v: p for v, p in matrix_pythons().items() if _release(v) != _release(HERE)}


@pytest.fixture(scope="session", params=sorted(OTHERS) or [None], ids=lambda v: v or "no-second-torch")
def other(request) -> tuple[str, Path]:
    """(torch version, interpreter) of a venv of the matrix with another torch. Session-scoped,
    so it is decided (and skips) before the session fixtures that would build exports."""
    if request.param is None:
        reason = (f"no second torch beside {HERE}: `bash scripts/setup-venv.sh torch2.14` makes .venv-torch2.14 "
                  "(torch 2.14.1, ~5.5 GB, from local disk)")
        if os.environ.get("PT2REG_TORCH_MATRIX") == "required":
            pytest.fail(reason + " (PT2REG_TORCH_MATRIX=required)")
        pytest.skip(reason)
    return request.param, OTHERS[request.param]


def _side(python: Path, *args: str) -> object:
    """``python -m tests.torch_matrix ARGS`` (the other torch); its JSON answer."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PT2REG_SANDBOX": "off"}
    env.pop("PYTHONHOME", None)
    r = subprocess.run([str(python), "-m", "tests.torch_matrix", *args], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=600)
    assert r.returncode == 0, f"{python} -m tests.torch_matrix {' '.join(args)}: exit {r.returncode}\n{r.stderr[-4000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def _assert_all_pass(results: list[dict], made_with: str, run_with: str) -> None:
    """Every bundle verifies compatible and runs its golden samples within tolerance."""
    assert results and {_release(r["torch"]) for r in results} == {_release(run_with)}
    for r in results:
        where = f"{r['bundle']} made with torch {made_with}, `pt2reg {r['command']}` with torch {run_with}"
        assert r["exit_code"] == 0 and r["json"] is not None, f"{where}: exit {r['exit_code']}: {r['stderr']}"
        if r["command"] == "verify":
            assert r["json"]["compatible"], f"{where}: {r['json']['findings']}"
            assert not [f for f in r["json"]["findings"] if f["severity"] == "error"], where
        else:
            assert r["json"]["ok"], f"{where}: {r['json']}"
            outputs = [o for s in r["json"]["samples"] for o in s["outputs"]]
            assert outputs and all(o["ok"] for o in outputs), f"{where}: {r['json']}"


def _recorded_torch(bundle: str, home: Path) -> str:
    """The torch a bundle's manifest says made it."""
    doc = json.loads(run_in_process("inspect", bundle, "--json", env={"PT2REG_HOME": str(home)}).stdout)
    return doc["environment"]["torch"]


@pytest.mark.slow
def test_bundles_made_here_verify_and_run_with_the_other_torch(other, pt2_dir, tmp_path):
    version, python = other
    bundles = bundle_exports(pt2_dir, tmp_path)
    assert {_recorded_torch(b, tmp_path / "home") for b in bundles.values()} == {HERE}
    _assert_all_pass(_side(python, "check", *bundles.values()), made_with=HERE, run_with=version)


@pytest.mark.slow
def test_bundles_made_with_the_other_torch_verify_and_run_here(other, tmp_path):
    version, python = other
    made = _side(python, "make", str(tmp_path / "there"))
    assert _release(made["torch"]) == _release(version)
    assert {_recorded_torch(b, tmp_path / "home") for b in made["bundles"].values()} == {made["torch"]}
    _assert_all_pass(check(list(made["bundles"].values()), tmp_path / "home"), made_with=made["torch"], run_with=HERE)


def _minor(version: str) -> tuple[int, int]:
    major, minor = _release(version).split(".")[:2]
    return int(major), int(minor)


@pytest.mark.slow
def test_a_program_needing_a_newer_schema_crosses_only_where_its_window_allows(other, tmp_path):
    """A uint32 input (torch 2.12's serde schema 8.20): made with the newer torch of the pair,
    checked with the older. It verifies and runs where the older reads 8.20 (2.13 <-> 2.14);
    on 2.10 or 2.11, ``verify`` and ``run`` are exit 4 naming the oldest torch that reads it and
    the one that cannot; a torch older than 2.12 cannot export it at all."""
    version, python = other
    newer_here = _minor(HERE) >= _minor(version)
    made = make_uint32(tmp_path / "made") if newer_here else _side(python, "make-uint32", str(tmp_path / "made"))
    maker, reader = (HERE, version) if newer_here else (version, HERE)
    if _minor(maker) < (2, 12):
        assert made["bundle"] is None and "uint32" in made["error"], made   # neither side can make one
        return
    results = (_side(python, "check", made["bundle"]) if newer_here
               else check([made["bundle"]], tmp_path / "home"))
    if _minor(reader) >= (2, 12):
        _assert_all_pass(results, made_with=maker, run_with=reader)
        return
    for r in results:
        where = f"uint32 made with torch {maker}, `pt2reg {r['command']}` with torch {r['torch']}"
        assert r["exit_code"] == 4, f"{where}: exit {r['exit_code']}: {r['stderr']}"
        assert "needs torch >= 2.12" in r["stderr"] and f"torch {r['torch']} reads up to schema 8." in r["stderr"], \
            f"{where}: {r['stderr']}"
