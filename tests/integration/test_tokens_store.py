"""API tokens in the SQL store (create, list, revoke, authenticate, expiry), what they leave in
the database and the audit log, ``audit_details`` on every write, the blob -> model map the
server authorizes downloads with, and ``pt2reg token``."""
from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta

import pytest
from sqlalchemy import inspect, text

from registry.errors import NotAuthenticatedError, NotFoundError, UsageError
from registry.store import SqlMetadataStore
from registry.store import tokens as token_rows
from registry.store.audit_chain import format_ts, parse_ts
from tests.store_calls import publish as store_publish

WHO = {"actor": "ana", "host": "laptop"}


def D(tag: str) -> str:
    return "sha256:" + tag.encode().hex().ljust(64, "0")[:64]


@pytest.fixture
def store(sql_store):  # tests.services_pg: once per backend (SQLite, PostgreSQL)
    return sql_store


def sql(store: SqlMetadataStore, statement: str, **params) -> list:
    with store.engine.begin() as conn:
        result = conn.execute(text(statement), params)
        return result.all() if result.returns_rows else []


def clock_at(monkeypatch, store: SqlMetadataStore, delta: timedelta) -> datetime:
    """Make the token code read the database clock as now + ``delta``."""
    moved = store.db_now() + delta
    monkeypatch.setattr(token_rows, "now_text", lambda session=None: format_ts(moved))
    return moved


def publish(store, name: str, tag: str, blobs=None, **kwargs):
    return store_publish(store, name, D(tag), json.dumps({"tag": tag}), 10,
                         blobs or [(D("blob-" + tag), 10)], **{**WHO, **kwargs})[0]


# -- create, list, authenticate ----------------------------------------------------------------

def test_create_returns_the_secret_once_and_stores_only_its_hash(store):
    record, secret = store.create_token("ci", ["model:team/*:push,pull", "audit:read"],
                                        expires_at=None, **WHO)
    assert secret.startswith("pt2r_") and len(secret) > 40
    assert record.owner == "ci" and record.created_by == "ana"
    assert record.scopes == ["model:team/*:pull,push", "audit:read"]   # canonical
    assert record.expires_at is None and record.revoked_at is None and record.last_used_at is None
    assert record.created_at.tzinfo is not None
    assert store.list_tokens() == [record]
    assert not hasattr(record, "secret") and secret not in repr(record)

    rows = sql(store, "SELECT * FROM tokens")
    assert len(rows) == 1
    row = rows[0]._mapping
    assert row["secret_hash"] == hashlib.sha256(secret.encode()).hexdigest()
    assert not any(secret in str(v) or secret[5:] in str(v) for v in row.values())


def test_the_secret_hash_is_unique_and_indexed(store):
    uniques = inspect(store.engine).get_unique_constraints("tokens")
    assert [u["column_names"] for u in uniques] == [["secret_hash"]]


def test_authenticate_returns_the_identity(store):
    record, secret = store.create_token("ci", ["model:team/*:pull"], expires_at=None, **WHO)
    who = store.authenticate(secret)
    assert (who.token_id, who.owner, who.expires_at) == (record.id, "ci", None)
    assert who.allows("pull", "team/bert") and not who.allows("push", "team/bert")
    assert not who.allows("pull", "team2/x")


def test_secrets_of_two_tokens_are_told_apart(store):
    _, first = store.create_token("a", ["admin"], expires_at=None, **WHO)
    _, second = store.create_token("b", ["audit:read"], expires_at=None, **WHO)
    assert store.authenticate(first).owner == "a" and store.authenticate(second).owner == "b"


@pytest.mark.parametrize("secret,needle", [
    ("pt2r_" + "x" * 43, "unknown token"), ("not-a-token", "unknown token"), ("", "no token given"),
])
def test_unknown_or_missing_tokens_are_refused_without_echoing_them(store, secret, needle):
    store.create_token("ci", ["admin"], expires_at=None, **WHO)
    with pytest.raises(NotAuthenticatedError) as caught:
        store.authenticate(secret)
    line = caught.value.one_line()
    assert needle in line and caught.value.exit_code == 7
    assert not secret or secret not in line


