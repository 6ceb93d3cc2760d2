"""The audit anchor's pure checks and its file (the end-to-end attacks are in
``tests/integration/test_lineage_audit.py``)."""
from __future__ import annotations

import json

import pytest

from registry.errors import IntegrityError
from registry.store import audit_anchor

H = "ab" * 32


def test_key_is_the_url_without_its_password():
    key = audit_anchor.anchor_key("postgresql+psycopg://ana:s3cret@db.internal:5432/registry")
    assert "s3cret" not in key and "ana" in key and "db.internal:5432/registry" in key
    assert audit_anchor.anchor_key("sqlite:////srv/reg.db") == "sqlite:////srv/reg.db"


def test_check_passes_only_when_the_anchored_event_kept_its_hash():
    anchor = {"seq": 4, "hash": H, "at": "2026-11-22T10:00:00Z"}
    assert audit_anchor.check(None, {}, "f") is None                    # never verified here
    assert audit_anchor.check(anchor, {4: H}, "f") is None
    changed = audit_anchor.check(anchor, {4: "cd" * 32}, "/h/audit-anchors.json")
    assert not changed.ok and changed.first_bad_seq == 4 and "different hash" in changed.reason
    assert "delete /h/audit-anchors.json" in changed.reason
    gone = audit_anchor.check(anchor, {}, "f")
    assert not gone.ok and gone.first_bad_seq == 4 and "is gone" in gone.reason


def test_file_round_trip_is_private_and_a_damaged_file_is_an_error(tmp_path):
    path = tmp_path / "audit-anchors.json"
    assert audit_anchor.load(path) == {}
    anchors = audit_anchor.load(path)
    audit_anchor.save(path, anchors, "sqlite:///x.db", (7, H))
    assert path.stat().st_mode & 0o777 == 0o600
    assert audit_anchor.load(path)["sqlite:///x.db"]["seq"] == 7
    path.write_text("{not json")
    with pytest.raises(IntegrityError, match="cannot read the audit anchors"):
        audit_anchor.load(path)
    for odd in (["odd"], {"sqlite:///x.db": 5}, {"sqlite:///x.db": {"seq": "7", "hash": H}}):
        path.write_text(json.dumps(odd))
        with pytest.raises(IntegrityError, match="not a JSON object"):
            audit_anchor.load(path)
