"""Issue 19, the signed audit head: ``pt2reg serve`` signs the newest audit event hash with its
Ed25519 key (generated under its home, mode 0600), ``GET /v1/keys`` gives the public key,
``GET /v1/audit/head`` the newest signed head, and ``audit --verify --server-key PUB`` (direct
and remote) catches someone with database write access who edits an event and recomputes the
whole chain, naming the event; heads signed by another key are refused.
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import httpx
from sqlalchemy import text

from registry.access.server_key import sign_head
from registry.digests import digest_of_bytes
from registry.format.signing import load_private_key
from registry.store import open_metadata_store
from registry.store.audit_chain import GENESIS_HASH, seal
from registry.store.engine import WRITE_OPTION
from registry.store.orm import json_text
from tests.fixtures_pt2 import run_cli
from tests.services_server import make_token, registry_server
from tests.store_calls import publish as store_publish
from tests.until import wait_until

FAST = {"PT2REG_WEBHOOK_POLL": "0.05", "PT2REG_AUDIT_SIGN_INTERVAL": "0.05"}


def _ok(r: Any) -> Any:
    assert r.returncode == 0, (r.args, r.stdout, r.stderr)
    return r


def _broken(r: Any, seq: int | None, *words: str) -> str:
    assert r.returncode == 5, (r.args, r.returncode, r.stdout, r.stderr)
    line = r.stderr.strip().splitlines()[0]
    if seq is not None:
        assert f"at event {seq}:" in line, line
    for w in words:
        assert w in line, line
    return line


def publish(store: Any, name: str, n: int, aliases: Sequence[str] = ()) -> None:
    """A version whose manifest (a stand-in: no members) is stored as its only blob."""
    manifest = json.dumps({"n": n})
    digest = digest_of_bytes(manifest.encode())
    store_publish(store, name, digest, manifest, len(manifest), [(digest, len(manifest))],
                  aliases=list(aliases), actor="ana", host="h")


def recompute_chain_after_editing(engine: Any, seq: int, details: dict[str, Any]) -> None:
    """The attack: set event ``seq``'s details, then recompute every hash from there on with
    the chain's own functions, so the chain links and hashes check out again. One write
    transaction from the start (``BEGIN IMMEDIATE`` on SQLite): a read that later upgrades to a
    write fails at once with "database is locked" if a running server signed a head meanwhile."""
    with engine.execution_options(**{WRITE_OPTION: True}).begin() as conn:
        rows = conn.execute(text("SELECT seq, ts, actor, host, action, model, version, digest, ref, "
                                 "details_json, prev_hash FROM audit_events ORDER BY seq")).mappings().all()
        prev = GENESIS_HASH
        for row in rows:
            event = {**row, "details": json.loads(row["details_json"])}
            if row["seq"] == seq:
                event["details"] = details
            if row["seq"] < seq:
                prev = conn.execute(text("SELECT hash FROM audit_events WHERE seq = :s"),
                                    {"s": row["seq"]}).scalar_one()
                continue
            sealed = seal(event, prev_hash=prev)
            conn.execute(text("UPDATE audit_events SET details_json = :d, prev_hash = :p, hash = :h "
                              "WHERE seq = :s"), {"d": json_text(sealed["details"], "details"),
                                                  "p": prev, "h": sealed["hash"], "s": row["seq"]})
            prev = sealed["hash"]


def test_recomputed_chain_is_caught_by_the_signed_head(tmp_path):
    db = f"sqlite:///{tmp_path / 'registry.db'}"
    store = open_metadata_store(db, auto_create=True)
    server_home = tmp_path / "server-home"
    try:
        with registry_server(db, "file://" + str(tmp_path / "store"), log_dir=tmp_path / "srv",
                             env={**FAST, "PT2REG_HOME": str(server_home)}) as server:
            key_file = server_home / "server-signing.key"
            assert os.stat(key_file).st_mode & 0o777 == 0o600  # generated on first start
            auditor = make_token(db, "auditor", ["audit:read"])
            headers = {"Authorization": f"Bearer {auditor}"}

            def signed_through() -> int:
                newest = store.audit_hashes()[0][0]

                def signed() -> bool:
                    r = httpx.get(f"{server.url}/v1/audit/head", headers=headers, timeout=60)
                    return r.status_code == 200 and r.json()["seq"] == newest

                wait_until(signed, f"event {newest} signed by the server")
                return newest

            # changes on the direct path (no server involved) are signed too, one head each
            publish(store, "team/m", 1, ["prod"])
            signed_through()
            store.record_event("pull", actor="eve", host="laptop", model="team/m", number=1,
                               details={"via": "cli"})
            pulled = signed_through()
            publish(store, "team/m", 2)
            signed_through()
            store.set_alias("team/m", "prod", 2, actor="ana", host="h")
            newest = signed_through()

            keys = httpx.get(f"{server.url}/v1/keys", timeout=5).json()["keys"]  # public: no token
            pub = tmp_path / "server.pub"
            pub.write_text(keys[0]["public_key"])
            assert keys[0]["public_key"] == (server_home / "server-signing.pub").read_text()
            head = httpx.get(f"{server.url}/v1/audit/head", headers=headers, timeout=5).json()
            assert head["seq"] == newest and head["key_id"] == keys[0]["key_id"]
            assert httpx.get(f"{server.url}/v1/audit/head", timeout=5).status_code == 401

            direct = {"PT2REG_DB": db, "PT2REG_HOME": str(tmp_path / "h-direct"), "PT2REG_URL": None}
            remote = {"PT2REG_URL": server.url, "PT2REG_TOKEN": auditor, "PT2REG_DB": None,
                      "PT2REG_HOME": str(tmp_path / "h-remote")}
            r = _ok(run_cli("audit", "--verify", "--server-key", str(pub), env=direct))
            assert f"signed head at event {newest}" in r.stdout
            _ok(run_cli("audit", "--verify", "--server-key", str(pub), env=remote))

            # the attack: hide what eve's pull said, recompute the whole chain from there
            recompute_chain_after_editing(store.engine, pulled, {"via": "cli", "note": "routine"})
            fresh = {**direct, "PT2REG_HOME": str(tmp_path / "h-fresh")}
            _ok(run_cli("audit", "--verify", env=fresh))  # the hash chain alone cannot tell
            _broken(run_cli("audit", "--verify", "--server-key", str(pub), env={
                **direct, "PT2REG_HOME": str(tmp_path / "h-fresh2")}), pulled, "recomputed")
            _broken(run_cli("audit", "--verify", "--server-key", str(pub), env={
                **remote, "PT2REG_HOME": str(tmp_path / "h-fresh3")}), pulled, "recomputed")
            as_json = run_cli("audit", "--verify", "--server-key", str(pub), "--json", env=fresh)
            assert as_json.returncode == 5 and json.loads(as_json.stdout)["first_bad_event"] == pulled

            # heads signed by another key are refused: another PUB, and a forged head row
            _ok(run_cli("key", "generate", str(tmp_path / "eve")))
            _broken(run_cli("audit", "--verify", "--server-key", str(tmp_path / "eve.pub"), env=fresh),
                    None, "refused")
            forged = sign_head(load_private_key(tmp_path / "eve.key"), newest + 50, "ab" * 32,
                               "2026-11-24T09:00:00.000000Z")
            with store.engine.begin() as conn:
                conn.execute(text("INSERT INTO audit_heads (seq, hash, signed_at, key_id, signature) "
                                  "VALUES (:seq, :hash, :signed_at, :key_id, :signature)"), forged)
            _broken(run_cli("audit", "--verify", "--server-key", str(pub), env=fresh), newest + 50,
                    "refused")
            with store.engine.begin() as conn:
                conn.execute(text("DELETE FROM audit_heads"))
            _broken(run_cli("audit", "--verify", "--server-key", str(pub), env=fresh), None,
                    "no audit head signed")
            # the server would not sign the rewritten chain either, heads deleted or not
            assert "not signing the audit head: event 6 no longer has the hash" in server.log()
    finally:
        store.close()
