"""Issue 41, class 5: authorize the object that is stored, not the name a request gives it.

- a lineage parent links by digest, so the digest is what is authorized: it must be a version
  of the model the edge names, which the token may pull; otherwise the answer is the one for a
  parent that does not exist (404), and nothing is linked;
- an uploaded but unpublished blob belongs to the push claim of the token that uploaded it: no
  other claim or model adopts it by naming its digest and size, or reads it afterwards;
- a blob, version or parent the token may not read answers exactly as one that does not exist
  (404, the same JSON text apart from the name the caller gave), GET, HEAD and download alike,
  so no answer tells that a hidden model holds a digest.
"""
from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_server_api import Server, _digest, _error, in_process_server
from tests.services_server import manifest_text

SECRET = b"hidden weights " * 40


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[Server]:
    with in_process_server(tmp_path) as server:
        yield server


def same_answer(a: httpx.Response, b: httpx.Response, names: dict[str, str]) -> None:
    """``a`` and ``b`` are the same answer once each name in ``names`` (``a``'s -> ``b``'s) is
    swapped: status, and for a body, its JSON text."""
    assert a.status_code == b.status_code, (a.status_code, b.status_code, a.text, b.text)
    if a.request.method == "HEAD":
        assert a.content == b.content == b""
        return
    text = a.text
    for mine, theirs in names.items():
        text = text.replace(mine, theirs)
    assert json.loads(text) == b.json(), (text, b.text)
    _error(b)


def _version(srv: Server, token: str, name: str, payload: bytes) -> tuple[str, str]:
    """Publish ``payload`` as ``name``'s next version with ``token``: (its digest, its member)."""
    r, member, mdigest = srv.publish(token, name, payload)
    assert r.status_code == 200, r.text
    return mdigest, member


@pytest.fixture
def world(srv: Server) -> dict[str, Any]:
    """secret/base (hidden from the team token) and team/base, each with one version."""
    admin = srv.token("admin", owner="root")
    team = srv.token("model:team/*:pull,push", owner="mallory")
    hidden, hidden_member = _version(srv, admin, "secret/base", SECRET)
    own, _ = _version(srv, team, "team/base", b"team weights " * 30)
    return {"admin": admin, "team": team, "hidden": hidden, "hidden_member": hidden_member, "own": own}


def _graph(srv: Server, admin: str) -> dict[str, Any]:
    """Everything a parent edge could change, as an admin sees it."""
    def nodes(name: str, direction: str) -> list[Any]:
        return srv.call("GET", "/v1/lineage", admin, params={"name": name, "number": 1,
                                                             "direction": direction}).json()["nodes"]
    return {"models": srv.call("GET", "/v1/models", admin).json(),
            "down": {n: nodes(n, "descendants") for n in ("secret/base", "team/base")},
            "events": len(srv.call("GET", "/v1/audit/events", admin).json()["events"])}


# -- lineage ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["own name, hidden digest", "hidden name, its digest", "own alias, hidden digest",
                                  "own name, another own digest", "hidden name, guessed digest"])
def test_a_parent_is_authorized_by_the_version_it_links_to(srv, world, case):
    team, admin = world["team"], world["admin"]
    other_own, _ = _version(srv, team, "team/other", b"other weights " * 30)
    guess = "sha256:" + uuid.uuid4().hex * 2
    value, digest = {"own name, hidden digest": ("team/base@1", world["hidden"]),
                     "hidden name, its digest": ("secret/base@1", world["hidden"]),
                     "own alias, hidden digest": ("team/base", world["hidden"]),
                     "own name, another own digest": ("team/base@1", other_own),
                     "hidden name, guessed digest": ("secret/base@1", guess)}[case]
    before = _graph(srv, admin)
    attack, _, _ = srv.publish(team, "team/child", b"child " * 30,
                               lineage=[{"kind": "parent", "value": value, "digest": digest}])
    # the answer for a parent that exists nowhere, naming only what the request sent
    baseline, _, _ = srv.publish(team, "team/child", b"child " * 30,
                                 lineage=[{"kind": "parent", "value": "team/nothing@1", "digest": guess}])
    assert attack.status_code == 404, attack.text
    same_answer(attack, baseline, {value: "team/nothing@1", digest: guess})
    assert "secret" not in attack.text or value.startswith("secret")
    # nothing changed: no version, no edge in anyone's graph, no event
    after = _graph(srv, admin)
    assert after == before
    assert srv.call("GET", "/v1/versions", team, params={"name": "team/child"}).status_code == 404


