"""Push to a real S3-compatible server vs boto3 ``upload_file``; cold pull + load vs raw
download + ``torch.export.load``.

SeaweedFS is started on loopback (``tests/services_s3.py``) and stopped at the end. Both sides
run in this process and both create their boto3 client inside the timed region.

1. ``Registry.push`` (SQLite metadata, ``s3://`` store; a fresh bucket and model name per
   repetition, so every byte is uploaded) vs ``upload_file`` of the same bundle to a fresh
   bucket with boto3's defaults.
2. ``registry.load("bench@1")`` with an empty cache (resolve, fetch and reassemble the chunks,
   verify, vet the program, compatibility check, load, ``.module()``; the first-load sandbox
   off, as ``bench_sandbox.py`` measures it) vs ``download_file`` of the ``.pt2`` +
   ``torch.export.load(...).module()``.
"""
from __future__ import annotations

import os
import shutil

from _common import Row, median, models, parse_args, registry, report, scratch, seaweed, set_registry_env, side_by_side


def main() -> None:
    args = parse_args(__doc__)
    ms = models(args.quick)
    # every cold load here uses a fresh HOME, so the first-load sandbox would run each time;
    # its once-per-digest cost is measured on its own by bench_sandbox.py
    os.environ["PT2REG_SANDBOX"] = "off"
    with scratch("s3-") as work, seaweed() as server:
        os.environ.update(server.env)
        import boto3
        import torch

        import registry as reg_pkg

        db = f"sqlite:///{work / 'registry.db'}"
        # warm-up: create the schema, import boto3/s3transfer paths, torch's loader
        registry(work / "warm", db, f"s3://{server.new_bucket()}/reg").push(ms.bundle("tiny"), "warm")
        torch.export.load(ms.pt2("tiny")).module()

        buckets = [server.new_bucket() for _ in range(2 * args.reps)]  # created outside the timing

        def ours_push() -> None:
            bucket = buckets.pop()
            registry(work / "push-home", db, f"s3://{bucket}/reg").push(ms.bundle("base"), bucket)

        def raw_push() -> None:
            client = boto3.session.Session().client("s3")
            client.upload_file(str(ms.bundle("base")), buckets.pop(), "base.pt2b")

        push = side_by_side(args.reps, {"ours": ours_push, "raw": raw_push})

        # cold pull + load: one registry holding the base; the raw .pt2 beside it
        bucket = server.new_bucket()
        store = f"s3://{bucket}/reg"
        registry(work / "pub", db, store).push(ms.bundle("base"), "bench")
        boto3.session.Session().client("s3").upload_file(str(ms.pt2("base")), bucket, "raw/base.pt2")
        homes = iter(range(10_000))

        def ours_load() -> None:
            set_registry_env(work / f"cold{next(homes)}", db, store)  # a fresh, empty cache
            loaded = reg_pkg.load("bench@1", device="cpu")
            assert "model" in loaded

        def raw_load() -> None:
            dest = work / "raw-download.pt2"
            boto3.session.Session().client("s3").download_file(bucket, "raw/base.pt2", str(dest))
            torch.export.load(dest).module()

        def clean() -> None:
            for p in work.glob("cold*"):
                shutil.rmtree(p, ignore_errors=True)
            (work / "raw-download.pt2").unlink(missing_ok=True)

        ours_load(), raw_load(), clean()  # warm-up (first torch deserialization in this process)
        load = side_by_side(args.reps, {"ours": ours_load, "raw": raw_load}, between=clean)

    size = ms.bundle("base").stat().st_size / 2**20
    p_ours, p_raw = median(push["ours"]), median(push["raw"])
    l_ours, l_raw = median(load["ours"]), median(load["raw"])
    rows = [Row(f"push {size:.0f} MiB to S3 (SeaweedFS)", p_ours, p_raw, target="<= 1.2x vs upload_file",
                ok=p_ours / p_raw <= 1.2, note=f"{size / p_ours:.0f} vs {size / p_raw:.0f} MiB/s"),
            Row("cold pull + load from S3 (empty cache)", l_ours, l_raw,
                target="<= 1.3x vs download_file + torch.export.load", ok=l_ours / l_raw <= 1.3,
                note="sandbox off (its first-load cost: bench_sandbox)")]
    report("s3", "S3: push and cold pull + load", rows, args, {"push": push, "load": load})


if __name__ == "__main__":
    main()
