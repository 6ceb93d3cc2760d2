"""Webhook fairness: delivery latency to a fast endpoint, with and without a dead one beside it.

Three registries side by side in one run, each a real ``pt2reg serve`` over SQLite and a local
store: **alone** (one webhook, a receiver that answers at once), **dead first** (a receiver that
accepts connections and never answers registered first, then the fast one) and **dead second**
(the other order). Each repetition moves an alias ``--quick`` 5 / 20 times in each registry
(the order of the registries rotates), one move every 50 ms, every move announced to every
webhook, and measures from the commit of the move to its arrival at the fast receiver; p50 and
p99 per case. The delivery timeout is ``PT2REG_WEBHOOK_TIMEOUT`` = 10 s (the default; quick:
2 s), so each attempt to the dead endpoint hangs for 2 x that; before issue 41 every such
attempt held up every later delivery to every endpoint. Target: with the dead endpoint
present, the fast endpoint's p99 under one delivery timeout (what the per-endpoint queues
promise); the ratio compares its p50 with the registry that has no dead endpoint.
"""
from __future__ import annotations

import contextlib
import json
import statistics
import time
from pathlib import Path
from typing import Any

from _common import Row, parse_args, report, scratch

POLL = 0.05
SPACING = 0.05
CASES = {"alone": ("fast",), "dead registered first": ("dead", "fast"), "dead registered second": ("fast", "dead")}


def _registry(work: Path, case: str, order: tuple[str, ...], env: dict[str, str], dead: Any,
              stack: contextlib.ExitStack) -> dict[str, Any]:
    """A server with team/m@1 and @2 and the webhooks of ``order`` (alias.moved each)."""
    import httpx

    from registry.store import open_metadata_store
    from tests.integration.test_audit_head import publish
    from tests.integration.test_webhooks import SECRET
    from tests.services_server import make_token, registry_server
    from tests.webhook_receivers import Catcher

    home = work / case.replace(" ", "-")
    db = f"sqlite:///{home}.db"
    store = open_metadata_store(db, auto_create=True)
    stack.callback(store.close)
    for n in (1, 2):
        publish(store, "team/m", n)
    admin = make_token(db, "bench", ["admin"])
    fast = Catcher()
    stack.callback(fast.close)
    server = stack.enter_context(registry_server(db, f"file://{home}-store", env=env, log_dir=home))
    for which in order:
        r = httpx.post(server.url + "/v1/webhooks", headers={"Authorization": f"Bearer {admin}"}, timeout=60,
                       json={"url": (dead if which == "dead" else fast).url(), "events": ["alias.moved"],
                             "secret": SECRET})
        r.raise_for_status()
    return {"store": store, "fast": fast, "moves": 0}


def _moves(reg: dict[str, Any], count: int, wait_s: float) -> list[float]:
    """Move the alias ``count`` times; seconds from each commit to its arrival at ``fast``."""
    store, fast = reg["store"], reg["fast"]
    sent: dict[int, float] = {}
    for _ in range(count):
        reg["moves"] += 1
        store.set_alias("team/m", "prod", 1 + reg["moves"] % 2, actor="bench", host="bench")
        committed = time.monotonic()
        head, _ = store.audit_hashes()
        sent[head[0]] = committed
        time.sleep(SPACING)
    deadline = time.monotonic() + wait_s
    while True:
        arrived = {json.loads(body)["data"]["audit_seq"]: at for _, _, body, at in fast.requests()}
        if all(seq in arrived for seq in sent):
            return [arrived[seq] - t for seq, t in sent.items()]
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(set(sent) - set(arrived))} of {count} events never reached the fast endpoint")
        time.sleep(0.01)


def _quantile(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else xs[0]


def main() -> None:
    args = parse_args(__doc__)
    from tests.webhook_receivers import Dead

    timeout = 2.0 if args.quick else 10.0
    count = 5 if args.quick else 20
    env = {"PT2REG_WEBHOOK_POLL": str(POLL), "PT2REG_WEBHOOK_TIMEOUT": str(timeout),
           "PT2REG_WEBHOOK_ALLOW": "127.0.0.1", "PT2REG_AUDIT_SIGN_INTERVAL": "1"}
    dead = Dead()
    with scratch("webhooks-") as work, contextlib.ExitStack() as stack:
        stack.callback(dead.close)  # first thing undone: hanging attempts fail, servers stop at once
        regs = {case: _registry(work, case, order, env, dead, stack) for case, order in CASES.items()}
        names = list(CASES)
        seconds: dict[str, list[float]] = {case: [] for case in names}
        for rep in range(args.reps):
            for case in names[rep % len(names):] + names[:rep % len(names)]:
                seconds[case] += _moves(regs[case], count, wait_s=60 + 4 * timeout * count)
        hung = dead.accepted()
    ms = {case: [s * 1000 for s in xs] for case, xs in seconds.items()}
    alone = ms["alone"]
    rows = [Row("fast endpoint, no dead one: p50", statistics.median(alone), unit="ms",
                note=f"p99 {_quantile(alone, 99):.0f} ms, {len(alone)} events")]
    for case in names[1:]:
        xs = ms[case]
        p99 = _quantile(xs, 99)
        rows.append(Row(f"fast endpoint, {case}: p50", statistics.median(xs), raw=statistics.median(alone),
                        unit="ms", target=f"p99 < {timeout:g} s", ok=p99 < timeout * 1000,
                        note=f"p99 {p99:.0f} ms (no dead one: {_quantile(alone, 99):.0f} ms), {len(xs)} events"))
    report("webhooks", "Webhook fairness: a dead receiver beside a fast one", rows, args,
           {"timeout_s": timeout, "events_per_rep": count, "poll_s": POLL, "dead_connections": hung,
            "ms": {case: {"p50": statistics.median(xs), "p99": _quantile(xs, 99), "n": len(xs)}
                   for case, xs in ms.items()}})


if __name__ == "__main__":
    main()
