"""The registry server in-process (Starlette's TestClient) over SQLite + a local blob store:
publish through the routes, tokens and scopes (401/403 naming the scope), identity in the
audit log, Range reads, hostile requests (size caps, bad names, no tracebacks)."""
from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from starlette.testclient import TestClient

from registry.config import Settings
from registry.server import ServerLimits, create_app
from registry.store.audit_chain import format_ts
from tests.services_server import manifest_text


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Server:
    client: TestClient
    app: Any

    @property
    def meta(self):
        return self.app.state.registry.meta

    def token(self, *scopes: str, owner: str = "ana", expires_at: datetime | None = None) -> str:
        _, secret = self.meta.create_token(owner, list(scopes), expires_at=expires_at,
                                           actor="operator", host="ci")
        return secret

    def call(self, method: str, path: str, token: str | None = None, **kwargs: Any):
        headers = dict(kwargs.pop("headers", {}) or {})
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return self.client.request(method, path, headers=headers, **kwargs)

    def publish(self, token: str, name: str, payload: bytes = b"weights" * 100, **extra: Any):
        """Upload a one-member version's blobs as a client would (claim them, upload what the
        server asks for), then publish it under the claim and end the claim."""
        member = _digest(payload)
        manifest = manifest_text(member, len(payload), salt=name)
        mdigest = _digest(manifest.encode())
        blobs = {member: payload, mdigest: manifest.encode()}
        claimed = self.call("POST", "/v1/pending", token, json={"blobs": list(blobs), "pid": 1})
        claim = claimed.json()["id"] if claimed.status_code == 200 else None
        plan = self.call("POST", "/v1/blobs/upload", token,
                         json={"blobs": [{"digest": d, "size": len(b)} for d, b in blobs.items()]})
        assert plan.status_code == 200, plan.text
        for item in plan.json()["missing"]:
            assert item["url"].endswith(f"/v1/blobs/{item['digest']}")
            put = self.call("PUT", f"/v1/blobs/{item['digest']}", token,
                            content=blobs[item["digest"]])
            assert put.status_code == 200, put.text
        body = {"name": name, "digest": mdigest, "manifest_json": manifest, "size": len(payload) + len(manifest),
                "blobs": [[d, len(b)] for d, b in blobs.items()], "host": "gpu-7", "claim": claim, **extra}
        published = self.call("POST", "/v1/publish", token, json=body)
        if claim is not None:
            self.call("DELETE", f"/v1/pending/{claim}", token)
        return published, member, mdigest


@contextlib.contextmanager
def in_process_server(tmp_path: Path) -> Iterator[Server]:
    """The app over SQLite + a local store under ``tmp_path``, with small body limits, served
    in process (shared with test_server_hostile.py)."""
    settings = Settings.resolve(home=str(tmp_path / "home"), env={})
    app = create_app(settings, limits=ServerLimits(json_body=64 * 1024, blob_body=1 << 20,
                                                   publish_body=256 * 1024))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield Server(client, app)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with in_process_server(tmp_path) as srv:
        yield srv


def _error(response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"type", "exit_code", "message", "hint", "scope"}
    return body["error"]


def test_health_and_readiness_are_public(server: Server) -> None:
    assert server.call("GET", "/healthz").json() == {"ok": True}
    ready = server.call("GET", "/readyz")
    assert ready.status_code == 200 and ready.json()["schema"]
    doc = server.call("GET", "/v1/openapi.json").json()
    assert "/v1/publish" in doc["paths"]
    assert server.call("GET", "/docs").status_code == 404