def test_a_parent_is_stored_as_the_version_it_was_authorized_by(srv, world):
    """The same content published in a hidden model and in the team's: a child naming the team's
    version links there only, and the value stored is that version's ``name@number``."""
    team, admin = world["team"], world["admin"]
    shared = b"the same weights " * 30
    srv.publish(admin, "secret/twin", shared)       # first published: a bare digest would link here
    r, _, twin = srv.publish(team, "team/twin", shared)
    assert r.status_code == 200, r.text
    child, _, _ = srv.publish(team, "team/kid", b"kid " * 30,
                              lineage=[{"kind": "parent", "value": "team/twin", "digest": twin}])
    assert child.status_code == 200, child.text

    def down(name: str) -> list[str]:
        nodes = srv.call("GET", "/v1/lineage", admin, params={"name": name, "number": 1,
                                                             "direction": "descendants"}).json()["nodes"]
        return [f"{n['name']}@{n['number']}" for n in nodes]

    assert down("team/twin") == ["team/twin@1", "team/kid@1"]
    assert down("secret/twin") == ["secret/twin@1"]   # not a child in the other team's graph
    up = srv.call("GET", "/v1/lineage", team, params={"name": "team/kid", "number": 1}).json()["nodes"]
    assert [(e["value"], e["digest"]) for e in up[0]["edges"] if e["kind"] == "parent"] == [("team/twin@1", twin)]
    assert [n["name"] for n in up] == ["team/kid", "team/twin"]


# -- blobs -----------------------------------------------------------------------------------------

def _reads(srv: Server, token: str, digest: str) -> list[httpx.Response]:
    return [srv.call("GET", f"/v1/blobs/{digest}", token), srv.call("HEAD", f"/v1/blobs/{digest}", token),
            srv.call("POST", "/v1/blobs/download", token, json={"digests": [digest]})]


def test_a_hidden_blob_answers_as_one_never_stored(srv, world):
    team = world["team"]
    for hidden in (world["hidden"], world["hidden_member"]):
        nowhere = _digest(uuid.uuid4().bytes)
        for got, baseline in zip(_reads(srv, team, hidden), _reads(srv, team, nowhere)):
            assert got.status_code == 404
            same_answer(got, baseline, {hidden: nowhere})
        # the upload plan asks for its bytes, as for a blob it has never seen
        plan = srv.call("POST", "/v1/blobs/upload", team, json={"blobs": [
            {"digest": hidden, "size": 10}, {"digest": nowhere, "size": 10}]}).json()
        assert plan["present"] == [] and [m["digest"] for m in plan["missing"]] == [hidden, nowhere]
    # a manifest naming the hidden member is missing a blob, as one naming a blob nobody stored
    answers = []
    for member in (world["hidden_member"], _digest(b"x" * len(SECRET))):
        manifest = manifest_text(member, len(SECRET), salt="adopt")
        mdigest = _digest(manifest.encode())
        claim = srv.call("POST", "/v1/pending", team, json={"blobs": [member, mdigest], "pid": 1}).json()["id"]
        assert srv.call("PUT", f"/v1/blobs/{mdigest}", team, content=manifest.encode()).status_code == 200
        answers.append((srv.call("POST", "/v1/publish", team, json={
            "name": "team/adopt", "digest": mdigest, "manifest_json": manifest, "claim": claim}), member, mdigest))
    (hidden_r, hm, hd), (none_r, nm, nd) = answers
    assert hidden_r.status_code == 422 and "missing from the blob store" in _error(hidden_r)["message"]
    same_answer(hidden_r, none_r, {hm: nm, hd: nd})
    assert srv.call("GET", "/v1/versions", team, params={"name": "team/adopt"}).status_code == 404


@pytest.fixture
def unpublished(srv: Server) -> dict[str, Any]:
    """Another team's push in flight: its blobs claimed and uploaded, not yet published."""
    victim = srv.token("model:team2/*:pull,push", owner="victim")
    manifest = manifest_text(_digest(SECRET), len(SECRET), salt="victim")
    mdigest = _digest(manifest.encode())
    blobs = {_digest(SECRET): SECRET, mdigest: manifest.encode()}
    claim = srv.call("POST", "/v1/pending", victim, json={"blobs": sorted(blobs), "pid": 1,
                                                          "name": "team2/m"}).json()["id"]
    for d, data in blobs.items():
        assert srv.call("PUT", f"/v1/blobs/{d}", victim, content=data).status_code == 200
    body = {"name": "team2/m", "digest": mdigest, "manifest_json": manifest, "claim": claim}
    return {"victim": victim, "claim": claim, "body": body, "member": _digest(SECRET), "blobs": blobs}


