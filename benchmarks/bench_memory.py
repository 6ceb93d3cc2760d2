"""Peak RSS while pushing and pulling the ~400 MB bundle, above the interpreter's baseline.

Each operation runs in a fresh process (``_worker_ours.py``) that imports the same modules
first; its peak resident set (``VmHWM``) minus the peak of a process that only did those
imports is the operation's own memory. Local store and a real S3 server (SeaweedFS on
loopback). Loads are shown for information: a loaded program holds its weights in memory, so
the reference is ``torch.export.load(...).module()`` on the same file.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from _common import BENCH, PYTHON, Row, median, models, parse_args, report, run, scratch, seaweed

WORKER = str(BENCH / "_worker_ours.py")


def worker(mode: str, **cfg) -> dict:
    out = run([PYTHON, WORKER, mode, json.dumps({k: str(v) for k, v in cfg.items()})]).stdout
    return json.loads(out.strip().splitlines()[-1])


def scenario(kind: str, ms, work: Path, db: str, store_of, reps: int) -> dict[str, list[float]]:
    """Peaks (MiB) of baseline, push (fresh store each time) and pull (empty cache each time)."""
    peaks: dict[str, list[float]] = {"baseline": [], "push": [], "pull": []}
    for rep in range(reps):
        peaks["baseline"].append(worker("baseline", home=work / "h-base")["peak_mib"])
        store = store_of(rep)
        peaks["push"].append(worker("push", home=work / f"h-push{rep}", db=db, store=store,
                                    bundle=ms.bundle("base"), name=f"{kind}{rep}")["peak_mib"])
        home = work / f"h-pull{rep}"
        peaks["pull"].append(worker("pull", home=home, db=db, store=store, ref=f"{kind}{rep}@1",
                                    out=work / "pulled.pt2b")["peak_mib"])
        for p in (work / f"h-push{rep}", home, work / "pulled.pt2b"):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        if store.startswith("file://"):
            shutil.rmtree(store[len("file://"):], ignore_errors=True)
    return peaks


def main() -> None:
    args = parse_args(__doc__, default_reps=3)
    ms = models(args.quick)
    rows, raw = [], {}
    with scratch("rss-") as work:
        db = f"sqlite:///{work / 'registry.db'}"
        raw["local"] = scenario("local", ms, work, db, lambda r: f"file://{work / f'store{r}'}", args.reps)
        with seaweed() as server:
            import os

            os.environ.update(server.env)
            raw["s3"] = scenario("s3", ms, work, db, lambda r: f"s3://{server.new_bucket()}/reg", args.reps)
        # loads, for information (torch imported in every mode here, the baseline included)
        store = f"file://{work / 'store-load'}"
        worker("push", home=work / "h", db=db, store=store, bundle=ms.bundle("base"), name="load")
        raw["load"] = {"baseline": [], "ours": [], "torch": []}
        for rep in range(args.reps):
            raw["load"]["baseline"].append(worker("baseline-torch", home=work / "h")["peak_mib"])
            raw["load"]["ours"].append(worker("load", home=work / f"h-load{rep}", db=db, store=store,
                                              ref="load@1")["peak_mib"])
            raw["load"]["torch"].append(worker("torch-load", home=work / "h", pt2=ms.pt2("base"))["peak_mib"])
            shutil.rmtree(work / f"h-load{rep}", ignore_errors=True)
    size = ms.bundle("base").stat().st_size / 2**20
    for kind in ("local", "s3"):
        base = median(raw[kind]["baseline"])
        for op in ("push", "pull"):
            extra = median(raw[kind][op]) - base
            rows.append(Row(f"peak RSS above baseline, {op} {size:.0f} MiB, {kind} store", extra, unit="MiB",
                            target="< 200 MiB", ok=extra < 200,
                            note=f"baseline {base:.0f} MiB (same imports, no work)"))
    lb = median(raw["load"]["baseline"])
    rows.append(Row("peak RSS above baseline, registry.load (cold cache, local store)",
                    median(raw["load"]["ours"]) - lb, median(raw["load"]["torch"]) - lb, unit="MiB",
                    note=f"raw = torch.export.load().module(); baseline with torch {lb:.0f} MiB; information"))
    report("memory", "Peak RSS", rows, args, {"peaks_mib": raw})


if __name__ == "__main__":
    main()
