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
    raw["format"] = 2
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
