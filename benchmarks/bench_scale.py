"""Scale: a ~2 GiB program of ~1,000 tensors and a ~200 MiB one of ~10,000, against the raw tools.

Two programs are generated once with ``torch.export`` and cached (``_scale_models.py``): "big",
~2 GiB of fp32 in ~1,000 tensors of mixed sizes (most 1-64 KiB, ~200 of 1-16 MiB, a few of
32-128 MiB and one 300 MiB embedding table), and "many", ~200 MiB in ~10,000 tensors; each
with a "2% fine-tune" (2% of its tensors, chosen with a fixed seed, changed by a small delta
like a merged LoRA adapter, and exported again). For each program, side by side in one run
(interleaved, the order rotated every repetition), medians of ``--reps``:

local  ``build_bundle`` of the .pt2 into a .pt2b (writing its vetting verdicts, as ``pt2reg
       bundle`` does); ``Registry.push`` into a fresh blob store, as on the machine that bundled:
       its cache holds the bundler's verdicts (``registry.pt2.verdicts``), so the program check
       is not run again; and "push, no verdict", the same into a fresh home whose cache is empty
       (a bundle made elsewhere: the check runs). The SQLite database is created beforehand
       (schema creation is a once-per-machine cost). Pull = ``Registry.materialize`` into an
       empty cache (what ``registry.load`` does before deserializing; ``pt2reg pull -o`` would
       write a bundle file on top). Each vs ``cp`` + ``sync FILE`` of the .pt2 (the same bytes;
       push and bundle fsync what they write).
s3     the same push (with the bundler's verdicts; without one it costs the check the local
       "push, no verdict" row shows on top) and materialize against SeaweedFS (a fresh bucket
       per repetition) vs boto3
       ``upload_file`` / ``download_file`` of the .pt2 with the default TransferConfig, the
       client created inside the timing on both sides.
load   cold ``registry.load`` (ref, empty cache, local store) of a bundle signed by a key the
       trust policy (``HOME/trust.toml``) names, and the first load of an unsigned one (the
       first-load sandbox on, the default) vs one read of the file + ``torch.export.load``;
       warm ``registry.load`` (pinned digest, everything cached) vs ``torch.export.load``. The
       raw side loads the cached program member itself (a hard link named .pt2).
rss    peak RSS (VmHWM) of a fresh process doing one operation (``_scale_worker.py``), minus
       that of a process with the same imports doing nothing. Its pushes have no verdict (the
       program check runs): the larger peak of the two.
growth bytes the blob store grows by when the fine-tune is pushed after the base, as % of the
       fine-tune bundle's size (and, for reference, the share of bytes the fine-tune changed);
       and a bound for a store that is not built: the changed weight records kept as their XOR
       with the base's, byte-shuffled and compressed (zlib, lzma), against the bundle; and the
       least any lossless store could add for them: the information the fine-tune's noise put
       into the changed values.
Then "scaling": seconds per GiB of every operation on the 200 MiB program against the 2 GiB one
(the ratio is the 10,000-tensor program's per-byte cost over the 1,000-tensor one's).

    .venv/bin/python benchmarks/bench_scale.py                       # both programs, everything
    .venv/bin/python benchmarks/bench_scale.py --only s3 --program big --reps 5
    .venv/bin/python benchmarks/bench_scale.py --big-mib 4096 --big-tensors 3000   # experiment
"""
from __future__ import annotations

import argparse
import functools
import gc
import importlib.metadata
import itertools
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _scale_models as sm
from _common import (
    BENCH,
    OUT,
    PYTHON,
    Row,
    fmt,
    median,
    quiesce,
    report,
    run,
    scratch,
    seaweed,
    side_by_side,
    tree_bytes,
    warm_files,
)

