"""Issue 41 (A1): one webhook receiver that never answers must not hold up another endpoint.

A real ``pt2reg serve`` with two endpoints subscribed to the same events: a "dead" receiver
that accepts connections and never answers (with a delivery timeout of a minute, each attempt
to it hangs a minute), and a fast one. Whether the dead one was registered first or second,
every event reaches the fast endpoint while the dead endpoint's first attempts are still
hanging: none of its deliveries has an attempt recorded yet, so nothing waited for them. The
dead endpoint also never has more connections open than its concurrency limit.

Nothing here measures time: the proof is the order of events (``benchmarks/bench_webhooks.py``
measures the latencies).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_audit_head import publish
from tests.integration.test_webhooks import SECRET, Receiver, _wait
from tests.services_server import make_token, registry_server
from tests.webhook_receivers import Dead

pytestmark = [pytest.mark.integration]

EVENTS = 6
CONCURRENCY = 2
# the dead endpoint's attempts must outlast the test, however slow the machine: dead.close()
# ends them, never this timeout (600 s, a hang guard)
ENV = {"PT2REG_WEBHOOK_POLL": "0.1", "PT2REG_WEBHOOK_TIMEOUT": "600", "PT2REG_WEBHOOK_CONCURRENCY": str(CONCURRENCY),
       "PT2REG_AUDIT_SIGN_INTERVAL": "0.5", "PT2REG_WEBHOOK_ALLOW": "127.0.0.1"}


def _deliveries(url: str, admin: str) -> list[dict[str, Any]]:
    r = httpx.get(url + "/v1/webhooks/deliveries", headers={"Authorization": f"Bearer {admin}"}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["deliveries"]


@pytest.mark.parametrize("dead_first", [True, False], ids=["dead-registered-first", "dead-registered-second"])
def test_a_dead_receiver_never_holds_up_another_endpoint(tmp_path: Path, dead_first: bool) -> None:
    from registry.store import open_metadata_store

    db = f"sqlite:///{tmp_path / 'r.db'}"
    store = open_metadata_store(db, auto_create=True)
    publish(store, "team/m", 1)
    publish(store, "team/m", 2)
    admin = make_token(db, "ops", ["admin"])
    dead, fast = Dead(), Receiver()
    fast.up()
    try:
        with registry_server(db, f"file://{tmp_path / 'store'}", env=ENV, log_dir=tmp_path / "srv") as server:
            urls = [dead.url(), fast.url]
            hooks = {}
            for url in urls if dead_first else urls[::-1]:
                r = httpx.post(server.url + "/v1/webhooks", headers={"Authorization": f"Bearer {admin}"},
                               json={"url": url, "events": ["alias.moved"], "secret": SECRET}, timeout=60)
                assert r.status_code == 200, r.text
                hooks["dead" if url == urls[0] else "fast"] = r.json()["id"]
            for i in range(EVENTS):  # every event goes to both endpoints
                store.set_alias("team/m", "prod", 1 + i % 2, actor="ana", host="h")

            _wait(lambda: len(fast.events()) == EVENTS, "every event at the fast endpoint")
            found = _deliveries(server.url, admin)
            dead_rows = [d for d in found if d["webhook_id"] == hooks["dead"]]
            # the dead endpoint's deliveries all still wait on their first attempt: the fast
            # endpoint's were never queued behind them
            assert len(dead_rows) == EVENTS and all(d["attempts"] == 0 for d in dead_rows), dead_rows
            assert {d["status"] for d in found if d["webhook_id"] == hooks["fast"]} == {"delivered"}
            _wait(lambda: dead.accepted() == CONCURRENCY, f"{CONCURRENCY} connections to the dead endpoint")
            assert dead.accepted() == CONCURRENCY  # its concurrency limit, however many are due
            assert len({i for i, _ in fast.events()}) == EVENTS  # each once
            dead.close()  # its hanging attempts now fail at once; the server stops without waiting
    finally:
        dead.close()
        fast.down()
        store.close()