def test_publish_pull_flow_and_identity_from_token(server: Server, monkeypatch) -> None:
    monkeypatch.setenv("PT2REG_ACTOR", "mallory")  # must not matter: the token names the actor
    pusher = server.token("model:team/*:push,pull,alias", owner="trainer")
    published, member, mdigest = server.publish(pusher, "team/bert", aliases=["prod"],
                                                actor="mallory")
    assert published.status_code == 200, published.text
    version = published.json()["version"]
    assert (version["name"], version["number"], version["aliases"]) == ("team/bert", 1, ["prod"])
    assert version["created_by"] == "trainer"
    assert published.json()["created"] is True

    puller = server.token("model:team/*:pull", owner="inference")
    got = server.call("GET", "/v1/resolve", puller, params={"ref": "team/bert@prod"})
    assert got.status_code == 200 and got.json()["digest"] == mdigest
    assert got.json()["manifest_json"]
    urls = server.call("POST", "/v1/blobs/download", puller, json={"digests": [member, mdigest]})
    assert urls.status_code == 200, urls.text
    assert urls.json()["urls"][member]["size"] == 700
    blob = server.call("GET", f"/v1/blobs/{member}", puller)
    assert blob.status_code == 200 and blob.content == b"weights" * 100
    assert server.call("HEAD", f"/v1/blobs/{member}", puller).headers["content-length"] == "700"
    event = server.call("POST", "/v1/events", puller,
                        json={"action": "pull", "model": "team/bert", "number": 1,
                              "digest": mdigest, "ref": "team/bert@prod", "host": "inf-3"})
    assert event.status_code == 200, event.text
    assert server.call("POST", "/v1/events", puller,
                       json={"action": "publish", "model": "team/bert"}).status_code == 400

    auditor = server.token("audit:read", owner="auditor")
    events = server.call("GET", "/v1/audit/events", auditor, params={"model": "team/bert"}).json()["events"]
    assert [e["action"] for e in events] == ["publish", "alias.set", "pull"]
    assert {e["actor"] for e in events} == {"trainer", "inference"}
    assert events[0]["host"] == "gpu-7" and events[2]["host"] == "inf-3"
    assert all(e["details"]["via"] == "server" and isinstance(e["details"]["token_id"], int)
               for e in events)
    verdict = server.call("GET", "/v1/audit/verify", auditor).json()
    assert verdict["ok"], verdict
    admin = server.token("admin", owner="root")
    assert server.call("GET", "/v1/stats", admin).json()["blob_bytes_served"] >= 700


def test_publish_refuses_missing_or_wrong_blobs(server: Server) -> None:
    pusher = server.token("model:m:push")
    payload = b"abc" * 10
    manifest = manifest_text(_digest(payload), 30)
    body = {"name": "m", "digest": _digest(manifest.encode()), "manifest_json": manifest,
            "size": 30 + len(manifest), "blobs": [[_digest(payload), 30]]}
    missing = server.call("POST", "/v1/publish", pusher, json=body)
    assert missing.status_code == 422 and "missing from the blob store" in _error(missing)["message"]
    wrong = server.call("PUT", f"/v1/blobs/{_digest(payload)}", pusher, content=b"abd" * 10)
    assert wrong.status_code == 422, wrong.text
    assert server.call("HEAD", f"/v1/blobs/{_digest(payload)}", pusher).status_code == 404
    assert server.call("GET", "/v1/models", pusher).json() == {"models": []}


def test_no_token_bad_token_expired_and_revoked(server: Server) -> None:
    none = server.call("GET", "/v1/models")
    assert none.status_code == 401 and _error(none)["exit_code"] == 7
    assert _error(none)["type"] == "NotAuthenticatedError"
    junk = server.call("GET", "/v1/models", "pt2r_" + "x" * 43)
    assert junk.status_code == 401 and "unknown token" in _error(junk)["message"]
    assert server.call("GET", "/v1/models", headers={"Authorization": "Basic abc"}).status_code == 401

    expiring = server.token("model:**:pull", expires_at=datetime.now(timezone.utc) + timedelta(hours=1))
    assert server.call("GET", "/v1/models", expiring).status_code == 200
    # then the same token's expiry passes: moved into the past in its row (every request reads
    # it there), instead of sleeping until it comes, which a busy machine could overrun
    token_id = server.call("GET", "/v1/whoami", expiring).json()["token_id"]
    with server.meta.engine.begin() as conn:
        conn.execute(text("UPDATE tokens SET expires_at = :t WHERE id = :id"),
                     {"t": format_ts(datetime.now(timezone.utc) - timedelta(seconds=1)), "id": token_id})
    expired = server.call("GET", "/v1/models", expiring)
    assert expired.status_code == 401 and "expired" in _error(expired)["message"], expired.text

    admin = server.token("admin", owner="root")
    victim = server.token("model:**:pull", owner="victim")
    victim_id = server.call("GET", "/v1/whoami", victim).json()["token_id"]
    revoked = server.call("DELETE", f"/v1/tokens/{victim_id}", admin, params={"host": "console"})
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    refused = server.call("GET", "/v1/models", victim)
    assert refused.status_code == 401 and "revoked" in _error(refused)["message"]


