"""Hostile clients against the registry server, in process (SQLite + a local blob store): every
route of the OpenAPI document with tokens for another model, name confusion, forged publishes
(a manifest that does not hash to its digest, blobs never uploaded, another model's blob named
without the right to read it), numbers too large for the database, oversize and deep bodies,
and the CLI's exit codes for the server's 4xx answers."""
from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_server_api import Server, _digest, _error, in_process_server
from tests.services_server import manifest_text


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[Server]:
    with in_process_server(tmp_path) as server:
        yield server


SECRET = b"secret-weights " * 40


def _no_leak(response, tmp_path: Path, *secrets: str) -> None:
    text = response.text
    for needle in ("Traceback", str(tmp_path), "sqlite", "secret-weights", *secrets):
        assert needle not in text, (response.request.url, needle, text[:300])


def test_every_route_refuses_tokens_for_other_models(srv: Server, tmp_path: Path):
    owner = srv.token("model:team/*:pull,push,alias,yank", owner="ana")
    admin = srv.token("admin", owner="root")
    r, member, mdigest = srv.publish(owner, "team/a", SECRET)
    assert r.status_code == 200, r.text
    assert srv.call("PUT", "/v1/alias", owner, json={"name": "team/a", "alias": "prod", "number": 1}).status_code == 200
    pushed_oci = {"name": "team/a", "number": 1, "location": "ghcr.io/team/a", "tag": "v1",
                  "manifest_digest": "sha256:" + "c" * 64}   # where team/a went: a listing must not say
    assert srv.call("POST", "/v1/oci", owner, json=pushed_oci).status_code == 200
    others = {"team2": srv.token("model:team2/*:pull,push,alias,yank", owner="bob"),
              "sibling": srv.token("model:team/b:pull,push,alias,yank", owner="carl"),
              "deeper": srv.token("model:team/a/*:pull,push,alias,yank", owner="dan"),
              "prefix": srv.token("model:team:pull,push,alias,yank", owner="eve")}
    pull_only = srv.token("model:team/*:pull", owner="fay")
    fills = {"name": "team/a", "model": "team/a", "ref": "team/a@prod", "number": "1",
             "alias": "prod", "when": "2999-01-01T00:00:00Z", "digest": member, "uri": "s3://d",
             "seqs": "1", "claim_id": "1", "token_id": "1", "direction": "ancestors", "host": "ghcr.io"}
    body = {"name": "team/a", "model": "team/a", "alias": "prod", "number": 1, "status": "yanked",
            "reason": "x", "digests": [member], "blobs": [{"digest": member, "size": len(SECRET)}],
            "digest": mdigest, "action": "pull", "owner": "x", "scopes": ["admin"],
            "dry_run": True, "url": "http://example.invalid/hook", "events": ["publish"]}
    public = {"/healthz", "/readyz", "/v1/keys", "/v1/openapi.json"}
    push_steps = {("post", "/v1/blobs/upload"), ("put", "/v1/blobs/{digest}"), ("post", "/v1/pending"),
                  ("head", "/v1/blobs/{digest}")}  # HEAD: push on some model (dedup), no bytes
    listing = {"/v1/whoami", "/v1/now", "/v1/models", "/v1/lineage/dataset", "/v1/oci/repositories"}  # filtered
    doc = srv.call("GET", "/v1/openapi.json").json()
    walked = 0
    for path, ops in doc["paths"].items():
        if path in public:
            continue
        url = re.sub(r"\{(\w+)(:path)?\}", lambda m: fills.get(m.group(1), "1"), path)
        for method, op in ops.items():
            params = {p["name"]: fills.get(p["name"], "1") for p in op.get("parameters", [])
                      if p.get("in") == "query"}
            kwargs: dict[str, Any] = {"params": params}
            if method in ("post", "put", "patch"):
                kwargs["json"] = body
            for label, token, header in [("none", None, None), ("basic", None, "Basic YWI6Y2Q="),
                                         ("garbage", None, "Bearer pt2r_" + "A" * 43),
                                         *[(k, t, None) for k, t in others.items()],
                                         ("pull-only", pull_only, None)]:
                headers = {"Authorization": header} if header else {}
                resp = srv.call(method.upper(), url, token, headers=headers, **kwargs)
                where = f"{label} {method.upper()} {path}"
                walked += 1
                if label != "pull-only":  # it may read team/a's bytes
                    _no_leak(resp, tmp_path, owner, admin)
                if label in ("none", "basic", "garbage"):
                    assert resp.status_code == 401, (where, resp.status_code, resp.text[:200])
                elif label == "pull-only" and (method in ("get", "head")
                                               or path in ("/v1/events", "/v1/blobs/download")):
                    assert resp.status_code < 500, (where, resp.text[:200])
                    continue
                elif (method, path) in push_steps and label != "pull-only":
                    # a push's first steps need push on some model (the design); nothing is read
                    assert resp.status_code in (200, 400, 403, 404, 422), (where, resp.text[:200])
                    assert SECRET.decode() not in resp.text
                    continue
                elif path.startswith("/v1/pending/") and resp.status_code == 200:
                    assert resp.json() in ({"alive": False}, {}), (where, resp.text)  # no such claim
                    continue
                elif path in listing and resp.status_code == 200:
                    assert '"team/a"' not in resp.text and member not in resp.text, (where, resp.text[:200])
                    continue
                else:
                    assert resp.status_code in (400, 403, 404), (where, resp.status_code, resp.text[:200])
                if method != "head":
                    _error(resp)
    assert walked > 200
    # a push claim is refreshed and ended only by the token that made it
    claim = srv.call("POST", "/v1/pending", owner, json={"blobs": [member], "name": "team/a", "pid": 1}).json()["id"]
    for method, path in (("POST", f"/v1/pending/{claim}/heartbeat"), ("DELETE", f"/v1/pending/{claim}")):
        assert srv.call(method, path, others["team2"]).status_code == 403
    assert srv.call("POST", f"/v1/pending/{claim}/heartbeat", owner).json() == {"alive": True}
    # nothing changed: the alias still points at 1, the version is active, no other token exists
    shown = srv.call("GET", "/v1/resolve", owner, params={"ref": "team/a@prod"}).json()
    assert (shown["number"], shown["status"]) == (1, "active")
    assert {t["owner"] for t in srv.call("GET", "/v1/tokens", admin).json()["tokens"]} == {
        "ana", "root", "bob", "carl", "dan", "eve", "fay"}


