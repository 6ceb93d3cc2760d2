"""Issue 14: torch only ever reads program bytes the registry has vetted.

A program member of a bundle is accepted only in the exact bytes the bundler writes: canonical
zip layout, an exact member allowlist, canonical JSON, payloads backed by their bytes, no native
code outside an AOTInductor variant, no pickled objects (pickled tensors only with
--trust-pickle). Each attack below is tried at ``bundle`` (where it is a .pt2 the user hands
over), at ``push``, and at ``verify``/``run``/``registry.load`` of a bundle file and of a
registry ref (pushed by a client that skipped the checks, as a hostile or old publisher
would): every path ends with exit 5, one line naming the program and the offending member or
field, and the marker file a payload would create never appears.
"""
from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

import pytest

from registry.errors import UnsafeArchiveError
from registry.format.bundle import BundleFile
from registry.format.zipsafe import read_canonical_entries
from tests.cli_inprocess import push_unchecked, refused
from tests.hostile import (
    bundle_with_raw_member,
    canonical_pt2_bytes,
    evil_pickle,
    pt2_with_pickled_constant,
    pt2_with_sympy_payload,
    read_json_member,
    rewrite_pt2,
)

MEMBER = "programs/decoder.pt2"


@pytest.fixture(scope="module")
def good(bundles) -> bytes:
    """The decoder program member as the bundler wrote it (canonical)."""
    b = BundleFile.open(bundles["ed"])
    with b.open_member(MEMBER) as f:
        return f.read()


# ------------------------------------------------------------------------- layout attacks (class 2)

def _cd(data: bytes) -> tuple[int, int, int]:
    """(central directory offset, size, end record offset) of a zip without zip64."""
    eocd = len(data) - 22
    _sig, _d, _cd, _n1, _n2, size, offset, _c = struct.unpack("<4s4H2LH", data[eocd:])
    return offset, size, eocd


def _shift_after(data: bytes, index: int, junk: bytes) -> bytes:
    """Insert ``junk`` before member ``index``'s local header, fixing every offset so that
    Python's zipfile still reads the archive (a gap torch's reader and ours disagree on)."""
    offset, size, eocd = _cd(data)
    names = list(read_canonical_entries_bytes(data))
    at = names[index][1]
    cd = bytearray(data[offset:offset + size])
    pos = 0
    while pos < len(cd):
        nlen, xlen, clen = struct.unpack_from("<3H", cd, pos + 28)
        (rel,) = struct.unpack_from("<L", cd, pos + 42)
        if rel >= at:
            struct.pack_into("<L", cd, pos + 42, rel + len(junk))
        pos += 46 + nlen + xlen + clen
    end = bytearray(data[eocd:])
    struct.pack_into("<L", end, 16, offset + len(junk))
    return data[:at] + junk + data[at:offset] + bytes(cd) + bytes(end)


def read_canonical_entries_bytes(data: bytes) -> list[tuple[str, int]]:
    import io

    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return [(i.filename, i.header_offset) for i in z.infolist()]


def _prepended(data: bytes) -> bytes:
    # zipfile shifts every offset by the prepended bytes; torch's reader does not
    return _shift_after(data, 0, b"PK\x03\x04" + b"\0" * 60)


def _comment(data: bytes) -> bytes:
    end = bytearray(data[-22:])
    struct.pack_into("<H", end, 20, 12)
    return data[:-22] + bytes(end) + b"hidden stuff"


def _local_name_case(data: bytes) -> bytes:
    # the local header names the graph in other case than the central directory does
    needle = b"archive/models/model.json"
    at = data.index(needle)
    return data[:at] + b"archive/models/MODEL.json" + data[at + len(needle):]


def _foreign_zip(data: bytes) -> bytes:
    # the same members written by Python's zipfile with its own headers (dates, no padding)
    import io

    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as z:
        for info in src.infolist():
            z.writestr(info.filename, src.read(info.filename))
    return out.getvalue()