def test_missing_scope_is_403_naming_it(server: Server) -> None:
    pusher = server.token("model:team/*:push,pull,alias,yank", owner="trainer")
    assert server.publish(pusher, "team/bert")[0].status_code == 200
    puller = server.token("model:team/*:pull", owner="reader")
    cases = [
        ("POST", "/v1/publish", {"json": {"name": "team/bert", "digest": "sha256:" + "0" * 64}},
         "model:team/bert:push"),
        ("PUT", "/v1/alias", {"json": {"name": "team/bert", "alias": "prod", "number": 1}},
         "model:team/bert:alias"),
        ("POST", "/v1/status", {"json": {"name": "team/bert", "number": 1, "status": "yanked",
                                         "reason": "x"}}, "model:team/bert:yank"),
        ("GET", "/v1/audit/events", {}, "audit:read"),
        ("GET", "/v1/tokens", {}, "admin"),
        ("POST", "/v1/gc", {"json": {"dry_run": True}}, "admin"),
        ("POST", "/v1/blobs/upload", {"json": {"blobs": []}}, "model:<glob>:push"),
    ]
    for method, path, kwargs, scope in cases:
        denied = server.call(method, path, puller, **kwargs)
        assert denied.status_code == 403, (path, denied.text)
        err = _error(denied)
        assert err["scope"] == scope and scope in err["message"] and err["exit_code"] == 7
    # a push's first steps name the model when the client sends it, so the line names the scope
    for path, body in (("/v1/pending", {"blobs": [], "pid": 1, "name": "team/bert"}),
                       ("/v1/blobs/upload", {"blobs": [], "name": "team/bert"})):
        denied = server.call("POST", path, puller, json=body)
        assert denied.status_code == 403 and _error(denied)["scope"] == "model:team/bert:push"
    other = server.token("model:other/*:push")
    assert server.call("POST", "/v1/pending", other,
                       json={"blobs": [], "pid": 1, "name": "team/bert"}).status_code == 403
    assert server.call("POST", "/v1/pending", other, json={"blobs": [], "pid": 1}).status_code == 200
    # publish with aliases needs alias on top of push
    pushonly = server.token("model:team/*:push")
    denied = server.publish(pushonly, "team/gpt", aliases=["prod"])[0]
    assert denied.status_code == 403 and _error(denied)["scope"] == "model:team/gpt:alias"


def test_team_glob_does_not_reach_team2_or_nested(server: Server) -> None:
    admin = server.token("admin", owner="root")
    for name in ("team/a", "team2/x", "team/a/b"):
        assert server.publish(admin, name, payload=name.encode() * 50)[0].status_code == 200
    team = server.token("model:team/*:pull,push,alias,yank", owner="team-bot")
    names = [m["name"] for m in server.call("GET", "/v1/models", team).json()["models"]]
    assert names == ["team/a"]
    for name in ("team2/x", "team/a/b"):
        assert server.call("GET", "/v1/versions", team, params={"name": name}).status_code == 403
        assert server.call("GET", "/v1/resolve", team, params={"ref": f"{name}@1"}).status_code == 403
        assert server.publish(team, name, payload=b"new")[0].status_code == 403
        status = server.call("POST", "/v1/status", team,
                             json={"name": name, "number": 1, "status": "yanked", "reason": "x"})
        assert status.status_code == 403
        # their blobs are not readable either, even by digest: 404, as for a blob no one stored
        mdigest = server.call("GET", "/v1/resolve", admin, params={"ref": f"{name}@1"}).json()["digest"]
        assert server.call("GET", f"/v1/blobs/{mdigest}", team).status_code == 404
        assert server.call("POST", "/v1/blobs/download", team,
                           json={"digests": [mdigest]}).status_code == 404
    assert server.call("GET", "/v1/versions", team, params={"name": "team/a"}).status_code == 200
    twice = server.call("GET", "/v1/versions?name=team/a&name=team2/x", team)
    assert twice.status_code == 400 and "repeated" in _error(twice)["message"]
    unknown = server.call("GET", "/v1/blobs/sha256:" + "e" * 64, team)
    assert unknown.status_code == 404


