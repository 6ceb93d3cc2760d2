"""Issue 6: hostile bundles are refused by `inspect` and `push` with exit 5, one clear line,
within seconds, and nothing is published."""
import json
import time

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


CASES = {
    "path-escaping": (lambda p: raw_zip(p, [("programs/model.pt2", PAYLOAD), ("../../escape", b"x")]), "unsafe member path"),
    "unlisted": (lambda p: raw_zip(p, [("programs/model.pt2", PAYLOAD), ("extra.sh", b"x")]), "not listed"),
    "zip-bomb": (zip_bomb, "compressed"),
    "truncated": (_truncated, ""),
    "schema-invalid": (_schema_invalid, "invalid manifest"),
}


@pytest.mark.parametrize("reg_env", ["local"], indirect=True)
@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_bundles_refused_by_inspect_and_push(reg_env, tmp_path, case):
    build, needle = CASES[case]
    path = build(tmp_path / f"{case}.pt2b")
    for args in (["inspect", str(path)], ["push", str(path), "--name", "hostile"]):
        start = time.monotonic()
        r = reg_env.cli(*args)
        assert time.monotonic() - start < 20  # decided quickly (mostly process start-up)
        assert r.returncode == 5, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], lines
    listing = reg_env.cli("list", "--json")
    assert json.loads(listing.stdout)["models"] == []