LAYOUT_ATTACKS = {
    "prepended": (_prepended, "before the first member"),
    "trailing": (lambda d: d + b"PK\x05\x06" + b"\0" * 30, "end-of-archive record"),
    "comment": (_comment, "end-of-archive record"),
    "gap": (lambda d: _shift_after(d, 2, b"\0" * 64), "gap"),
    "hidden_member": (lambda d: _shift_after(d, 1, b"PK\x03\x04archive/data/aotinductor/model/x.so"), "gap"),
    "local_name": (_local_name_case, "local header"),
    "foreign_zip": (_foreign_zip, "non-canonical attributes"),
}


@pytest.mark.parametrize("attack", sorted(LAYOUT_ATTACKS))
def test_non_canonical_zip_is_refused_everywhere(pt2reg, bundles, good, tmp_path, marker, monkeypatch, attack):
    craft, words = LAYOUT_ATTACKS[attack]
    data = craft(good)
    crafted = bundle_with_raw_member(bundles["ed"], tmp_path / "crafted.pt2b", MEMBER, data, canonical=False)
    refused(pt2reg("push", crafted, "--name", "team/crafted"), MEMBER, words)
    assert pt2reg("list", "--json").exit_code == 0
    assert "team/crafted" not in pt2reg("list", "--json").stdout
    for args in (("verify", crafted), ("run", crafted, "--samples"), ("run", crafted, "--trust-pickle", "--samples")):
        refused(pt2reg(*args), "decoder", MEMBER)
    push_unchecked(pt2reg.home, crafted, "team/crafted", monkeypatch)
    for args in (("verify", "team/crafted@1"), ("run", "team/crafted@1", "--samples")):
        refused(pt2reg(*args), "decoder", MEMBER, words)
    import registry

    monkeypatch.setenv("PT2REG_HOME", str(pt2reg.home))
    with pytest.raises(UnsafeArchiveError, match="not a canonical program archive"):
        registry.load("team/crafted@1")
    with pytest.raises(UnsafeArchiveError, match="not a canonical program archive"):
        registry.load(crafted, cache_dir=tmp_path / "cache")


def test_canonical_reader_accepts_exactly_what_the_writer_writes(good, tmp_path):
    path = tmp_path / "p.pt2"
    path.write_bytes(good)
    entries = read_canonical_entries(path)
    assert next(iter(entries.values())).header_offset == 0
    for craft, _ in LAYOUT_ATTACKS.values():
        path.write_bytes(craft(good))
        with pytest.raises(UnsafeArchiveError):
            read_canonical_entries(path)


# ------------------------------------------------------------ member names and native code (3, 4)

def _member_attack(kind: str, src: Path, dest: Path, marker: Path) -> tuple[Path, str]:
    if kind == "case_below_first_folder":
        return (rewrite_pt2(src, dest, add={"data/Sample_Inputs/model.pt": evil_pickle(marker)}),
                "data/Sample_Inputs/model.pt")
    if kind == "case_file_name":
        return (rewrite_pt2(src, dest, add={"data/sample_inputs/MODEL.pt": evil_pickle(marker)}),
                "data/sample_inputs/MODEL.pt")
    if kind == "unreferenced_weight":
        return (rewrite_pt2(src, dest, add={"data/weights/model.pt": evil_pickle(marker)}), "data/weights/model.pt")
    if kind == "unknown_folder":
        return (rewrite_pt2(src, dest, add={"data/misc/payload.pkl": evil_pickle(marker)}), "data/misc/payload.pkl")
    if kind == "sample_inputs_of_no_program":
        return (rewrite_pt2(src, dest, add={"data/sample_inputs/other.pt": evil_pickle(marker)}),
                "data/sample_inputs/other.pt")
    if kind == "native_in_portable":
        return (rewrite_pt2(src, dest, add={"data/aotinductor/model/x.wrapper.so": b"\x7fELF" + b"\0" * 60}),
                "data/aotinductor/model/x.wrapper.so")
    if kind == "native_in_extra":
        return rewrite_pt2(src, dest, add={"extra/libevil.so": b"\x7fELF" + b"\0" * 60}), "extra/libevil.so"
    if kind == "config_path_escape":
        cfg = read_json_member(src, "data/weights/model_weights_config.json")
        next(iter(cfg["config"].values()))["path_name"] = "../../models/model.json"
        return (rewrite_pt2(src, dest, {"data/weights/model_weights_config.json": json.dumps(cfg).encode()}),
                "../../models/model.json")
    raise AssertionError(kind)


