"""Issue 19, webhooks: an outbox written with each change, delivered by ``pt2reg serve``
replicas over PostgreSQL with Standard Webhooks signatures, retried while the receiver is down,
each event delivered exactly once, every attempt logged.

The receiver is a plain HTTP server in the test process; it checks nothing itself: the test
verifies each signature the way the Standard Webhooks spec tells a receiver to.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from registry.store import open_metadata_store
from registry.store.migrate import upgrade
from tests.fixtures_pt2 import run_cli
from tests.integration.test_audit_head import publish
from tests.services_server import make_token, registry_server
from tests.until import HANG_GUARD_S

pytestmark = [pytest.mark.integration]

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
EVENTS = "version.published,alias.moved,alias.removed,version.yanked,attestation.recorded"
FAST = {"PT2REG_WEBHOOK_POLL": "0.1", "PT2REG_WEBHOOK_RETRY_BASE": "0.3",
        "PT2REG_WEBHOOK_RETRY_MAX": "1", "PT2REG_AUDIT_SIGN_INTERVAL": "0.2",
        "PT2REG_WEBHOOK_ALLOW": "127.0.0.1"}  # the receivers run on loopback, allowed explicitly


def verify_standard_webhook(secret: str, headers: dict[str, str], body: bytes) -> dict[str, Any]:
    """What a receiver does (standardwebhooks.com): HMAC-SHA256 over "{id}.{timestamp}.{body}"
    with the base64-decoded secret, compared in constant time with any v1 signature given;
    a timestamp more than 5 minutes off is refused."""
    msg_id, ts = headers["webhook-id"], headers["webhook-timestamp"]
    assert abs(time.time() - int(ts)) < 300
    key = base64.b64decode(secret.removeprefix("whsec_"))
    expected = base64.b64encode(hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest())
    given = [s.split(",", 1)[1].encode() for s in headers["webhook-signature"].split() if s.startswith("v1,")]
    assert any(hmac.compare_digest(expected, g) for g in given), "bad webhook signature"
    return json.loads(body)


class Receiver:
    """An HTTP server on a fixed port that is down (bound, so no other socket can take the
    port, but not listening: connections are refused) until it comes up."""

    def __init__(self) -> None:
        self.got: list[tuple[dict[str, str], bytes]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["content-length"]))
                with outer.lock:
                    outer.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler, bind_and_activate=False)
        self._server.server_bind()
        self.port = self._server.server_address[1]
        self._serving = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def up(self) -> None:
        self._server.server_activate()
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self._serving = True

    def down(self) -> None:
        if self._serving:   # shutdown() waits for a serve_forever loop
            self._server.shutdown()
        self._server.server_close()

    def events(self) -> list[tuple[str, dict[str, Any]]]:
        with self.lock:
            got = list(self.got)
        return [(h["webhook-id"], verify_standard_webhook(SECRET, h, b)) for h, b in got]


def _wait(predicate: Any, what: str, timeout: float = HANG_GUARD_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _ok(r: Any) -> Any:
    assert r.returncode == 0, (r.args, r.stdout, r.stderr)
    return r


def _publish(store: Any, n: int, aliases: list[str] = (), name: str = "team/m") -> None:
    publish(store, name, n, aliases)


def test_webhooks_signed_retried_and_delivered_exactly_once_by_two_replicas(pg_db_url, tmp_path):
    db = pg_db_url
    from sqlalchemy import create_engine

    engine = create_engine(db)
    upgrade(engine)
    engine.dispose()
    store = open_metadata_store(db, auto_create=db.startswith("sqlite"))
    key = tmp_path / "server-signing"
    _ok(run_cli("key", "generate", str(key)))
    admin = make_token(db, "ops", ["admin"])
    receiver = Receiver()
    secret_file = tmp_path / "hook.secret"
    secret_file.write_text(SECRET + "\n")
    env = {**FAST, "PT2REG_HOME": str(tmp_path / "server-home")}
    try:
        with registry_server(db, "file://" + str(tmp_path / "store"), env=env, log_dir=tmp_path / "a",
                             extra_args=["--signing-key", f"{key}.key"]) as a, \
                registry_server(db, "file://" + str(tmp_path / "store"), env=env, log_dir=tmp_path / "b",
                                extra_args=["--signing-key", f"{key}.key"]) as b:
            remote = {"PT2REG_URL": a.url, "PT2REG_TOKEN": admin, "PT2REG_HOME": str(tmp_path / "c"),
                      "PT2REG_DB": None}
            # hostile URLs are refused before anything is stored
            bad = run_cli("webhook", "add", "file:///etc/passwd", "--events", EVENTS,
                          "--secret-file", str(secret_file), env=remote)
            assert bad.returncode == 2 and "http:// or https://" in bad.stderr, bad.stderr
            added = json.loads(_ok(run_cli("webhook", "add", receiver.url, "--events", EVENTS,
                                           "--model", "team/*", "--secret-file", str(secret_file),
                                           "--json", env=remote)).stdout)["webhook"]
            listed = json.loads(_ok(run_cli("webhook", "list", "--json", env=remote)).stdout)["webhooks"]
            assert [w["id"] for w in listed] == [added["id"]] and "secret" not in json.dumps(listed)

            # receiver down: publish (with an alias) on the direct path; both events are queued
            _publish(store, 1, ["prod"])
            _publish(store, 3)  # no alias: one event
            _publish(store, 1, name="other/x")  # not matched by --model team/*

            def failing() -> list[dict[str, Any]]:
                r = _ok(run_cli("webhook", "deliveries", "--failed", "--json", env=remote))
                found = json.loads(r.stdout)["deliveries"]
                return found if len(found) == 3 and all(d["attempts"] >= 2 for d in found) else []
            found = _wait(failing, "three deliveries failing at least twice")
            assert {d["event"] for d in found} == {"version.published", "alias.moved"}
            attempt = found[0]["history"][0]
            assert not attempt["ok"] and attempt["status_code"] is None and "Connect" in attempt["error"]
            table = _ok(run_cli("webhook", "deliveries", "--failed", env=remote)).stdout
            assert "failing" in table

            receiver.up()
            _wait(lambda: len(receiver.events()) >= 3, "the queued events to arrive once the receiver is up")
            # more changes while it is up, through the server and on the direct path
            _publish(store, 2)
            store.set_alias("team/m", "prod", 2, actor="ana", host="h")
            store.remove_alias("team/m", "prod", actor="ana", host="h")
            store.set_status("team/m", 3, "yanked", "bad numbers", actor="ana", host="h")
            if hasattr(store, "record_attestation"):
                store.record_attestation("team/m", 2, label="cpu-ci", passed=True, device="cpu",
                                         target={"device": "cpu"}, results=[], actor="ana", host="h")
            expected = 7 + hasattr(store, "record_attestation")
            _wait(lambda: len(receiver.events()) >= expected, f"{expected} events")
            time.sleep(1.0)  # a duplicate from the other replica would have come by now
            got = receiver.events()
            ids = [i for i, _ in got]
            assert len(got) == expected and len(set(ids)) == expected, ids  # exactly once each
            kinds = [(p["type"], p["data"]["version"]) for _, p in got]
            assert kinds.count(("version.published", 1)) == 1 and ("alias.moved", 1) in kinds
            assert ("alias.moved", 2) in kinds and "alias.removed" in [t for t, _ in kinds]
            assert ("version.yanked", 3) in kinds
            if expected == 8:
                assert ("attestation.recorded", 2) in kinds
            moved = next(p for _, p in got if p["type"] == "alias.moved" and p["data"]["version"] == 2)
            assert moved["data"]["model"] == "team/m" and moved["data"]["details"]["alias"] == "prod"
            assert moved["data"]["details"]["from"] == 1 and "fields" not in moved["data"]["details"]
            assert all(p["data"]["model"] == "team/m" for _, p in got)  # other/x filtered out

            all_deliveries = json.loads(_ok(run_cli("webhook", "deliveries", "--json", env=remote)).stdout)
            delivered = [d for d in all_deliveries["deliveries"] if d["status"] == "delivered"]
            assert len(delivered) == expected
            for d in delivered:  # every attempt logged: failures first, then one success
                assert [h["ok"] for h in d["history"]].count(True) == 1 and d["history"][-1]["ok"]
                assert d["history"][-1]["status_code"] == 204
            assert json.loads(_ok(run_cli("webhook", "deliveries", "--failed", "--json",
                                          env=remote)).stdout)["deliveries"] == []

            # redeliver: the same message (same webhook-id) arrives once more
            first = delivered[-1]
            _ok(run_cli("webhook", "redeliver", str(first["id"]), env=remote))
            _wait(lambda: len(receiver.events()) == expected + 1, "the redelivery")
            assert receiver.events()[-1][0] == first["message_id"]

            # a pull-only token may not manage webhooks
            puller = make_token(db, "inference", ["model:team/*:pull"])
            denied = run_cli("webhook", "list", env={**remote, "PT2REG_TOKEN": puller})
            assert denied.returncode == 7, denied.stderr
            _ok(run_cli("webhook", "rm", str(added["id"]), env=remote))
            assert json.loads(_ok(run_cli("webhook", "list", "--json", env=remote)).stdout)["webhooks"] == []
            replicas = {h["replica"] for d in delivered for h in d["history"]}
            assert replicas and a.proc.poll() is None and b.proc.poll() is None
    finally:
        receiver.down()
        store.close()


def test_outbox_rows_commit_with_the_change_only(tmp_path, monkeypatch):
    """A change that fails leaves no outbox row; webhook add on the direct path stores the
    secret encrypted (never the secret itself); bad URLs and secrets are one-line errors."""
    from sqlalchemy import text

    home = tmp_path / "home"
    monkeypatch.setenv("PT2REG_HOME", str(home))
    db = f"sqlite:///{tmp_path / 'r.db'}"
    secret_file = tmp_path / "s"
    secret_file.write_text(SECRET)
    env = {"PT2REG_DB": db, "PT2REG_HOME": str(home)}
    _ok(run_cli("webhook", "add", "https://hooks.example.com/x", "--events", "alias.moved",
                "--secret-file", str(secret_file), env=env))
    assert (home / "server-signing.key").exists()
    assert os.stat(home / "server-signing.key").st_mode & 0o777 == 0o600
    for url, why in (("ftp://h/x", "http:// or https://"), ("https://u:p@h/x", "credentials"),
                     ("http:///nohost", "with a host")):
        r = run_cli("webhook", "add", url, "--events", "alias.moved", "--secret-file", str(secret_file), env=env)
        assert r.returncode == 2 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    (tmp_path / "weak").write_text("whsec_" + base64.b64encode(b"short").decode())
    r = run_cli("webhook", "add", "https://h/x", "--events", "alias.moved", "--secret-file",
                str(tmp_path / "weak"), env=env)
    assert r.returncode == 2 and "24 to 64 bytes" in r.stderr
    r = run_cli("webhook", "add", "https://h/x", "--events", "nope", "--secret-file", str(secret_file), env=env)
    assert r.returncode == 2 and "unknown webhook event" in r.stderr

    store = open_metadata_store(db, auto_create=db.startswith("sqlite"))
    try:
        _publish(store, 1, ["prod"])
        with pytest.raises(Exception):  # noqa: B017
            store.set_alias("team/m", "prod", 99, actor="ana", host="h")  # no version 99: rolled back
        with store.engine.connect() as conn:
            rows = conn.execute(text("SELECT event_type, audit_seq FROM webhook_deliveries")).all()
            stored = conn.execute(text("SELECT secret_enc FROM webhooks")).scalar_one()
        assert [r[0] for r in rows] == ["alias.moved"]  # the publish itself is not subscribed
        assert SECRET not in stored and SECRET.removeprefix("whsec_") not in stored
        assert stored.startswith("v1:")
    finally:
        store.close()