def test_bad_input_is_refused_before_anything_is_written(store):
    for owner, scopes, problem in [
        ("ci", ["model:team/*:fly"], "unknown action"),
        ("ci", [], "at least one scope"),
        ("ci", "admin", "list of scopes"),
        ("bad owner", ["admin"], "invalid token owner"),
    ]:
        with pytest.raises(UsageError, match=problem):
            store.create_token(owner, scopes, expires_at=None, **WHO)
    with pytest.raises(UsageError, match="already passed"):
        store.create_token("ci", ["admin"], expires_at=store.db_now() - timedelta(seconds=1), **WHO)
    with pytest.raises(UsageError, match="timezone-aware"):
        store.create_token("ci", ["admin"], expires_at=datetime(2099, 1, 1), **WHO)
    assert store.list_tokens() == [] and store.events() == []


# -- expiry and revocation ---------------------------------------------------------------------

def test_expired_tokens_are_refused_saying_when(store, monkeypatch):
    expires = store.db_now() + timedelta(hours=1)
    record, secret = store.create_token("ci", ["admin"], expires_at=expires, **WHO)
    assert record.expires_at == parse_ts(format_ts(expires))
    assert store.authenticate(secret).expires_at == record.expires_at
    clock_at(monkeypatch, store, timedelta(hours=1, seconds=1))
    with pytest.raises(NotAuthenticatedError) as caught:
        store.authenticate(secret)
    assert caught.value.one_line().startswith(f"token {record.id} expired at {format_ts(expires)}")
    assert store.list_tokens()[0].state(store.db_now() + timedelta(hours=2)) == "expired"


def test_revoked_tokens_are_refused_saying_when(store):
    record, secret = store.create_token("ci", ["admin"], expires_at=None, **WHO)
    store.authenticate(secret)
    revoked = store.revoke_token(record.id, actor="root", host="ops")
    assert revoked.revoked_at is not None and revoked.state(store.db_now()) == "revoked"
    with pytest.raises(NotAuthenticatedError) as caught:
        store.authenticate(secret)
    assert f"token {record.id} was revoked at {format_ts(revoked.revoked_at)}" in caught.value.one_line()
    again = store.revoke_token(record.id, **WHO)   # idempotent: no second event, same time
    assert again.revoked_at == revoked.revoked_at
    assert [e.action for e in store.events()] == ["token.create", "token.revoke"]


def test_revoking_an_unknown_token_is_not_found(store):
    with pytest.raises(NotFoundError, match="token 42 not found"):
        store.revoke_token(42, **WHO)
    with pytest.raises(UsageError):
        store.revoke_token("1", **WHO)


def test_last_used_is_written_at_most_once_a_minute(store, monkeypatch):
    record, secret = store.create_token("ci", ["admin"], expires_at=None, **WHO)
    writes: list[int] = []
    real_touch = token_rows.touch
    monkeypatch.setattr(token_rows, "touch", lambda s, tid: (writes.append(tid), real_touch(s, tid)))
    store.authenticate(secret)
    first = store.list_tokens()[0].last_used_at
    assert first is not None and writes == [record.id]
    for _ in range(5):
        store.authenticate(secret)
    assert writes == [record.id] and store.list_tokens()[0].last_used_at == first
    later = clock_at(monkeypatch, store, timedelta(minutes=2))
    store.authenticate(secret)
    assert writes == [record.id, record.id]
    assert store.list_tokens()[0].last_used_at == parse_ts(format_ts(later))


# -- the audit log -----------------------------------------------------------------------------

def test_token_events_name_owner_and_scopes_never_the_secret(store):
    record, secret = store.create_token("ci", ["model:team/*:pull"], expires_at=None,
                                        actor="root", host="ops",
                                        audit_details={"token_id": 1, "via": "server"})
    store.revoke_token(record.id, actor="root", host="ops")
    created, revoked = store.events()
    assert (created.action, created.actor, created.host) == ("token.create", "root", "ops")
    assert created.details == {"token": record.id, "owner": "ci", "scopes": ["model:team/*:pull"],
                               "expires_at": None, "token_id": 1, "via": "server"}
    assert (revoked.action, revoked.details) == ("token.revoke", {"token": record.id, "owner": "ci"})
    dumped = json.dumps([e.details for e in store.events()])
    assert secret not in dumped and hashlib.sha256(secret.encode()).hexdigest() not in dumped
    assert store.verify_audit_chain().ok


