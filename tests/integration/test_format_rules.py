"""The integrity rules of format 2 (issue 17), through the CLI on every setup.

* A chunked member's integrity is its chunk list: every chunk's sha256 and sizes that tile the
  member exactly. Nothing checks (or needs) a whole-member sha256.
* A tensor larger than ``PIECE`` is cut into pieces, each its own blob: a corrupt piece in the
  store is caught on pull, and names itself.
* A format-1 bundle written before (``tests/data/format1/mlp.pt2b``, by commit 5d23abf) still
  reads, verifies, pushes, pulls back byte for byte and loads.
* A weight whose bytes do not match the CRC-32 of the ``.pt2`` they come from is refused
  when bundling (the bundle copies weights straight from the user's file).
"""
from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from registry.format.bundle import BundleFile
from tests.fixtures_pt2 import run_cli
from tests.fixtures_registry import RegistryEnv
from tests.integration.test_chunk_tables import forge

FORMAT1 = Path(__file__).resolve().parents[1] / "data" / "format1" / "mlp.pt2b"


def _manifest(path: Path) -> dict:
    with zipfile.ZipFile(path) as zf:
        return json.loads(zf.read("manifest.json"))


@pytest.fixture()
def mlp_pt2(tmp_path: Path) -> Path:
    """The format-1 bundle's program as a plain `.pt2` (a 1 MiB weight among four)."""
    return BundleFile.open(FORMAT1).extract_member("programs/mlp.pt2", tmp_path / "mlp.pt2")


def _verified(r, requirement: str) -> None:
    """``verify`` passed; on a torch older than the bundle's requirement (it was made on 2.13,
    before requirements came from the programs' windows: ``>=2.13``), refused for that alone."""
    import torch
    from packaging.specifiers import SpecifierSet

    if SpecifierSet(requirement).contains(torch.__version__.split("+")[0]):
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode == 4 and f"does not satisfy the bundle's requirement '{requirement}'" in r.stderr, r.stderr


@pytest.mark.parametrize("reg_env", ["local", "team"], indirect=True)
def test_a_format1_bundle_still_reads_pushes_and_pulls(reg_env: RegistryEnv, tmp_path: Path):
    old = tmp_path / "old.pt2b"
    shutil.copyfile(FORMAT1, old)
    raw = _manifest(old)
    assert raw["format"] == 1 and all("sha256" in m for m in raw["members"])
    assert any(m.get("chunks") for m in raw["members"])
    r = reg_env.cli("verify", str(old))             # checks chunks and the programs
    _verified(r, raw["requirements"]["torch"])
    r = reg_env.cli("push", str(old), "--name", "legacy", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["digest"] == BundleFile.open(old).digest
    out = tmp_path / "pulled.pt2b"
    r = reg_env.cli("pull", "legacy@1", "-o", str(out), home=tmp_path / "inference-host")
    assert r.returncode == 0, r.stderr
    assert _manifest(out) == raw                    # still format 1, the same digest
    pulled, original = BundleFile.open(out), BundleFile.open(old)
    for m in original.manifest.members:
        with pulled.open_member(m.path) as a, original.open_member(m.path) as b:
            assert a.read() == b.read()
    r = reg_env.cli("verify", "legacy@1", home=tmp_path / "inference-host")
    _verified(r, raw["requirements"]["torch"])


@pytest.mark.parametrize("reg_env", ["local", "team"], indirect=True)
def test_a_corrupt_piece_of_a_split_tensor_is_caught_on_pull(reg_env: RegistryEnv, mlp_pt2: Path,
                                                             tmp_path: Path, monkeypatch):
    monkeypatch.setattr("registry.format.chunking.PIECE", 256 * 1024)
    bundle = tmp_path / "m.pt2b"
    assert reg_env.cli("bundle", f"mlp={mlp_pt2}", "-o", str(bundle)).returncode == 0
    member = BundleFile.open(bundle).manifest.member("programs/mlp.pt2")
    pieces = [sha for sha, n in member.chunks if n == 256 * 1024]
    assert len(pieces) >= 4 and max(n for _, n in member.chunks) == 256 * 1024  # the 1 MiB weight, in 4
    assert reg_env.cli("push", str(bundle), "--name", "m").returncode == 0
    victim = "sha256:" + pieces[2]
    reg_env.corrupt_blob(victim)
    r = reg_env.cli("pull", "m@1", "-o", str(tmp_path / "out.pt2b"), home=tmp_path / "cold")
    assert r.returncode == 5, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and victim in lines[0] and "corrupt" in lines[0], lines
    assert not (tmp_path / "out.pt2b").exists()
    cached = [p for p in (tmp_path / "cold").rglob("*") if p.is_file() and "/members/" in str(p)]
    assert cached == []                              # nothing half-verified was cached


def _cli(tmp_path: Path, *args: str):
    return run_cli(*args, env={"PT2REG_HOME": str(tmp_path / "home")})


@pytest.mark.parametrize("edit", ["missing-chunk", "short-chunk"])
def test_a_bundle_whose_chunks_do_not_tile_its_member_is_refused(mlp_pt2: Path, tmp_path: Path, edit):
    from tests.integration.test_chunk_tables import _not_tiling, _short_chunk

    bundle = tmp_path / "m.pt2b"
    assert _cli(tmp_path, "bundle", f"mlp={mlp_pt2}", "-o", str(bundle)).returncode == 0
    forged = forge(bundle, tmp_path / "forged.pt2b", {"missing-chunk": _not_tiling, "short-chunk": _short_chunk}[edit])
    for cmd in (("verify", str(forged)), ("inspect", str(forged))):
        r = _cli(tmp_path, *cmd)
        assert r.returncode == 5, (cmd, r.stdout, r.stderr)
        assert "chunks do not tile the member" in r.stderr, r.stderr


def test_a_weight_that_fails_its_crc_is_refused_when_bundling(mlp_pt2: Path, tmp_path: Path):
    from registry.format.zipsafe import read_entries

    weight = max(read_entries(mlp_pt2).values(), key=lambda e: e.size)
    data = bytearray(mlp_pt2.read_bytes())
    data[weight.data_offset + 1000] ^= 0x01         # one bit of the 1 MiB weight, on disk
    damaged = tmp_path / "damaged.pt2"
    damaged.write_bytes(bytes(data))
    r = _cli(tmp_path, "bundle", f"mlp={damaged}", "-o", str(tmp_path / "out.pt2b"))
    assert r.returncode == 5, (r.stdout, r.stderr)
    assert "CRC-32" in r.stderr and str(damaged) in r.stderr, r.stderr
    assert not (tmp_path / "out.pt2b").exists()
