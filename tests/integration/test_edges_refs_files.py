"""Issue 41, class 1: the meaning of what a user types never depends on the disk.

A string that parses as a ref is a ref, whatever files the working directory holds; files are
named explicitly (``./PATH``, ``/PATH``, ``file:PATH``, or a name ending in a bundle suffix,
which no model name may end in). The hostile fixture: files named exactly like refs of a
model a trust rule protects, planted in the working directory, holding an unsigned bundle.
Before the fix each was loaded as a *file* (only ``files = true`` rules apply to files) and
passed; now each is the ref, and the rule refuses it.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from registry.format.signing import generate_keypair
from tests.cli_inprocess import invoker, one_error_line, run_in_process


def _line(r) -> str:
    """The single error line of a finished command (``run_in_process``)."""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    return lines[0]


@pytest.fixture
def home(clean_home: Path) -> Path:
    return clean_home


@pytest.fixture
def planted(home, bundles, tmp_path) -> dict:
    """team/m@1 published unsigned under a rule requiring release.pub for team/*; a working
    directory with files named like its refs, each an unsigned bundle."""
    pt2reg = invoker(home)
    key, pub = generate_keypair(tmp_path / "release")
    r = pt2reg("push", bundles["ed"], "--name", "team/m", "--alias", "prod", "--json")
    assert r.exit_code == 0, r.output
    digest = json.loads(r.stdout)["digest"]
    (home / "trust.toml").write_text(f'[[rule]]\nmodels = "team/*"\nkeys = ["{pub}"]\n')
    cwd = tmp_path / "cwd"
    names = ["team/m@1", "team/m", "team/m@prod", f"team/m@{digest}"]
    for name in names:
        (cwd / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(bundles["ed"], cwd / name)
    return {"cwd": cwd, "names": names, "digest": digest, "pt2reg": pt2reg}


@pytest.mark.parametrize("command", [("verify", "{}"), ("run", "{}", "--samples"),
                                     ("export-triton", "{}", "out-{i}"), ("materialize", "{}", "dest-{i}"),
                                     ("materialize", "pt2reg:///{}", "dest2-{i}"), ("inspect", "{}", "--json")])
def test_a_file_named_like_a_ref_never_stands_in_for_the_ref(planted, home, command):
    cwd = planted["cwd"]
    for i, name in enumerate(planted["names"]):
        if command[0] == "materialize" and "@" not in name:
            continue  # a storage URI must pin a version
        args = [a.format(name, i=i) for a in command]
        r = run_in_process("--home", home, *args, cwd=cwd)
        if command[0] == "inspect":  # reads the manifest only: the registry's version, not the file
            assert r.returncode == 0 and json.loads(r.stdout)["name"] == "team/m", r.stderr
            continue
        assert r.returncode == 5, (args, r.stdout, r.stderr)
        line = _line(r)
        assert "model team/m must be signed by release.pub" in line, line


def test_the_python_api_reads_the_same_string_as_a_ref(planted, monkeypatch):
    import registry
    from registry.errors import SignatureError

    monkeypatch.chdir(planted["cwd"])
    for name in planted["names"]:
        with pytest.raises(SignatureError, match="model team/m must be signed by release.pub"):
            registry.load(name, device="cpu")


def test_a_file_is_named_explicitly(planted, home, bundles):
    """``./``, an absolute path, ``file:`` and a bundle suffix name the file (files = true
    rules apply to it, and this policy has none)."""
    cwd = planted["cwd"]
    shutil.copyfile(bundles["ed"], cwd / "local.pt2b")
    for text in ("./team/m@1", str(cwd / "team/m@1"), "file:team/m@1", f"file://{cwd}/team/m@1", "local.pt2b",
                 "team/../local.pt2b"):
        r = run_in_process("--home", home, "verify", text, "--json", cwd=cwd)
        assert r.returncode == 0, (text, r.stderr)
        assert json.loads(r.stdout)["digest"] == planted["digest"]
    r = run_in_process("--home", home, "verify", "file://elsewhere/x.pt2b", cwd=cwd)
    assert r.returncode == 2 and "names a file on another host" in _line(r)
    r = run_in_process("--home", home, "verify", "./team/missing@1", cwd=cwd)
    assert r.returncode == 3 and _line(r) == "error: ./team/missing@1: no such file"


@pytest.mark.parametrize("name", ["team/m.pt2b", "m.pt2", "a/b.zip"])
def test_a_model_name_never_ends_like_a_file(home, bundles, name):
    r = invoker(home)("push", bundles["v1"], "--name", name)
    assert r.exit_code == 2 and "ends like a bundle file" in one_error_line(r)
    from registry.errors import UsageError
    from registry.refs import Ref

    with pytest.raises(UsageError):
        Ref.parse(f"{name}@1")


def test_neither_a_ref_nor_a_file_names_both_readings(home, tmp_path):
    r = run_in_process("--home", home, "verify", "Team/M@1", cwd=tmp_path)
    assert r.returncode == 2
    line = _line(r)
    assert "is neither a ref" in line and "./PATH" in line and "NAME[@N" in line