def test_audit_details_reach_every_write_event(store):
    extra = {"token_id": 9, "via": "server"}
    publish(store, "team/a", "a")
    publish(store, "team/a", "b", aliases=["prod"], audit_details=extra,
            signatures=[("sha256:" + "1" * 64, "ed25519", "c2ln")])
    store.set_alias("team/a", "prod", 1, **WHO, audit_details=extra)
    store.set_status("team/a", 1, "deprecated", "old", **WHO, audit_details=extra)
    store.remove_alias("team/a", "prod", **WHO, audit_details=extra)
    store.sweep_blobs([(D("orphan"), 5)], is_alive=lambda claim, now: True,
                      delete=lambda digest: None, **WHO, audit_details=extra)
    record, _ = store.create_token("ci", ["admin"], expires_at=None, **WHO, audit_details=extra)
    store.revoke_token(record.id, **WHO, audit_details=extra)
    events = store.events()
    assert "token_id" not in events[0].details   # None keeps the event as it was
    tagged = [e.action for e in events[1:]]
    assert tagged == ["publish", "alias.set", "alias.move", "deprecate", "alias.remove",
                      "gc.delete", "token.create", "token.revoke"]
    for e in events[1:]:
        assert e.details["token_id"] == 9 and e.details["via"] == "server", e.action
    assert events[1].details["size"] == 10 and events[3].details["from"] == 2
    assert store.verify_audit_chain().ok


def test_audit_details_never_overwrite_the_stores_own(store):
    publish(store, "m", "a")
    with pytest.raises(UsageError, match="audit detail 'alias' is reserved"):
        store.set_alias("m", "prod", 1, **WHO, audit_details={"alias": "forged"})
    with pytest.raises(UsageError, match="not JSON"):
        store.set_alias("m", "prod", 1, **WHO, audit_details={"x": object()})
    assert [a.alias for a in store.aliases("m")] == []
    assert [e.action for e in store.events()] == ["publish"]


@pytest.mark.parametrize("tamper,needle", [
    ("INSERT INTO tokens (owner, secret_hash, scopes_json, created_at, created_by) VALUES "
     "('eve', '" + "e" * 64 + "', '[\"admin\"]', '2026-01-01T00:00:00.000000Z', 'eve')",
     "has no token.create event"),
    ("UPDATE tokens SET scopes_json = '[\"admin\"]' WHERE id = 1", "differ from what event"),
    ("UPDATE tokens SET owner = 'root' WHERE id = 1", "differ from what event"),
    ("UPDATE tokens SET expires_at = NULL WHERE id = 1", "differ from what event"),
    ("UPDATE tokens SET revoked_at = NULL WHERE id = 2", "is not revoked but event"),
    ("UPDATE tokens SET revoked_at = '2026-01-01T00:00:00.000000Z' WHERE id = 1",
     "is revoked but the log has no token.revoke"),
    ("DELETE FROM tokens WHERE id = 1", "which is not in the registry"),
])
def test_audit_verify_catches_tokens_edited_behind_the_logs_back(store, tamper, needle):
    store.create_token("ci", ["model:team/*:pull"], expires_at=store.db_now() + timedelta(days=1),
                       **WHO)
    second, _ = store.create_token("old", ["audit:read"], expires_at=None, **WHO)
    store.revoke_token(second.id, **WHO)
    assert store.verify_audit_chain().ok
    sql(store, tamper)
    verdict = store.verify_audit_chain()
    assert not verdict.ok and needle in verdict.reason, verdict


# -- which models a blob belongs to ------------------------------------------------------------