@pytest.mark.parametrize("how", ["no claim", "its own claim", "claimed before the upload", "the victim's claim",
                                 "a sibling model"])
def test_an_unpublished_blob_cannot_be_adopted_by_another_claim(srv, unpublished, how):
    scope = "model:team2/other:pull,push" if how == "a sibling model" else "model:team/*:pull,push"
    mallory = srv.token(scope, owner="mallory")
    member = unpublished["member"]
    # mallory's own manifest naming the victim's member: mallory uploads only the manifest
    manifest = manifest_text(member, len(SECRET), salt="mallory")
    mdigest = _digest(manifest.encode())
    claim: int | None = None
    target = "team2/other" if how == "a sibling model" else "team/stolen"
    if how in ("its own claim", "claimed before the upload", "a sibling model"):
        claim = srv.call("POST", "/v1/pending", mallory, json={"blobs": [member, mdigest], "pid": 2,
                                                               "name": target}).json()["id"]
    elif how == "the victim's claim":
        claim = unpublished["claim"]
    if how == "claimed before the upload":   # the victim uploads again, after mallory's claim names it
        assert srv.call("PUT", f"/v1/blobs/{member}", unpublished["victim"], content=SECRET).status_code == 200
    put = srv.call("PUT", f"/v1/blobs/{mdigest}", mallory, content=manifest.encode())
    assert put.status_code == 200 and put.json() == {"stored": True}
    plan = srv.call("POST", "/v1/blobs/upload", mallory, json={"blobs": [{"digest": member, "size": len(SECRET)}]})
    assert plan.json()["present"] == [] and [m["digest"] for m in plan.json()["missing"]] == [member]
    r = srv.call("POST", "/v1/publish", mallory, json={"name": target, "digest": mdigest,
                                                       "manifest_json": manifest, "claim": claim})
    if how == "the victim's claim":  # as if the claim were gone
        assert r.status_code == 409 and "lost its pending-push claim" in _error(r)["message"], r.text
    else:
        assert r.status_code == 422, r.text
        err = _error(r)
        assert "missing from the blob store" in err["message"]
        assert member in err["message"] or how == "no claim"   # then its own manifest is not adoptable either
    # nothing changed: no version, the bytes unreadable to mallory; the victim still publishes
    assert srv.call("GET", "/v1/versions", mallory, params={"name": target}).status_code == 404
    assert all(x.status_code == 404 for x in _reads(srv, mallory, member))
    assert srv.call("POST", "/v1/publish", unpublished["victim"], json=unpublished["body"]).status_code == 200
    assert all(x.status_code == 404 for x in _reads(srv, mallory, member))


def test_a_token_pushing_the_same_model_shares_its_unpublished_blobs(srv, unpublished):
    """Two trainers pushing one model: the second uses the chunk the first uploaded, unpublished
    yet (its claim is for that model), without sending it again."""
    colleague = srv.token("model:team2/m:push,pull", owner="colleague")
    member = unpublished["member"]
    manifest = manifest_text(member, len(SECRET), salt="colleague")
    mdigest = _digest(manifest.encode())
    claim = srv.call("POST", "/v1/pending", colleague, json={"blobs": [member, mdigest], "pid": 4,
                                                             "name": "team2/m"}).json()["id"]
    plan = srv.call("POST", "/v1/blobs/upload", colleague, json={"blobs": [{"digest": member, "size": len(SECRET)}]})
    assert plan.json()["present"] == [member]
    assert srv.call("PUT", f"/v1/blobs/{mdigest}", colleague, content=manifest.encode()).status_code == 200
    r = srv.call("POST", "/v1/publish", colleague, json={"name": "team2/m", "digest": mdigest,
                                                         "manifest_json": manifest, "claim": claim})
    assert r.status_code == 200, r.text
    assert srv.call("POST", "/v1/publish", unpublished["victim"], json=unpublished["body"]).status_code == 200


