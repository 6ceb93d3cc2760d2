"""Issue 41 (A2): what a pull-only token may add to the hash-chained audit log through a real
``pt2reg serve`` (``POST /v1/events``). Megabyte details, "loads" of versions that do not exist
(by number, by digest, a number and a digest that disagree, a model that does not exist, no
version at all, a ref of another model), and a flood past the token's rate: each is refused
with a status and the JSON error body (413, 404, 400, 429 with ``Retry-After``), and the audit
log is exactly what it was. The rate is per token: another token is not held up by it.

The server runs with a bucket of a few events and a refill of one per thousand seconds, so
which request is refused never depends on how fast this machine is.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.test_audit_head import publish
from tests.services_server import make_token, registry_server

pytestmark = [pytest.mark.integration]

BURST = 20  # the first test spends 13 of its token's: every checked request takes one


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from registry.store import open_metadata_store

    tmp = tmp_path_factory.mktemp("events")
    db = f"sqlite:///{tmp / 'r.db'}"
    store = open_metadata_store(db, auto_create=True)
    publish(store, "team/m", 1)
    publish(store, "team/m", 2)
    publish(store, "other/x", 1)
    env = {"PT2REG_EVENT_BURST": str(BURST), "PT2REG_EVENT_RATE": "0.001"}
    try:
        with registry_server(db, f"file://{tmp / 'store'}", env=env, log_dir=tmp / "srv") as srv:
            yield {"url": srv.url, "db": db, "store": store,
                   "digests": {n: store.resolve(f"team/m@{n}").digest for n in (1, 2)}}
    finally:
        store.close()


def _post(server: dict[str, Any], token: str, **body: Any) -> httpx.Response:
    event = {"action": "load", "model": "team/m", "host": "inf-1", **body}
    return httpx.post(server["url"] + "/v1/events", headers={"Authorization": f"Bearer {token}"}, json=event,
                      timeout=60)


def _error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text[:300])
    body = r.json()
    assert set(body) == {"error"} and isinstance(body["error"]["message"], str), body
    return body["error"]


def _log(server: dict[str, Any]) -> list[tuple[int, str]]:
    return [(e.seq, e.hash) for e in server["store"].events()]


def test_oversize_and_untrue_events_are_refused_and_nothing_is_recorded(server: dict[str, Any]) -> None:
    token = make_token(server["db"], "inference", ["model:team/*:pull"])
    before = _log(server)
    one, two = server["digests"][1], server["digests"][2]
    err = _error(_post(server, token, number=1, details={"blob": "x" * 900_000}), 413)
    assert "at most 2048" in err["message"] and "nothing was recorded" in err["message"]
    _error(_post(server, token, number=1, details={f"k{i}": "v" * 30 for i in range(80)}), 413)
    _error(_post(server, token, number=1, details={"nested": [[["x" * 3000]]]}), 413)
    err = _error(_post(server, token, number=99), 404)
    assert err["type"] == "NotFoundError" and "no version 99" in err["message"]
    err = _error(_post(server, token, digest="sha256:" + "0" * 64), 404)
    assert "no version with digest" in err["message"]
    err = _error(_post(server, token, number=1, digest=two), 404)  # version 1 is not that digest
    assert "no version 1 with digest" in err["message"]
    _error(_post(server, token, model="team/nothing", number=1), 404)
    _error(_post(server, token), 400)  # names no version at all
    _error(_post(server, token, number=1, ref="other/x@1"), 400)  # a ref of another model
    _error(_post(server, token, number=1, ref="team/m@" + "a" * 5000), 400)
    _error(_post(server, token, model="other/x", number=1), 403)  # not this token's model
    assert _log(server) == before  # not one event appended

    # what a client really sends is still recorded: by number, by digest, both agreeing
    for body in ({"number": 1}, {"digest": two}, {"number": 1, "digest": one, "ref": "team/m@prod"},
                 {"number": 2, "details": {"served_from_cache_at": "2026-01-01T00:00:00+00:00"}}):
        r = _post(server, token, **body)
        assert r.status_code == 200, (body, r.text)
    assert len(_log(server)) == len(before) + 4
    assert server["store"].verify_audit_chain().ok


def test_a_token_past_its_rate_gets_429_with_retry_after_and_others_do_not(server: dict[str, Any]) -> None:
    flooder = make_token(server["db"], "flooder", ["model:team/*:pull"])
    other = make_token(server["db"], "bystander", ["model:team/*:pull"])
    before = _log(server)
    # refused requests take from the bucket too: oversize ones cannot be sent for free
    for _ in range(4):
        _error(_post(server, flooder, number=1, details={"blob": "x" * 100_000}), 413)
    for _ in range(BURST - 4):
        assert _post(server, flooder, number=1).status_code == 200
    for body in ({"number": 1}, {"number": 1, "details": {"blob": "x" * 100_000}}, {"number": 99}):
        r = _post(server, flooder, **body)
        err = _error(r, 429)
        assert int(r.headers["retry-after"]) >= 1, r.headers
        assert "faster than this server allows" in err["message"] and "nothing was recorded" in err["message"]
    assert len(_log(server)) == len(before) + BURST - 4
    assert _post(server, other, number=2).status_code == 200  # per token: the bystander is not held up
    assert server["store"].verify_audit_chain().ok