def test_lineage_redacts_models_the_token_cannot_pull(server: Server) -> None:
    admin = server.token("admin", owner="root")
    assert server.publish(admin, "secret/base", payload=b"base" * 10)[0].status_code == 200
    child = server.publish(admin, "team/child", payload=b"child" * 10,
                           lineage=[{"kind": "parent", "value": "secret/base@1",
                                     "digest": server.call("GET", "/v1/resolve", admin,
                                                           params={"ref": "secret/base@1"}).json()["digest"]}])[0]
    assert child.status_code == 200, child.text
    team = server.token("model:team/*:pull,push")
    nodes = server.call("GET", "/v1/lineage", team,
                        params={"name": "team/child", "number": 1}).json()["nodes"]
    assert [n["name"] for n in nodes] == ["team/child", "restricted"]
    assert "secret" not in json.dumps(nodes)
    hidden = server.call("GET", "/v1/resolve", admin, params={"ref": "secret/base@1"}).json()["digest"]
    assert hidden[7:] not in json.dumps(nodes)  # its content address is not shown either
    again = server.call("GET", "/v1/lineage", team, params={"name": "team/child", "number": 1}).json()["nodes"]
    assert nodes[1]["digest"].startswith("restricted:") and again[1]["digest"] == nodes[1]["digest"]
    # naming a parent you cannot read is refused at publish, as one that does not exist is
    refused = server.publish(team, "team/other", payload=b"other" * 10,
                             lineage=[{"kind": "parent", "value": "secret/base@1", "digest": hidden}])[0]
    assert refused.status_code == 404 and "is not in this registry" in _error(refused)["message"]


def test_range_reads(server: Server) -> None:
    admin = server.token("admin")
    payload = bytes(range(256)) * 4
    _, member, _ = server.publish(admin, "r", payload=payload)
    whole = server.call("GET", f"/v1/blobs/{member}", admin)
    assert whole.status_code == 200 and whole.content == payload
    assert whole.headers["accept-ranges"] == "bytes"
    part = server.call("GET", f"/v1/blobs/{member}", admin, headers={"Range": "bytes=10-19"})
    assert part.status_code == 206 and part.content == payload[10:20]
    assert part.headers["content-range"] == f"bytes 10-19/{len(payload)}"
    tail = server.call("GET", f"/v1/blobs/{member}", admin, headers={"Range": "bytes=-5"})
    assert tail.status_code == 206 and tail.content == payload[-5:]
    open_end = server.call("GET", f"/v1/blobs/{member}", admin, headers={"Range": "bytes=1000-"})
    assert open_end.content == payload[1000:]
    outside = server.call("GET", f"/v1/blobs/{member}", admin, headers={"Range": "bytes=5000-6000"})
    assert outside.status_code == 416 and outside.headers["content-range"] == f"bytes */{len(payload)}"


