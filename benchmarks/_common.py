"""Shared helpers for the benchmark scripts: the generated model, timing, tables and JSON.

Every script measures *ours* and the *raw* operation side by side in one run (interleaved,
so a noisy neighbour hurts both), reports medians and the ratio, prints a rich table and
writes ``benchmarks/out/<name>.json``. ``--quick`` shrinks the model and runs once (a smoke
test: the figures mean nothing).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
OUT = BENCH / "out"
MODELS = OUT / "models-v2"  # bumped whenever the bundler's output bytes change (v2: canonical programs)
PYTHON = sys.executable
PT2REG = str(Path(sys.executable).parent / "pt2reg")

if str(REPO) not in sys.path:  # tests.services_s3 / services_pg start the real servers
    sys.path.insert(0, str(REPO))

MiB = 1024 * 1024


# -- arguments and results -------------------------------------------------------------------

def parse_args(doc: str | None, default_reps: int = 5) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0] if doc else None)
    p.add_argument("--quick", action="store_true", help="tiny model, one repetition (smoke test)")
    p.add_argument("--reps", type=int, default=None, help=f"repetitions (default {default_reps})")
    args = p.parse_args()
    if args.reps is None:
        args.reps = 1 if args.quick else default_reps
    return args


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)}


@dataclass
class Row:
    """One figure: ours vs the raw operation (``raw`` None when there is no counterpart)."""

    metric: str
    ours: float
    raw: float | None = None
    unit: str = "s"
    target: str = ""          # e.g. "<= 1.5x", "< 2 ms"
    ok: bool | None = None
    mlflow: float | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return self.ours / self.raw if self.raw else None

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["ratio"] = self.ratio
        return d


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return f"{value:.3f} s" if value >= 0.1 else f"{value * 1000:.1f} ms"
    if unit == "ms":
        return f"{value:.2f} ms"
    if unit == "MiB":
        return f"{value:.1f} MiB"
    if unit == "%":
        return f"{value:.1f} %"
    return f"{value:.3g} {unit}"


def report(name: str, title: str, rows: list[Row], args: argparse.Namespace,
           extra: dict[str, Any] | None = None) -> Path:
    """Print a rich table and write ``out/<name>.json``; returns the JSON path."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{title}{' (quick: figures meaningless)' if args.quick else ''}")
    for col in ("metric", "ours", "raw", "ratio", "target", "ok", "MLflow", "note"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r.metric, fmt(r.ours, r.unit), fmt(r.raw, r.unit),
                      f"{r.ratio:.2f}x" if r.ratio is not None else "-", r.target,
                      {True: "yes", False: "NO", None: "-"}[r.ok], fmt(r.mlflow, r.unit), r.note)
    Console(width=160).print(table)
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}{'-quick' if args.quick else ''}.json"
    doc = {"name": name, "title": title, "quick": args.quick, "reps": args.reps, "machine": machine(),
           "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rows": [r.to_json() for r in rows],
           **(extra or {})}
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"results: {path}")
    return path


# -- timing ----------------------------------------------------------------------------------

def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def side_by_side(reps: int, cases: dict[str, Callable[[], Any]],
                 between: Callable[[], Any] | None = None,
                 before: Mapping[str, Callable[[], Any]] | None = None) -> dict[str, list[float]]:
    """Run every case once per repetition, rotating the order each time; seconds per case.
    ``before[case]``, untimed, right before each run of that case (e.g. ``warm_files``)."""
    names = list(cases)
    out: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for n in order:
            if before and n in before:
                before[n]()
            out[n].append(timed(cases[n]))
            if between:
                between()
    return out


def quiesce() -> None:
    """Between two timed cases: collect the heap and flush the disk (``sync``), so that no
    case pays for the writeback or the deletions of the one before it."""
    gc.collect()
    os.sync()


def warm_files(*paths: Path) -> None:
    """Read every file at or under ``paths`` once, so that a timed case finds its input in the
    page cache whatever ran before it, for ours and the raw tool alike. (The machines these
    figures come from run DAMON with a ``pageout`` scheme, /sys/kernel/mm/damon: file pages
    left alone for about a minute may be evicted, so an input read a few cases ago may or may
    not be cached.)"""
    buf = bytearray(1 << 20)
    for root in paths:
        for f in ([root] if root.is_file() else sorted(x for x in root.rglob("*") if x.is_file())):
            with open(f, "rb", buffering=0) as fp:
                while fp.readinto(buf):
                    pass


