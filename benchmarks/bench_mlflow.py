"""The same workflow through MLflow's model registry, the peer a user would pick instead.

MLflow is installed only for this benchmark, into ``benchmarks/.venv-mlflow`` (created here
when missing; no system site-packages; torch pinned to the local 2.13.0 CPU wheel through
``constraints-dev.txt``; boto3 for its S3 artifact store). Tracking and registry: a local SQLite file; artifacts: a local
directory. MLflow publishes the ``.pt2`` as a run artifact, registers it and sets an alias,
and loads ``models:/NAME@prod`` (download + ``torch.export.load(...).module()``);
``mlflow.pytorch.log_model`` cannot take an ExportedProgram or a ``.pt2`` (it exports an
``nn.Module`` itself), see ``_worker_mlflow.py``.

Ours: ``Registry.push(bundle, aliases=["prod"])`` into a local store, and ``NAME@prod``
loaded with an empty cache (cold) and a filled one (warm). Both sides run as long-lived
worker processes (imports and database set-up warmed before timing), alternating per
repetition; peak RSS comes from fresh one-operation processes above a same-imports baseline.

Then the same publish and cold load with both sides' blobs on S3 (SeaweedFS on loopback,
a fresh bucket per repetition; MLflow's artifacts through ``MLFLOW_S3_ENDPOINT_URL``), resolve
latency with 100,000 versions of one model in SQLite (ours filled as in ``bench_resolve.py``,
MLflow's through its own ORM tables; ``get_model_version_by_alias`` / ``get_model_version``),
and the start-up of ``pt2reg --help`` vs ``mlflow --help``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

from _common import (
    BENCH,
    PT2REG,
    PYTHON,
    REPO,
    Row,
    median,
    models,
    parse_args,
    registry,
    report,
    run,
    scratch,
    seaweed,
    tree_bytes,
)

VENV = BENCH / ".venv-mlflow"
MLFLOW_PY = str(VENV / "bin" / "python")


def ensure_mlflow() -> str | None:
    """Create the MLflow venv if needed; its MLflow version, or None when it cannot be installed."""
    try:
        if not (VENV / "bin" / "python").exists():
            run(["python3.11" if shutil.which("python3.11") else "python3", "-m", "venv", str(VENV)])
        probe = subprocess.run([MLFLOW_PY, "-c", "import mlflow, torch, boto3; print(mlflow.__version__)"],
                               capture_output=True, text=True)
        if probe.returncode != 0:
            run([str(VENV / "bin" / "pip"), "install", "-q", "-c", str(REPO / "constraints-dev.txt"),
                 "mlflow", "boto3", "torch==2.13.0"], timeout=1800)  # boto3: MLflow's S3 artifacts
            probe = subprocess.run([MLFLOW_PY, "-c", "import mlflow; print(mlflow.__version__)"],
                                   capture_output=True, text=True, check=True)
        return probe.stdout.strip()
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        print(f"MLflow could not be installed here: {exc}")
        return None


class Worker:
    """A long-lived worker process: send "MODE JSON", get one JSON line back."""

    def __init__(self, python: str, script: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen([python, str(BENCH / script), "serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     env={**os.environ, **(env or {})})

    def __call__(self, mode: str, **cfg) -> dict:
        self.proc.stdin.write(f"{mode} {json.dumps({k: str(v) for k, v in cfg.items()})}\n")
        self.proc.stdin.flush()
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"worker {self.proc.args} died during {mode}")
            if line.startswith("{"):
                return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def one_shot(python: str, script: str, mode: str, **cfg) -> dict:
    out = run([python, str(BENCH / script), mode, json.dumps({k: str(v) for k, v in cfg.items()})]).stdout
    return json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])


def main() -> None:
    args = parse_args(__doc__)
    version = ensure_mlflow()
    if version is None:
        report("mlflow", "MLflow comparison: MLflow could NOT be installed here", [], args, {"mlflow": None})
        return
    ms = models(args.quick)
    t: dict[str, list[float]] = {k: [] for k in ("ours publish", "mlflow publish", "ours load cold",
                                                  "ours load warm", "mlflow load")}
    with scratch("mlflow-") as work:
        db = f"sqlite:///{work / 'ours.db'}"
        mdb, art = work / "mlflow.db", work / "artifacts"
        ours, theirs = Worker(PYTHON, "_worker_ours.py"), Worker(MLFLOW_PY, "_worker_mlflow.py")
        try:
            # warm-up: schemas created, lazy imports done on both sides
            ours("push", home=work / "h0", db=db, store=f"file://{work / 's0'}", bundle=ms.bundle("tiny"),
                 name="warm", aliases="prod")
            ours("load", home=work / "h0", db=db, store=f"file://{work / 's0'}", ref="warm@prod")
            theirs("publish", db=mdb, artifacts=art, pt2=ms.pt2("tiny"), name="warm", alias="prod")
            theirs("load", db=mdb, dest=work / "dl0", pt2=ms.pt2("tiny"), name="warm", alias="prod")
            for rep in range(args.reps):
                store = f"file://{work / f's{rep + 1}'}"  # a fresh store: every byte is written
                t["ours publish"].append(ours("push", home=work / "h", db=db, store=store,
                                              bundle=ms.bundle("base"), name=f"m{rep}", aliases="prod")["seconds"])
                t["mlflow publish"].append(theirs("publish", db=mdb, artifacts=art, pt2=ms.pt2("base"),
                                                  name=f"m{rep}", alias="prod")["seconds"])
                home = work / f"cold{rep}"
                t["ours load cold"].append(ours("load", home=home, db=db, store=store, ref=f"m{rep}@prod")["seconds"])
                t["ours load warm"].append(ours("load", home=home, db=db, store=store, ref=f"m{rep}@prod")["seconds"])
                t["mlflow load"].append(theirs("load", db=mdb, dest=work / f"dl{rep}", pt2=ms.pt2("base"),
                                               name=f"m{rep}", alias="prod")["seconds"])
                shutil.rmtree(home, ignore_errors=True)
                shutil.rmtree(work / f"dl{rep}", ignore_errors=True)
                shutil.rmtree(store[len("file://"):], ignore_errors=True)
        finally:
            ours.close()
            theirs.close()

        # store growth for the one-layer fine-tune: base then ft as version 2 of one model
        growth = {}
        store = work / "growth-store"
        one_shot(PYTHON, "_worker_ours.py", "push", home=work / "h", db=db, store=f"file://{store}",
                 bundle=ms.bundle("base"), name="g")
        before = tree_bytes(store)
        one_shot(PYTHON, "_worker_ours.py", "push", home=work / "h", db=db, store=f"file://{store}",
                 bundle=ms.bundle("ft"), name="g")
        growth["ours"] = 100 * (tree_bytes(store) - before) / ms.bundle("ft").stat().st_size
        gart, gdb = work / "growth-art", work / "growth.db"
        one_shot(MLFLOW_PY, "_worker_mlflow.py", "publish", db=gdb, artifacts=gart, pt2=ms.pt2("base"),
                 name="g", alias="prod")
        before = tree_bytes(gart)
        one_shot(MLFLOW_PY, "_worker_mlflow.py", "publish", db=gdb, artifacts=gart, pt2=ms.pt2("ft"),
                 name="g", alias="prod")
        growth["mlflow"] = 100 * (tree_bytes(gart) - before) / ms.pt2("ft").stat().st_size

        # peak RSS, each in a fresh process, above the same process's imports alone
        rss: dict[str, list[float]] = {k: [] for k in ("ours base", "ours publish", "ours base+torch",
                                                       "ours load", "mlflow base", "mlflow publish",
                                                       "mlflow base+torch", "mlflow load")}
        for rep in range(min(args.reps, 3)):
            store = f"file://{work / 'rss-store'}"
            rss["ours base"].append(one_shot(PYTHON, "_worker_ours.py", "baseline", home=work / "h")["peak_mib"])
            rss["ours publish"].append(one_shot(PYTHON, "_worker_ours.py", "push", home=work / "h", db=db,
                                                store=store, bundle=ms.bundle("base"), name=f"r{rep}",
                                                aliases="prod")["peak_mib"])
            rss["ours base+torch"].append(one_shot(PYTHON, "_worker_ours.py", "baseline-torch",
                                                   home=work / "h")["peak_mib"])
            rss["ours load"].append(one_shot(PYTHON, "_worker_ours.py", "load", home=work / f"rc{rep}", db=db,
                                             store=store, ref=f"r{rep}@prod")["peak_mib"])
            rss["mlflow base"].append(one_shot(MLFLOW_PY, "_worker_mlflow.py", "baseline")["peak_mib"])
            rss["mlflow publish"].append(one_shot(MLFLOW_PY, "_worker_mlflow.py", "publish", db=mdb, artifacts=art,
                                                  pt2=ms.pt2("base"), name=f"r{rep}", alias="prod")["peak_mib"])
            rss["mlflow base+torch"].append(one_shot(MLFLOW_PY, "_worker_mlflow.py", "baseline-torch")["peak_mib"])
            rss["mlflow load"].append(one_shot(MLFLOW_PY, "_worker_mlflow.py", "load", db=mdb, dest=work / "rdl",
                                               pt2=ms.pt2("base"), name=f"r{rep}", alias="prod")["peak_mib"])
            shutil.rmtree(work / "store", ignore_errors=True)
            shutil.rmtree(work / "rss-store", ignore_errors=True)
            shutil.rmtree(work / f"rc{rep}", ignore_errors=True)
            shutil.rmtree(work / "rdl", ignore_errors=True)

        s3 = s3_workflow(ms, args, work)
        resolve = resolve_latency(ms, args, work)
        cli = {"ours": [], "mlflow": []}
        for _ in range(max(args.reps, 3)):
            for side, cmd in (("ours", [PT2REG, "--help"]), ("mlflow", [str(VENV / "bin" / "mlflow"), "--help"])):
                t0 = time.perf_counter()
                run(cmd)
                cli[side].append(time.perf_counter() - t0)

    m = {k: median(v) for k, v in t.items()}
    r = {k: median(v) for k, v in rss.items()}
    m3 = {k: median(v) for k, v in s3.items()}
    c = {k: median(v) for k, v in cli.items()}
    size = ms.bundle("base").stat().st_size / 2**20
    rows = [
        Row(f"publish {size:.0f} MiB + alias (local store)", m["ours publish"], mlflow=m["mlflow publish"],
            note=f"ours/MLflow {m['ours publish'] / m['mlflow publish']:.2f}x"),
        Row("load by alias, cold cache (fetch + load)", m["ours load cold"], mlflow=m["mlflow load"],
            note=f"ours/MLflow {m['ours load cold'] / m['mlflow load']:.2f}x; MLflow has no cache"),
        Row("load by alias, warm cache", m["ours load warm"], mlflow=m["mlflow load"],
            note=f"ours/MLflow {m['ours load warm'] / m['mlflow load']:.2f}x"),
        Row("store growth, 1-of-6-layer fine-tune", growth["ours"], unit="%", mlflow=growth["mlflow"],
            note="% of the bundle (.pt2 for MLflow)"),
        Row("peak RSS above baseline, publish", r["ours publish"] - r["ours base"], unit="MiB",
            mlflow=r["mlflow publish"] - r["mlflow base"],
            note=f"baselines {r['ours base']:.0f} / {r['mlflow base']:.0f} MiB"),
        Row("peak RSS above baseline, load by alias", r["ours load"] - r["ours base+torch"], unit="MiB",
            mlflow=r["mlflow load"] - r["mlflow base+torch"],
            note=f"baselines with torch {r['ours base+torch']:.0f} / {r['mlflow base+torch']:.0f} MiB"),
        Row(f"publish {size:.0f} MiB + alias (S3 store)", m3["ours publish"], mlflow=m3["mlflow publish"],
            note=f"ours/MLflow {m3['ours publish'] / m3['mlflow publish']:.2f}x"),
        Row("load by alias from S3, cold cache (fetch + load)", m3["ours load"], mlflow=m3["mlflow load"],
            note=f"ours/MLflow {m3['ours load'] / m3['mlflow load']:.2f}x"),
        *[Row(f"resolve {kind}, sqlite, {resolve['versions']:,} versions: p50", q["p50"], unit="ms",
              mlflow=resolve["mlflow"][kind]["p50"],
              note=f"ours/MLflow {q['p50'] / resolve['mlflow'][kind]['p50']:.2f}x; p95 {q['p95']:.2f} / "
                   f"{resolve['mlflow'][kind]['p95']:.2f} ms")
          for kind, q in resolve["ours"].items()],
        Row("--help start-up", c["ours"], mlflow=c["mlflow"], note=f"ours/MLflow {c['ours'] / c['mlflow']:.2f}x"),
    ]
    report("mlflow", f"Ours vs MLflow {version} (same workflow)", rows, args,
           {"mlflow": version, "timings": t, "growth_pct": growth, "rss_mib": rss, "s3": s3,
            "resolve": resolve, "cli": cli})


def s3_workflow(ms, args, work: Path) -> dict[str, list[float]]:
    """Publish + alias and cold load by alias with both sides' blobs on S3 (SeaweedFS)."""
    out: dict[str, list[float]] = {k: [] for k in ("ours publish", "mlflow publish", "ours load", "mlflow load")}
    db, mdb = f"sqlite:///{work / 'ours-s3.db'}", work / "mlflow-s3.db"
    with seaweed() as server:
        env = {**server.env, "MLFLOW_S3_ENDPOINT_URL": server.env["AWS_ENDPOINT_URL"]}
        ours, theirs = Worker(PYTHON, "_worker_ours.py", env), Worker(MLFLOW_PY, "_worker_mlflow.py", env)
        try:
            warm = server.new_bucket()
            ours("push", home=work / "s3h0", db=db, store=f"s3://{warm}/reg", bundle=ms.bundle("tiny"),
                 name="warm", aliases="prod")
            ours("load", home=work / "s3h0", db=db, store=f"s3://{warm}/reg", ref="warm@prod")
            theirs("publish", db=mdb, artifacts=f"s3://{warm}/mlflow", experiment=warm, pt2=ms.pt2("tiny"),
                   name="warm", alias="prod")
            theirs("load", db=mdb, dest=work / "s3dl0", pt2=ms.pt2("tiny"), name="warm", alias="prod")
            for rep in range(args.reps):
                # a fresh bucket per side and repetition: every byte is uploaded, and each side
                # pays SeaweedFS's volume allocation on a bucket's first write once
                bucket, their_bucket = server.new_bucket(), server.new_bucket()
                store = f"s3://{bucket}/reg"
                out["ours publish"].append(ours("push", home=work / "s3h", db=db, store=store,
                                                bundle=ms.bundle("base"), name=f"s{rep}",
                                                aliases="prod")["seconds"])
                out["mlflow publish"].append(theirs("publish", db=mdb, artifacts=f"s3://{their_bucket}/mlflow",
                                                    experiment=their_bucket, pt2=ms.pt2("base"), name=f"s{rep}",
                                                    alias="prod")["seconds"])
                home, dest = work / f"s3cold{rep}", work / f"s3dl{rep}"
                out["ours load"].append(ours("load", home=home, db=db, store=store, ref=f"s{rep}@prod")["seconds"])
                out["mlflow load"].append(theirs("load", db=mdb, dest=dest, pt2=ms.pt2("base"), name=f"s{rep}",
                                                 alias="prod")["seconds"])
                shutil.rmtree(home, ignore_errors=True)
                shutil.rmtree(dest, ignore_errors=True)
        finally:
            ours.close()
            theirs.close()
    return out


def resolve_latency(ms, args, work: Path) -> dict:
    """p50/p95 of resolving by alias and by number with 100,000 versions of one model, SQLite."""
    from bench_resolve import fill, measure

    versions = 2_000 if args.quick else 100_000
    calls = 50 if args.quick else 200
    manifest = zipfile.ZipFile(ms.bundle("base")).read("manifest.json").decode()
    url = f"sqlite:///{work / 'resolve.db'}"
    fill(url, versions, manifest, auto_create=True)
    reg = registry(work / "resolve-home", db=url)
    ours = {k: v for k, v in measure(reg, versions, calls).items() if k in ("NAME@alias", "NAME@N")}
    reg.meta.close()
    mdb = work / "mlflow-resolve.db"
    one_shot(MLFLOW_PY, "_worker_mlflow.py", "populate", db=mdb, name="bench", versions=versions,
             source=(work / "artifacts" / "model").as_uri())
    theirs = one_shot(MLFLOW_PY, "_worker_mlflow.py", "resolve", db=mdb, name="bench", versions=versions,
                      calls=calls)
    return {"versions": versions, "calls": calls, "ours": ours,
            "mlflow": {k: theirs[k] for k in ("NAME@alias", "NAME@N")}}


if __name__ == "__main__":
    main()
