"""The same workflow through MLflow's model registry, the peer a user would pick instead.

MLflow is installed only for this benchmark, into ``benchmarks/.venv-mlflow`` (created here
when missing; no system site-packages; torch pinned to the local 2.13.0 CPU wheel through
``constraints-dev.txt``). Tracking and registry: a local SQLite file; artifacts: a local
directory. MLflow publishes the ``.pt2`` as a run artifact, registers it and sets an alias,
and loads ``models:/NAME@prod`` (download + ``torch.export.load(...).module()``);
``mlflow.pytorch.log_model`` cannot take an ExportedProgram or a ``.pt2`` (it exports an
``nn.Module`` itself), see ``_worker_mlflow.py``.

Ours: ``Registry.push(bundle, aliases=["prod"])`` into a local store, and ``NAME@prod``
loaded with an empty cache (cold) and a filled one (warm). Both sides run as long-lived
worker processes (imports and database set-up warmed before timing), alternating per
repetition; peak RSS comes from fresh one-operation processes above a same-imports baseline.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from _common import BENCH, PYTHON, REPO, Row, median, models, parse_args, report, run, scratch, tree_bytes

VENV = BENCH / ".venv-mlflow"
MLFLOW_PY = str(VENV / "bin" / "python")


def ensure_mlflow() -> str | None:
    """Create the MLflow venv if needed; its MLflow version, or None when it cannot be installed."""
    try:
        if not (VENV / "bin" / "python").exists():
            run(["python3.11" if shutil.which("python3.11") else "python3", "-m", "venv", str(VENV)])
        probe = subprocess.run([MLFLOW_PY, "-c", "import mlflow, torch; print(mlflow.__version__)"],
                               capture_output=True, text=True)
        if probe.returncode != 0:
            run([str(VENV / "bin" / "pip"), "install", "-q", "-c", str(REPO / "constraints-dev.txt"),
                 "mlflow", "torch==2.13.0"], timeout=1800)
            probe = subprocess.run([MLFLOW_PY, "-c", "import mlflow; print(mlflow.__version__)"],
                                   capture_output=True, text=True, check=True)
        return probe.stdout.strip()
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        print(f"MLflow could not be installed here: {exc}")
        return None


class Worker:
    """A long-lived worker process: send "MODE JSON", get one JSON line back."""

    def __init__(self, python: str, script: str) -> None:
        self.proc = subprocess.Popen([python, str(BENCH / script), "serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

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

    m = {k: median(v) for k, v in t.items()}
    r = {k: median(v) for k, v in rss.items()}
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
    ]
    report("mlflow", f"Ours vs MLflow {version} (same workflow)", rows, args,
           {"mlflow": version, "timings": t, "growth_pct": growth, "rss_mib": rss})


if __name__ == "__main__":
    main()
