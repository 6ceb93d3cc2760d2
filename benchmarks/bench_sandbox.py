"""First-load sandbox: what deserializing an unsigned program in a limited subprocess first adds.

The first time a machine loads a program whose bundle no trusted key signed, ``registry.load``
runs the same deserialization in ``python -m registry.runtime.sandbox`` (RLIMIT_AS/CPU, wall timeout)
before loading it in-process; the verdict is cached by the program's digest. Side by side, in
one run, with medians over ``--reps``:

- raw: ``torch.export.load(path).module()`` of the cached file (what a caller needs to run it);
- ours, first load, sandbox on: ``registry.load(ref)`` of a pinned, cached ref with the vetted
  verdicts removed before each repetition (a fresh subprocess: python + torch import + load);
- ours, first load, sandbox off (``PT2REG_SANDBOX=off``): the same load without the child;
- ours, later load, sandbox on: the verdict is cached, one small file read.
"""
from __future__ import annotations

import os
import shutil

import torch
from _common import Row, median, models, parse_args, registry, report, scratch, set_registry_env, side_by_side

import registry as reg_pkg


def main() -> None:
    args = parse_args(__doc__)
    ms = models(args.quick)
    with scratch("sandbox-") as work:
        home = work / "home"
        reg = registry(home)
        pushed = reg.push(ms.bundle("base"), "bench")
        ref = f"bench@{pushed.version.digest}"
        src = reg.materialize(ref)  # fills the cache
        path = work / "model.pt2"
        os.link(src.member_file("programs/model.pt2"), path)
        set_registry_env(home)
        vetted = home / "cache" / "vetted"
        for var in ("PT2REG_SANDBOX_MEMORY", "PT2REG_SANDBOX_SECONDS", "PT2REG_TRUST"):
            os.environ.pop(var, None)

        def ours(mode: str, fresh: bool):
            def go() -> None:
                if fresh:
                    shutil.rmtree(vetted, ignore_errors=True)
                os.environ["PT2REG_SANDBOX"] = mode
                reg_pkg.load(ref, device="cpu")
            return go

        cases = {
            "raw": lambda: torch.export.load(path).module(),
            "first, sandbox on": ours("on", True),
            "first, sandbox off": ours("off", False),  # never reads or writes verdicts
            "later, sandbox on (cached verdict)": ours("on", False),
        }
        side_by_side(1, cases)  # warm-up (page cache, imports)
        t = side_by_side(args.reps, cases)
    m = {k: median(v) for k, v in t.items()}
    raw = m["raw"]
    added = m["first, sandbox on"] - m["first, sandbox off"]
    rows = [Row("first load, sandbox on (vs torch.export.load().module())", m["first, sandbox on"], raw,
                note=f"adds {added:.2f} s: one python + torch start and a second deserialization"),
            Row("  first load, sandbox off", m["first, sandbox off"], raw),
            Row("  later load, verdict cached", m["later, sandbox on (cached verdict)"], raw,
                target="<= 1.1x", ok=m["later, sandbox on (cached verdict)"] / raw <= 1.1),
            Row("  sandbox cost of a first load (on - off)", added, None)]
    report("sandbox", "First-load sandbox vs torch.export.load().module()", rows, args, {"timings": t})


if __name__ == "__main__":
    main()
