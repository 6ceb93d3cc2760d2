"""Web page latency for a model with 1,000 versions, through a real ``pt2reg serve``.

The registry is the web UI test's (``tests/integration/_web_registry.py``: a multi-program
bundle with dynamic dims and a custom op, a three-generation lineage), plus 1,000 versions of
``team/enc`` published through the store (each its own manifest: the bundle's with one more
metadata key) and 50 moves of its ``prod`` alias, all audited. The server is a real process on
loopback over SQLite and a local store; one client with the session cookie fetches each page
``--reps`` x 40 times after a warm-up. Target: every page under 200 ms (p95 reported too).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import REPO, Row, parse_args, report, scratch

TARGET_MS = 200.0


def build(home: Path, versions: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    subprocess.run([sys.executable, "-m", "tests.integration._web_registry", str(home)], cwd=REPO, env=env,
                   check=True, capture_output=True, timeout=600)
    from registry.digests import canonical_json, digest_of_bytes
    from registry.format.manifest import stored_blobs
    from registry.store import open_metadata_store

    t0 = time.perf_counter()
    store = open_metadata_store(f"sqlite:///{home / 'registry.db'}", auto_create=True)
    try:
        first = store.resolve("team/enc@1")
        raw = json.loads(first.manifest_json or "{}")
        blobs = sorted(stored_blobs(first.manifest_json or "{}"))
        have = len(store.list_versions("team/enc"))
        for n in range(have + 1, versions + 1):
            raw["metadata"] = {**raw["metadata"], "build": str(n)}
            text = canonical_json(raw).decode("utf-8")
            store.publish("team/enc", digest_of_bytes(text.encode("utf-8")), text, first.size, blobs,
                          metadata=raw["metadata"], actor="bench", host="bench",
                          lineage=[{"kind": "run", "value": f"run-{n}"}])
            if n % 20 == 0:
                store.set_alias("team/enc", "prod", n, actor="bench", host="bench")
    finally:
        store.close()
    return time.perf_counter() - t0


def measure(base: str, token: str, pages: dict[str, str], calls: int) -> dict[str, dict[str, float]]:
    import httpx

    out = {}
    with httpx.Client(base_url=base, timeout=30) as client:
        r = client.post("/login", data={"token": token}, headers={"Origin": base},  # as a browser's form
                        follow_redirects=False)
        assert r.status_code == 303, r.text[:300]
        for label, url in pages.items():
            for _ in range(5):  # warm-up: pool, statement and template caches
                assert client.get(url).status_code == 200, url
            ms, size = [], 0
            for _ in range(calls):
                t0 = time.perf_counter()
                r = client.get(url)
                ms.append((time.perf_counter() - t0) * 1000)
                size = len(r.content)
                assert r.status_code == 200, url
            q = statistics.quantiles(ms, n=20)
            out[label] = {"p50": statistics.median(ms), "p95": q[18], "bytes": size}
    return out


def main() -> None:
    args = parse_args(__doc__)
    versions = 100 if args.quick else 1_000
    calls = 10 if args.quick else 40 * args.reps
    from tests.services_server import make_token, registry_server

    with scratch("web-") as work:
        home = work / "home"
        fill_s = build(home, versions)
        db, store = f"sqlite:///{home / 'registry.db'}", f"file://{home / 'store'}"
        mid = versions // 2
        pages = {
            "models list": "/",
            "models search": "/?q=enc+task%3Dtranslate",
            f"model ({versions:,} versions)": "/model?name=team/enc",
            "model, oldest page": f"/model?name=team/enc&page={-(-versions // 100)}",
            "version": f"/version?name=team/enc&number={mid}",
            "version (lineage)": "/version?name=team/ft&number=1",
            "compare": f"/compare?ref=team/enc@1&to_ref=team/enc@{versions}",
            "audit (chain verdict reused)": "/audit",
            "audit (chain re-walked)": "/audit?verify=1",
            "audit (filtered)": "/audit?model=team/enc&action=alias",
        }
        with registry_server(db, store, log_dir=work / "logs") as server:
            token = make_token(db, "bench", ["admin"])
            results = measure(server.url, token, pages, calls)
    rows = [Row(f"web page {label}: p50", q["p50"], unit="ms", target=f"< {TARGET_MS:.0f} ms",
                ok=q["p95"] < TARGET_MS, note=f"p95 {q['p95']:.1f} ms, {q['bytes'] / 1024:.0f} KiB")
            for label, q in results.items()]
    report("web", "Web page latency", rows, args,
           {"versions": versions, "calls": calls, "fill_seconds": fill_s, "pages": pages, "results": results})


if __name__ == "__main__":
    main()