PARTS = ("local", "s3", "load", "rss", "growth")
WORKER = str(BENCH / "_scale_worker.py")
GiB = 1 << 30
MiB = 1 << 20
TARGET_LOCAL, TARGET_S3, TARGET_COLD, TARGET_WARM = 1.3, 1.15, 1.3, 1.05
TARGET_RSS_MIB, TARGET_PER_BYTE, TARGET_GROWTH = 256.0, 1.5, 4.0
#: the fine-tune's noise: ``_scale_models.py`` adds uniform(-FT_NOISE, FT_NOISE) to each changed
#: tensor (kept here, not imported, so the models' cache key, a hash of that file, stays put)
FT_NOISE = 1e-3
ENV_VARS = ("PT2REG_HOME", "PT2REG_DB", "PT2REG_STORE", "PT2REG_TRUST", "PT2REG_SANDBOX",
            "PT2REG_SANDBOX_MEMORY", "PT2REG_SANDBOX_SECONDS")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="tiny programs (16 MiB / 200 tensors, 8 MiB / 2,000), one repetition, load and rss "
                        "on the first only (smoke test)")
    p.add_argument("--reps", type=int, default=None, help="repetitions of the timings (default 3; quick 1)")
    p.add_argument("--rss-reps", type=int, default=1, help="repetitions of each peak-RSS process (default 1)")
    p.add_argument("--only", default=",".join(PARTS),
                   help=f"comma-separated parts to run (default all): {','.join(PARTS)}")
    p.add_argument("--program", choices=("big", "many", "both"), default="both")
    p.add_argument("--big-mib", type=float, help="size of the big program (default 2048; quick 16)")
    p.add_argument("--big-tensors", type=int, help="tensors in the big program (default 1000; quick 200)")
    p.add_argument("--huge-mib", type=float, help="its one huge tensor (default 300; quick 4)")
    p.add_argument("--many-mib", type=float, help="size of the many-tensor program (default 200; quick 8)")
    p.add_argument("--many-tensors", type=int, help="tensors in it (default 10000; quick 2000)")
    p.add_argument("--ft-percent", type=float, default=2.0, help="share of tensors the fine-tune changes")
    p.add_argument("--seed", type=int, default=0, help="generator seed (sizes, values, fine-tuned tensors)")
    args = p.parse_args()
    if args.reps is None:
        args.reps = 1 if args.quick else 3
    if args.reps < 1 or args.rss_reps < 1:
        p.error("--reps and --rss-reps must be at least 1")
    parts = [x.strip() for x in args.only.split(",") if x.strip()]
    bad = sorted(set(parts) - set(PARTS))
    if bad or not parts:
        p.error(f"--only: unknown part {', '.join(bad) or '(none)'}; choose from {','.join(PARTS)}")
    args.parts = [x for x in PARTS if x in parts]
    defaults = {"big_mib": (2048, 16), "big_tensors": (1000, 200), "huge_mib": (300, 4),
                "many_mib": (200, 8), "many_tensors": (10000, 2000)}
    for key, (full, quick) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    return args


# -- the programs and their registries -------------------------------------------------------

@dataclass
class Program:
    """One generated program, its bundles and the registries built from it during the run."""

    name: str
    files: sm.Programs
    work: Path
    bundle: Path = Path()
    ft_bundle: Path = Path()
    #: the client cache of the machine that bundled: holds the bundler's vetting verdicts
    cache: Path = Path()
    lazy: dict[str, Any] = field(default_factory=dict)

    @property
    def pt2(self) -> Path:
        return self.files.base

    @property
    def size(self) -> int:
        return self.pt2.stat().st_size

    @property
    def label(self) -> str:
        i = self.files.info["base"]
        return f"{self.name} ({self.size / MiB:,.0f} MiB, {i['tensors']:,} tensors)"

    def once(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self.lazy:
            self.lazy[key] = make()
        return self.lazy[key]


def settings(home: Path, db: str | None = None, store: str | None = None):
    from registry.config import Settings

    return Settings.resolve(home=str(home), db=db, store=store, env={})


def open_registry(home: Path, db: str | None = None, store: str | None = None, cache: Path | None = None):
    from registry.client import Registry

    return Registry(settings(home, db, store), cache_dir=cache)


def build(out: Path, pt2: Path, cache: Path | None = None) -> None:
    """``build_bundle``; with ``cache`` (a client cache), its verdicts are written there, as
    ``pt2reg bundle`` writes them to the home's cache."""
    from registry.bundler import ProgramInput, build_bundle
    from registry.pt2.verdicts import verdicts_dir

    build_bundle(out, [ProgramInput("model", pt2)], metadata={"benchmark": "scale"},
                 vetted_dir=verdicts_dir(cache) if cache is not None else None)


def counter() -> Callable[[], int]:
    it = itertools.count()
    return lambda: next(it)


def clear(*paths: Path) -> None:
    for p in paths:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def clear_glob(work: Path, *patterns: str) -> None:
    for pattern in patterns:
        clear(*work.glob(pattern))


def read_once(path: Path) -> int:
    """One sequential read of the whole file (what ``cat FILE > /dev/null`` does)."""
    buf = bytearray(MiB)
    view, n = memoryview(buf), 0
    with open(path, "rb", buffering=0) as f:
        while True:
            got = f.readinto(view)
            if not got:
                return n
            n += got


def local_registry(p: Program, db: str) -> tuple[str, Path, str]:
    """A local registry holding the base bundle: (store URL, home, ref)."""
    def make() -> tuple[str, Path, str]:
        home, store = p.work / "pub-home", f"file://{p.work / 'pub-store'}"
        with open_registry(home, db, store) as reg:
            reg.push(p.bundle, f"pub-{p.name}")
        return store, home, f"pub-{p.name}@1"
    return p.once("local-registry", make)


# -- parts -----------------------------------------------------------------------------------

def part_local(p: Program, reps: int, db: str, warm: Path) -> dict[str, list[float]]:
    store, home, ref = local_registry(p, db)
    n = counter()
    work = p.work

    def pusher(verdicts: bool) -> Callable[[], None]:
        def push() -> None:
            i = n()  # a fresh store; the bundling machine's cache (its verdicts), or an empty one
            with open_registry(work / f"push-home{i}", db, f"file://{work / f'push-store{i}'}",
                               cache=p.cache if verdicts else None) as reg:
                result = reg.push(p.bundle, f"push-{p.name}-{i}")
            assert result.uploaded_bytes >= 0.9 * p.bundle.stat().st_size, "push skipped blobs: not a fresh store"
        return push

    def pull() -> None:
        with open_registry(home, db, store, cache=work / f"pull-cache{n()}") as reg:
            reg.materialize(ref)

    def cp_sync() -> None:
        run(["cp", str(p.pt2), str(work / "copy.pt2")])
        run(["sync", str(work / "copy.pt2")])

    def between() -> None:
        clear_glob(work, "push-home*", "push-store*", "pull-cache*", "copy.pt2", "timed.pt2b", "timed-cache")
        quiesce()

    # warm-up on the tiny bundle: imports, the first bundling, the database's connections
    with open_registry(work / "warm-home", db, f"file://{work / 'warm-store'}") as reg:
        reg.push(warm, f"warm-{p.name}")
        reg.materialize(f"warm-{p.name}@1")
    clear_glob(work, "warm-*")
    cases = {"bundle": lambda: build(work / "timed.pt2b", p.pt2, work / "timed-cache"), "push": pusher(True),
             "push, no verdict": pusher(False), "pull": pull, "cp+sync": cp_sync}
    inputs = {"bundle": [p.pt2], "push": [p.bundle], "push, no verdict": [p.bundle],
              "pull": [work / "pub-store"], "cp+sync": [p.pt2]}
    return side_by_side(reps, cases, between=between,
                        before={case: functools.partial(warm_files, *paths) for case, paths in inputs.items()})


def drop_bucket(server: Any, bucket: str) -> None:
    """Empty and delete a bucket, so its bytes leave SeaweedFS's disk."""
    client = server.client()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        for i in range(0, len(keys), 1000):
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys[i:i + 1000], "Quiet": True})
    client.delete_bucket(Bucket=bucket)