def test_an_upload_answers_the_same_whether_the_blob_was_stored(srv, unpublished):
    """A PUT of bytes already stored is read and verified like a new one: the same answer, and
    wrong bytes are refused the same way."""
    mallory = srv.token("model:team/*:push", owner="mallory")
    fresh = b"never seen " * 20
    stored_again = srv.call("PUT", f"/v1/blobs/{unpublished['member']}", mallory, content=SECRET)
    new = srv.call("PUT", f"/v1/blobs/{_digest(fresh)}", mallory, content=fresh)
    assert stored_again.status_code == new.status_code == 200 and stored_again.json() == new.json()
    wrong_stored = srv.call("PUT", f"/v1/blobs/{unpublished['member']}", mallory, content=SECRET[:-1] + b"X")
    wrong_new = srv.call("PUT", f"/v1/blobs/{_digest(fresh + b'!')}", mallory, content=fresh + b"?")
    assert wrong_stored.status_code == wrong_new.status_code == 422
    same_answer(wrong_stored, wrong_new, {unpublished["member"]: _digest(fresh + b"!"),
                                          _digest(SECRET[:-1] + b"X"): _digest(fresh + b"?")})


def test_sending_the_bytes_is_what_lets_a_token_reuse_a_stored_blob(srv, unpublished):
    """Dedup across teams still works for a token that has the bytes: it uploads them under its
    own claim (verified) and may then publish them."""
    other = srv.token("model:team/*:pull,push", owner="colleague")
    r, _, _ = srv.publish(other, "team/same", SECRET)
    assert r.status_code == 200, r.text
    blob = srv.call("GET", f"/v1/blobs/{unpublished['member']}", other)
    assert blob.status_code == 200 and blob.content == SECRET


# -- S3: the uploader is recorded on the object ---------------------------------------------------

