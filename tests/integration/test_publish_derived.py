"""Issue 41, class 4: the server records what the manifest says, never what the client says beside it.

A version's size, metadata and blob list are functions of its manifest: the server derives them
from the manifest text it verified. A publish whose body carries other values (a manifest saying
``stage=dev`` sent with ``security_review=passed``, a size of 1 byte, a blob at another size) is
refused with 422 and a JSON error naming the field, and nothing is recorded: no version, no
event, nothing in ``show``, the web page or search, and ``audit --verify`` stays green. A
version recorded otherwise (by an older server, or by a direct writer) fails ``audit --verify``.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from registry.format.manifest import Manifest
from registry.server.auth import SESSION_COOKIE
from tests.integration.test_server_api import Server, _digest, _error, in_process_server
from tests.store_calls import publish
from tests.unit.test_manifest import minimal

PAYLOAD = b"tensor bytes " * 50
HONEST = {"stage": "dev", "owner": "nlp"}


def manifest_of(payload: bytes, metadata: dict[str, str]) -> str:
    """The canonical text of a valid one-member manifest with ``metadata``."""
    raw = minimal()
    raw["members"][0].update(sha256=_digest(payload)[7:], size=len(payload))
    raw["metadata"] = metadata
    return Manifest.from_raw(raw).canonical.decode("utf-8")


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[Server]:
    with in_process_server(tmp_path) as server:
        yield server


def _upload(srv: Server, token: str, blobs: dict[str, bytes]) -> int:
    """Claim and upload ``blobs`` as the client does; the claim's id."""
    claim = srv.call("POST", "/v1/pending", token, json={"blobs": sorted(blobs), "pid": 1})
    assert claim.status_code == 200, claim.text
    for digest, data in blobs.items():
        assert srv.call("PUT", f"/v1/blobs/{digest}", token, content=data).status_code == 200
    return claim.json()["id"]


@pytest.fixture
def staged(srv: Server) -> dict[str, Any]:
    """A pusher's blobs uploaded under a claim, and the honest publish body."""
    pusher = srv.token("model:team/*:pull,push", owner="trainer")
    manifest = manifest_of(PAYLOAD, HONEST)
    mdigest = _digest(manifest.encode())
    claim = _upload(srv, pusher, {_digest(PAYLOAD): PAYLOAD, mdigest: manifest.encode()})
    body = {"name": "team/m", "digest": mdigest, "manifest_json": manifest, "claim": claim,
            "size": len(PAYLOAD) + len(manifest), "metadata": dict(HONEST),
            "blobs": [[_digest(PAYLOAD), len(PAYLOAD)], [mdigest, len(manifest)]]}
    return {"token": pusher, "body": body, "manifest": manifest, "digest": mdigest}


def _nothing_recorded(srv: Server, token: str) -> None:
    assert srv.call("GET", "/v1/models", token).json() == {"models": []}
    assert srv.call("GET", "/v1/versions", token, params={"name": "team/m"}).status_code == 404
    auditor = srv.token("audit:read", owner="auditor")
    events = srv.call("GET", "/v1/audit/events", auditor).json()["events"]
    assert [e["action"] for e in events if e["action"] == "publish"] == []
    assert srv.call("GET", "/v1/audit/verify", auditor).json()["ok"] is True
    assert srv.call("GET", "/v1/audit/contents", auditor).json() is None
    srv.client.cookies.set(SESSION_COOKIE, token)
    try:
        page = srv.call("GET", "/", params={"q": "security_review=passed"})
        assert page.status_code == 200 and "team/m" not in page.text
    finally:
        srv.client.cookies.clear()


@pytest.mark.parametrize("field,forged", [
    ("metadata", {"stage": "dev", "owner": "nlp", "security_review": "passed"}),   # a key added
    ("metadata", {"stage": "prod", "owner": "nlp"}),                               # a value changed
    ("metadata", {"stage": "dev"}),                                                # a key left out
    ("metadata", {}),                                                              # all left out
    ("size", 1),
    ("size", len(PAYLOAD)),                                                        # the manifest's text not counted
    ("blobs", [[_digest(PAYLOAD), 1]]),                                            # a blob at another size
    ("blobs", [[_digest(b"another blob"), 12]]),                                   # a blob it does not name
])
def test_a_value_beside_the_manifest_that_disagrees_is_refused_naming_the_field(srv, staged, field, forged):
    r = srv.call("POST", "/v1/publish", staged["token"], json={**staged["body"], field: forged})
    assert r.status_code == 422, r.text
    err = _error(r)
    assert err["type"] == "IntegrityError" and err["exit_code"] == 5
    assert f"field '{field}'" in err["message"] and "nothing was recorded" in err["message"]
    assert "\n" not in err["message"]
    _nothing_recorded(srv, staged["token"])
    # the same request with the manifest's own values is recorded
    assert srv.call("POST", "/v1/publish", staged["token"], json=staged["body"]).status_code == 200


def test_a_digest_that_is_not_the_manifests_is_refused_naming_the_field(srv, staged):
    other = manifest_of(PAYLOAD, {"stage": "prod"})
    r = srv.call("POST", "/v1/publish", staged["token"], json={**staged["body"], "manifest_json": other})
    assert r.status_code == 422 and "field 'digest'" in _error(r)["message"], r.text
    _nothing_recorded(srv, staged["token"])