def s3_registry(p: Program, server: Any, db: str) -> tuple[str, str, str]:
    """A bucket holding the base bundle in a registry and the raw .pt2: (bucket, store, ref)."""
    def make() -> tuple[str, str, str]:
        import boto3

        bucket = server.new_bucket()
        store = f"s3://{bucket}/reg"
        with open_registry(p.work / "s3-pub-home", db, store) as reg:
            reg.push(p.bundle, f"s3-{p.name}")
        boto3.session.Session().client("s3").upload_file(str(p.pt2), bucket, "raw/model.pt2")
        return bucket, store, f"s3-{p.name}@1"
    return p.once("s3-registry", make)


def part_s3(p: Program, reps: int, server: Any, db: str, warm: Path) -> dict[str, list[float]]:
    import boto3

    bucket, store, ref = s3_registry(p, server, db)
    work, n = p.work, counter()
    used: list[str] = []

    def fresh_bucket() -> str:
        used.append(server.new_bucket())
        return used[-1]

    def push() -> None:
        i, b = n(), fresh_bucket()
        with open_registry(work / f"s3-push-home{i}", db, f"s3://{b}/reg", cache=p.cache) as reg:
            reg.push(p.bundle, f"s3push-{p.name}-{i}")  # bundled here: the bundler's verdicts

    def upload() -> None:
        b = fresh_bucket()
        boto3.session.Session().client("s3").upload_file(str(p.pt2), b, "model.pt2")

    def pull() -> None:
        with open_registry(work / "s3-pub-home", db, store, cache=work / f"s3-cache{n()}") as reg:
            reg.materialize(ref)

    def download() -> None:
        boto3.session.Session().client("s3").download_file(bucket, "raw/model.pt2", str(work / "download.pt2"))

    def between() -> None:
        while used:
            drop_bucket(server, used.pop())
        clear_glob(work, "s3-push-home*", "s3-cache*", "download.pt2")
        quiesce()

    # warm-up: boto3 and s3transfer paths, on the tiny bundle
    warm_bucket = fresh_bucket()
    with open_registry(work / "s3-warm-home", db, f"s3://{warm_bucket}/reg", cache=work / "s3-warm-cache") as reg:
        reg.push(warm, f"s3warm-{p.name}")
        reg.materialize(f"s3warm-{p.name}@1")
    boto3.session.Session().client("s3").upload_file(str(warm), warm_bucket, "warm.pt2b")
    between()
    clear_glob(work, "s3-warm-*")
    cases = {"push": push, "upload_file": upload, "pull": pull, "download_file": download}
    volumes = [d for d in [server.log_path.parent / "data"] if d.is_dir()]  # what the server reads a pull from
    inputs = {"push": [p.bundle], "upload_file": [p.pt2], "pull": volumes, "download_file": volumes}
    return side_by_side(reps, cases, between=between,
                        before={case: functools.partial(warm_files, *paths) for case, paths in inputs.items()})


