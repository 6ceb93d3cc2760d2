"""Issue 42: the compatibility window, end to end through the CLI and the HTTP API.

Programs exported here (torch 2.13) are bundled; the window each one carries is what an older
torch is checked against: a described 2.11 machine (``pt2reg target --json``, its torch and
serde schema set to 2.11's) reads a program that uses nothing newer, and refuses one that uses
a 2.12 dtype with exit 4 naming both torches. The same verdicts come from metadata alone
(``verify --target FILE REF`` with the store emptied, ``POST /v1/compat``, the version page).
Runs on a real older torch: ``tests/integration/test_torch_matrix.py``.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.cli_inprocess import refused
from tests.hostile import read_json_member, rewrite_pt2

T211 = {"torch_version": "2.11.0+cu130", "serde_schema": [8, 17]}


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``plain`` (float32 add: reads on 2.10), ``u32`` (a uint32 input: needs 2.12), with inputs."""
    import torch

    out = tmp_path_factory.mktemp("window")

    class Plain(torch.nn.Module):
        def forward(self, x):
            return x + 1

    class U32(torch.nn.Module):
        def forward(self, x):
            return x.to(torch.float32) * 2

    for name, mod, x in (("plain", Plain(), torch.randn(3)), ("u32", U32(), torch.tensor([1, 2, 3], dtype=torch.uint32))):
        torch.export.save(torch.export.export(mod, (x,)), str(out / f"{name}.pt2"))
        torch.save({"x": x}, out / f"{name}_in.pt")
    return {"plain": out / "plain.pt2", "u32": out / "u32.pt2", "dir": out}


def _bundle(pt2reg, programs: dict[str, Path], name: str, out: Path) -> Path:
    path = out / f"{name}.pt2b"
    r = pt2reg("bundle", f"main={programs[name]}", "--sample", f"main={programs['dir'] / f'{name}_in.pt'}",
               "-o", path)
    assert r.exit_code == 0, r.output
    return path


def _box(pt2reg, tmp_path: Path, edit: dict[str, Any] | None = None, drop_ops: tuple[str, ...] = (),
         change_ops: tuple[str, ...] = ()) -> Path:
    r = pt2reg("target", "--device", "cpu", "--json")
    assert r.exit_code == 0, r.output
    box = json.loads(r.stdout)
    box.update(edit or {})
    for op in drop_ops:
        del box["op_schemas"][op]
    for op in change_ops:
        box["op_schemas"][op] = "0" * 16
    path = tmp_path / "box.json"
    path.write_text(json.dumps(box))
    return path


def test_the_window_is_computed_from_the_program_not_from_its_writer(pt2reg, programs, tmp_path):
    plain, u32 = (_bundle(pt2reg, programs, n, tmp_path) for n in ("plain", "u32"))
    shown = json.loads(pt2reg("inspect", plain, "--json").stdout)
    ser = shown["programs"]["main"]["serialization"]
    assert ser["schema_version"] == [8, 20]                  # written by this torch (2.13)...
    assert ser["window"] == {"torch": "2.10", "schema": [8, 15], "features": []}   # ...read from 2.10 on
    assert shown["requirements"]["torch"] == ">=2.10"
    ops = {op["name"] + "." + op["overload"]: op["schema"] for op in shown["programs"]["main"]["operators"]}
    assert ops["aten::add.Tensor"].startswith("aten::add.Tensor(Tensor self, Tensor other")

    shown = json.loads(pt2reg("inspect", u32, "--json").stdout)
    assert shown["programs"]["main"]["serialization"]["window"] == {
        "torch": "2.12", "schema": [8, 20], "features": ["ScalarType.UINT32 (torch 2.12)"]}
    assert shown["requirements"]["torch"] == ">=2.12"
    text = pt2reg("inspect", u32).stdout
    assert "reads on torch >= 2.12 (serde 8.20: ScalarType.UINT32 (torch 2.12))" in text