MEMBER_ATTACKS = ["case_below_first_folder", "case_file_name", "unreferenced_weight", "unknown_folder",
                  "sample_inputs_of_no_program", "native_in_portable", "native_in_extra", "config_path_escape"]


@pytest.mark.parametrize("kind", MEMBER_ATTACKS)
def test_members_outside_the_allowlist_arerefused(pt2reg, pt2_dir, bundles, tmp_path, marker, monkeypatch, kind):
    evil, needle = _member_attack(kind, pt2_dir / "decoder.pt2", tmp_path / "evil.pt2", marker)
    out = tmp_path / "x.pt2b"
    refused(pt2reg("bundle", f"decoder={evil}", "--sample", f"decoder={pt2_dir / 'decoder_inputs.pt'}",
                    "-o", out), needle)
    assert not out.exists()
    crafted = bundle_with_raw_member(bundles["ed"], tmp_path / "crafted.pt2b", MEMBER, evil.read_bytes())
    refused(pt2reg("push", crafted, "--name", "team/crafted"), MEMBER, needle)
    for args in (("verify", crafted), ("run", crafted, "--samples", "--trust-pickle")):
        refused(pt2reg(*args), "decoder", needle)
    push_unchecked(pt2reg.home, crafted, "team/crafted", monkeypatch)
    refused(pt2reg("run", "team/crafted@1", "--samples", "--trust-pickle"), "decoder", needle)


def test_aoti_package_labelled_portable_isrefused(pt2reg, bundles, tmp_path):
    """A member the manifest calls a portable program but that is an AOTInductor package
    (torch would dlopen its library) is refused for what it is."""
    import io

    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as z:
        for name, data in (("x/data/aotinductor/model/x.wrapper.so", b"\x7fELF" + b"\0" * 60),
                           ("x/data/aotinductor/model/x.wrapper_metadata.json", b'{"AOTI_DEVICE_KEY": "cpu"}'),
                           ("x/archive_format", b"pt2"), ("x/archive_version", b"0")):
            z.writestr(name, data)
    crafted = bundle_with_raw_member(bundles["ed"], tmp_path / "crafted.pt2b", MEMBER, out.getvalue())
    refused(pt2reg("push", crafted, "--name", "team/crafted"), MEMBER, "AOTInductor package")
    refused(pt2reg("run", crafted, "--samples", "--trust-pickle"), "decoder", "AOTInductor package")


# ----------------------------------------------------------------- payload sizes (class 7, bombs)

def _payload_attack(kind: str, src: Path, dest: Path) -> tuple[Path, str]:
    cfg = read_json_member(src, "data/weights/model_weights_config.json")
    fqn, item = next(iter(cfg["config"].items()))
    meta = item["tensor_meta"]
    replace: dict[str, bytes] = {}
    if kind == "huge_shape_zero_bytes":  # torch would allocate zeros(1<<20, 1<<20)
        meta["sizes"] = [{"as_int": 1 << 20}, {"as_int": 1 << 20}]
        meta["strides"] = [{"as_int": 1 << 20}, {"as_int": 1}]
        replace[f"data/weights/{item['path_name']}"] = b""
    elif kind == "shape_past_bytes":
        meta["sizes"] = [{"as_int": 1 << 16}, {"as_int": 1 << 10}]
        meta["strides"] = [{"as_int": 1 << 10}, {"as_int": 1}]
    elif kind == "offset_past_bytes":
        meta["storage_offset"] = {"as_int": 1 << 30}
    elif kind == "odd_byte_count":
        replace[f"data/weights/{item['path_name']}"] = b"\0" * 7
    elif kind == "unknown_dtype":
        meta["dtype"] = 99
    else:
        raise AssertionError(kind)
    replace["data/weights/model_weights_config.json"] = json.dumps(cfg).encode()
    return rewrite_pt2(src, dest, replace), fqn


