"""Issue 6: hostile bundles are refused by `inspect` and `push` with exit 5, one clear line
naming the check that refused them (the zip bomb because its members are compressed, which
is refused before anything is inflated), and nothing is published."""
import json
import os

import pytest

from registry.digests import canonical_json
from tests.unit.test_archive_hostile import PAYLOAD, manifest_for, raw_zip, zip_bomb


def _schema_invalid(path):
    bad = json.loads(manifest_for().canonical)
    bad["programs"]["model"]["inputs"] = "not a list"
    return raw_zip(path, [("programs/model.pt2", PAYLOAD)], canonical_json(bad))


def _truncated(path):
    raw_zip(path, [("programs/model.pt2", PAYLOAD)])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 40])
    return path


def _manifest_text(edit):
    return edit(manifest_for().canonical.decode())


def _junk_signatures(path):
    sigs = {"signatures": [{"algorithm": "ed25519", "key_id": "sha256:" + "a" * 64, "signature": "bm90IGEgc2ln"}]}
    return raw_zip(path, [("programs/model.pt2", PAYLOAD), ("signatures.json", json.dumps(sigs).encode())])


CASES = {
    "path-escaping": (lambda p: raw_zip(p, [("programs/model.pt2", PAYLOAD), ("../../escape", b"x")]), "unsafe member path"),
    "unlisted": (lambda p: raw_zip(p, [("programs/model.pt2", PAYLOAD), ("extra.sh", b"x")]), "not listed"),
    "zip-bomb": (zip_bomb, "compressed"),
    "truncated": (_truncated, ""),
    "schema-invalid": (_schema_invalid, "invalid manifest"),
    "nan-number": (lambda p: raw_zip(p, [("programs/model.pt2", PAYLOAD)],
                                     _manifest_text(lambda t: t.replace('"format":1', '"format":NaN')).encode()),
                   "NaN"),
    "float-format": (lambda p: raw_zip(p, [("programs/model.pt2", PAYLOAD)],
                                       _manifest_text(lambda t: t.replace('"format":1', '"format":1.0')).encode()),
                     "format"),
    "deep-nesting": (lambda p: raw_zip(p, [("programs/model.pt2", PAYLOAD)],
                                       b'{"a":' * 50_000 + b"1" + b"}" * 50_000), "nested too deeply"),
}
#: refused by push only: inspect shows what is in the file
PUSH_ONLY = {
    "junk-signature": (_junk_signatures, "64-byte ed25519 signature"),
}


@pytest.mark.parametrize("reg_env", ["local"], indirect=True)
@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_bundles_refused_by_inspect_and_push(reg_env, tmp_path, case):
    build, needle = CASES[case]
    path = build(tmp_path / f"{case}.pt2b")
    for args in (["inspect", str(path)], ["push", str(path), "--name", "hostile"]):
        r = reg_env.cli(*args)
        assert r.returncode == 5, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], lines
    listing = reg_env.cli("list", "--json")
    assert json.loads(listing.stdout)["models"] == []


@pytest.mark.parametrize("reg_env", ["local"], indirect=True)
@pytest.mark.parametrize("case", sorted(PUSH_ONLY))
def test_push_refuses_malformed_signatures(reg_env, tmp_path, case):
    build, needle = PUSH_ONLY[case]
    path = build(tmp_path / f"{case}.pt2b")
    r = reg_env.cli("push", str(path), "--name", "hostile")
    assert r.returncode == 5 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert json.loads(reg_env.cli("list", "--json").stdout)["models"] == []


@pytest.mark.parametrize("reg_env", ["local"], indirect=True)
def test_repush_of_a_damaged_copy_fails_even_when_every_blob_is_stored(reg_env, bundles, tmp_path):
    """Dedup must not skip verification: a copy with one flipped byte in any member is refused
    although the store already holds every blob of the intact bundle."""
    from registry.format.bundle import BundleFile

    good = bundles["ed"]
    assert reg_env.cli("push", str(good), "--name", "ed").returncode == 0
    src = BundleFile.open(good)
    for m in src.manifest.members:
        offset, size = src.member_span(m.path)
        damaged = tmp_path / "damaged.pt2b"
        data = bytearray(good.read_bytes())
        data[offset + size // 2] ^= 0x01
        damaged.write_bytes(bytes(data))
        r = reg_env.cli("push", str(damaged), "--name", "ed")
        assert r.returncode == 5, (m.path, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    versions = json.loads(reg_env.cli("list", "ed", "--json").stdout)
    assert len(versions["versions"]) == 1, versions


@pytest.mark.parametrize("reg_env", ["local", "moto"], indirect=True)
def test_push_replaces_a_stored_blob_of_the_wrong_size(reg_env, bundles, tmp_path):
    """A damaged (truncated) blob in the store is not trusted by a later push of the same bytes:
    it is replaced, and the new version pulls byte-identical."""
    from registry.format.bundle import BundleFile

    good = bundles["v3"]
    assert reg_env.cli("push", str(good), "--name", "a").returncode == 0
    m = BundleFile.open(good).manifest.members[0]
    digest = f"sha256:{m.chunks[0][0]}" if m.chunks else m.digest
    loc = reg_env.blob_location(digest)
    if isinstance(loc, tuple):
        reg_env.s3_client().put_object(Bucket=loc[0], Key=loc[1], Body=b"short")
    else:
        os.chmod(loc, 0o644)
        loc.write_bytes(b"short")
    assert reg_env.cli("push", str(good), "--name", "b").returncode == 0
    out = tmp_path / "b.pt2b"
    r = reg_env.cli("pull", "b@1", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == good.read_bytes()
