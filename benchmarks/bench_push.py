"""Push to a local store vs `cp`, and store growth for a one-layer-in-six fine-tune.

1. ``pt2reg push`` (a separate process, as a user runs it) into a fresh local registry vs
   ``cp`` of the same bundle. Marginal cost = (push big - push tiny) vs (cp big - cp tiny), so
   interpreter start-up, the schema creation of a fresh SQLite file and the manifest cancel
   out and what is left is the per-byte cost. ``push`` makes every blob durable before it
   records the version, ``cp`` does not; ``cp + sync`` is shown too, as information, and so
   is one sha256 pass over the bundle on one core (hashlib, 1 MiB reads): what a whole-member
   digest cost before format 2 (issue 17), where push hashes the chunks on every core.
2. The canonical-bytes check push runs on every program member (``check_bundle_programs``:
   zip layout, member allowlist, canonical JSON, graph and payload checks), timed alone on the
   same bundle, as a share of the whole push.
3. Store growth: push the base, then the fine-tune (one Linear of six retrained); bytes the
   blob store grew by / the fine-tune bundle's size. A file-level store grows by ~100%.
"""
from __future__ import annotations

import hashlib
import shutil

from _common import (
    PT2REG,
    MiB,
    Row,
    median,
    models,
    parse_args,
    registry,
    report,
    run,
    scratch,
    side_by_side,
    timed,
    tree_bytes,
)


def push_vs_cp(ms, reps: int, work) -> tuple[Row, Row, dict]:
    homes: list = []

    def push(which: str):
        home = work / f"home{len(homes)}"
        homes.append(home)
        return lambda: run([PT2REG, "--home", str(home), "push", str(ms.bundle(which)), "--name", "bench"])

    def cp(which: str, sync: bool):
        dest = work / f"copy-{which}.pt2b"

        def go():
            run(["cp", str(ms.bundle(which)), str(dest)])
            if sync:
                run(["sync", str(dest)])
        return go

    def cleanup() -> None:
        for h in homes:
            shutil.rmtree(h, ignore_errors=True)
        for p in work.glob("copy-*"):
            p.unlink()

    cases = {"push big": lambda: push("base")(), "push tiny": lambda: push("tiny")(),
             "cp big": cp("base", False), "cp tiny": cp("tiny", False),
             "cp+sync big": cp("base", True), "cp+sync tiny": cp("tiny", True)}
    side_by_side(1, cases, between=cleanup)  # warm-up: page cache, pyc files
    t = side_by_side(reps, cases, between=cleanup)
    m = {k: median(v) for k, v in t.items()}
    push_m, cp_m = m["push big"] - m["push tiny"], m["cp big"] - m["cp tiny"]
    sync_m = m["cp+sync big"] - m["cp+sync tiny"]
    size = ms.bundle("base").stat().st_size / 2**20
    hash_s = median([timed(lambda: sha256_file(ms.bundle("base"))) for _ in range(reps)])
    rows = [Row(f"push {size:.0f} MiB, local store, marginal (big - tiny)", push_m, cp_m,
                target="<= 1.5x vs cp", ok=push_m / cp_m <= 1.5 if cp_m > 0 else None,
                note=f"whole: push {m['push big']:.2f} s, cp {m['cp big']:.2f} s"),
            Row("  same, vs cp + sync (push makes every blob durable)", push_m, sync_m,
                note="information only"),
            Row("  one sha256 pass on one core (no copy, no sync) vs cp", hash_s, cp_m,
                note="a whole-member sha256, which format 1 checked at push (format 2 hashes "
                     "chunks on every core): information only")]
    return rows, {"timings": t, "sha256_one_pass": hash_s}


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MiB), b""):
            h.update(block)
    return h.hexdigest()


def store_growth(ms, work) -> tuple[Row, dict]:
    home = work / "growth"
    reg = registry(home)
    base = reg.push(ms.bundle("base"), "bench")
    before = tree_bytes(home / "store")
    ft = reg.push(ms.bundle("ft"), "bench")
    after = tree_bytes(home / "store")
    size = ms.bundle("ft").stat().st_size
    pct = 100 * (after - before) / size
    detail = {"store_after_base": before, "store_after_ft": after, "ft_bundle": size,
              "uploaded_ft": ft.uploaded_bytes, "skipped_ft": ft.skipped_bytes,
              "base_ref": base.ref, "ft_ref": ft.ref}
    return Row("store growth, 1-of-6-layer fine-tune (% of bundle)", pct, unit="%",
               target="<= 25%", ok=pct <= 25,
               note=f"+{(after - before) / 2**20:.1f} MiB for a {size / 2**20:.0f} MiB bundle"), detail


def vet_share(ms, reps: int, push_whole: float) -> tuple[Row, float]:
    from registry.format.bundle import BundleFile
    from registry.pt2.reader import check_bundle_programs

    path = ms.bundle("base")
    vet_s = median([timed(lambda: check_bundle_programs(BundleFile.open(path))) for _ in range(max(reps, 3))])
    size = path.stat().st_size / 2**20
    return Row(f"canonical-bytes check at push, {size:.0f} MiB bundle (share of the whole push)", vet_s,
               push_whole, target="<= 0.10x", ok=vet_s / push_whole <= 0.10,
               note="every program member vetted in place as the loader will"), vet_s


def main() -> None:
    args = parse_args(__doc__)
    ms = models(args.quick)
    with scratch("push-") as work:
        rows, t = push_vs_cp(ms, args.reps, work)
        vet_row, vet_s = vet_share(ms, args.reps, median(t["timings"]["push big"]))
        growth_row, growth = store_growth(ms, work)
    report("push", "Push vs cp; canonical check; store growth", [*rows, vet_row, growth_row], args,
           {**t, "vet_seconds": vet_s, "growth": growth})


if __name__ == "__main__":
    main()
