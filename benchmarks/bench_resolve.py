"""Resolve latency with 100,000 versions, in SQLite and in PostgreSQL.

One model holds every version (the worst case for "latest"), each with the real manifest of
the benchmark bundle (~2.6 KB), plus two aliases. Rows go in through the store's own ORM
tables in bulk (one transaction); the schema comes from the store's migrations. PostgreSQL is
started on loopback (``tests/services_pg.py``) and stopped at the end.

Measured: ``Registry.resolve`` (ref parsing + one read transaction on a pooled connection) for
``NAME``, ``NAME@N``, ``NAME@alias`` and ``NAME@sha256:...``; p50 and p95 over many calls.
"""
from __future__ import annotations

import hashlib
import statistics
import time
import zipfile

from _common import Row, models, parse_args, registry, report, scratch

BATCH = 5_000


def digest(n: int) -> str:
    return "sha256:" + hashlib.sha256(f"version {n}".encode()).hexdigest()


def fill(url: str, versions: int, manifest: str, auto_create: bool) -> float:
    """Bulk-insert ``versions`` versions of model ``bench`` (+ aliases); returns seconds."""
    from sqlalchemy import insert

    from registry.store import open_metadata_store
    from registry.store.engine import run_transaction
    from registry.store.orm import AliasRow, ModelRow, VersionRow, now_text

    t0 = time.perf_counter()
    store = open_metadata_store(url, auto_create=auto_create)
    now = now_text()

    def work(s) -> None:
        model_id = s.execute(insert(ModelRow).values(name="bench", created_at=now)
                             .returning(ModelRow.id)).scalar_one()
        for start in range(1, versions + 1, BATCH):
            s.execute(insert(VersionRow), [
                {"model_id": model_id, "number": n, "digest": digest(n), "manifest_json": manifest,
                 "size": 402_777_619, "status": "active", "created_at": now, "created_by": "bench",
                 "metadata_json": "{}"} for n in range(start, min(start + BATCH, versions + 1))])
        ids = dict(s.execute(
            VersionRow.__table__.select().with_only_columns(VersionRow.number, VersionRow.id)
            .where(VersionRow.number.in_([versions // 2, versions - 1]))).all())
        s.execute(insert(AliasRow), [
            {"model_id": model_id, "alias": "prod", "version_id": ids[versions // 2],
             "updated_at": now, "updated_by": "bench"},
            {"model_id": model_id, "alias": "staging", "version_id": ids[versions - 1],
             "updated_at": now, "updated_by": "bench"}])

    run_transaction(store.engine, work, write=True)
    store.close()
    return time.perf_counter() - t0


def measure(reg, versions: int, calls: int) -> dict[str, dict[str, float]]:
    refs = {"NAME": "bench", "NAME@N": f"bench@{versions // 3}", "NAME@alias": "bench@prod",
            "NAME@sha256": f"bench@{digest(versions // 4)}"}
    out = {}
    for kind, ref in refs.items():
        for _ in range(20):  # warm-up: connection pool, statement caches
            reg.resolve(ref)
        ms = []
        for _ in range(calls):
            t0 = time.perf_counter()
            reg.resolve(ref)
            ms.append((time.perf_counter() - t0) * 1000)
        q = statistics.quantiles(ms, n=20)
        out[kind] = {"p50": statistics.median(ms), "p95": q[18]}
    return out


def main() -> None:
    args = parse_args(__doc__)
    versions = 2_000 if args.quick else 100_000
    calls = 50 if args.quick else 200 * args.reps
    ms = models(args.quick)
    manifest = zipfile.ZipFile(ms.bundle("base")).read("manifest.json").decode()
    results, fill_s = {}, {}
    with scratch("resolve-") as work:
        url = f"sqlite:///{work / 'registry.db'}"
        fill_s["sqlite"] = fill(url, versions, manifest, auto_create=True)
        results["sqlite"] = measure(registry(work / "home", db=url), versions, calls)

        from registry.store import make_engine, upgrade
        from tests.services_pg import postgres_server

        with postgres_server() as pg:
            url = pg.new_database()
            engine = make_engine(url)
            upgrade(engine)  # what `pt2reg db upgrade` does
            engine.dispose()
            fill_s["postgresql"] = fill(url, versions, manifest, auto_create=False)
            reg = registry(work / "home-pg", db=url)
            results["postgresql"] = measure(reg, versions, calls)
            reg.meta.close()
    rows = []
    for backend, by_kind in results.items():
        for kind, q in by_kind.items():
            ok = q["p50"] < 2 if backend == "sqlite" else None
            rows.append(Row(f"resolve {kind}, {backend}, {versions:,} versions: p50", q["p50"], unit="ms",
                            target="< 2 ms" if backend == "sqlite" else "", ok=ok,
                            note=f"p95 {q['p95']:.2f} ms"))
    report("resolve", "Resolve latency", rows, args,
           {"versions": versions, "calls": calls, "fill_seconds": fill_s, "results": results})


if __name__ == "__main__":
    main()