@pytest.mark.parametrize("name", ["team/a/b", "team", "team2/x", "Team/a", "team/A", "team/..",
                                  "team/a%2Fb", "team/\u00e9", "team/" + "a" * 300, "team//a",
                                  "team/a/", " team/a", "team/a\x00", "team2/../team/a"])
def test_name_confusion_never_reaches_another_model(srv: Server, name: str):
    token = srv.token("model:team/*:pull,push,alias,yank")
    other = srv.token("model:team2/*:pull")
    r = srv.call("POST", "/v1/publish", token, json={"name": name, "digest": "sha256:" + "0" * 64,
                                                     "manifest_json": "{}", "size": 1, "blobs": []})
    assert r.status_code in (400, 403), r.text
    err = _error(r)
    assert err["exit_code"] in (2, 7)
    if name != "team2/x":
        r = srv.call("GET", "/v1/versions", other, params={"name": name})
        assert r.status_code in (400, 403), r.text


def test_foreign_blobs_cannot_be_read_or_adopted(srv: Server):
    owner = srv.token("model:team/*:pull,push")
    r, member, mdigest = srv.publish(owner, "team/a", SECRET)
    assert r.status_code == 200
    eve = srv.token("model:team2/*:pull,push", owner="eve")
    for method in ("GET", "HEAD"):  # 404, as for a blob nobody stored
        assert srv.call(method, f"/v1/blobs/{member}", srv.token("model:team2/*:pull")).status_code == 404
    err = _error(srv.call("POST", "/v1/blobs/download", eve, json={"digests": [member]}))
    assert err["exit_code"] == 3 and "team/a" not in err["message"]
    # a manifest that merely names team/a's blob must not make it team2's
    manifest = manifest_text(member, len(SECRET), salt="x")
    digest = _digest(manifest.encode())
    body = {"name": "team2/x", "digest": digest, "manifest_json": manifest, "size": len(SECRET) + len(manifest)}
    claim = srv.call("POST", "/v1/pending", eve, json={"blobs": [member, digest], "pid": 1}).json()["id"]
    assert srv.call("PUT", f"/v1/blobs/{digest}", eve, content=manifest.encode()).status_code == 200
    r = srv.call("POST", "/v1/publish", eve, json={**body, "blobs": [], "claim": claim})
    assert r.status_code == 422 and member in _error(r)["message"] and "missing" in _error(r)["message"], r.text
    assert srv.call("GET", f"/v1/blobs/{member}", eve).status_code == 404
    # a token that may pull team/a may reuse its blobs (dedup across a team's models); the
    # manifest it uploads itself (eve's upload is eve's)
    both = srv.token("model:team/*:pull", "model:team2/*:push")
    claim = srv.call("POST", "/v1/pending", both, json={"blobs": [member, digest], "pid": 1}).json()["id"]
    assert srv.call("PUT", f"/v1/blobs/{digest}", both, content=manifest.encode()).status_code == 200
    r = srv.call("POST", "/v1/publish", both, json={**body, "claim": claim})
    assert r.status_code == 200, r.text


