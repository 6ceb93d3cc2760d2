"""Issue 2: bundling and inspecting through the CLI contract, on tiny exported models."""
import json
import os
import shutil
from pathlib import Path

import pytest

from registry.format.bundle import BundleFile
from registry.format.manifest import RequiredOp
from tests.fixtures_pt2 import cli_process, run_cli


@pytest.fixture(scope="module")
def ed_bundle(pt2_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ed") / "ed.pt2b"
    r = run_cli("bundle", f"encoder={pt2_dir / 'encoder.pt2'}", f"decoder={pt2_dir / 'decoder.pt2'}",
                "--sample", f"encoder={pt2_dir / 'encoder_inputs.pt'}",
                "--sample", f"decoder={pt2_dir / 'decoder_inputs.pt'}", "--meta", "owner=nlp", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith(BundleFile.open(out).digest)
    return out


def test_encoder_decoder_inspect_json(ed_bundle):
    r = run_cli("inspect", str(ed_bundle), "--json")
    assert r.returncode == 0, r.stderr
    view = json.loads(r.stdout)
    enc, dec = view["programs"]["encoder"], view["programs"]["decoder"]
    tokens, mask = enc["inputs"]
    assert (tokens["name"], tokens["dtype"], tokens["kind"]) == ("tokens", "int64", "positional")
    assert mask["dtype"] == "bool"
    batch, seq = tokens["shape"]
    assert (batch["min"], batch["max"]) == (1, 32) and (seq["min"], seq["max"]) == (2, 16)
    # the derived dim (seq + 1) shares seq's symbol and has its own range
    assert mask["shape"][1] == {"min": 3, "max": 17, "expr": f"{seq['expr']} + 1"}
    assert mask["shape"][0]["expr"] == batch["expr"]
    hidden = dec["inputs"][0]
    assert hidden["shape"][2] == 8 and hidden["shape"][0]["max"] == 32
    assert [o["path"] for o in enc["outputs"]] == ["out['hidden']", "out['lengths'][0]"]
    assert {c["expr"]: (c["min"], c["max"]) for c in enc["range_constraints"]}[f"{seq['expr']} + 1"] == (3, 17)
    assert view["metadata"] == {"owner": "nlp"}
    assert [s["program"] for s in view["samples"]] == ["encoder", "decoder"]
    assert view["environment"]["torch"].startswith("2.")


def test_inspect_human_view_shows_ranges(ed_bundle):
    r = run_cli("inspect", str(ed_bundle))
    assert r.returncode == 0, r.stderr
    assert "program encoder" in r.stdout and "1..32" in r.stdout and "3..17" in r.stdout


def test_same_content_same_digest_whatever_the_file_name(pt2_dir, tmp_path):
    renamed = tmp_path / "totally_different_name.pt2"
    shutil.copy(pt2_dir / "decoder.pt2", renamed)
    a = run_cli("bundle", f"decoder={pt2_dir / 'decoder.pt2'}", "-o", str(tmp_path / "a.pt2b"), "--meta", "k=v")
    b = run_cli("bundle", f"decoder={renamed}", "-o", str(tmp_path / "b.pt2b"), "--meta", "k=v")
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    da, db = BundleFile.open(tmp_path / "a.pt2b"), BundleFile.open(tmp_path / "b.pt2b")
    assert da.digest == db.digest
    assert da.build is not None  # who/when is recorded, outside the identity
    c = run_cli("bundle", f"decoder={renamed}", "-o", str(tmp_path / "c.pt2b"), "--meta", "k=other")
    assert c.returncode == 0, c.stderr
    assert BundleFile.open(tmp_path / "c.pt2b").digest != da.digest


def test_custom_op_not_importable_bundles_and_is_listed(pt2_dir, tmp_path):
    import torch  # the op must not be registered in this process or the CLI's

    assert not hasattr(torch.ops.pt2reg_test, "scale")
    out = tmp_path / "op.pt2b"
    r = run_cli("bundle", str(pt2_dir / "custom_op.pt2"), "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    prog = BundleFile.open(out).manifest.programs["model"]
    assert prog.required_ops == (RequiredOp("pt2reg_test::scale", "default", "torch.ops.pt2reg_test.scale.default",
                                            None),)


def test_custom_op_schema_recorded_when_importable(pt2_dir, tmp_path):
    out = tmp_path / "op.pt2b"
    # a process of its own: importing tests.make_models registers the op for good
    r = cli_process("bundle", str(pt2_dir / "custom_op.pt2"), "--import", "tests.make_models",
                "--sample", f"model={pt2_dir / 'custom_op_inputs.pt'}", "-o", str(out))
    assert r.returncode == 0, r.stderr
    op = BundleFile.open(out).manifest.programs["model"].required_ops[0]
    assert op.schema == "pt2reg_test::scale(Tensor x, float alpha) -> Tensor"


def test_samples_need_the_op_and_say_so(pt2_dir, tmp_path):
    out = tmp_path / "op.pt2b"
    r = run_cli("bundle", str(pt2_dir / "custom_op.pt2"), "--sample", f"model={pt2_dir / 'custom_op_inputs.pt'}",
                "-o", str(out))
    assert r.returncode == 4
    assert "pt2reg_test::scale" in r.stderr and "--import" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()


def test_baked_device_warning_names_op_and_line(pt2_dir, tmp_path):
    r = run_cli("bundle", f"baked={pt2_dir / 'baked.pt2'}", "-o", str(tmp_path / "b.pt2b"))
    assert r.returncode == 0, r.stderr
    # one line per program and source line, the op named, the file without its directories
    (line,) = r.stderr.strip().splitlines()
    assert "device 'cpu' baked into 1 op at make_models.py:" in line and "(arange)" in line, line
    assert 'torch.arange(x.shape[1], device="cpu")' in line and str(pt2_dir.parent) not in line
    baked = BundleFile.open(tmp_path / "b.pt2b").manifest.programs["baked"].baked_devices
    arange = [b for b in baked if "arange" in b.op][0]
    assert arange.device == "cpu" and arange.source.split(":")[0] == "make_models.py"
    assert arange.source.split(":")[-1].isdigit()
    assert 'device="cpu"' in arange.code


def _flip_byte(src: Path, dst: Path, member: str) -> None:
    b = BundleFile.open(src)
    offset, size = b.member_span(member)
    data = bytearray(src.read_bytes())
    data[offset + size // 2] ^= 0xFF
    dst.write_bytes(bytes(data))


def test_flipped_byte_fails_with_exit_5(ed_bundle, tmp_path):
    bad = tmp_path / "bad.pt2b"
    _flip_byte(ed_bundle, bad, "programs/encoder.pt2")
    r = run_cli("inspect", str(bad))
    assert r.returncode == 5
    assert "programs/encoder.pt2" in r.stderr and "corrupt" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


@pytest.mark.parametrize("kind", ["random", "missing", "text", "pt2-not-bundle", "empty", "dir"])
def test_bad_inputs_one_clear_line_no_output(kind, pt2_dir, tmp_path):
    path = tmp_path / "in.pt2b"
    if kind == "random":
        path.write_bytes(os.urandom(4096))
    elif kind == "text":
        path.write_text("hello")
    elif kind == "pt2-not-bundle":
        shutil.copy(pt2_dir / "decoder.pt2", path)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "dir":
        path.mkdir()
    r = run_cli("inspect", str(path))
    assert r.returncode == (3 if kind == "missing" else 5), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    out = tmp_path / "out.pt2b"
    src = path if kind != "pt2-not-bundle" else tmp_path / "random.pt2"
    if kind == "pt2-not-bundle":
        src.write_bytes(os.urandom(100))
    r = run_cli("bundle", f"m={src}", "-o", str(out))
    assert r.returncode == (3 if kind == "missing" else 5), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".incomplete")]


@pytest.mark.parametrize("saved", ["module", "tensors", "legacy-format"])
def test_a_torch_save_file_is_named_as_such_exit_2(saved, tmp_path):
    """The first hour: ``torch.save`` writes a pickle (a zip holding data.pkl, or the legacy bare
    pickle), not a program. ``bundle`` says exactly that in one line, exit 2 (a usage error:
    nothing was read but the zip's directory, nothing unpickled), naming torch.export.save."""
    torch = pytest.importorskip("torch")
    path = tmp_path / "model.pt2"
    if saved == "module":
        torch.save(torch.nn.Linear(3, 2), path)
    elif saved == "tensors":
        torch.save((torch.randn(2, 3),), path)
    else:
        torch.save(torch.nn.Linear(3, 2).state_dict(), path, _use_new_zipfile_serialization=False)
    out = tmp_path / "out.pt2b"
    r = run_cli("bundle", path, "-o", out)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "Traceback" not in r.stderr
    assert f"{path} is a torch.save file (a pickle" in r.stderr
    assert "not a torch.export.save program" in r.stderr and "torch.export.save(torch.export.export(" in r.stderr
    assert not out.exists()


def test_sample_and_dim_name_the_program_a_plain_pt2_gets(pt2_dir, tmp_path):
    """A PATH.pt2 given without NAME= is program "model": the help of --sample and --dim says so,
    and so does every error about a program name they were given."""
    help_text = " ".join(run_cli("bundle", "--help").stdout.split())
    assert 'NAME is the program\'s name in the bundle: "model" for a PATH.pt2 given without NAME=' in help_text
    assert 'PROGRAM is "model" for a PATH.pt2 given without NAME=' in help_text
    out, src = tmp_path / "b.pt2b", pt2_dir / "baked.pt2"
    hint = 'a PATH.pt2 given without NAME= keeps the name torch.export.save gave it, "model"'
    for args in (["--sample", f"baked={pt2_dir / 'custom_op_inputs.pt'}"], ["--dim", "baked:x.1=width"],
                 ["--dim", "x.1"], ["--sample", str(pt2_dir / "custom_op_inputs.pt")]):
        r = run_cli("bundle", src, *args, "-o", out)
        assert r.returncode == 2, (args, r.stderr)
        assert hint in " ".join(r.stderr.split()), (args, r.stderr)
        assert not out.exists()
    r = run_cli("bundle", src, "--dim", "model:x.1=width", "-o", out)
    assert r.returncode == 0, r.stderr
    assert json.loads(run_cli("inspect", out, "--json").stdout)["programs"]["model"]["inputs"][0]["shape"][1]["dim"] == "width"
