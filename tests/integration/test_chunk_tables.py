"""Forged chunk tables, through the CLI on every setup: a chunked member is stored as its chunks,
and its chunk list is its integrity (format 2: no whole-member sha256). So push must check
every chunk's digest and that the chunks tile the member exactly (exit 5 and nothing published
otherwise), while any self-consistent chunking of the right bytes is fine and pulls back byte
for byte."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from registry.constants import MANIFEST_MEMBER
from registry.digests import canonical_json
from registry.format.bundle import BundleFile
from registry.format.zipwrite import DeterministicZipWriter


@pytest.fixture(scope="module")
def chunked_bundle(tmp_path_factory) -> Path:
    """A ~5 MiB bundle whose program is stored as several chunks."""
    from tests.big_bundle import BigBundles

    return BigBundles(tmp_path_factory.mktemp("chunky"), hidden=64, small=1).make(7)


def forge(src: Path, dest: Path, edit: Callable[[dict[str, Any], bytes], None]) -> Path:
    """Rewrite ``src`` with its manifest edited by ``edit(raw, member_bytes)``, members unchanged.
    No check is made: this is what an attacker (or a buggy tool) could hand to push."""
    bundle = BundleFile.open(src)
    raw = bundle.manifest.to_json()
    member = next(m for m in raw["members"] if m.get("chunks"))
    offset, size = bundle.member_span(member["path"])
    with open(src, "rb") as f:
        f.seek(offset)
        edit(member, f.read(size))
    with open(dest, "wb") as out:  # the manifest is not validated: that is push's job
        writer = DeterministicZipWriter(out)
        writer.write_bytes(MANIFEST_MEMBER, canonical_json(raw))
        for m in bundle.manifest.members:
            off, n = bundle.member_span(m.path)
            with open(src, "rb") as f:
                f.seek(off)
                writer.write_bytes(m.path, f.read(n))
        writer.close()
    return dest


def _member_bytes(bundle: BundleFile, path: str) -> bytes:
    offset, size = bundle.member_span(path)
    with open(bundle.path, "rb") as f:
        f.seek(offset)
        return f.read(size)


def _not_tiling(member: dict[str, Any], _body: bytes) -> None:
    """Every digest true, but the last chunk is left out: the chunks no longer make up the member."""
    member["chunks"] = member["chunks"][:-1]


def _short_chunk(member: dict[str, Any], body: bytes) -> None:
    """The first chunk claims 1 byte less (its digest re-computed, so it is true of those bytes):
    the chunks no longer tile the member."""
    first = member["chunks"][0]
    first["size"] -= 1
    first["sha256"] = hashlib.sha256(body[:first["size"]]).hexdigest()


def _wrong_chunk_sha(member: dict[str, Any], _body: bytes) -> None:
    big = max(member["chunks"], key=lambda c: c["size"])
    big["sha256"] = hashlib.sha256(b"not this weight").hexdigest()


def _other_tiling(member: dict[str, Any], body: bytes) -> None:
    """Cut the member differently and hash the new ranges: the right bytes, every digest true.
    The first four chunks become one (a glue chunk of several entries, as bundles made before
    entry-level chunking have), and the largest is cut in two at an odd offset."""
    sizes = [c["size"] for c in member["chunks"]]
    sizes[0:4] = [sum(sizes[0:4])]
    k = max(range(len(sizes)), key=sizes.__getitem__)
    sizes[k:k + 1] = [sizes[k] // 2 + 1, sizes[k] - sizes[k] // 2 - 1]
    chunks, pos = [], 0
    for n in sizes:
        chunks.append({"sha256": hashlib.sha256(body[pos:pos + n]).hexdigest(), "size": n})
        pos += n
    member["chunks"] = chunks


@pytest.mark.parametrize("reg_env", ["local", "team"], indirect=True)
@pytest.mark.parametrize("edit,needle", [(_not_tiling, "chunks do not tile the member"),
                                         (_short_chunk, "chunks do not tile the member"),
                                         (_wrong_chunk_sha, "does not match its digest")],
                         ids=["missing-chunk", "short-chunk", "chunk-sha"])
def test_inconsistent_chunk_table_is_refused_at_push(reg_env, chunked_bundle, tmp_path, edit, needle):
    forged = forge(chunked_bundle, tmp_path / "forged.pt2b", edit)
    r = reg_env.cli("push", str(forged), "--name", "forged")
    assert r.returncode == 5, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], lines
    assert reg_env.cli("show", "forged").returncode == 3           # nothing was published
    assert json.loads(reg_env.cli("list", "--json").stdout)["models"] == []


@pytest.mark.parametrize("reg_env", ["local", "team"], indirect=True)
def test_any_true_chunking_round_trips(reg_env, chunked_bundle, tmp_path):
    forged = forge(chunked_bundle, tmp_path / "retiled.pt2b", _other_tiling)
    r = reg_env.cli("push", str(forged), "--name", "retiled")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "pulled.pt2b"
    r = reg_env.cli("pull", "retiled@1", "-o", str(out), home=tmp_path / "other-home")
    assert r.returncode == 0, r.stderr
    pulled, original = BundleFile.open(out), BundleFile.open(chunked_bundle)
    for m in original.manifest.members:
        assert _member_bytes(pulled, m.path) == _member_bytes(original, m.path)
    assert reg_env.cli("verify", str(out)).returncode == 0