def test_an_older_torch_reads_what_its_window_admits_and_refuses_the_rest(pt2reg, programs, tmp_path):
    plain, u32 = (_bundle(pt2reg, programs, n, tmp_path) for n in ("plain", "u32"))
    box = _box(pt2reg, tmp_path, T211)
    r = pt2reg("verify", plain, "--target", box)
    assert r.exit_code == 0, r.output
    line = refused(pt2reg("verify", u32, "--target", box), "needs torch >= 2.12", "ScalarType.UINT32",
                   "torch 2.11.0+cu130 reads up to schema 8.17", code=4)
    assert "serde schema 8.20" in line
    report = json.loads(pt2reg("verify", u32, "--target", box, "--json").stdout)
    fix = next(f["fix"] for f in report["findings"] if f["code"] == "serde-schema")
    assert "torch >= 2.12" in fix and "re-export" in fix


def test_a_requirement_the_window_would_allow_says_how_to_lower_it(pt2reg, programs, tmp_path):
    pinned = tmp_path / "pinned.pt2b"
    r = pt2reg("bundle", f"main={programs['plain']}", "--torch-requirement", ">=2.13", "-o", pinned)
    assert r.exit_code == 0, r.output
    line = refused(pt2reg("verify", pinned, "--target", _box(pt2reg, tmp_path, T211)),
                   "torch 2.11.0+cu130 does not satisfy the bundle's requirement '>=2.13'", code=4)
    report = json.loads(pt2reg("verify", pinned, "--target", tmp_path / "box.json", "--json").stdout)
    assert "--torch-requirement '>=2.11'" in report["findings"][0]["fix"], line


def test_operators_the_target_lacks_or_changed_are_exit_4(pt2reg, programs, tmp_path):
    plain = _bundle(pt2reg, programs, "plain", tmp_path)
    refused(pt2reg("verify", plain, "--target", _box(pt2reg, tmp_path, drop_ops=("aten::add.Tensor",))),
            "calls aten::add.Tensor, which torch", code=4)
    refused(pt2reg("verify", plain, "--target", _box(pt2reg, tmp_path, change_ops=("aten::add.Tensor",))),
            "aten::add.Tensor, whose schema differs", code=4)


def _from_newer_torch(programs: dict[str, Path], tmp_path: Path, edit) -> Path:
    model = read_json_member(programs["plain"], "models/model.json")
    model["schema_version"] = {"major": 8, "minor": model["schema_version"]["minor"] + 1}
    edit(model)
    return rewrite_pt2(programs["plain"], tmp_path / "newer.pt2", {"models/model.json": json.dumps(model).encode()})


@pytest.mark.parametrize("edit, words", [
    (lambda m: m["graph_module"]["graph"]["nodes"][0].update(future_field=1), "unknown field"),
    (lambda m: m["graph_module"]["graph"]["nodes"][0]["inputs"][0].update(arg={"as_future_tensor": {"name": "x"}}),
     "as_future_tensor"),
])
def test_a_field_or_tag_from_a_newer_schema_is_exit_4_not_a_tamper_verdict(pt2reg, programs, tmp_path, edit, words):
    newer = _from_newer_torch(programs, tmp_path, edit)
    out = tmp_path / "newer.pt2b"
    refused(pt2reg("bundle", f"main={newer}", "-o", out),
            "was written by a newer torch (schema 8.21; this pt2-registry reads up to 8.20)", words, code=4)
    assert not out.exists()


def test_the_same_novelty_under_this_schema_is_still_refused_as_tampering(pt2reg, programs, tmp_path):
    model = read_json_member(programs["plain"], "models/model.json")
    model["graph_module"]["graph"]["nodes"][0]["future_field"] = 1
    forged = rewrite_pt2(programs["plain"], tmp_path / "forged.pt2", {"models/model.json": json.dumps(model).encode()})
    refused(pt2reg("bundle", f"main={forged}", "-o", tmp_path / "f.pt2b"), "unknown field", code=5)


