"""Warm load: a pinned digest ref already in the cache vs ``torch.export.load`` of the same file.

``registry.load("bench@sha256:...")`` with the blobs cached goes through no database and no
store (the manifest and members come from the verified cache), then checks compatibility,
scans for pickles, deserializes and calls ``.module()``. The raw side is
``torch.export.load`` of the cached file (a hard link named ``.pt2``), alone (the literal target) and with ``.module()`` (what the
caller needs to run it, and what ours returns).
"""
from __future__ import annotations

import os

import torch
from _common import Row, median, models, parse_args, registry, report, scratch, set_registry_env, side_by_side

import registry as reg_pkg


def main() -> None:
    args = parse_args(__doc__)
    ms = models(args.quick)
    with scratch("load-") as work:
        reg = registry(work / "home")
        pushed = reg.push(ms.bundle("base"), "bench")
        ref = f"bench@{pushed.version.digest}"
        src = reg.materialize(ref)  # fills the cache
        path = work / "model.pt2"  # the cached file itself (a hard link), named as torch expects
        os.link(src.member_file("programs/model.pt2"), path)
        set_registry_env(work / "home")
        cases = {
            "ours": lambda: reg_pkg.load(ref, device="cpu"),
            "torch.export.load": lambda: torch.export.load(path),
            "torch.export.load().module()": lambda: torch.export.load(path).module(),
        }
        side_by_side(1, cases)  # warm-up
        t = side_by_side(args.reps, cases)
    m = {k: median(v) for k, v in t.items()}
    bare, full = m["torch.export.load"], m["torch.export.load().module()"]
    rows = [Row("warm load, pinned digest, cached (vs torch.export.load)", m["ours"], bare,
                target="<= 1.1x", ok=m["ours"] / bare <= 1.1),
            Row("  same, vs torch.export.load().module()", m["ours"], full, target="<= 1.1x",
                ok=m["ours"] / full <= 1.1, note="like for like: both return a callable module")]
    report("load", "Warm load vs torch.export.load", rows, args, {"timings": t})


if __name__ == "__main__":
    main()
