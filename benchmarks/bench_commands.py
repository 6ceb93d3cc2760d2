"""Data paths as a user times them: each ``pt2reg`` command as a whole process, beside the same
operation in-process, against the raw operation on the same bytes (issue 45).

A family of programs (``torch.export``, generated once in a child process and cached under
``out/models-shapes/``), each at 200 MiB and 2 GiB of fp32:

* ``large``: few large tensors (8 of 1/8 of the size each);
* ``small``: many small ones (log-uniform 4-256 KiB: ~3,300 at 200 MiB, ~34,000 at 2 GiB);
* ``mixed``: the shape of issue 45's table: one tensor of 15.6 % of the size (320 MiB at 2 GiB),
  ~570 per 2 GiB of 4-20 KiB and the rest in tensors of 1-7 MiB (~430 at 2 GiB).

For each, side by side in one run (interleaved, the order rotated every repetition, the inputs
read into the page cache before each case, and the code of both sides too, ``warm_code``;
the run's other files evicted from it, ``drop_cached``; ``sync`` between cases), medians of
``--reps``:

whole      ``pt2reg bundle P.pt2 -o B.pt2b`` from a home that bundled with this torch before (its
           cache knows the schemas of the program's operators: no ``import torch``; the first
           bundle with a torch on a machine imports it once, ~1.2 s more, not measured here) and
           no vetting verdict for the program; ``pt2reg push B.pt2b`` into a fresh database and
           store (created beforehand by a tiny push: schema creation is once per machine) from
           the home that bundled it (its cache holds the vetting verdicts, so the program check
           is not run again, as on the machine that bundled); ``pt2reg pull
           NAME@1 -o OUT.pt2b`` with an empty cache; each a fresh process, interpreter and
           imports included, vs ``cp`` + ``sync FILE`` of the same file (two processes).
in-process ``build_bundle`` (vetting verdicts written, as ``pt2reg bundle`` does),
           ``Registry.push``, ``Registry.pull`` in this warm process vs ``shutil.copyfile`` +
           ``fsync``.

Every figure is written to ``out/commands[-quick].json`` with the date, the machine, its load
average when measured, and the exact commands of both sides. The registry's bytecode is
compiled first (``compileall``), as ``pip install`` leaves it: a machine that sets
``PYTHONDONTWRITEBYTECODE`` would otherwise compile every module of it in every process.

    .venv/bin/python benchmarks/bench_commands.py                        # 3 shapes x 200 MiB and 2 GiB
    .venv/bin/python benchmarks/bench_commands.py --sizes 200 --shapes mixed --reps 5
    .venv/bin/python benchmarks/bench_commands.py --quick                # smoke test: 8 MiB, 1 repetition
    .venv/bin/python benchmarks/bench_commands.py --sizes 2048 --shapes mixed --s3   # issue 45's table, S3 too
    .venv/bin/python benchmarks/bench_commands.py --sizes 2048 --shapes mixed --s3 --ops "push s3,pull s3"
"""
from __future__ import annotations

import argparse
import compileall
import contextlib
import os
import random
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import (
    CODE,
    OUT,
    PT2REG,
    PYTHON,
    REPO,
    S3_CODE,
    MiB,
    Row,
    drop_cached,
    machine,
    median,
    report,
    run,
    scratch,
    seaweed,
    side_by_side,
    warm_code,
    warm_files,
)

SHAPES = ("large", "small", "mixed")
KiB = 1024
#: issue 45 point 3, whole commands: local store vs cp + sync, S3 vs boto3
TARGET = {"bundle": 1.3, "push": 1.3, "pull": 1.3, "push s3": 1.15, "pull s3": 1.15}
HEAD = 64


# -- the programs ----------------------------------------------------------------------------