def test_pullable_blob_models_maps_digests_to_the_models_using_them(store):
    shared = (D("shared"), 10)
    publish(store, "team/a", "a", blobs=[shared, (D("only-a"), 10)])
    publish(store, "team2/b", "b", blobs=[shared])
    found = store.pullable_blob_models([shared[0], D("only-a"), D("nobody")])
    assert found == {shared[0]: {"team/a", "team2/b"}, D("only-a"): {"team/a"}}
    assert store.pullable_blob_models([]) == {}
    with pytest.raises(UsageError, match="invalid digest"):
        store.pullable_blob_models(["sha256:nothex"])


# -- the Registry API and the CLI --------------------------------------------------------------

def test_registry_api_parses_scopes_and_durations(tmp_path):
    from registry.client import Registry
    from registry.config import Settings

    with Registry(Settings.resolve(home=str(tmp_path / "home"), env={})) as reg:
        before = reg.meta.db_now()
        record, secret = reg.create_token("ci", ["model:team/**:pull,alias"], "12h")
        assert record.scopes == ["model:team/**:pull,alias"]
        assert timedelta(hours=12) <= record.expires_at - before < timedelta(hours=12, minutes=1)
        with pytest.raises(UsageError, match="model:<glob>:<actions>"):
            reg.create_token("ci", ["model:team/*"])
        with pytest.raises(UsageError, match="invalid expiry"):
            reg.create_token("ci", ["admin"], "soon")
        assert [t.id for t in reg.list_tokens()] == [record.id]
        assert reg.revoke_token(record.id).revoked_at is not None
        with pytest.raises(NotAuthenticatedError, match="was revoked"):
            reg.meta.authenticate(secret)


def test_token_cli_create_list_revoke(pt2reg):
    from registry.store import open_metadata_store as open_store

    made = pt2reg("token", "create", "ci", "--scope", "model:team/*:pull", "--expires", "30d")
    assert made.exit_code == 0, made.output
    secret = made.stdout.strip()
    assert secret.startswith("pt2r_") and "\n" not in secret      # the secret alone on stdout
    warning = made.stderr.strip().splitlines()
    assert len(warning) == 1 and "cannot be shown again" in warning[0] and secret not in warning[0]

    as_json = pt2reg("token", "create", "ops", "--scope", "admin", "--scope", "audit:read", "--json")
    assert as_json.exit_code == 0, as_json.output
    doc = json.loads(as_json.stdout)
    assert doc["secret"].startswith("pt2r_")
    assert doc["token"]["owner"] == "ops" and doc["token"]["scopes"] == ["admin", "audit:read"]

    listed = pt2reg("token", "list")
    assert listed.exit_code == 0 and "ci" in listed.stdout and "model:team/*:pull" in listed.stdout
    assert secret not in listed.output and doc["secret"] not in listed.output
    docs = json.loads(pt2reg("token", "list", "--json").stdout)["tokens"]
    assert [(t["id"], t["owner"], t["state"]) for t in docs] == [(1, "ci", "active"), (2, "ops", "active")]
    assert docs[0]["expires_at"] is not None and docs[1]["expires_at"] is None
    assert all("secret" not in t for t in docs)

    revoked = pt2reg("token", "revoke", "1")
    assert revoked.exit_code == 0 and revoked.stdout.startswith("revoked token 1 (ci)")
    docs = json.loads(pt2reg("token", "list", "--json").stdout)["tokens"]
    assert docs[0]["state"] == "revoked" and docs[0]["revoked_at"] is not None

    with open_store(f"sqlite:///{pt2reg.home / 'registry.db'}", auto_create=False) as store:
        with pytest.raises(NotAuthenticatedError, match="was revoked"):
            store.authenticate(secret)
        assert store.authenticate(doc["secret"]).owner == "ops"
    assert pt2reg("audit", "--verify").exit_code == 0


@pytest.mark.parametrize("args,code,needle", [
    (("token", "create", "ci", "--scope", "model:team/*:fly"), 2, "unknown action 'fly'"),
    (("token", "create", "ci", "--scope", "admin", "--expires", "3x"), 2, "invalid expiry '3x'"),
    (("token", "revoke", "7"), 3, "token 7 not found"),
])
def test_token_cli_errors_are_one_line(pt2reg, args, code, needle):
    from tests.cli_inprocess import refused

    refused(pt2reg(*args), needle, code=code)