def drop_cached(*roots: Path, keep: Sequence[Path] = ()) -> int:
    """Evict from the page cache every file at or under ``roots`` but those at or under
    ``keep`` (``posix_fadvise(DONTNEED)``: clean pages only, so ``sync`` first); returns the
    size of the files evicted. A benchmark's own leftovers (the bundles, stores and programs of
    its set-up and of other cases) then do not sit in memory going cold while a case runs: on these machines
    DAMON's ``pageout`` scheme reclaims file pages idle for ~a minute, and a 2 GiB ``cp`` +
    ``sync`` took 1.6-4.5 s (spells of a minute, the same copy 1.6-1.8 s before) while 8 GiB
    of such pages were cold, and 6.3-6.9 s right after they were written; with them evicted
    first, 1.62-1.93 s throughout (docs/performance-log.md, "the benchmark's own cold page cache")."""
    kept = [k.resolve() for k in keep]
    dropped = 0
    for root in roots:
        for f in ([root] if root.is_file() else (x for x in root.rglob("*") if x.is_file())):
            full = f.resolve()
            if any(full == k or k in full.parents for k in kept):
                continue
            try:
                fd = os.open(f, os.O_RDONLY)
            except OSError:   # gone meanwhile, or unreadable: nothing of ours to drop
                continue
            try:
                dropped += os.fstat(fd).st_size
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return dropped


#: the packages a ``pt2reg`` data command runs (``warm_code``); ``S3_CODE``: boto3's, which the
#: raw side of the S3 cases runs too
CODE = ("registry", "sqlalchemy", "click", "isal", "greenlet", "typing_extensions", "sqlite3", "_sqlite3")
S3_CODE = ("boto3", "botocore", "s3transfer", "urllib3", "jmespath", "dateutil")


def warm_code(*packages: str) -> None:
    """``warm_files`` of the files of ``packages`` (found without importing them): the code a
    whole command is about to run, in the page cache as its input is. On these machines DAMON
    pages out a virtualenv's files ~20 s after their last use, and a command started after
    that reads its modules from the disk (``import sqlalchemy.orm, registry.store.sql`` 0.42 s
    warm, 0.45-0.60 s with 1,300-5,800 KiB read back); the figures are the command's, not the
    reclaimer's."""
    import importlib.util

    paths = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None:
            continue
        if spec.submodule_search_locations:
            paths += [Path(p) for p in spec.submodule_search_locations]
        elif spec.origin and spec.origin not in ("built-in", "frozen"):
            paths.append(Path(spec.origin))
    warm_files(*paths)


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def run(cmd: list[str], env: dict[str, str] | None = None, check: bool = True,
        **kw: Any) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, **kw)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A temp dir under out/tmp (same filesystem as the models), removed afterwards."""
    (OUT / "tmp").mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix=prefix, dir=OUT / "tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())


def peak_rss_mib() -> float:
    """This process's peak resident set (VmHWM), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


#: JSON {"seaweed": {...}, "postgres": {...}}: services already running that a script uses
#: instead of starting its own (the smoke test passes the test run's: starting and stopping
#: SeaweedFS takes ~10 s, PostgreSQL a few). Each use makes its own bucket or database.
ENV_SHARED_SERVICES = "PT2REG_BENCH_SERVICES"


def _shared(name: str) -> dict[str, Any] | None:
    raw = os.environ.get(ENV_SHARED_SERVICES)
    return json.loads(raw).get(name) if raw else None


@contextlib.contextmanager
def seaweed(attempts: int = 3) -> Iterator[Any]:
    """A SeaweedFS S3 server on loopback (tests/services_s3.py), retried if it fails to start
    (it occasionally dies at start-up when a chosen port is taken meanwhile); the one named in
    ``PT2REG_BENCH_SERVICES`` if any (left running)."""
    from tests.services_s3 import _load_seaweed, seaweed_server

    doc = _shared("seaweed")
    if doc is not None:
        print(f"shared SeaweedFS at {doc['endpoint']} ({ENV_SHARED_SERVICES})", file=sys.stderr)
        yield _load_seaweed(doc)
        return
    for attempt in range(attempts):
        cm = seaweed_server()
        try:
            server = cm.__enter__()
            break
        except RuntimeError:
            if attempt == attempts - 1:
                raise
    try:
        yield server
    finally:
        cm.__exit__(None, None, None)