PAYLOAD_ATTACKS = ["huge_shape_zero_bytes", "shape_past_bytes", "offset_past_bytes", "odd_byte_count",
                   "unknown_dtype"]


@pytest.mark.parametrize("kind", PAYLOAD_ATTACKS)
def test_declared_shapes_must_match_stored_bytes(pt2reg, pt2_dir, bundles, tmp_path, monkeypatch, kind):
    import resource

    evil, fqn = _payload_attack(kind, pt2_dir / "decoder.pt2", tmp_path / "evil.pt2")
    out = tmp_path / "x.pt2b"
    refused(pt2reg("bundle", f"decoder={evil}", "-o", out), fqn)
    crafted = bundle_with_raw_member(bundles["ed"], tmp_path / "crafted.pt2b", MEMBER, evil.read_bytes())
    refused(pt2reg("push", crafted, "--name", "team/crafted"), fqn)
    push_unchecked(pt2reg.home, crafted, "team/crafted", monkeypatch)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    refused(pt2reg("run", "team/crafted@1", "--samples", "--trust-pickle"), "decoder", fqn)
    # refused from the config alone: nothing close to the declared size was allocated
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 256 * 1024


# -------------------------------------------------------- flags never widen more than they say (6)

def test_trust_pickle_does_not_switch_off_graph_vetting(pt2reg, pt2_dir, bundles, tmp_path, marker, monkeypatch):
    evil = pt2_with_sympy_payload(pt2_dir / "decoder.pt2", tmp_path / "evil.pt2", marker)
    crafted = bundle_with_raw_member(bundles["ed"], tmp_path / "crafted.pt2b", MEMBER, evil.read_bytes())
    push_unchecked(pt2reg.home, crafted, "team/crafted", monkeypatch)
    for args in (("run", crafted, "--samples", "--trust-pickle"), ("run", "team/crafted@1", "--trust-pickle", "--samples"),
                 ("verify", "team/crafted@1", "--trust-pickle")):
        refused(pt2reg(*args), "decoder", "is refused before torch reads it")
    import registry

    monkeypatch.setenv("PT2REG_HOME", str(pt2reg.home))
    with pytest.raises(UnsafeArchiveError, match="is refused before torch reads it"):
        registry.load("team/crafted@1", trust_pickle=True)


@pytest.mark.parametrize("prefix", ["opaque_obj_", "custom_obj_"])
def test_trust_pickle_permits_pickled_tensors_and_nothing_else(pt2reg, pt2_dir, bundles, tmp_path, marker,
                                                               monkeypatch, prefix):
    evil = pt2_with_pickled_constant(pt2_dir / "decoder.pt2", tmp_path / "evil.pt2", marker, prefix)
    crafted = bundle_with_raw_member(bundles["ed"], tmp_path / "crafted.pt2b", MEMBER, evil.read_bytes())
    assert pt2reg("push", crafted, "--name", "team/crafted").exit_code == 0  # the loader decides
    for ref in (crafted, "team/crafted@1"):
        refused(pt2reg("run", ref, "--samples", "--trust-pickle"), "decoder", "pickled objects",
                 f"data/constants/{prefix}0")
        r = pt2reg("verify", ref, "--trust-pickle", "--json")
        doc = json.loads(r.stdout)
        assert r.exit_code == 5 and not doc["compatible"]
        assert [(f["code"], f["severity"]) for f in doc["findings"]] == [("pickle", "error")]
    import registry

    monkeypatch.setenv("PT2REG_HOME", str(pt2reg.home))
    with pytest.raises(UnsafeArchiveError, match="pickled objects"):
        registry.load("team/crafted@1", trust_pickle=True)


def test_canonical_pt2_bytes_keep_content(good, tmp_path):
    """The test helper that lays hostile content out canonically is itself canonical."""
    path = tmp_path / "p.pt2"
    path.write_bytes(canonical_pt2_bytes(good))
    assert path.read_bytes() == good