def load_registry(p: Program, keys: tuple[Path, Path]) -> tuple[Path, str, str, str, Path]:
    """A home whose trust policy names ``keys``' public key for ``signed-*``, holding the bundle
    signed and unsigned: (home, signed ref, unsigned ref, pinned signed ref, cached member)."""
    def make() -> tuple[Path, str, str, str, Path]:
        key, pub = keys
        home = p.work / "load-home"
        home.mkdir(parents=True, exist_ok=True)
        (home / "trust.toml").write_text(f'[[rule]]\nmodels = "signed-*"\nkeys = [{json.dumps(str(pub))}]\n')
        with open_registry(home) as reg:
            signed = reg.push(p.bundle, f"signed-{p.name}", sign_key=key)
            reg.push(p.bundle, f"unsigned-{p.name}")
            src = reg.materialize(f"signed-{p.name}@{signed.version.digest}")  # fills the home's cache
            member = p.work / "member.pt2"  # the cached program itself, named as torch expects
            clear(member)
            os.link(src.member_file("programs/model.pt2"), member)
        return (home, f"signed-{p.name}@1", f"unsigned-{p.name}@1",
                f"signed-{p.name}@{signed.version.digest}", member)
    return p.once("load-registry", make)


def part_load(p: Program, reps: int, keys: tuple[Path, Path], warm: Path) -> dict[str, list[float]]:
    import torch

    import registry

    home, signed, unsigned, pinned, member = load_registry(p, keys)
    os.environ["PT2REG_HOME"] = str(home)
    work, n = p.work, counter()

    def cold(ref: str) -> Callable[[], None]:
        def go() -> None:
            loaded = registry.load(ref, device="cpu", cache_dir=work / f"load-cache{n()}")
            assert "model" in loaded
        return go

    def warm_load() -> None:
        loaded = registry.load(pinned, device="cpu")
        assert "model" in loaded

    def between() -> None:
        clear_glob(work, "load-cache*")
        gc.collect()

    # warm-up: the first torch deserialization in this process, the policy and signature paths
    with open_registry(home) as reg:
        reg.push(warm, "signed-warm", sign_key=keys[0])
    registry.load("signed-warm@1", device="cpu", cache_dir=work / "load-cache-warm")
    torch.export.load(member)
    warm_load()
    between()
    cases = {"cold, signed": cold(signed), "cold, unsigned (sandbox)": cold(unsigned), "warm": warm_load,
             "read": lambda: read_once(member), "torch.export.load": lambda: torch.export.load(member),
             "torch.export.load().module()": lambda: torch.export.load(member).module()}
    return side_by_side(reps, cases, between=between)