def test_hostile_requests(server: Server) -> None:
    admin = server.token("admin")
    big = server.call("POST", "/v1/tokens", admin, content=b"{" + b" " * (70 * 1024) + b"}",
                      headers={"content-type": "application/json"})
    assert big.status_code == 413 and _error(big)["exit_code"] == 2

    def chunked():  # no Content-Length: the cap is counted as the body arrives
        for _ in range(100):
            yield b" " * 1024

    streamed = server.call("POST", "/v1/tokens", admin, content=chunked())
    assert streamed.status_code == 413
    blob = server.call("PUT", "/v1/blobs/sha256:" + "a" * 64, admin, content=b"x" * ((1 << 20) + 1))
    assert blob.status_code == 413
    deep = server.call("POST", "/v1/tokens", admin, content=b"[" * 5000 + b"]" * 5000)
    assert deep.status_code == 400
    nested_value: Any = []
    for _ in range(80):  # valid JSON, under the size cap, too deep
        nested_value = [nested_value]
    nested = server.call("POST", "/v1/tokens", admin, json={"a": nested_value})
    assert nested.status_code == 400 and "deeper" in _error(nested)["message"]
    for params in ({"name": "../etc"}, {"name": "Team/Bert"}, {"name": "a" * 200}, {"name": "x\n"}):
        bad = server.call("GET", "/v1/versions", admin, params=params)
        assert bad.status_code == 400 and _error(bad)["type"] == "UsageError", params
    assert server.call("GET", "/v1/resolve", admin, params={"ref": "m@"}).status_code == 400
    assert server.call("GET", "/v1/blobs/sha256:xyz", admin).status_code == 400
    notjson = server.call("POST", "/v1/tokens", admin, content=b"not json")
    assert notjson.status_code == 400
    missing = server.call("GET", "/v1/versions", admin)
    assert missing.status_code == 400 and _error(missing)["type"] == "UsageError"
    nowhere = server.call("GET", "/v1/nowhere", admin)
    assert nowhere.status_code == 404 and _error(nowhere)["type"] == "NotFoundError"
    unknown_model = server.call("GET", "/v1/versions", admin, params={"name": "ghost"})
    assert unknown_model.status_code == 404 and _error(unknown_model)["exit_code"] == 3
    no_length = server.call("PUT", "/v1/blobs/sha256:" + "a" * 64, admin, content=chunked())
    assert no_length.status_code in (411, 413)


def test_unexpected_errors_answer_generic_json(server: Server, monkeypatch, caplog) -> None:
    admin = server.token("admin")

    def boom(*a, **k):
        raise RuntimeError("/srv/secret/path exploded")

    monkeypatch.setattr(server.meta, "list_models", boom)
    failed = server.call("GET", "/v1/models", admin)
    assert failed.status_code == 500
    err = _error(failed)
    assert "/srv/secret" not in failed.text and "Traceback" not in failed.text
    assert "incident" in err["message"] and err["exit_code"] == 1
    assert "exploded" in caplog.text  # the operator's log has the details


def test_error_bodies_do_not_name_store_paths(server: Server) -> None:
    admin = server.token("admin")
    _, member, _ = server.publish(admin, "lost", payload=b"lost" * 100)
    store = server.app.state.registry.blobs
    store.delete(member)  # referenced by a version, gone from the store
    for response in (server.call("GET", f"/v1/blobs/{member}", admin),
                     server.call("POST", "/v1/blobs/download", admin, json={"digests": [member]})):
        assert response.status_code == 404, response.text
        assert str(store.root) not in response.text and "blob store" in _error(response)["message"]