@pytest.mark.parametrize("sent", ["all", "none", "some"])
def test_the_server_records_what_the_manifest_says(srv, staged, sent):
    """The fields may be sent (an older server needs ``size``) or left out: either way the
    version shows the manifest's metadata and size, in ``resolve``, listings, the web page and
    search, and its publish event counts the manifest's size."""
    body = dict(staged["body"])
    if sent == "none":
        for key in ("size", "metadata", "blobs"):
            body.pop(key)
    elif sent == "some":
        body["blobs"] = body["blobs"][:1]   # fewer blobs than it needs: the server stores them all
        body.pop("metadata")
    r = srv.call("POST", "/v1/publish", staged["token"], json=body)
    assert r.status_code == 200, r.text
    size = len(PAYLOAD) + len(staged["manifest"])
    version = srv.call("GET", "/v1/resolve", staged["token"], params={"ref": "team/m@1"}).json()
    assert (version["metadata"], version["size"]) == (HONEST, size)
    listed = srv.call("GET", "/v1/versions", staged["token"], params={"name": "team/m"}).json()["versions"]
    assert [(v["metadata"], v["size"]) for v in listed] == [(HONEST, size)]
    auditor = srv.token("audit:read", owner="auditor")
    [event] = [e for e in srv.call("GET", "/v1/audit/events", auditor).json()["events"] if e["action"] == "publish"]
    assert event["details"]["size"] == size and event["details"]["blobs"] == 2
    srv.client.cookies.set(SESSION_COOKIE, staged["token"])
    try:
        assert "team/m" in srv.call("GET", "/", params={"q": "stage=dev"}).text
        assert "team/m" not in srv.call("GET", "/", params={"q": "security_review=passed"}).text
    finally:
        srv.client.cookies.clear()
    assert srv.call("GET", "/v1/audit/contents", auditor).json() is None


def test_audit_verify_catches_a_version_whose_size_or_metadata_are_not_its_manifests(srv, staged):
    """A version recorded with values its manifest does not have (by an older server, or a
    direct writer with database access) is named by ``audit --verify``, even though its publish
    event vouched for the forged metadata when it was written."""
    meta = srv.meta
    manifest, digest = staged["manifest"], staged["digest"]
    blobs = [(_digest(PAYLOAD), len(PAYLOAD)), (digest, len(manifest))]
    publish(meta, "team/forged", digest, manifest, 1, blobs, metadata=dict(HONEST), actor="old-server", host="h")
    auditor = srv.token("audit:read", owner="auditor")
    assert srv.call("GET", "/v1/audit/verify", auditor).json()["ok"] is True   # the chain alone holds
    verdict = srv.call("GET", "/v1/audit/contents", auditor).json()
    assert verdict["ok"] is False and "team/forged@1" in verdict["reason"] and "size 1" in verdict["reason"]
    with meta.engine.begin() as conn:   # mended: the size its manifest says
        conn.execute(text("UPDATE versions SET size = :n WHERE size = 1"), {"n": len(PAYLOAD) + len(manifest)})
    assert srv.call("GET", "/v1/audit/contents", auditor).json() is None
    publish(meta, "team/forged2", digest, manifest, len(PAYLOAD) + len(manifest), blobs,
                 metadata={**HONEST, "security_review": "passed"}, actor="old-server", host="h")
    assert srv.call("GET", "/v1/audit/verify", auditor).json()["ok"] is True
    verdict = srv.call("GET", "/v1/audit/contents", auditor).json()
    assert verdict["ok"] is False and "team/forged2@1" in verdict["reason"] and "metadata" in verdict["reason"]


def test_cli_shows_the_manifests_values_and_a_forged_publish_leaves_nothing(tmp_path):
    """Through the CLI: a forged publish (raw HTTP with a restricted token) leaves no version for
    ``show``, and ``audit --verify`` passes; the honest one shows the manifest's metadata."""
    import httpx

    from tests.cli_inprocess import run_in_process
    from tests.integration.test_remote_e2e import _Server, client
    from tests.services_server import make_token

    with _Server(tmp_path) as server:
        pusher = make_token(server.db, "trainer", ["model:team/*:pull,push"])
        auditor = make_token(server.db, "auditor", ["audit:read", "model:team/*:pull"])
        manifest = manifest_of(PAYLOAD, HONEST)
        mdigest = _digest(manifest.encode())
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {pusher}"}) as http:
            claim = http.post("/v1/pending", json={"blobs": [_digest(PAYLOAD), mdigest], "pid": 1}).json()["id"]
            for d, data in ((_digest(PAYLOAD), PAYLOAD), (mdigest, manifest.encode())):
                assert http.put(f"/v1/blobs/{d}", content=data).status_code == 200
            body = {"name": "team/m", "digest": mdigest, "manifest_json": manifest, "claim": claim}
            forged = http.post("/v1/publish", json={**body, "metadata": {**HONEST, "security_review": "passed"}})
            assert forged.status_code == 422 and "field 'metadata'" in forged.json()["error"]["message"]
            env = client(server, tmp_path / "c", auditor)
            shown = run_in_process("show", "team/m", "--json", env=env)
            assert shown.returncode == 3, shown.stderr
            assert run_in_process("audit", "--verify", env=env).returncode == 0
            assert http.post("/v1/publish", json=body).status_code == 200
        shown = run_in_process("show", "team/m@1", "--json", env=env)
        assert shown.returncode == 0, shown.stderr
        doc = json.loads(shown.stdout)
        assert doc["metadata"] == HONEST and "security_review" not in shown.stdout
        assert run_in_process("audit", "--verify", env=env).returncode == 0
