"""One time format across ``show``, ``list``, ``audit``, their ``--json`` and a server's answers:
ISO 8601 UTC with ``Z`` (``registry.format.times.iso_utc``), exact in documents and to the second in
tables, so a time read anywhere pastes into ``show --at`` and ``audit --since``."""
from __future__ import annotations

import json
import re

import pytest

EXACT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z\Z")


def _json(r):
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("reg_env", ["local", "server"], indirect=True)
def test_show_list_audit_and_their_json_write_one_time_format(reg_env, bundles):
    assert reg_env.cli("push", bundles["v0"], "--name", "clock/m", "--alias", "prod").returncode == 0
    shown = _json(reg_env.cli("show", "clock/m@prod", "--json"))
    created = shown["created_at"]
    assert EXACT.match(created), created
    assert _json(reg_env.cli("list", "clock/m", "--json"))["versions"][0]["created_at"] == created
    events = _json(reg_env.cli("audit", "--model", "clock/m", "--json"))["events"]
    assert [e["action"] for e in events] == ["publish", "alias.set"]
    assert all(EXACT.match(e["time"]) for e in events), events
    # tables: the same text, to the second
    assert f"created: {created[:19]}Z by" in reg_env.cli("show", "clock/m@prod").stdout
    assert f" {created[:19]}Z " in reg_env.cli("list", "clock/m").stdout
    audit_table = reg_env.cli("audit", "--model", "clock/m").stdout
    assert all(f" {e['time'][:19]}Z " in audit_table for e in events), audit_table
    # pasted back: --at and --since take what they printed
    assert reg_env.cli("push", bundles["v1"], "--name", "clock/m", "--alias", "prod").returncode == 0
    events = _json(reg_env.cli("audit", "--model", "clock/m", "--json"))["events"]
    assert [e["action"] for e in events] == ["publish", "alias.set", "publish", "alias.move"]
    first, moved = events[1]["time"], events[3]["time"]
    assert first < moved  # the text compares as the times do
    assert _json(reg_env.cli("show", "clock/m@prod", "--at", first, "--json"))["version"] == 1
    assert _json(reg_env.cli("show", "clock/m@prod", "--at", moved, "--json"))["version"] == 2
    since = _json(reg_env.cli("audit", "--model", "clock/m", "--since", moved, "--json"))["events"]
    assert since == events[2:]