def test_pending_claims_gc_and_tokens(server: Server) -> None:
    admin = server.token("admin", owner="root")
    pusher = server.token("model:team/*:push")
    claim = server.call("POST", "/v1/pending", pusher,
                        json={"blobs": ["sha256:" + "a" * 64], "host": "gpu-1", "pid": 42})
    assert claim.status_code == 200
    claim_id = claim.json()["id"]
    assert server.call("POST", f"/v1/pending/{claim_id}/heartbeat", pusher).json() == {"alive": True}
    pusher_id = server.call("GET", "/v1/whoami", pusher).json()["token_id"]
    assert server.meta.pending_claims()[0].host == f"remote:t{pusher_id}:gpu-1"
    someone_else = server.token("model:other/*:push")
    for method, path in (("POST", f"/v1/pending/{claim_id}/heartbeat"), ("DELETE", f"/v1/pending/{claim_id}")):
        assert server.call(method, path, someone_else).status_code == 403
    assert server.call("DELETE", f"/v1/pending/{claim_id}", pusher).json() == {}
    assert server.call("POST", f"/v1/pending/{claim_id}/heartbeat", pusher).json() == {"alive": False}
    orphan = b"orphan" * 10
    server.app.state.registry.blobs.put_bytes(orphan, _digest(orphan))
    dry = server.call("POST", "/v1/gc", admin, json={"dry_run": True, "grace_seconds": 0})
    assert dry.status_code == 200 and dry.json()["deleted"] == [[_digest(orphan), 60]]
    done = server.call("POST", "/v1/gc", admin, json={"dry_run": False, "host": "ops"}).json()
    assert done["reclaimed_bytes"] == 60
    gc_events = [e for e in server.meta.events() if e.action == "gc.delete"]
    assert gc_events and gc_events[0].actor == "root" and gc_events[0].host == "ops"
    made = server.call("POST", "/v1/tokens", admin,
                       json={"owner": "ci", "scopes": ["model:team/*:pull"], "host": "console"})
    assert made.status_code == 200 and made.json()["secret"].startswith("pt2r_")
    listed = server.call("GET", "/v1/tokens", admin).json()["tokens"]
    assert "ci" in [t["owner"] for t in listed] and "secret" not in json.dumps(listed)
    bad_scope = server.call("POST", "/v1/tokens", admin, json={"owner": "ci", "scopes": ["model:x"]})
    assert bad_scope.status_code == 400
    now = server.call("GET", "/v1/now", pusher).json()["now"]
    assert datetime.fromisoformat(now).tzinfo is not None


def test_slow_client_gets_408(tmp_path: Path) -> None:
    """A client that stops sending its body mid-way is cut off after the idle limit: the only
    limit that can answer here (the whole-body deadline is off), since the body never comes."""
    import math

    import anyio

    app = create_app(Settings.resolve(home=str(tmp_path / "home"), env={}),
                     limits=ServerLimits(idle_seconds=0.3, body_seconds=math.inf))
    _, secret = app.state.registry.meta.create_token("ana", ["admin"], expires_at=None,
                                                     actor="operator", host="ci")
    sent: list[dict[str, Any]] = []
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/tokens", "raw_path": b"/v1/tokens", "query_string": b"",
             "root_path": "", "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80),
             "headers": [(b"host", b"test"), (b"content-length", b"100"),
                         (b"authorization", f"Bearer {secret}".encode())]}
    messages = [{"type": "http.request", "body": b'{"owner": ', "more_body": True}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await anyio.Event().wait()  # the rest never comes
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def main() -> None:
        with anyio.fail_after(300):  # a hang guard only: without the idle limit nothing ever answers
            await app(scope, receive, send)

    anyio.run(main)
    assert sent[0]["status"] == 408
    assert json.loads(sent[1]["body"])["error"]["type"] == "UsageError"
    app.state.registry.close()


def test_serve_refuses_a_database_behind_head(tmp_path: Path) -> None:
    """`pt2reg serve` on an outdated schema stops before listening, with the CLI's own line."""
    from sqlalchemy import text

    from registry.store import open_metadata_store
    from tests.fixtures_pt2 import run_cli

    db = f"sqlite:///{tmp_path / 'old.db'}"
    store = open_metadata_store(db, auto_create=True)
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0002_audit_version_fields'"))
    store.close()
    env = {"PT2REG_HOME": str(tmp_path / "home"), "PT2REG_URL": None, "PT2REG_TOKEN": None}
    served = run_cli("--db", db, "--store", str(tmp_path / "blobs"), "serve", "--port", "1", env=env)
    listed = run_cli("--db", db, "--store", str(tmp_path / "blobs"), "list", env=env)
    assert served.returncode == listed.returncode == 1
    assert served.stderr.strip() == listed.stderr.strip()
    assert served.stderr.count("\n") == 1 and "pt2reg db upgrade" in served.stderr