@contextlib.contextmanager
def postgres() -> Iterator[Any]:
    """A PostgreSQL server on loopback (tests/services_pg.py), or the one named in
    ``PT2REG_BENCH_SERVICES`` (left running)."""
    from tests.services_pg import _load, postgres_server

    doc = _shared("postgres")
    if doc is not None:
        print(f"shared PostgreSQL on port {doc['port']} ({ENV_SHARED_SERVICES})", file=sys.stderr)
        yield _load(doc)
        return
    with postgres_server() as server:
        yield server


# -- the generated model ---------------------------------------------------------------------

@dataclass(frozen=True)
class ModelSet:
    """Programs and bundles: ``base``, a one-layer fine-tune ``ft`` and a ``tiny`` one."""

    dir: Path
    width: int
    layers: int

    def pt2(self, which: str) -> Path:
        return self.dir / f"{which}.pt2"

    def bundle(self, which: str) -> Path:
        return self.dir / f"{which}.pt2b"


FULL = (4096, 6)   # 6 x Linear(4096, 4096) fp32 = 384 MiB of weights
QUICK = (256, 6)   # 1.5 MiB: every layer still a chunk of its own
TINY = (64, 1)     # the "tiny" bundle whose cost is subtracted (start-up, DB, manifest)


def models(quick: bool) -> ModelSet:
    """Generate (once, cached under out/models) the base, fine-tune and tiny bundles."""
    width, layers = QUICK if quick else FULL
    d = MODELS / f"w{width}x{layers}"
    ms = ModelSet(d, width, layers)
    if all(ms.bundle(w).is_file() for w in ("base", "ft", "tiny")):
        return ms
    # one temporary directory per process: two benchmarks started at once may both generate
    tmp = d.parent / f"{d.name}.incomplete-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    code = f"import sys; sys.path.insert(0, {str(BENCH)!r}); import _common; " \
           f"_common._generate({str(tmp)!r}, {width}, {layers})"
    t0 = time.perf_counter()
    run([PYTHON, "-c", code])  # a child process, so torch stays out of this one
    if d.exists() and not all(ms.bundle(w).is_file() for w in ("base", "ft", "tiny")):
        shutil.rmtree(d, ignore_errors=True)  # a set left incomplete by hand
    try:
        os.replace(tmp, d)
    except OSError:  # another process finished first: its set is as good as ours
        if not all(ms.bundle(w).is_file() for w in ("base", "ft", "tiny")):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"generated {d} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return ms


def _generate(out: str, width: int, layers: int) -> None:
    import torch

    from registry.bundler import ProgramInput, build_bundle

    class Stack(torch.nn.Module):
        def __init__(self, width: int, layers: int) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = torch.relu(layer(x))
            return x

    def export(width: int, layers: int, seed: int):
        torch.manual_seed(seed)
        with torch.device("meta"):
            model = Stack(width, layers)
        model = model.to_empty(device="cpu").eval()
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.uniform_(-0.02, 0.02, generator=gen)
        return model, torch.export.export(model, (torch.zeros(2, width),))

    o = Path(out)
    model, ep = export(width, layers, 0)
    torch.export.save(ep, o / "base.pt2")
    # The fine-tune: the same program with one layer in six retrained (new weight and bias).
    with torch.no_grad():
        layer = model.layers[layers // 2]
        layer.weight.add_(0.001)
        layer.bias.add_(0.001)
    torch.export.save(torch.export.export(model, (torch.zeros(2, width),)), o / "ft.pt2")
    _tiny_model, tiny = export(TINY[0], TINY[1], 1)
    torch.export.save(tiny, o / "tiny.pt2")
    for which in ("base", "ft", "tiny"):
        build_bundle(o / f"{which}.pt2b", [ProgramInput("model", o / f"{which}.pt2")],
                     metadata={"benchmark": which})


# -- the registry in-process -----------------------------------------------------------------

def registry(home: Path, db: str | None = None, store: str | None = None):
    from registry.client import Registry
    from registry.config import Settings

    return Registry(Settings.resolve(home=str(home), db=db, store=store, env={}))


def set_registry_env(home: Path, db: str | None = None, store: str | None = None) -> None:
    """Point ``registry.load`` (which reads the environment) at a registry."""
    os.environ["PT2REG_HOME"] = str(home)
    for key, value in (("PT2REG_DB", db), ("PT2REG_STORE", store)):
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
