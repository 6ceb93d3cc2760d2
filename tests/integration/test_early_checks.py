"""Inputs the manifest refuses are refused before any program is loaded, and errors name the
user's file or ref, never the cache blob or a temp copy."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import registry.runtime.loader as loader_mod
from tests.cli_inprocess import refused


@pytest.fixture(scope="module")
def translator(pt2_dir, tmp_path_factory) -> Path:
    from tests.cli_inprocess import invoker

    out = tmp_path_factory.mktemp("early") / "t.pt2b"
    r = invoker(out.parent / "home")("bundle", f"encoder={pt2_dir / 'encoder.pt2'}",
                                     f"decoder={pt2_dir / 'decoder.pt2'}",
                                     "--sample", f"encoder={pt2_dir / 'encoder_inputs.pt'}", "-o", out)
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture
def no_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the program was loaded")

    monkeypatch.setattr(loader_mod, "load_bundle", refuse)


def test_out_of_range_inputs_refused_before_loading(pt2reg, translator, tmp_path, no_load):
    import torch

    big = tmp_path / "big.pt"
    torch.save((torch.randint(0, 100, (40, 8)), torch.ones(40, 9, dtype=torch.bool)), big)
    refused(pt2reg("run", translator, "--program", "encoder", "--inputs", big),
            "input 'tokens' dim 0", "is 40, allowed 1..32", code=4)
    wrong = tmp_path / "wrong.pt"
    torch.save((torch.randint(0, 100, (2, 8)),), wrong)
    refused(pt2reg("run", translator, "--program", "encoder", "--inputs", wrong), "input(s)", code=4)
    torch.save((torch.randint(0, 100, (2, 8)), torch.ones(2, 8, dtype=torch.bool)), wrong)  # mask: seq + 1
    refused(pt2reg("run", translator, "--program", "encoder", "--inputs", wrong), "mask", code=4)


def test_precheck_passes_what_the_call_accepts(translator, pt2_dir, tmp_path):
    import torch

    from registry.client.sources import materialize_file

    src = materialize_file(translator, tmp_path / "cache")
    loader_mod.precheck_inputs(src.manifest.programs["encoder"], torch.load(pt2_dir / "encoder_inputs.pt"))


def test_samples_the_manifest_refuses_fail_before_loading(pt2reg, translator, tmp_path, no_load):
    """A bundle whose golden sample no longer fits its program's ranges (edited by hand)."""
    from registry.format.bundle import BundleFile, write_bundle
    from registry.format.manifest import Manifest

    good = BundleFile.open(translator)
    raw = good.manifest.to_json()
    for c in raw["programs"]["encoder"]["inputs"][0]["shape"][:1]:
        c["max"] = 1  # the sample's batch is 2
    for c in raw["programs"]["encoder"]["range_constraints"]:
        if c["expr"] == raw["programs"]["encoder"]["inputs"][0]["shape"][0]["expr"]:
            c["max"] = 1
    edited = tmp_path / "edited.pt2b"
    write_bundle(edited, Manifest.from_raw(raw),
                 {m.path: (lambda p=m.path: good.open_member(p)) for m in good.manifest.members})
    r = pt2reg("run", edited, "--samples", "--json")
    refused(r, "1 of 1 sample(s) failed before loading, first encoder-0", "sample inputs rejected", code=1)
    doc = json.loads(r.stdout)
    assert doc["loaded"] is False and doc["samples"][0]["ok"] is False


def test_torch_load_errors_name_the_users_file(pt2reg, translator, pt2_dir, tmp_path, monkeypatch):
    """Whatever torch says, the line names the bundle file (or the user's .pt2), not the cache."""
    import torch.export.pt2_archive._package as package

    def broken(f, *args, **kwargs):
        raise RuntimeError(f"PytorchStreamReader failed reading {getattr(f, 'name', f)}")

    monkeypatch.setattr(package, "load_pt2", broken)
    r = pt2reg("run", translator, "--samples")
    line = refused(r, "torch could not load program 'encoder' from", str(translator), "programs/encoder.pt2")
    assert "cache" not in line and "blobs" not in line
    r = pt2reg("bundle", f"encoder={pt2_dir / 'encoder.pt2'}",
               "--sample", f"encoder={pt2_dir / 'encoder_inputs.pt'}", "-o", tmp_path / "x.pt2b")
    line = refused(r, f"from {pt2_dir / 'encoder.pt2'}")
    assert "pt2reg-bundle-" not in line and "/p0.pt2" not in line


def test_a_damaged_member_is_named_by_file_and_member(pt2reg, translator, tmp_path):
    import struct
    import zipfile

    data = bytearray(translator.read_bytes())
    info = next(i for i in zipfile.ZipFile(translator).infolist() if i.filename == "programs/encoder.pt2")
    n, e = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    data[info.header_offset + 30 + n + e + 100] ^= 0xFF
    bad = tmp_path / "bad.pt2b"
    bad.write_bytes(bytes(data))
    line = refused(pt2reg("run", bad, "--samples"), f"{bad}: member programs/encoder.pt2 is corrupt")
    assert "blob sha256" not in line