def worker(mode: str, **cfg: Any) -> float:
    done = subprocess.run([PYTHON, WORKER, mode, json.dumps({k: str(v) for k, v in cfg.items()})],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=BENCH)
    if done.returncode != 0:
        raise RuntimeError(f"_scale_worker.py {mode} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["peak_mib"])


def part_rss(p: Program, reps: int, db: str, keys: tuple[Path, Path], server: Any | None,
             jobs: int) -> dict[str, list[float]]:
    store, home, ref = local_registry(p, db)
    load_home, signed, _unsigned, _pinned, member = load_registry(p, keys)
    s3 = s3_registry(p, server, db) if server is not None else None
    work = p.work
    peaks: dict[str, list[float]] = {}
    for rep in range(reps):
        tasks: dict[str, Callable[[], float]] = {
            "baseline": lambda: worker("baseline", home=work / "rss-base"),
            "baseline-torch": lambda: worker("baseline-torch", home=work / "rss-base"),
            "bundle": lambda: worker("bundle", home=work / "rss-base", pt2=p.pt2, out=work / "rss.pt2b",
                                     cache=work / "rss-bundle-cache"),
            "push, local": lambda rep=rep: worker("push", home=work / "rss-push-home", db=db,
                                                  store=f"file://{work / 'rss-push-store'}", bundle=p.bundle,
                                                  name=f"rss-{p.name}-{rep}"),
            "pull, local": lambda: worker("pull", home=home, db=db, store=store, ref=ref,
                                          cache=work / "rss-pull-cache"),
            "load, cold, signed": lambda: worker("load", home=load_home, ref=signed,
                                                 cache=work / "rss-load-cache"),
            "torch.export.load().module()": lambda: worker("torch-load", home=work / "rss-base", pt2=member),
        }
        if s3 is not None:
            bucket, s3_store, s3_ref = s3
            fresh = server.new_bucket()
            tasks["push, s3"] = lambda fresh=fresh, rep=rep: worker(
                "push", home=work / "rss-s3-push-home", db=db, store=f"s3://{fresh}/reg", bundle=p.bundle,
                name=f"rss-s3-{p.name}-{rep}")
            tasks["pull, s3"] = lambda s3_store=s3_store, s3_ref=s3_ref: worker(
                "pull", home=work / "s3-pub-home", db=db, store=s3_store, ref=s3_ref,
                cache=work / "rss-s3-pull-cache")
        with ThreadPoolExecutor(max_workers=jobs) as pool:  # each its own process: peaks are independent
            futures = {k: pool.submit(fn) for k, fn in tasks.items()}
            for k, f in futures.items():
                peaks.setdefault(k, []).append(f.result())
        if s3 is not None:
            drop_bucket(server, fresh)
        clear_glob(work, "rss-*")
    return peaks


def part_growth(p: Program) -> dict[str, Any]:
    home = p.work / "growth-home"
    with open_registry(home) as reg:
        reg.push(p.bundle, f"growth-{p.name}")
        before = tree_bytes(home / "store")
        ft = reg.push(p.ft_bundle, f"growth-{p.name}")
        after = tree_bytes(home / "store")
    clear(home)
    return {"store_after_base": before, "store_after_ft": after, "ft_bundle": p.ft_bundle.stat().st_size,
            "uploaded_ft": ft.uploaded_bytes, "skipped_ft": ft.skipped_bytes,
            "ft_changed_tensors": p.files.info["ft_changed_tensors"],
            "ft_changed_bytes": p.files.info["ft_changed_bytes"],
            "delta_bound": delta_bound(p.files.base, p.files.ft, p.bundle, p.ft_bundle)}


def _shuffled(data: bytes) -> bytes:
    """The bytes of each fp32 value in four planes (every first byte, then every second, ...)."""
    import numpy as np

    return np.frombuffer(data, dtype=np.uint8).reshape(-1, 4).T.tobytes()


def delta_bound(base: Path, ft: Path, base_bundle: Path, ft_bundle: Path) -> dict[str, Any]:
    """A bound, not a feature: what a store that kept each changed chunk as a compressed delta
    against its parent's would add for the fine-tune. Every weight record whose bytes differ
    between the two programs (the same module exported twice: the same record names under
    each archive's folder), as the XOR with the base's, byte-shuffled, compressed by zlib and
    lzma; and the new bytes compressed alone, for reference. Then the rest of what the
    fine-tune's push adds (``metadata``: its manifest, and every chunk or blob of its bundle
    that the base's lacks and that is not a changed weight: the program's central directory,
    which holds every CRC), raw and compressed by zlib. Sizes in bytes."""
    import lzma
    import zipfile
    import zlib

    import numpy as np

    out = {"changed": 0, "xor_zlib": 0, "xor_lzma": 0, "new_shuffled_zlib": 0, "new_zlib": 0, "information": 0.0}
    weights: set[str] = set()
    with zipfile.ZipFile(base) as zb, zipfile.ZipFile(ft) as zf:
        def inside(names: list[str]) -> dict[str, str]:   # the archive's folder is its file's stem
            return {n.split("/", 1)[1]: n for n in names if "/" in n}
        old, new = inside(zb.namelist()), inside(zf.namelist())
        for name in sorted(n for n in old if n.startswith(("data/weights/", "data/constants/")) and n in new):
            a, b = zb.read(old[name]), zf.read(new[name])
            if a == b or len(a) != len(b) or len(a) % 4:
                continue
            xor = _shuffled((np.frombuffer(a, dtype=np.uint32) ^ np.frombuffer(b, dtype=np.uint32)).tobytes())
            out["changed"] += len(a)
            out["xor_zlib"] += len(zlib.compress(xor, 6))
            out["xor_lzma"] += len(lzma.compress(xor, preset=6))
            out["new_shuffled_zlib"] += len(zlib.compress(_shuffled(b), 6))
            out["new_zlib"] += len(zlib.compress(b, 6))
            out["information"] += _information(np.frombuffer(b, dtype=np.float32))
            weights.add(name)
    out["metadata"], out["metadata_zlib"] = _new_metadata(base_bundle, ft_bundle, weights)
    return out


def _information(new: Any) -> float:
    """Bytes of new information in fine-tuned values ``new`` (fp32) given their parents: each is
    its parent plus uniform noise of +-``FT_NOISE``, one of the ~2 * FT_NOISE / ulp floats that
    noise can land on, so log2 of that many bits (estimated at the value itself; summed over
    thousands of values the estimate is tight). No lossless store can keep the fine-tune's
    changed values in fewer bytes, whatever its coding."""
    import numpy as np

    ulp = np.spacing(np.abs(new)).astype(np.float64)
    return float(np.log2(np.maximum(1.0, 2 * FT_NOISE / ulp)).sum() / 8)


def _record_spans(f: Any, names: set[str]) -> list[tuple[int, int]]:
    """Where the data of the records ``names`` (paths under the archive's folder) lies in the
    program archive open as ``f`` (seekable), as sorted ``[start, end)`` spans."""
    import struct
    import zipfile

    spans = []
    for info in zipfile.ZipFile(f).infolist():
        if info.filename.split("/", 1)[-1] in names:
            f.seek(info.header_offset)
            name_len, extra_len = struct.unpack("<HH", f.read(30)[26:30])
            start = info.header_offset + 30 + name_len + extra_len
            spans.append((start, start + info.file_size))
    return sorted(spans)


def _new_metadata(base_bundle: Path, ft_bundle: Path, weights: set[str]) -> tuple[int, int]:
    """Bytes, and zlib-compressed bytes, of what ``ft_bundle`` stores that ``base_bundle`` does
    not, but for the data of the changed weight records ``weights``: its manifest, and the rest
    of its new chunks and whole members (the program's central directory, which holds every
    CRC, and the record headers around a changed tensor, in its chunk)."""
    import zipfile
    import zlib

    from registry.format.manifest import Manifest

    def manifest(z: zipfile.ZipFile) -> tuple[bytes, Manifest]:
        raw = z.read("manifest.json")
        return raw, Manifest.from_bytes(raw)

    with zipfile.ZipFile(base_bundle) as zb, zipfile.ZipFile(ft_bundle) as zf:
        _, old = manifest(zb)
        raw, new = manifest(zf)
        had = {sha for m in old.members for sha, _ in m.chunks} | {m.sha256 for m in old.members if not m.chunks}
        pieces = [raw]
        for m in new.members:
            spans = m.chunk_spans() if m.chunks else [(m.sha256, 0, m.size)]
            fresh = [(at, at + n) for sha, at, n in spans if sha not in had]
            if not fresh:
                continue
            with zf.open(m.path) as f:
                skip = _record_spans(f, weights) if m.role == "program" else []
                for lo, hi in fresh:   # the chunk, less the changed records' data in it
                    for s_lo, s_hi in skip:
                        if s_hi <= lo or s_lo >= hi:
                            continue
                        if s_lo > lo:
                            f.seek(lo)
                            pieces.append(f.read(s_lo - lo))
                        lo = max(lo, s_hi)
                    if hi > lo:
                        f.seek(lo)
                        pieces.append(f.read(hi - lo))
    return sum(map(len, pieces)), sum(len(zlib.compress(piece, 6)) for piece in pieces)


# -- rows ------------------------------------------------------------------------------------

def ratio_row(metric: str, ours: float, raw: float, limit: float | None, raw_name: str, note: str = "") -> Row:
    return Row(metric, ours, raw, target=f"<= {limit}x vs {raw_name}" if limit else f"(vs {raw_name})",
               ok=(ours / raw <= limit) if limit and raw > 0 else None, note=note)


def rows_for(p: Program, res: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    gib = p.size / GiB
    if "local" in res:
        m = {k: median(v) for k, v in res["local"].items()}
        raw = m["cp+sync"]
        for op, what in (("bundle", "bundle (build_bundle .pt2 -> .pt2b)"),
                         ("push", "push, local store (fresh; bundled on this machine: its verdicts)"),
                         ("pull", "pull, local store (materialize, empty cache)")):
            rows.append(ratio_row(f"{p.label}: {what}", m[op], raw, TARGET_LOCAL, "cp + sync",
                                  f"{p.size / MiB / m[op]:.0f} vs {p.size / MiB / raw:.0f} MiB/s"))
        if "push, no verdict" in m:
            op = "push, no verdict"
            rows.append(ratio_row(f"{p.label}: push, local store (fresh; no verdict: a bundle from elsewhere, "
                                  f"the program check runs)", m[op], raw, None, "cp + sync",
                                  f"information; the check adds {m[op] - m['push']:.2f} s over the push "
                                  f"with a verdict"))
    if "s3" in res:
        m = {k: median(v) for k, v in res["s3"].items()}
        rows.append(ratio_row(f"{p.label}: push to S3 (SeaweedFS, fresh bucket; the bundler's verdicts)",
                              m["push"], m["upload_file"],
                              TARGET_S3, "upload_file",
                              f"{p.size / MiB / m['push']:.0f} vs {p.size / MiB / m['upload_file']:.0f} MiB/s"))
        rows.append(ratio_row(f"{p.label}: pull from S3 (materialize, empty cache)", m["pull"],
                              m["download_file"], TARGET_S3, "download_file",
                              f"{p.size / MiB / m['pull']:.0f} vs {p.size / MiB / m['download_file']:.0f} MiB/s"))
    if "load" in res:
        m = {k: median(v) for k, v in res["load"].items()}
        cold_raw = m["read"] + m["torch.export.load"]
        cold_raw_mod = m["read"] + m["torch.export.load().module()"]
        rows.append(ratio_row(f"{p.label}: cold registry.load, signed by a trusted key", m["cold, signed"],
                              cold_raw, TARGET_COLD, "read + torch.export.load",
                              f"vs read + torch.export.load().module(): {m['cold, signed'] / cold_raw_mod:.2f}x; "
                              f"read alone {fmt(m['read'], 's')}"))
        rows.append(ratio_row(f"{p.label}: first load of an unsigned bundle (sandbox on)",
                              m["cold, unsigned (sandbox)"], cold_raw, None, "read + torch.export.load",
                              f"information; the sandbox child adds "
                              f"{m['cold, unsigned (sandbox)'] - m['cold, signed']:.2f} s over the signed load"))
        rows.append(ratio_row(f"{p.label}: warm registry.load (pinned digest, cached)", m["warm"],
                              m["torch.export.load"], TARGET_WARM, "torch.export.load",
                              f"vs torch.export.load().module(): {m['warm'] / m['torch.export.load().module()']:.2f}x"))
    if "rss" in res:
        pk = {k: median(v) for k, v in res["rss"].items()}
        base, base_t = pk["baseline"], pk["baseline-torch"]
        for op in ("bundle", "push, local", "pull, local", "push, s3", "pull, s3"):
            if op not in pk:
                continue
            with_torch = op == "bundle"  # the bundler reads the exporting environment from torch
            b = base_t if with_torch else base
            extra = pk[op] - b
            rows.append(Row(f"{p.label}: peak RSS above baseline, {op}", extra, unit="MiB",
                            target=f"< {TARGET_RSS_MIB:.0f} MiB", ok=extra < TARGET_RSS_MIB,
                            note=f"baseline {b:.0f} MiB (same imports{', with torch' if with_torch else ''})"
                                 + ("; no verdict: the program check runs" if op.startswith("push") else "")))
        rows.append(Row(f"{p.label}: peak RSS above baseline, cold registry.load (signed)",
                        pk["load, cold, signed"] - base_t, pk["torch.export.load().module()"] - base_t, unit="MiB",
                        note=f"raw = torch.export.load().module(); baseline with torch {base_t:.0f} MiB; "
                             "a loaded program holds its weights: information"))
    if "growth" in res:
        g = res["growth"]
        pct = 100 * (g["store_after_ft"] - g["store_after_base"]) / g["ft_bundle"]
        ideal = 100 * g["ft_changed_bytes"] / g["ft_bundle"]
        rows.append(Row(f"{p.label}: store growth, {g['ft_changed_tensors']} tensors fine-tuned (% of bundle)",
                        pct, unit="%", target=f"<= {TARGET_GROWTH:g}%", ok=pct <= TARGET_GROWTH,
                        note=f"+{(g['store_after_ft'] - g['store_after_base']) / MiB:.1f} MiB; the changed tensors "
                             f"hold {ideal:.1f}% of the bytes ({gib:.2f} GiB program)"))
        d = g["delta_bound"]
        if d["changed"]:
            def share(n: int) -> str:
                return f"{100 * n / d['changed']:.1f}% ({100 * n / g['ft_bundle']:.2f}% of the bundle)"
            rows.append(Row(f"{p.label}: the changed weights as a delta store could keep them (bound, not built: "
                            f"XOR with the parent's, byte-shuffled, zlib; % of bundle)",
                            100 * d["xor_zlib"] / g["ft_bundle"], unit="%",
                            note=f"of the changed bytes: XOR + zlib {share(d['xor_zlib'])}, XOR + lzma "
                                 f"{share(d['xor_lzma'])}; the new bytes alone, shuffled + zlib "
                                 f"{share(d['new_shuffled_zlib'])}, zlib {share(d['new_zlib'])}; information"))
            if "information" in d:
                info = 100 * d["information"] / g["ft_bundle"]
                rows.append(Row(f"{p.label}: the least any lossless store could add for the changed weights "
                                f"(the information their noise carries; % of bundle)", info, unit="%",
                                target=f"<= {TARGET_GROWTH:g}%", ok=None,
                                note=f"{100 * d['information'] / d['changed']:.1f}% of the changed bytes, before "
                                     f"any manifest or directory; a lower bound, not a store; information"))
            bound = 100 * (d["xor_zlib"] + d["metadata_zlib"]) / g["ft_bundle"]
            rows.append(Row(f"{p.label}: store growth a delta store could reach (bound, not built: the changed "
                            f"weights as above, the rest zlib-compressed; % of bundle)", bound, unit="%",
                            target=f"<= {TARGET_GROWTH:g}%", ok=None,
                            note=f"the rest (manifest, central directory: what the push adds besides the weights) "
                                 f"{d['metadata'] / MiB:.2f} MiB, {d['metadata_zlib'] / MiB:.2f} MiB compressed "
                                 f"({100 * d['metadata_zlib'] / g['ft_bundle']:.2f}% of the bundle); information"))
    return rows


SCALING = (  # (part, our case, raw case, label, per-byte target)
    ("local", "bundle", "cp+sync", "bundle", None),
    ("local", "push", "cp+sync", "push, local", TARGET_PER_BYTE),
    ("local", "push, no verdict", "cp+sync", "push, local, no verdict", None),
    ("local", "pull", "cp+sync", "pull, local", TARGET_PER_BYTE),
    ("s3", "push", "upload_file", "push, S3", TARGET_PER_BYTE),
    ("s3", "pull", "download_file", "pull, S3", TARGET_PER_BYTE),
    ("load", "cold, signed", "torch.export.load", "cold load, signed", None),
    ("load", "warm", "torch.export.load", "warm load", None),
)


def scaling_rows(small: Program, big: Program, results: dict[str, dict[str, Any]]) -> list[Row]:
    """Seconds per GiB on the many-tensor program vs the big one; the ratio is per byte."""
    rows = []
    for part, ours, raw, label, limit in SCALING:
        if part not in results[small.name] or part not in results[big.name]:
            continue

        def per_gib(p: Program, case: str, part: str = part) -> float:
            return median(results[p.name][part][case]) / (p.size / GiB)
        o_s, o_b, r_s, r_b = per_gib(small, ours), per_gib(big, ours), per_gib(small, raw), per_gib(big, raw)
        rows.append(Row(f"scaling, {label}: s/GiB at {small.size / MiB:,.0f} MiB x "
                        f"{small.files.info['base']['tensors']:,} tensors vs {big.size / MiB:,.0f} MiB x "
                        f"{big.files.info['base']['tensors']:,}", o_s, o_b, unit="s/GiB",
                        target=f"<= {limit}x per byte" if limit else "(information)",
                        ok=(o_s / o_b <= limit) if limit else None,
                        note=f"raw ({raw}): {r_s:.2f} vs {r_b:.2f} s/GiB; ours/raw {o_s / r_s:.2f}x vs "
                             f"{o_b / r_b:.2f}x"))
    return rows


def markdown(rows: list[Row]) -> str:
    lines = ["| measurement | ours | raw | ratio | target | met | note |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r.metric, fmt(r.ours, r.unit), fmt(r.raw, r.unit) if r.raw is not None else "",
                 f"{r.ratio:.2f}x" if r.ratio is not None else "", r.target,
                 {True: "yes", False: "**no**", None: ""}[r.ok], r.note]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------------

def tiny_bundle(work: Path) -> Path:
    """A one-layer program for warm-ups (imports, first bundling and deserialization)."""
    import torch

    pt2, out = work / "warm.pt2", work / "warm.pt2b"
    torch.export.save(torch.export.export(torch.nn.Linear(8, 8).eval(), (torch.zeros(1, 8),)), pt2)
    build(out, pt2)
    return out


def main() -> None:
    args = parse_args()
    for var in ENV_VARS:
        os.environ.pop(var, None)
    torch_version = importlib.metadata.version("torch")
    specs = {"big": sm.Spec("big", args.big_mib, args.big_tensors, args.huge_mib, args.ft_percent, args.seed),
             "many": sm.Spec("many", args.many_mib, args.many_tensors, 0, args.ft_percent, args.seed)}
    names = ["big", "many"] if args.program == "both" else [args.program]
    files = {n: sm.programs(specs[n], torch_version, OUT / "models-scale") for n in names}
    results: dict[str, dict[str, Any]] = {n: {} for n in names}
    with scratch("scale-") as work:
        from registry.format.signing import generate_keypair

        keys = generate_keypair(work / "release")
        warm = tiny_bundle(work)
        db = f"sqlite:///{work / 'registry.db'}"
        with open_registry(work / "db-home", db) as reg:  # the schema, once: not part of any timing
            reg.push(warm, "schema")
        server_cm = seaweed() if {"s3", "rss"} & set(args.parts) else None
        server = server_cm.__enter__() if server_cm is not None else None
        try:
            if server is not None:
                os.environ.update(server.env)
            for n in names:
                p = Program(n, files[n], work / n)
                p.work.mkdir()
                print(f"== {p.label}", flush=True)
                p.bundle, p.cache = p.work / "base.pt2b", p.work / "bundler-cache"
                build(p.bundle, p.pt2, p.cache)
                if "growth" in args.parts:
                    p.ft_bundle = p.work / "ft.pt2b"
                    build(p.ft_bundle, p.files.ft)
                res = results[n]
                res["program"] = {**p.files.info, "pt2_bytes": p.size, "bundle_bytes": p.bundle.stat().st_size}
                parts: dict[str, Callable[[], Any]] = {
                    "local": lambda p=p: part_local(p, args.reps, db, warm),
                    "s3": lambda p=p: part_s3(p, args.reps, server, db, warm),
                    "load": lambda p=p: part_load(p, args.reps, keys, warm),
                    "rss": lambda p=p: part_rss(p, args.rss_reps, db, keys, server, 2 if args.quick else 1),
                    "growth": lambda p=p: part_growth(p)}
                for part in args.parts:
                    if args.quick and len(names) == 2 and n == "many" and part in ("load", "rss"):
                        continue  # the smoke test: the same code paths ran on "big" already
                    t0 = time.perf_counter()
                    res[part] = parts[part]()
                    print(f"  {part}: {time.perf_counter() - t0:.0f} s", flush=True)
                res["rows"] = rows_for(p, res)
                res["_p"] = p
                if server is not None and "s3-registry" in p.lazy:
                    drop_bucket(server, p.lazy["s3-registry"][0])
                clear(p.work)  # its bundles and registries: the next program starts on a clean disk
        finally:
            if server_cm is not None:
                server_cm.__exit__(None, None, None)
    rows = [r for n in names for r in results[n]["rows"]]
    if len(names) == 2:
        rows += scaling_rows(results["many"]["_p"], results["big"]["_p"], results)
    for n in names:
        results[n]["label"] = results[n].pop("_p").label
        del results[n]["rows"]
    report("scale", "Scale: " + ", ".join(results[n]["label"] for n in names) + " vs the raw tools", rows, args,
           {"parts": args.parts, "rss_reps": args.rss_reps, "results": results})
    print(markdown(rows))


if __name__ == "__main__":
    main()