def test_forged_publishes_are_refused(srv: Server):
    token = srv.token("model:team/*:pull,push")
    payload = b"never uploaded"
    manifest = manifest_text(_digest(payload), len(payload))
    digest = _digest(manifest.encode())
    srv.call("PUT", f"/v1/blobs/{digest}", token, content=manifest.encode())

    def publish(**body: Any):
        base = {"name": "team/a", "digest": digest, "manifest_json": manifest, "size": len(payload) + len(manifest)}
        return srv.call("POST", "/v1/publish", token, json={**base, **body})

    # the blob list leaves out the member that was never uploaded: the server derives it anyway
    r = publish(blobs=[[digest, len(manifest)]])
    assert r.status_code == 422 and "missing" in _error(r)["message"], r.text
    r = publish(blobs=[])
    assert r.status_code == 422, r.text
    # a manifest whose text does not hash to the digest it is published under
    r = publish(manifest_json=manifest + " ", blobs=[])
    assert r.status_code == 422 and "does not hash" in _error(r)["message"], r.text
    r = publish(manifest_json="not json", digest=_digest(b"not json"), blobs=[])
    assert r.status_code == 422 and "manifest" in _error(r)["message"], r.text
    # text that hashes to the digest it is sent with, but no client could pull it as a version:
    # not a manifest at all, or a manifest in another spelling than its canonical form
    bare = json.dumps({"members": [{"sha256": _digest(payload)[7:], "size": len(payload)}]})
    r = publish(manifest_json=bare, digest=_digest(bare.encode()), blobs=[])
    assert r.status_code == 422 and "invalid manifest" in _error(r)["message"], r.text
    spaced = json.dumps(json.loads(manifest), indent=1)
    r = publish(manifest_json=spaced, digest=_digest(spaced.encode()), blobs=[])
    err = _error(r)
    assert r.status_code == 422 and "not in canonical form" in err["message"] and digest in err["message"], r.text
    assert "\n" not in err["message"] and err["exit_code"] == 5
    # a size that lies about a blob the manifest names
    r = publish(blobs=[[digest, len(manifest) + 1]])
    assert r.status_code == 422 and "field 'blobs'" in _error(r)["message"], r.text
    # bytes that do not match their digest, and a Content-Length that lies
    d = _digest(b"hello")
    assert srv.call("PUT", f"/v1/blobs/{d}", token, content=b"hellX").status_code == 422
    assert srv.call("PUT", f"/v1/blobs/{d}", token, content=b"hellXhello",
                    headers={"Content-Length": "5"}).status_code in (400, 422)
    assert srv.call("HEAD", f"/v1/blobs/{d}", token).status_code == 404
    assert srv.call("GET", "/v1/versions", token, params={"name": "team/a"}).status_code == 404