@pytest.fixture(params=["moto", pytest.param("seaweed", marks=pytest.mark.integration)])
def s3_server(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    import boto3
    from starlette.testclient import TestClient

    from registry.config import Settings
    from registry.server import create_app
    from tests.unit.test_server_s3 import _s3_env

    if request.param == "moto":
        _s3_env(monkeypatch, request.getfixturevalue("moto_endpoint"))
        bucket = f"own-{uuid.uuid4().hex[:12]}"
        boto3.client("s3").create_bucket(Bucket=bucket)
    else:
        seaweed = request.getfixturevalue("seaweed_s3")
        _s3_env(monkeypatch, seaweed.endpoint, "any")
        bucket = seaweed.new_bucket()
    app = create_app(Settings.resolve(home=str(tmp_path / "home"), store=f"s3://{bucket}/reg", env={}))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield Server(client, app)


def _presigned_push(srv: Server, token: str, blobs: dict[str, bytes], name: str, also: tuple[str, ...] = ()) -> int:
    """Claim ``blobs`` and ``also`` (for model ``name``), ask the plan for ``blobs``, PUT each
    missing one to its presigned URL with its headers; the claim's id."""
    claim = srv.call("POST", "/v1/pending", token, json={"blobs": sorted([*blobs, *also]), "pid": 1,
                                                         "name": name}).json()["id"]
    plan = srv.call("POST", "/v1/blobs/upload", token,
                    json={"blobs": [{"digest": d, "size": len(b)} for d, b in blobs.items()]}).json()
    for item in plan["missing"]:
        assert httpx.put(item["url"], content=blobs[item["digest"]], headers=item["headers"]).status_code == 200
    return claim


def test_on_s3_an_unpublished_blob_is_adopted_only_by_its_uploader(s3_server):
    srv = s3_server
    victim = srv.token("model:team2/*:pull,push", owner="victim")
    mallory = srv.token("model:team/*:pull,push", owner="mallory")
    vmanifest = manifest_text(_digest(SECRET), len(SECRET), salt="victim")
    vblobs = {_digest(SECRET): SECRET, _digest(vmanifest.encode()): vmanifest.encode()}
    vclaim = _presigned_push(srv, victim, vblobs, "team2/m")
    member = _digest(SECRET)
    # the object names its uploader (signed into the presigned PUT)
    assert srv.app.state.registry.blobs.head_info(member)[2] == "t1"
    # mallory: her plan asks for the bytes, her publish naming the member finds it missing
    manifest = manifest_text(member, len(SECRET), salt="mallory")
    mdigest = _digest(manifest.encode())
    claim = _presigned_push(srv, mallory, {mdigest: manifest.encode()}, "team/stolen", also=(member,))
    plan = srv.call("POST", "/v1/blobs/upload", mallory, json={"blobs": [{"digest": member, "size": len(SECRET)}]})
    assert plan.json()["present"] == [] and plan.json()["missing"][0]["headers"]["x-amz-meta-pt2reg-uploader"] == "t2"
    r = srv.call("POST", "/v1/publish", mallory, json={"name": "team/stolen", "digest": mdigest,
                                                       "manifest_json": manifest, "claim": claim})
    assert r.status_code == 422 and member in _error(r)["message"], r.text
    assert srv.call("GET", f"/v1/blobs/{member}", mallory, follow_redirects=False).status_code == 404
    assert srv.call("HEAD", f"/v1/blobs/{member}", mallory).status_code == 404
    # a colleague pushing the same model uses the victim's upload as it is
    colleague = srv.token("model:team2/m:pull,push", owner="colleague")
    cmanifest = manifest_text(member, len(SECRET), salt="colleague")
    cclaim = _presigned_push(srv, colleague, {member: SECRET, _digest(cmanifest.encode()): cmanifest.encode()},
                             "team2/m")
    assert srv.app.state.registry.blobs.head_info(member)[2] == "t1"   # not sent again
    cbody = {"name": "team2/m", "digest": _digest(cmanifest.encode()), "manifest_json": cmanifest, "claim": cclaim}
    assert srv.call("POST", "/v1/publish", colleague, json=cbody).status_code == 200
    # the victim's own publish goes through; the bytes stay the victim's team's
    body = {"name": "team2/m", "digest": _digest(vmanifest.encode()), "manifest_json": vmanifest, "claim": vclaim}
    assert srv.call("POST", "/v1/publish", victim, json=body).status_code == 200, body
    assert srv.call("GET", f"/v1/blobs/{member}", mallory, follow_redirects=False).status_code == 404
    assert srv.call("GET", "/v1/versions", mallory, params={"name": "team/stolen"}).status_code == 404


def test_cli_answers_a_hidden_digest_as_a_missing_one(tmp_path):
    """Through the CLI: ``show team/x@sha256:<a hidden version's digest>`` exits 3 as for a
    digest nobody published, with the same line apart from the digest."""
    from tests.cli_inprocess import run_in_process
    from tests.integration.test_remote_e2e import _Server, client
    from tests.services_server import make_token

    with _Server(tmp_path) as server, httpx.Client(base_url=server.url) as http:
        admin = make_token(server.db, "ops", ["admin"])
        team = make_token(server.db, "mallory", ["model:team/*:pull,push"])
        srv = Server(http, server.app)   # type: ignore[arg-type]
        hidden, _ = _version(srv, admin, "secret/base", SECRET)
        _version(srv, team, "team/base", b"team weights " * 30)
        nowhere = "sha256:" + "ab" * 32
        env = client(server, tmp_path / "c", team)
        got = run_in_process("show", f"team/base@{hidden}", env=env)
        baseline = run_in_process("show", f"team/base@{nowhere}", env=env)
        assert got.returncode == baseline.returncode == 3, got.stderr
        assert got.stderr.replace(hidden, nowhere) == baseline.stderr


def test_an_upload_is_noted_only_in_its_tokens_claims_that_list_it(sql_store):
    """The store side over SQLite and PostgreSQL: ``record_upload`` notes the blob in the claims
    of one token (``remote:t1:`` is not ``remote:t12:``) that list it, a claim keeps the model it
    pushes, and gc still sees only the claimed digests."""
    blob, other = "sha256:" + "a1" * 32, "sha256:" + "b2" * 32
    mine = sql_store.begin_pending([blob], "remote:t1:gpu", 1, name="team/m")
    theirs = sql_store.begin_pending([blob], "remote:t12:gpu", 1)
    unlisted = sql_store.begin_pending([other], "remote:t1:gpu", 1)
    assert sql_store.record_upload(blob, host_prefix="remote:t1:") == [mine]
    assert sql_store.record_upload(blob, host_prefix="remote:t1:") == []   # once
    assert sql_store.extend_pending(mine, [other])
    claims = {c.id: c for c in sql_store.pending_claims()}
    assert (claims[mine].blobs, claims[mine].uploaded, claims[mine].model) == ([blob, other], [blob], "team/m")
    assert (claims[theirs].uploaded, claims[unlisted].uploaded) == ([], [])
    assert {d for c in claims.values() for d in c.blobs} == {blob, other}   # what gc spares