def test_verify_target_of_a_ref_needs_its_metadata_only(pt2reg, programs, tmp_path):
    """The store's blobs and the client cache are gone: a ref is still checked against a
    described machine, from the manifest the database holds."""
    plain, u32 = (_bundle(pt2reg, programs, n, tmp_path) for n in ("plain", "u32"))
    for path, name in ((plain, "team/plain"), (u32, "team/u32")):
        assert pt2reg("push", path, "--name", name).exit_code == 0
    for sub in ("store", "cache"):
        shutil.rmtree(pt2reg.home / sub, ignore_errors=True)
    box = _box(pt2reg, tmp_path, T211)
    r = pt2reg("verify", "team/plain@1", "--target", box, "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["compatible"] and "metadata-only" in [f["code"] for f in report["findings"]]
    refused(pt2reg("verify", "team/u32@1", "--target", box), "needs torch >= 2.12", code=4)
    assert pt2reg("verify", "team/plain@1").exit_code not in (0, 4)   # the members really are gone


def test_the_server_answers_from_metadata_alone(pt2reg, programs, tmp_path):
    from starlette.testclient import TestClient

    from registry.config import Settings
    from registry.server import create_app

    for name in ("plain", "u32"):
        assert pt2reg("push", _bundle(pt2reg, programs, name, tmp_path), "--name", f"team/{name}").exit_code == 0
    box211 = json.loads(_box(pt2reg, tmp_path, T211).read_text())
    app = create_app(Settings.resolve(home=str(pt2reg.home), env={}))
    meta = app.state.registry.meta
    _, secret = meta.create_token("ana", ["model:team/*:pull"], expires_at=None, actor="t", host="t")
    _, other = meta.create_token("bo", ["model:other/*:pull"], expires_at=None, actor="t", host="t")
    auth = {"Authorization": f"Bearer {secret}"}
    with TestClient(app, base_url="http://testserver", raise_server_exceptions=False) as client:
        r = client.post("/v1/compat", json={"ref": "team/plain@1", "target": box211}, headers=auth)
        assert r.status_code == 200 and r.json()["compatible"], r.text
        r = client.post("/v1/compat", json={"ref": "team/u32@1", "target": box211}, headers=auth)
        body = r.json()
        assert r.status_code == 200 and not body["compatible"] and body["ref"] == "team/u32@1"
        assert any(f["code"] == "serde-schema" and "needs torch >= 2.12" in f["message"] for f in body["findings"])
        r = client.post("/v1/compat", json={"ref": "team/u32@1", "target": {"torch_version": 3}}, headers=auth)
        assert 400 <= r.status_code < 500 and "target" in r.json()["error"]["message"], r.text
        r = client.post("/v1/compat", json={"ref": "team/u32@1", "target": box211},
                        headers={"Authorization": f"Bearer {other}"})
        assert r.status_code in (403, 404)
        assert client.post("/v1/compat", json={"ref": "team/u32@1", "target": box211}).status_code == 401

        r = client.post("/login", data={"token": secret, "next": "/"}, headers={"Origin": "http://testserver"},
                        follow_redirects=False)
        assert r.status_code == 303
        page = client.get("/version?name=team/u32&number=1").text
        assert 'data-release="2.11" data-ok="no"' in page and 'data-release="2.12" data-ok="yes"' in page
        assert "reads on torch &ge; 2.12" in page and "pt2reg verify team/u32@1 --target box.json" in page
        page = client.get("/version?name=team/plain&number=1").text
        assert 'data-release="2.10" data-ok="yes"' in page


@pytest.mark.slow
def test_compiled_variants_record_their_torch_and_abi_and_run_only_on_that_torch(pt2reg, programs, tmp_path):
    """``pt2reg compile`` of a program without weights (torch's loader cannot map an empty
    weights file: compiled with the weights in the library), its variant's target naming the
    torch and C++ ABI that compiled it; a 2.11 machine is given the portable program instead."""
    import torch

    assert pt2reg("push", _bundle(pt2reg, programs, "plain", tmp_path), "--name", "team/plain").exit_code == 0
    r = pt2reg("compile", "team/plain@1", "--device", "cpu")
    assert r.exit_code == 0, r.output
    variants = json.loads(pt2reg("inspect", "team/plain@2", "--json").stdout)["programs"]["main"]["variants"]
    target = next(v["target"] for v in variants if v["kind"] == "aoti")
    assert target["torch_version"] == torch.__version__ and isinstance(target["cxx11_abi"], bool)
    box = _box(pt2reg, tmp_path)
    here = json.loads(pt2reg("verify", "team/plain@2", "--target", box, "--trust-native", "--json").stdout)
    assert here["variants"]["main"]["id"].startswith("aoti-cpu")
    other = json.loads(pt2reg("verify", "team/plain@2", "--target", _box(pt2reg, tmp_path, T211), "--trust-native",
                              "--json").stdout)
    assert other["compatible"] and other["variants"]["main"]["id"] == "portable"
    assert f"compiled by torch {torch.__version__}, the target runs torch 2.11.0+cu130" in \
        other["variants"]["main"]["reason"]
