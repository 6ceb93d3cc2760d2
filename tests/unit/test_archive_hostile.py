"""Issue 6 (archive hygiene): hostile bundles are refused quickly, in bounded memory, with
exit 5 and one clear line; a fuzzer only ever sees the project's own errors."""
import io
import json
import stat
import struct
import time
import zipfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from registry.digests import canonical_json, sha256_bytes
from registry.errors import IntegrityError, RegistryError, UnsafeArchiveError
from registry.format.bundle import BundleFile, write_bundle
from registry.format.manifest import Manifest
from tests.unit.test_manifest import minimal

PAYLOAD = b"not really a program, but bytes with a digest" * 10


def manifest_for(payload: bytes = PAYLOAD) -> Manifest:
    raw = minimal()
    raw["members"][0].update(sha256=sha256_bytes(payload), size=len(payload))
    return Manifest.from_raw(raw)


@pytest.fixture
def good(tmp_path) -> Path:
    path = tmp_path / "good.pt2b"
    write_bundle(path, manifest_for(), {"programs/model.pt2": lambda: io.BytesIO(PAYLOAD)})
    return path


def raw_zip(path: Path, members: list[tuple], manifest: bytes | None = None) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("manifest.json", manifest if manifest is not None else manifest_for().canonical)
        for item in members:
            name, data = item[0], item[1]
            info = zipfile.ZipInfo(name)
            if len(item) > 2:
                item[2](info)
            z.writestr(info, data)
    return path


def test_good_bundle_opens_and_verifies(good):
    b = BundleFile.open(good)
    b.verify()
    assert b.digest == manifest_for().digest


def _symlink(info):
    info.external_attr = (stat.S_IFLNK | 0o777) << 16


def _deflate(info):
    info.compress_type = zipfile.ZIP_DEFLATED


@pytest.mark.parametrize("name,members,pattern", [
    ("unlisted", [("programs/model.pt2", PAYLOAD), ("extra/evil.sh", b"rm -rf /")], "not listed"),
    ("traversal", [("programs/model.pt2", PAYLOAD), ("../../etc/passwd", b"x")], "unsafe member path"),
    ("absolute", [("programs/model.pt2", PAYLOAD), ("/etc/passwd", b"x")], "unsafe member path"),
    ("symlink", [("programs/model.pt2", PAYLOAD, _symlink)], "symlink"),
    ("compressed", [("programs/model.pt2", PAYLOAD, _deflate)], "compressed"),
    ("size", [("programs/model.pt2", PAYLOAD + b"!")], "bytes, the manifest says"),
    ("missing", [], "missing"),
])
def test_hostile_structure_is_refused(tmp_path, name, members, pattern):
    path = raw_zip(tmp_path / f"{name}.pt2b", members)
    with pytest.raises((UnsafeArchiveError, IntegrityError), match=pattern) as e:
        BundleFile.open(path)
    assert e.value.exit_code == 5


def test_duplicate_member_names_refused(tmp_path):
    path = tmp_path / "dup.pt2b"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("manifest.json", manifest_for().canonical)
        z.writestr("programs/model.pt2", PAYLOAD)
        with pytest.warns(UserWarning):
            z.writestr("programs/model.pt2", b"evil")
    with pytest.raises(UnsafeArchiveError, match="duplicate"):
        BundleFile.open(path)


def test_schema_invalid_and_non_canonical_manifests(tmp_path):
    bad = json.loads(manifest_for().canonical)
    bad["members"][0]["path"] = "../x"
    with pytest.raises(IntegrityError, match="invalid manifest"):
        BundleFile.open(raw_zip(tmp_path / "a.pt2b", [], canonical_json(bad)))
    pretty = json.dumps(json.loads(manifest_for().canonical), indent=2).encode()
    with pytest.raises(IntegrityError, match="canonical"):
        BundleFile.open(raw_zip(tmp_path / "b.pt2b", [("programs/model.pt2", PAYLOAD)], pretty))
    with pytest.raises(IntegrityError, match="not valid JSON"):
        BundleFile.open(raw_zip(tmp_path / "c.pt2b", [], b"{not json"))


def test_truncated_file(good, tmp_path):
    data = good.read_bytes()
    for cut in (10, len(data) // 2, len(data) - 5):
        p = tmp_path / f"t{cut}.pt2b"
        p.write_bytes(data[:cut])
        with pytest.raises(UnsafeArchiveError):
            BundleFile.open(p)


def zip_bomb(path: Path) -> Path:
    """A bundle whose program member is 512 MiB of zeros deflated to ~0.5 MiB."""
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk = b"\0" * (1 << 20)
    body = b"".join(comp.compress(chunk) for _ in range(512)) + comp.flush()
    crc = 0
    for _ in range(512):
        crc = zlib.crc32(chunk, crc)
    mf = manifest_for().canonical
    out = io.BytesIO()
    entries = []
    for n, data, method, usize, c in ((b"manifest.json", mf, 0, len(mf), zlib.crc32(mf)),
                                      (b"programs/model.pt2", body, 8, 512 << 20, crc)):
        entries.append((n, out.tell(), method, len(data), usize, c))
        out.write(struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, method, 0, 0, c, len(data), usize, len(n), 0))
        out.write(n + data)
    cd = out.tell()
    for n, off, method, csize, usize, c in entries:
        out.write(struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, method, 0, 0, c, csize, usize,
                              len(n), 0, 0, 0, 0, 0, off) + n)
    out.write(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 2, 2, out.tell() - cd, cd, 0))
    path.write_bytes(out.getvalue())
    return path


def test_zip_bomb_refused_fast_without_inflating(tmp_path):
    path = zip_bomb(tmp_path / "bomb.pt2b")
    assert path.stat().st_size < 2 << 20
    start = time.monotonic()
    with pytest.raises(UnsafeArchiveError, match="compressed"):
        BundleFile.open(path)
    assert time.monotonic() - start < 2


def test_stored_member_claiming_huge_size_is_refused(good, tmp_path):
    data = bytearray(good.read_bytes())
    central = data.find(b"PK\x01\x02")  # first central-directory entry
    header = data.find(b"programs/model.pt2", central) - 46  # its fixed part is 46 bytes
    struct.pack_into("<LL", data, header + 20, 512 << 20, 512 << 20)  # compressed, uncompressed size
    p = tmp_path / "huge.pt2b"
    p.write_bytes(bytes(data))
    with pytest.raises(UnsafeArchiveError):
        BundleFile.open(p)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(min_value=0), st.integers(min_value=0, max_value=255)),
                min_size=1, max_size=8))
def test_fuzz_mutated_bundles_only_raise_registry_errors(good, tmp_path, flips):
    data = bytearray(good.read_bytes())
    for pos, value in flips:
        data[pos % len(data)] = value
    p = tmp_path / "fuzz.pt2b"
    p.write_bytes(bytes(data))
    try:
        BundleFile.open(p).verify()
    except RegistryError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
                    max_leaves=30))
def test_fuzz_manifests_only_raise_registry_errors(value):
    raw = minimal()
    raw["programs"]["model"]["inputs"] = value
    try:
        Manifest.from_raw(raw)
    except RegistryError:
        pass
    try:
        Manifest.from_bytes(canonical_json(value) if not isinstance(value, str) else value.encode())
    except RegistryError:
        pass
