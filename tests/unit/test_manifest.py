import copy
import json
from pathlib import Path

import pytest

from registry.errors import ManifestError, UnsupportedFormatError
from registry.format.manifest import Manifest, load_schema

ROOT = Path(__file__).resolve().parents[2]


def minimal() -> dict:
    member = {"path": "programs/model.pt2", "sha256": "0" * 64, "size": 10, "role": "program"}
    program = {
        "variants": [{"id": "portable", "kind": "exported_program", "member": member["path"],
                      "archive_name": "model"}],
        "inputs": [{"name": "x", "dtype": "float32", "shape": [{"min": 1, "max": 8, "expr": "s0", "dim": "b"}, 4],
                    "kind": "positional", "path": "args[0]"}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": [4], "path": "out"}],
        "range_constraints": [{"expr": "s0", "min": 1, "max": 8, "dim": "b"}],
        "required_ops": [], "torchbind_classes": [], "baked_devices": [], "dtypes": ["float32"],
        "serialization": {"torch_version": "2.13.0", "schema_version": [8, 20], "opset_version": {"aten": 10}},
    }
    return {"format": 1, "kind": "pt2-bundle", "programs": {"model": program}, "members": [member],
            "samples": [], "requirements": {"torch": ">=2.13", "device_types": None, "hardware_dtypes": []},
            "metadata": {"k": "v"}, "environment": {"python": "3.11", "torch": "2.13.0", "platform": "linux"}}


def test_packaged_schema_is_the_repository_schema():
    assert load_schema() == json.loads((ROOT / "schema" / "manifest.schema.json").read_text())


def test_packaged_schema_is_a_valid_schema_of_its_draft():
    """The validator trusts the shipped schema (no metaschema check per process): checked here."""
    import jsonschema

    schema = load_schema()
    jsonschema.validators.validator_for(schema).check_schema(schema)
    broken = {**schema, "properties": {**schema["properties"], "format": {"type": "no-such-type"}}}
    with pytest.raises(jsonschema.SchemaError):
        jsonschema.validators.validator_for(broken).check_schema(broken)


def test_minimal_manifest_is_valid_and_digest_is_canonical():
    m = Manifest.from_raw(minimal())
    again = Manifest.from_raw(json.loads(json.dumps(minimal(), indent=4)))
    assert m.digest == again.digest and m.digest.startswith("sha256:")
    assert list(m.programs) == ["model"]


def test_every_problem_is_reported_at_once():
    raw = minimal()
    raw["members"][0]["sha256"] = "xyz"
    raw["metadata"] = {"k": 1}
    with pytest.raises(ManifestError) as e:
        Manifest.from_raw(raw)
    assert len(e.value.problems) == 2
    assert e.value.exit_code == 5


def test_unknown_keys_are_rejected():
    raw = minimal()
    raw["programs"]["model"]["surprise"] = True
    with pytest.raises(ManifestError):
        Manifest.from_raw(raw)


def test_future_format_says_so():
    raw = minimal()
    raw["format"] = 3
    with pytest.raises(UnsupportedFormatError) as e:
        Manifest.from_raw(raw)
    assert "newer" in str(e.value) and e.value.exit_code == 4


@pytest.mark.parametrize("path", ["/abs", "../up", "a/../b", "a//b", "a\\b"])
def test_member_paths_must_be_safe(path):
    raw = minimal()
    raw["members"][0]["path"] = path
    raw["programs"]["model"]["variants"][0]["member"] = path
    with pytest.raises(ManifestError):
        Manifest.from_raw(raw)


def test_cross_field_checks():
    raw = minimal()
    raw["programs"]["model"]["variants"][0]["member"] = "programs/other.pt2"
    with pytest.raises(ManifestError, match="not listed"):
        Manifest.from_raw(raw)
    raw = copy.deepcopy(minimal())
    raw["samples"] = [{"name": "s", "program": "nope", "member": "programs/model.pt2", "inputs": [],
                       "outputs": [], "rtol": 0, "atol": 0}]
    with pytest.raises(ManifestError, match="unknown program"):
        Manifest.from_raw(raw)


@pytest.mark.parametrize("edit", [
    lambda r: r.__setitem__("format", 1.0),
    lambda r: r["members"][0].__setitem__("size", 10.0),
    lambda r: r["programs"]["model"]["range_constraints"][0].__setitem__("max", 8.0),
])
def test_integers_written_as_floats_are_refused(edit):
    raw = minimal()
    edit(raw)
    with pytest.raises(ManifestError):
        Manifest.from_raw(raw)
    with pytest.raises(ManifestError):
        Manifest.from_bytes(json.dumps(raw).encode())


@pytest.mark.parametrize("data", [
    b'{"format": NaN}', b'{"format": Infinity}', b'{"format": -Infinity}',
    b"[" * 200_000 + b"]" * 200_000, b'{"a":' * 20_000 + b"1" + b"}" * 20_000,
])
def test_non_json_numbers_and_deep_nesting_are_manifest_errors(data):
    with pytest.raises(ManifestError) as info:
        Manifest.from_bytes(data)
    assert info.value.exit_code == 5


def test_required_op_dispatcher_names():
    """The key of an op in a target's ``custom_ops`` (was ``runtime.target.op_key``)."""
    from registry.format.manifest import RequiredOp

    assert RequiredOp("mylib::f", "default", "torch.ops.mylib.f.default", None).dispatcher_name == "mylib::f"
    assert RequiredOp("quantized::add", "out", "torch.ops.quantized.add.out", None).dispatcher_name == "quantized::add.out"


def test_typed_view_reads_every_field_and_writes_the_same_json():
    from registry.digests import canonical_json
    from registry.format.manifest import Dim

    raw = minimal()
    raw["programs"]["model"]["in_spec"] = None               # optional keys given as null stay given
    raw["programs"]["model"]["constant_inputs"] = []
    raw["programs"]["model"]["variants"].append(
        {"id": "aoti-cpu", "kind": "aoti", "member": "programs/model.aoti.pt2", "archive_name": "model",
         "target": {"device_key": "cpu", "compute_capability": None}})
    raw["members"].append({"path": "programs/model.aoti.pt2", "sha256": "1" * 64, "size": 3, "role": "aoti",
                           "chunks": [{"sha256": "1" * 64, "size": 3}]})
    raw["samples"] = [{"name": "s", "program": "model", "member": "samples/s.safetensors", "inputs": ["input.0"],
                       "outputs": ["output.0"], "rtol": 0, "atol": 1e-5}]
    raw["members"].append({"path": "samples/s.safetensors", "sha256": "2" * 64, "size": 1, "role": "sample"})
    raw["members"].sort(key=lambda e: e["path"])
    raw["requirements"]["min_compute_capability"] = None
    m = Manifest.from_raw(raw)
    prog = m.programs["model"]
    (x,) = prog.inputs
    assert x.shape == (Dim(1, 8, "s0", "b"), 4) and x.dims[0].label == "b" and x.path == "args[0]"
    assert prog.serialization.schema_version == (8, 20) and prog.in_spec is None and prog.constant_inputs == ()
    assert prog.variant("aoti-cpu").target.device_key == "cpu" and prog.portable.id == "portable"
    assert m.member("programs/model.aoti.pt2").chunks == (("1" * 64, 3),)
    assert m.samples[0].rtol == 0 and type(m.samples[0].rtol) is int
    assert canonical_json(m.to_json()) == m.canonical == canonical_json(raw)
    del raw["programs"]["model"]["in_spec"], raw["requirements"]["min_compute_capability"]
    assert canonical_json(Manifest.from_raw(raw).to_json()) == canonical_json(raw)


def test_warnings_name_baked_devices_and_unknown_op_schemas():
    raw = minimal()
    raw["programs"]["model"]["baked_devices"] = [
        {"op": "torch.ops.aten.arange.start", "arg": "device", "device": "cpu", "source": "m.py:3",
         "code": "pos = torch.arange(n, device='cpu')"}]
    raw["programs"]["model"]["required_ops"] = [
        {"name": "mylib::f", "overload": "default", "target": "torch.ops.mylib.f.default", "schema": None}]
    assert Manifest.from_raw(raw).warnings() == [
        "program 'model': device 'cpu' baked into 1 op at m.py:3 (arange): pos = torch.arange(n, device='cpu')",
        "program 'model': custom op mylib::f is required; its schema was not known at bundle time"]


def _chunked(n: int = 50) -> dict:
    """``minimal()`` with its program member split into ``n`` chunks (format 2)."""
    raw = minimal()
    raw["format"] = 2
    member = raw["members"][0]
    del member["sha256"]
    member["chunks"] = [{"sha256": f"{i:064x}", "size": 1} for i in range(n)]
    member["size"] = n
    return raw


@pytest.mark.parametrize("item, problem", [
    ({"sha256": "A" * 64, "size": 1}, "is not 64 lowercase hex digits"),
    ({"sha256": "a" * 63 + " ", "size": 1}, "is not 64 lowercase hex digits"),
    ({"sha256": "a" * 62 + "\u0663\u0663", "size": 1}, "is not 64 lowercase hex digits"),
    ({"sha256": "a" * 65, "size": 1}, "is not 64 lowercase hex digits"),
    ({"sha256": 7, "size": 1}, "is not 64 lowercase hex digits"),
    ({"sha256": "a" * 64, "size": True}, "is not an integer >= 0"),
    ({"sha256": "a" * 64, "size": -1}, "is not an integer >= 0"),
    ({"sha256": "a" * 64, "size": 1.0}, "is not an integer >= 0"),
    ({"sha256": "a" * 64}, "not an object of exactly"),
    ({"sha256": "a" * 64, "sizes": 1}, "not an object of exactly"),
    ({"sha256": "a" * 64, "size": 1, "x": 1}, "not an object of exactly"),
    (["a" * 64, 1], "not an object of exactly"),
])
def test_every_chunk_item_is_checked_past_the_first(item, problem):
    """Chunk lists are checked by whole-list operations first (a 10,000-chunk manifest), then
    one by one for the message: a bad item anywhere past the first is named."""
    raw = _chunked()
    raw["members"][0]["chunks"][37] = item
    with pytest.raises(ManifestError) as info:
        Manifest.from_raw(raw)
    assert any(p.startswith("members/0/chunks/37") and problem in p for p in info.value.problems), info.value.problems


def test_a_chunked_members_identity_is_the_canonical_json_of_its_chunk_list():
    from registry.digests import canonical_json, digest_of_bytes
    from registry.format.manifest import chunk_list_json

    m = Manifest.from_raw(_chunked(300)).members[0]
    assert m.digest == digest_of_bytes(canonical_json([{"sha256": h, "size": n} for h, n in m.chunks]))
    odd = (("not hex \"quoted\"", 3), ("ab" * 32, 2 ** 70))    # the direct writer's fallback
    assert chunk_list_json(odd) == canonical_json([{"sha256": h, "size": n} for h, n in odd])


def test_the_canonical_form_of_a_long_chunk_list_is_the_generic_encoders():
    """``Manifest.canonical`` splices long chunk lists in, written directly: the bytes (and so
    the digest) are exactly ``canonical_json``'s, whatever else the manifest holds, even text
    that looks like the stand-in for a list."""
    from registry.digests import canonical_json

    for n in (1, 65, 3000):
        raw = _chunked(n)
        raw["metadata"] = {"k": "\x00chunks 0\x00", "note": "\u00e9t\u00e9 \u2028 \"quoted\" \\ back", "z": "[]"}
        m = Manifest.from_raw(raw)
        assert m.canonical == canonical_json(raw)
        assert Manifest.from_bytes(json.dumps(raw, indent=1).encode()).canonical == canonical_json(raw)


def test_a_lone_surrogate_is_a_manifest_error_not_a_crash():
    """JSON lets ``\\ud800`` stand alone; it is not Unicode text, so no canonical bytes exist."""
    raw = minimal()
    raw["metadata"] = {"k": "\ud800"}
    with pytest.raises(ManifestError, match="lone surrogate") as info:
        Manifest.from_bytes(json.dumps(raw).encode())
    assert info.value.exit_code == 5
    with pytest.raises(ManifestError, match="lone surrogate"):
        Manifest.from_raw(_chunked(100) | {"metadata": {"k": "\udfff"}})


def test_a_manifest_read_against_its_digest_is_the_one_the_standard_library_reads():
    """``from_bytes(text, digest)`` parses with orjson first, which reads an integer past 64 bits
    as a float: the standard library then decides, so the manifest, its canonical bytes and its
    errors are the same either way."""
    from registry.digests import canonical_json

    raw = _chunked(3000)
    raw["programs"]["model"]["constant_inputs"] = [
        {"name": "n", "value": 2 ** 70, "leaf": 1, "kind": "positional", "path": "args[1]"},
        {"name": "m", "value": -(2 ** 64) - 1, "leaf": 2, "kind": "positional", "path": "args[2]"},
        {"name": "f", "value": 1.5e-07, "leaf": 3, "kind": "positional", "path": "args[3]"}]
    text = json.dumps(raw).encode()
    want = Manifest.from_bytes(text)
    assert want.canonical == canonical_json(raw)
    got = Manifest.from_bytes(text, want.digest)
    assert got == want and got.canonical == want.canonical
    assert [c.value for c in got.programs["model"].constant_inputs] == [2 ** 70, -(2 ** 64) - 1, 1.5e-07]
    assert type(got.programs["model"].constant_inputs[0].value) is int
    plain = _chunked(3000)
    text = json.dumps(plain).encode()
    assert Manifest.from_bytes(text, "sha256:" + "0" * 64) == Manifest.from_bytes(text)   # another digest
    for bad in (b'{"format": NaN}', b"[" * 200_000 + b"]" * 200_000, text[:-1]):
        with pytest.raises(ManifestError) as slow:
            Manifest.from_bytes(bad)
        with pytest.raises(ManifestError) as fast:
            Manifest.from_bytes(bad, "sha256:" + "0" * 64)
        assert str(fast.value) == str(slow.value)


def test_a_members_identity_is_not_taken_from_a_chunk_list_it_no_longer_has():
    """The parser keeps each long chunk list's canonical JSON for the member's digest; a member
    made from it with other chunks hashes its own."""
    import dataclasses

    from registry.digests import canonical_json, digest_of_bytes

    m = Manifest.from_raw(_chunked(300)).members[0]
    assert m.listing is not None and m.digest == digest_of_bytes(m.listing.text)
    other = dataclasses.replace(m, chunks=m.chunks[:-1] + ((m.chunks[-1][0], 2),), size=m.size + 1)
    assert other.digest == digest_of_bytes(canonical_json([{"sha256": h, "size": n} for h, n in other.chunks]))
    assert other.digest != m.digest
