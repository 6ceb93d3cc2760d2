"""Where versions were pushed as OCI artifacts, through the server (issue 43): recording needs
``push`` on the model, reading ``pull``; the repositories of a host a push may mount from are
only those of models the caller may pull; the actor is the token's, never the client's claim."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_server_api import Server, _error, in_process_server

MANIFEST = "sha256:" + "ab" * 32


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[Server]:
    with in_process_server(tmp_path) as server:
        yield server


def _record(srv: Server, token: str, name: str, location: str, tag: str | None = "v1", **extra):
    return srv.call("POST", "/v1/oci", token, json={"name": name, "number": 1, "location": location, "tag": tag,
                                                   "manifest_digest": MANIFEST, "host": "ci", **extra})


def test_recording_needs_push_and_reading_needs_pull(srv: Server) -> None:
    pusher = srv.token("model:team/*:push,pull", owner="trainer")
    reader = srv.token("model:team/*:pull", owner="reader")
    other = srv.token("model:other/*:push,pull", owner="other")
    assert srv.publish(pusher, "team/m")[0].status_code == 200
    assert srv.publish(other, "other/x")[0].status_code == 200

    denied = _record(srv, reader, "team/m", "ghcr.io/acme/m")
    assert denied.status_code == 403 and _error(denied)["exit_code"] == 7
    assert _record(srv, other, "team/m", "ghcr.io/acme/m").status_code == 403
    ok = _record(srv, pusher, "team/m", "ghcr.io/acme/m", actor="mallory")
    assert ok.status_code == 200, ok.text
    assert ok.json()["artifact"]["pushed_by"] == "trainer"          # the token's owner
    again = _record(srv, pusher, "team/m", "ghcr.io/acme/m")
    assert again.json()["artifact"] == ok.json()["artifact"]          # recorded once

    listed = srv.call("GET", "/v1/oci", reader, params={"name": "team/m", "number": 1})
    assert [(a["location"], a["manifest_digest"], a["tag"]) for a in listed.json()["artifacts"]] == [
        ("ghcr.io/acme/m", MANIFEST, "v1")]
    assert srv.call("GET", "/v1/oci", other, params={"name": "team/m", "number": 1}).status_code in (403, 404)
    events = [e for e in srv.meta.events("team/m") if e.action == "oci.push"]
    assert len(events) == 1 and events[0].actor == "trainer"


@pytest.mark.parametrize("body, field", [
    ({"location": "ghcr.io/acme/m:v1"}, "location"),              # a tag in the location
    ({"location": "ghcr.io/acme/m@" + MANIFEST}, "location"),
    ({"location": "acme/m"}, "registry host"),                     # no host
    ({"location": "ghcr.io/ACME/m"}, "location"),
    ({"manifest_digest": "sha256:xyz"}, "digest"),
    ({"tag": "-bad"}, "tag"),
    ({"tag": "x" * 200}, "tag"),
])
def test_hostile_records_are_refused_with_a_json_error(srv: Server, body, field) -> None:
    pusher = srv.token("model:team/*:push,pull", owner="trainer")
    srv.publish(pusher, "team/m")
    answer = _record(srv, pusher, "team/m", **{"location": "ghcr.io/acme/m", **body})
    assert answer.status_code in (400, 422), answer.text
    err = _error(answer)
    assert err["exit_code"] == 2 and field in err["message"]
    assert not [e for e in srv.meta.events("team/m") if e.action == "oci.push"]


def test_mount_candidates_are_only_repositories_of_models_the_caller_may_pull(srv: Server) -> None:
    team = srv.token("model:team/*:push,pull", owner="trainer")
    other = srv.token("model:other/*:push,pull", owner="other")
    srv.publish(team, "team/m")
    srv.publish(other, "other/x")
    assert _record(srv, team, "team/m", "ghcr.io/team/m").status_code == 200
    assert _record(srv, other, "other/x", "ghcr.io/secret/x").status_code == 200
    assert _record(srv, other, "other/x", "quay.io/secret/x").status_code == 200
    seen = srv.call("GET", "/v1/oci/repositories", team, params={"host": "ghcr.io"}).json()["repositories"]
    assert seen == ["team/m"]
    assert srv.call("GET", "/v1/oci/repositories", other, params={"host": "ghcr.io"}).json()["repositories"] == \
        ["secret/x"]
    assert srv.call("GET", "/v1/oci/repositories", None, params={"host": "ghcr.io"}).status_code == 401