def tensor_sizes(shape: str, total_mib: float, seed: int = 0) -> list[int]:
    """Element counts (fp32) of every tensor of ``shape`` at ``total_mib``; deterministic."""
    rng = random.Random(f"{shape}-{total_mib}-{seed}")
    total = int(total_mib * MiB) // 4
    if shape == "large":
        return [total // 8 // 256 * 256] * 8
    if shape == "small":
        out: list[int] = []
        while sum(out) < total:
            out.append(round(2 ** rng.uniform(12, 18) / 4))
        return out
    if shape == "mixed":
        huge = int(total * 320 / 2048) // 1024 * 1024
        small = [round(rng.uniform(4 * KiB, 20 * KiB) / 4) for _ in range(max(8, round(570 * total_mib / 2048)))]
        mids: list[int] = []
        left = total - huge - sum(small)
        while left > 0:
            n = min(left, round(rng.uniform(1 * MiB, 7 * MiB) / 4)) // 256 * 256 or left
            mids.append(n)
            left -= n
        rest = mids + small
        rng.shuffle(rest)
        return [huge, *rest]
    raise SystemExit(f"unknown shape {shape!r}; choose from {', '.join(SHAPES)}")


def program(shape: str, total_mib: float) -> Path:
    """The ``.pt2`` of ``shape`` at ``total_mib``, generated once (a child process: torch stays
    out of this one) and cached under ``out/models-shapes``."""
    d = OUT / "models-shapes" / f"{shape}-{total_mib:g}m"
    pt2 = d / "program.pt2"
    if pt2.is_file():
        return pt2
    tmp = d.parent / f"{d.name}.incomplete-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    print(f"generating {shape} {total_mib:g} MiB -> {d} (once; cached)", file=sys.stderr, flush=True)
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import bench_commands as b; "
            f"b._generate({shape!r}, {total_mib!r}, {str(tmp / 'program.pt2')!r})")
    run([PYTHON, "-c", code])
    shutil.rmtree(d, ignore_errors=True)
    os.replace(tmp, d)
    return pt2


