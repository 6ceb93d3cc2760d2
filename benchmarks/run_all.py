"""Run every benchmark (each in its own process) and print one markdown table (for docs/performance-log.md).

    .venv/bin/python benchmarks/run_all.py                 # full size (~20-30 min on 2 cores)
    .venv/bin/python benchmarks/run_all.py --quick         # smoke test: tiny model, 1 repetition
    .venv/bin/python benchmarks/run_all.py --skip mlflow   # without creating the MLflow venv

The table is also written to ``benchmarks/out/results.md``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from _common import BENCH, OUT, PYTHON, fmt, machine

SCRIPTS = ["push", "s3", "load", "resolve", "memory", "cli", "commands", "hashing", "sandbox", "scale", "mlflow", "server",
           "web", "webhooks", "gpu_load"]


def table(quick: bool) -> str:
    suffix = "-quick" if quick else ""
    lines = ["| measurement | ours | raw | ratio | target | met | MLflow | note |",
             "|---|---|---|---|---|---|---|---|"]
    for name in SCRIPTS:
        path = OUT / f"{name}{suffix}.json"
        if not path.exists():
            lines.append(f"| {name}: not run | | | | | | | |")
            continue
        doc = json.loads(path.read_text())
        if name == "mlflow" and not doc.get("mlflow"):
            lines.append("| MLflow comparison: MLflow could NOT be installed here | | | | | | | |")
        for r in doc["rows"]:
            ratio = f"{r['ratio']:.2f}x" if r.get("ratio") is not None else ""
            met = {True: "yes", False: "**no**", None: ""}[r.get("ok")]
            cells = [r["metric"].strip(), fmt(r["ours"], r["unit"]),
                     fmt(r["raw"], r["unit"]) if r.get("raw") is not None else "", ratio,
                     r.get("target", ""), met,
                     fmt(r["mlflow"], r["unit"]) if r.get("mlflow") is not None else "", r.get("note", "")]
            lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    m = machine()
    head = (f"Machine: {m['cpus']} cores, {m['mem_gib']} GiB, {m['platform']}, Python {m['python']}; "
            f"shared and noisy. {time.strftime('%Y-%m-%d')}{' (QUICK: figures meaningless)' if quick else ''}")
    return head + "\n\n" + "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description="run every benchmark and print the markdown table")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int)
    p.add_argument("--only", nargs="*", choices=SCRIPTS)
    p.add_argument("--skip", nargs="*", choices=SCRIPTS, default=[])
    p.add_argument("--table-only", action="store_true", help="print the table from existing results")
    args = p.parse_args()
    failed = []
    if not args.table_only:
        for name in args.only or SCRIPTS:
            if name in args.skip:
                continue
            cmd = [PYTHON, str(BENCH / f"bench_{name}.py")] + (["--quick"] if args.quick else []) + \
                  (["--reps", str(args.reps)] if args.reps else [])
            print(f"== {' '.join(cmd[1:])}", flush=True)
            t0 = time.perf_counter()
            if subprocess.run(cmd).returncode != 0:
                failed.append(name)
            print(f"== {name}: {time.perf_counter() - t0:.0f} s", flush=True)
    md = table(args.quick)
    OUT.mkdir(parents=True, exist_ok=True)  # --table-only on a fresh clone, or every script failed early
    (OUT / f"results{'-quick' if args.quick else ''}.md").write_text(md)
    print(md)
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