def test_numbers_too_large_and_bodies_too_big_or_deep(srv: Server, tmp_path: Path):
    token = srv.token("model:team/*:pull,push,alias,yank")
    admin = srv.token("admin")
    assert srv.publish(token, "team/a")[0].status_code == 200
    huge = str(10 ** 30)
    for method, path, kwargs, who in [
            ("GET", "/v1/build", {"params": {"name": "team/a", "number": huge}}, token),
            ("GET", "/v1/signatures", {"params": {"name": "team/a", "number": huge}}, token),
            ("GET", "/v1/lineage", {"params": {"name": "team/a", "number": huge}}, token),
            ("POST", "/v1/status", {"json": {"name": "team/a", "number": 10 ** 30, "status": "yanked",
                                             "reason": "x"}}, token),
            ("PUT", "/v1/alias", {"json": {"name": "team/a", "alias": "prod", "number": 10 ** 30}}, token),
            ("POST", "/v1/blobs/upload", {"json": {"blobs": [{"digest": _digest(b"q"), "size": 10 ** 30}]}}, token),
            ("POST", f"/v1/pending/{huge}/heartbeat", {}, token),
            ("DELETE", f"/v1/tokens/{huge}", {}, admin)]:
        r = srv.call(method, path, who, **kwargs)
        assert r.status_code == 400, (path, r.status_code, r.text)
        _error(r)
        _no_leak(r, tmp_path, token, admin)
    for content in (b"[" * 5000 + b"]" * 5000, b'{"a":' * 3000 + b"1" + b"}" * 3000,
                    b'{"blobs": [' + b"9" * 5000 + b"]}", b"\xff\xfe", b"[1, 2]"):
        r = srv.call("POST", "/v1/blobs/upload", token, content=content,
                     headers={"Content-Type": "application/json"})
        assert r.status_code == 400, r.text
        _error(r)
    r = srv.call("POST", "/v1/alias", token, content=b"{" + b" " * (100 * 1024) + b"}")
    assert r.status_code in (405, 413), r.text

    def chunked():
        for _ in range(40):
            yield b" " * 4096

    r = srv.call("PUT", "/v1/alias", token, content=chunked(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and _error(r)["exit_code"] == 2, r.text
    r = srv.call("PUT", f"/v1/blobs/{_digest(b'x' * (2 << 20))}", token, content=b"x" * (2 << 20))
    assert r.status_code == 413, r.text


def test_cli_maps_server_refusals_to_exit_codes(tmp_path: Path):
    from tests.cli_inprocess import run_in_process
    from tests.integration.test_remote_e2e import _Server, client
    from tests.services_server import make_token

    with _Server(tmp_path) as server:
        pull = make_token(server.db, "inference", ["model:team/*:pull"])
        expired = make_token(server.db, "old", ["model:team/*:pull"])
        app_meta = server.app.state.registry.meta
        app_meta.revoke_token(next(t.id for t in app_meta.list_tokens() if t.owner == "old"),
                              actor="op", host="ci")
        _, short = app_meta.create_token("brief", ["model:team/*:pull"], actor="op", host="ci",
                                         expires_at=datetime.now(timezone.utc) + timedelta(seconds=1))
        time.sleep(1.2)
        cases = [(("list",), None, 7, "token"),
                 (("list",), "pt2r_" + "A" * 43, 7, "unknown token"),
                 (("list",), "not a token", 2, "token"),
                 (("list",), expired, 7, "revoked"),
                 (("list",), short, 7, "expired"),
                 (("show", "team2/x@1"), pull, 7, "model:team2/x:pull"),
                 (("show", "team/nothing@1"), pull, 3, "team/nothing"),
                 (("show", "Team/X"), pull, 2, "Team/X"),
                 (("audit",), pull, 7, "audit:read")]
        for args, token, code, needle in cases:
            r = run_in_process(*args, env=client(server, tmp_path / "c", token))
            lines = r.stderr.strip().splitlines()
            assert r.returncode == code, (args, r.returncode, r.stderr)
            assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], (args, r.stderr)
            assert "Traceback" not in r.stderr and (token or "pt2r_") not in r.stderr
