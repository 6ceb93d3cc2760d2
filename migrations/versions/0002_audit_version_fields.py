"""The audit chain covers each version's publisher, metadata and lineage edges.

Revision ID: 0002_audit_version_fields
Revises: 0001_initial
Create Date: 2026-11-24

From this revision a ``publish`` event's details carry ``fields``: the sha256 of the version's
``created_by``, ``metadata_json`` and lineage edges exactly as stored
(:func:`registry.store.audit_chain.version_fields_hash`), and ``audit --verify`` recomputes it from
the tables. For versions published before, this migration *appends* one ``attest`` event per
version recording the same hash of what the tables hold at upgrade time. Nothing already in the
chain changes, so it still verifies; an edit made before the upgrade is vouched for by it (the
chain could not see those fields then), any edit after it is caught.

No schema change: the hash lives in the (hashed) event details. Plain SQL with explicit
columns, so later changes to the ORM rows cannot change what this revision does.
"""
from __future__ import annotations

import getpass
import json
import socket
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0002_audit_version_fields"
down_revision: Union[str, Sequence[str], None] = "0001_initial"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

AUDIT_LOCK_KEY = 0x70743261  # registry.store.audit_log.AUDIT_LOCK_KEY ("pt2a")


def _db_now(conn: sa.Connection) -> str:
    from datetime import datetime, timezone

    from registry.store.audit_chain import format_ts

    if conn.dialect.name == "postgresql":
        return conn.execute(sa.text(
            "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', "
            "'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')")).scalar_one()
    raw = conn.execute(sa.text("SELECT strftime('%Y-%m-%dT%H:%M:%f', 'now')")).scalar_one()
    return format_ts(datetime.fromisoformat(raw).replace(tzinfo=timezone.utc))


def upgrade() -> None:
    from registry.store.audit_chain import GENESIS_HASH, seal, version_fields_hash

    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": AUDIT_LOCK_KEY})
    versions = conn.execute(sa.text(
        "SELECT v.id, m.name, v.number, v.digest, v.created_by, v.metadata_json "
        "FROM versions v JOIN models m ON m.id = v.model_id ORDER BY m.name, v.number")).all()
    if not versions:
        return
    edges: dict[int, list] = {}
    for vid, kind, value, digest, extra in conn.execute(sa.text(
            "SELECT version_id, kind, value, digest, extra_json FROM lineage_edges")):
        edges.setdefault(vid, []).append((kind, value, digest, extra))
    last = conn.execute(sa.text(
        "SELECT seq, hash, ts FROM audit_events ORDER BY seq DESC LIMIT 1")).first()
    seq, prev, ts = (last[0], last[1], last[2]) if last else (0, GENESIS_HASH, "")
    ts = max(_db_now(conn), ts)
    try:
        who = getpass.getuser()
    except Exception:  # no user name (some containers): still a valid event
        who = "unknown"
    host = socket.gethostname() or "unknown"
    insert = sa.text(
        "INSERT INTO audit_events (seq, ts, actor, host, action, model, version, digest, ref, "
        "details_json, prev_hash, hash) VALUES (:seq, :ts, :actor, :host, :action, :model, "
        ":version, :digest, :ref, :details_json, :prev_hash, :hash)")
    rows = []
    for vid, name, number, digest, created_by, metadata_json in versions:
        seq += 1
        event = seal({"seq": seq, "ts": ts, "actor": who, "host": host, "action": "attest",
                      "model": name, "version": number, "digest": digest, "ref": None,
                      "details": {"fields": version_fields_hash(created_by, metadata_json,
                                                                edges.get(vid, [])),
                                  "reason": "schema 0002: the chain now covers created_by, "
                                            "metadata and lineage"}},
                     prev_hash=prev)
        prev = event["hash"]
        rows.append({**{k: event[k] for k in ("seq", "ts", "actor", "host", "action", "model",
                                               "version", "digest", "ref", "prev_hash", "hash")},
                     "details_json": json.dumps(event["details"], sort_keys=True,
                                                separators=(",", ":"), ensure_ascii=False)})
        if len(rows) >= 1000:
            conn.execute(insert, rows)
            rows = []
    if rows:
        conn.execute(insert, rows)


def downgrade() -> None:
    # The log is append-only: deleting the attest events would break the chain after them.
    # They are harmless to 0001 software, which ignores actions it does not replay.
    pass
