"""``sources.AuditSpool``: events of pulls the log has not taken yet are never lost, never fail
the command that flushes them, and a version since deleted is dropped (issue 41: the server now
rate-limits and checks client events)."""
from __future__ import annotations

import json

from registry.client.sources import AuditSpool
from registry.errors import NotFoundError, UsageError


def _spool(tmp_path, n: int) -> AuditSpool:
    spool = AuditSpool(tmp_path / "audit-spool.jsonl")
    for i in range(n):
        spool.append("pull", actor="a", host="h", model="m", digest=f"d{i}", ref=f"m@{i}")
    return spool


def test_a_refusal_keeps_that_event_and_the_rest_for_later(tmp_path):
    spool, taken = _spool(tmp_path, 5), []

    def record(event):
        if len(taken) == 2:
            raise UsageError("too many events (429)")
        taken.append(event["digest"])

    spool.flush(record)  # no exception reaches the caller
    assert taken == ["d0", "d1"]
    left = [json.loads(line)["digest"] for line in spool.path.read_text().splitlines()]
    assert left == ["d2", "d3", "d4"] and not list(tmp_path.glob("*.flushing"))
    spool.flush(lambda e: taken.append(e["digest"]))
    assert taken == ["d0", "d1", "d2", "d3", "d4"] and not spool.path.exists()


def test_an_event_of_a_deleted_version_is_dropped(tmp_path):
    spool, taken = _spool(tmp_path, 3), []

    def record(event):
        if event["digest"] == "d1":
            raise NotFoundError("version not found", what="version", name="m@1")
        taken.append(event["digest"])

    spool.flush(record)
    assert taken == ["d0", "d2"] and not spool.path.exists()