def _generate(shape: str, total_mib: float, out: str) -> None:
    import torch

    sizes = tensor_sizes(shape, total_mib)

    class Shape(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = torch.nn.Linear(HEAD, HEAD, bias=False)
            for i, n in enumerate(sizes):
                dims = (n // 256, 256) if n >= 256 * 256 and n % 256 == 0 else (n,)
                self.register_parameter(f"p{i:05d}", torch.nn.Parameter(torch.empty(dims)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.head(x))

    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        model = Shape().eval()
        for t in model.state_dict().values():
            t.uniform_(-0.02, 0.02, generator=gen)
    ep = torch.export.export(model, (torch.zeros(2, HEAD),))
    if len(ep.state_dict) != len(sizes) + 1:
        raise SystemExit(f"export kept {len(ep.state_dict)} of {len(sizes) + 1} tensors")
    torch.export.save(ep, out)


# -- measuring -------------------------------------------------------------------------------

def cp_sync(src: Path, dest: Path) -> list[list[str]]:
    return [["cp", str(src), str(dest)], ["sync", str(dest)]]


def copy_fsync(src: Path, dest: Path) -> None:
    shutil.copyfile(src, dest)
    fd = os.open(dest, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def settle(work: Path, inputs: list[Path], code: tuple[str, ...]) -> None:
    """Before a case (untimed): the disk flushed, the run's files that the case does not read
    evicted from the page cache (``drop_cached``: those of ``work`` and the cached programs),
    its ``inputs`` and the ``code`` of both sides read into it, the disk flushed again."""
    os.sync()
    drop_cached(work, OUT / "models-shapes", keep=inputs)
    warm_files(*inputs)
    warm_code(*code)
    os.sync()


def commands(work: Path, pt2: Path, bundle: Path, tiny: Path) -> dict[str, dict[str, Any]]:
    """Per operation: the whole commands (ours, raw), the in-process callables (ours, raw), the
    input to have in the page cache, and the cleanup before each case (untimed)."""
    n = iter(range(1_000_000))

    # push runs on the machine that bundled: the home whose cache holds the bundler's vetting
    # verdicts (as bench_scale's push row), into a fresh database and store each time
    vetted = work / "vetted-home"
    if not vetted.exists():
        run([PT2REG, "--home", str(vetted), "bundle", str(pt2), "-o", str(work / "vetted.pt2b")])

    def fresh_home() -> list[str]:
        """--home/--db/--store of a fresh registry whose database exists (a tiny push: schema
        creation is once per machine), with the bundling home's cache."""
        k = next(n)
        for old in work.glob("home-*"):   # the last repetition's store: 2 GiB each would fill the disk
            shutil.rmtree(old, ignore_errors=True)
        where = ["--home", str(vetted), "--db", f"sqlite:///{work / f'home-{k}' / 'registry.db'}",
                 "--store", str(work / f"home-{k}" / "store")]
        run([PT2REG, *where, "push", str(tiny), "--name", "tiny"])
        return where

    bundler = work / "bundler"   # a machine that bundled with this torch before (its op schemas known)
    if not bundler.exists():
        run([PT2REG, "--home", str(bundler), "bundle", str(pt2), "-o", str(work / "first.pt2b")])
        (work / "first.pt2b").unlink()
    pulled = work / "pull-home"
    if not pulled.exists():
        run([PT2REG, "--home", str(pulled), "push", str(bundle), "--name", "bench"])
    homes: dict[str, list[str]] = {}

    def prepare(op: str) -> Callable[[], None]:
        def go() -> None:
            for p in work.glob("out-*"):
                p.unlink()
            if op == "push":
                homes["push"] = fresh_home()
            if op == "pull":
                shutil.rmtree(pulled / "cache", ignore_errors=True)
            if op == "bundle":  # no vetting verdict from the last run: the program is checked again
                # (the operator schemas this torch gave are kept, cache/op-schemas: machine
                # knowledge, not the program's; the first bundle with a torch imports it, +1.2 s)
                shutil.rmtree(work / "bundler" / "cache" / "vetted-programs", ignore_errors=True)
                shutil.rmtree(work / "cache", ignore_errors=True)
            # a pull's input: the store it pulls from, and the bundle cp copies
            settle(work, [pt2] if op == "bundle" else [bundle, pulled] if op == "pull" else [bundle], CODE)
        return go

    def registry(home: Path, db: str | None = None, store: str | None = None):
        from registry.client import Registry
        from registry.config import Settings

        return Registry(Settings.resolve(home=str(home), db=db, store=store, env={}))

    def bundle_in_process() -> None:
        from registry.bundler import ProgramInput, build_bundle
        from registry.pt2.verdicts import verdicts_dir

        build_bundle(work / "out-b.pt2b", [ProgramInput("model", pt2)], vetted_dir=verdicts_dir(work / "cache"))

    def push_in_process() -> None:
        _, home, _, db, _, store = homes["push"]
        with registry(Path(home), db, store) as reg:
            reg.push(bundle, "bench", detect_git=False)

    def pull_in_process() -> None:
        with registry(pulled) as reg:
            reg.pull("bench@1", work / "out-p.pt2b")

    return {
        "bundle": {"ours": lambda: [PT2REG, "--home", str(work / "bundler"), "bundle", str(pt2), "-o",
                                    str(work / "out-b.pt2b")],
                   "raw": lambda: cp_sync(pt2, work / "out-c"), "src": pt2,
                   "ours_in": bundle_in_process, "prepare": prepare("bundle")},
        "push": {"ours": lambda: [PT2REG, *homes["push"], "push", str(bundle), "--name", "bench"],
                 "raw": lambda: cp_sync(bundle, work / "out-c"), "src": bundle,
                 "ours_in": push_in_process, "prepare": prepare("push")},
        "pull": {"ours": lambda: [PT2REG, "--home", str(pulled), "pull", "bench@1", "-o", str(work / "out-p.pt2b")],
                 "raw": lambda: cp_sync(bundle, work / "out-c"), "src": bundle,
                 "ours_in": pull_in_process, "prepare": prepare("pull")},
    }


_BOTO_UP = ("import boto3,sys; boto3.client('s3').upload_file(sys.argv[1], sys.argv[2], sys.argv[3])")
_BOTO_DOWN = ("import boto3,os,sys; boto3.client('s3').download_file(sys.argv[2], sys.argv[3], sys.argv[1]); "
              "fd = os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd)")


def s3_commands(work: Path, bundle: Path, tiny: Path, server: Any) -> dict[str, dict[str, Any]]:
    """push and cold pull against S3 (SeaweedFS; SQLite metadata), a fresh bucket per push, vs
    boto3 ``upload_file`` / ``download_file`` (+ fsync) of the same file, each a process."""
    import boto3

    env = {**os.environ, **server.env}
    s3 = boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id="any", aws_secret_access_key="any",
                      region_name="us-east-1")
    n = iter(range(1_000_000))

    def bucket() -> str:
        name = f"cmd-{uuid.uuid4().hex[:16]}"
        s3.create_bucket(Bucket=name)
        return name

    vetted = work / "vetted-home"
    pulled_bucket = bucket()
    pulled = work / f"s3-pull-{pulled_bucket}"   # per shape: a registry of its own
    where_pull = ["--home", str(pulled), "--db", f"sqlite:///{pulled / 'registry.db'}", "--store",
                  f"s3://{pulled_bucket}/reg"]
    run([PT2REG, *where_pull, "push", str(bundle), "--name", "bench"], env=env)
    raw_bucket = bucket()

    def drop_bucket(name: str) -> None:
        """Delete a bucket and what is in it (SeaweedFS frees its volumes with it)."""
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            for i in range(0, len(keys), 1000):
                s3.delete_objects(Bucket=name, Delete={"Objects": keys[i:i + 1000]})
        s3.delete_bucket(Bucket=name)
    s3.upload_file(str(bundle), raw_bucket, "bench.pt2b")
    homes: dict[str, list[str]] = {}

    def prepare(op: str) -> Callable[[], None]:
        def go() -> None:
            for p in work.glob("out-*"):
                p.unlink()
            if op == "push":   # a fresh bucket per repetition, the last one deleted: SeaweedFS
                k = next(n)        # answered InternalError once 2 GiB pushes filled the disk
                if "raw" in homes:
                    drop_bucket(homes["raw"][0])
                b = bucket()
                homes["push"] = ["--home", str(vetted), "--db", f"sqlite:///{work / f's3-home-{k}.db'}",
                                 "--store", f"s3://{b}/reg"]
                run([PT2REG, *homes["push"], "push", str(tiny), "--name", "tiny"], env=env)
                homes["raw"] = [b, "raw.pt2b"]
            else:
                shutil.rmtree(pulled / "cache", ignore_errors=True)
            settle(work, [bundle], (*CODE, *S3_CODE))
        return go

    def in_process(op: str) -> Callable[[], None]:
        def go() -> None:
            from registry.client import Registry
            from registry.config import Settings

            old = dict(os.environ)
            os.environ.update(server.env)
            try:
                args = homes["push"] if op == "push" else where_pull
                settings = Settings.resolve(home=args[1], db=args[3], store=args[5], env={})
                with Registry(settings) as reg:
                    if op == "push":
                        reg.push(bundle, "bench", detect_git=False)
                    else:
                        reg.pull("bench@1", work / "out-p.pt2b")
            finally:
                os.environ.clear()
                os.environ.update(old)
        return go

    def in_raw(op: str) -> Callable[[], None]:
        def go() -> None:
            if op == "push":
                s3.upload_file(str(bundle), *homes["raw"])
            else:
                s3.download_file(raw_bucket, "bench.pt2b", str(work / "out-c"))
                fd = os.open(work / "out-c", os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        return go

    return {
        "push s3": {"ours": lambda: [PT2REG, *homes["push"], "push", str(bundle), "--name", "bench"],
                    "raw": lambda: [[PYTHON, "-c", _BOTO_UP, str(bundle), *homes["raw"]]],
                    "src": bundle, "env": env, "ours_in": in_process("push"), "raw_in": in_raw("push"),
                    "prepare": prepare("push")},
        "pull s3": {"ours": lambda: [PT2REG, *where_pull, "pull", "bench@1", "-o", str(work / "out-p.pt2b")],
                    "raw": lambda: [[PYTHON, "-c", _BOTO_DOWN, str(work / "out-c"), raw_bucket, "bench.pt2b"]],
                    "src": bundle, "env": env, "ours_in": in_process("pull"), "raw_in": in_raw("pull"),
                    "prepare": prepare("pull")},
    }


def measure(shape: str, size: float, reps: int, work: Path, tiny: Path, s3: Any = None,
            only: set[str] | None = None) -> list[dict[str, Any]]:
    pt2 = program(shape, size)
    bundle = work / f"{shape}.pt2b"
    run([PT2REG, "--home", str(work / "bundler"), "bundle", str(pt2), "-o", str(bundle)])
    ops = commands(work, pt2, bundle, tiny)
    if s3 is not None:
        ops.update(s3_commands(work, bundle, tiny, s3))
    if only:
        ops = {op: c for op, c in ops.items() if op in only}
    figures = []
    for op, c in ops.items():
        said: dict[str, Any] = {}

        def whole_ours(c: dict = c, said: dict = said) -> None:
            said["ours"] = c["ours"]()
            run(said["ours"], env=c.get("env"))

        def whole_raw(c: dict = c, said: dict = said) -> None:
            said["raw"] = c["raw"]()
            for cmd in said["raw"]:
                run(cmd, env=c.get("env"))

        def in_raw(c: dict = c) -> None:
            copy_fsync(c["src"], work / "out-c")

        cases = {"whole ours": whole_ours, "whole raw": whole_raw, "in ours": c["ours_in"],
                 "in raw": c.get("raw_in", in_raw)}
        before = dict.fromkeys(cases, c["prepare"])
        side_by_side(1, cases, before=before)  # warm-up: bytecode, page cache, the first deserialization
        load = os.getloadavg()
        t = side_by_side(reps, cases, before=before)
        m = {k: median(v) for k, v in t.items()}
        mib = c["src"].stat().st_size / MiB
        common = {"op": op, "shape": shape, "size_mib": round(mib, 1), "tensors": len(tensor_sizes(shape, size)),
                  "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine(),
                  "loadavg_1_5_15": [round(x, 2) for x in load], "reps": reps}
        figures.append({**common, "mode": "whole command", "ours_s": m["whole ours"], "raw_s": m["whole raw"],
                        "ratio": m["whole ours"] / m["whole raw"], "target": TARGET[op],
                        "ours_command": " ".join(said["ours"]),
                        "raw_command": " && ".join(" ".join(x[:2] + ["..."] if x[0] == PYTHON else x)
                                                   for x in said["raw"]), "timings": t})
        figures.append({**common, "mode": "in-process", "ours_s": m["in ours"], "raw_s": m["in raw"],
                        "ratio": m["in ours"] / m["in raw"],
                        "ours_command": {"bundle": "registry.bundler.build_bundle", "push": "Registry.push",
                                         "pull": "Registry.pull", "push s3": "Registry.push (S3 store)",
                                         "pull s3": "Registry.pull (S3 store)"}[op],
                        "raw_command": {"push s3": "boto3 upload_file", "pull s3": "boto3 download_file + fsync"}
                        .get(op, "shutil.copyfile + os.fsync")})
        print(f"{op} {shape} {mib:,.0f} MiB: whole {figures[-2]['ratio']:.2f}x, in-process "
              f"{figures[-1]['ratio']:.2f}x (load {load[0]:.1f})", file=sys.stderr, flush=True)
    return figures


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="8 MiB programs, one repetition (smoke test)")
    p.add_argument("--reps", type=int, default=None, help="repetitions (default 3; quick 1)")
    p.add_argument("--sizes", default=None, help="comma-separated MiB (default 200,2048; quick 8)")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {','.join(SHAPES)}")
    p.add_argument("--s3", action="store_true", help="also push and pull against S3 (SeaweedFS) vs boto3")
    p.add_argument("--ops", default=None, help=f"comma-separated, of {', '.join(TARGET)} (default: all)")
    args = p.parse_args()
    only = {o.strip() for o in args.ops.split(",")} if args.ops else None
    if only and only - set(TARGET):
        p.error(f"unknown --ops {sorted(only - set(TARGET))}; choose from {', '.join(TARGET)}")
    args.reps = args.reps or (1 if args.quick else 3)
    sizes = [float(s) for s in (args.sizes or ("8" if args.quick else "200,2048")).split(",")]
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    for s in shapes:
        tensor_sizes(s, 1)  # an unknown shape stops here
    compileall.compile_dir(str(REPO / "registry"), quiet=1)  # as pip install leaves it
    figures: list[dict[str, Any]] = []
    with scratch("commands-") as work, (seaweed() if args.s3 else contextlib.nullcontext()) as s3:
        tiny = work / "tiny.pt2b"
        shutil.copyfile(REPO / "tests" / "data" / "format1" / "mlp.pt2b", tiny)
        for size in sizes:
            for shape in shapes:
                figures += measure(shape, size, args.reps, work, tiny, s3, only)
                for h in work.glob("home-*"):
                    shutil.rmtree(h, ignore_errors=True)
                for d in ("pull-home", "vetted-home"):
                    shutil.rmtree(work / d, ignore_errors=True)
    rows = []
    for f in figures:
        whole = f["mode"] == "whole command"
        raw_name = "boto3" if "s3" in f["op"] else "cp + sync"
        target = f"<= {f['target']}x vs {raw_name}" if whole else ""
        rows.append(Row(f"{f['op']} {f['shape']} {f['size_mib']:,.0f} MiB ({f['tensors']:,} tensors), {f['mode']}",
                        f["ours_s"], f["raw_s"], target=target,
                        ok=(f["ratio"] <= f["target"]) if whole else None,
                        note=f"load {f['loadavg_1_5_15'][0]}; " + f["ours_command"].replace(str(OUT), "out")[:80]))
    report("commands", "Whole commands and in-process vs cp + sync (issue 45)", rows, args,
           {"figures": figures, "bytecode": "compiled (compileall) before measuring"})


if __name__ == "__main__":
    main()
