"""The registry server (``pt2reg serve``) under load, against MLflow's tracking server, and a
pull of the 384 MiB bundle through presigned URLs against a direct S3 pull, in one run.

Services, all real processes on loopback, started here and stopped at the end: PostgreSQL
(``tests/services_pg.py``; one database for us, one for MLflow), SeaweedFS
(``tests/services_s3.py``; our blob store), ``pt2reg serve`` (uvicorn) over both, and
``mlflow server`` over its PostgreSQL database (from ``benchmarks/.venv-mlflow``, created by
``bench_mlflow.ensure_mlflow`` when missing, + psycopg for PostgreSQL).

1. **Resolve by alias over HTTP.** One model ``bench`` with 100,000 versions (2,000 with
   ``--quick``) and alias ``prod`` on the middle one, on each side. Ours: rows bulk-inserted
   through the store's ORM tables in one transaction (``bench_resolve.fill``: what publish
   writes, the real manifest of the benchmark bundle in every version), schema from the
   migrations. MLflow: ``registered_models`` + ``model_versions`` rows through MLflow's own
   ORM tables in one transaction, schema from MLflow's migrations, then
   ``set_registered_model_alias``. 16 clients (``--client-procs`` processes x threads, each an
   ``httpx.Client`` with keep-alive) call ``GET /v1/resolve?ref=bench@prod`` with a pull-only
   bearer token on ours, and ``GET /api/2.0/mlflow/registered-models/alias?name=bench&alias=prod``
   (the REST call behind ``MlflowClient.get_model_version_by_alias``) on MLflow's, for a fixed
   duration (``--quick``: a fixed number of requests per client, so a busy machine gets the
   same data points, only later) after a warm-up that starts once every client process has
   imported and connected, synchronized on the wall clock. Both servers run the same number
   of processes (``--workers``, default 1) and are measured only once their process trees are
   idle (MLflow's job runner starts 7 huey consumers after it first answers). One untimed
   warm-up round each, then the sides alternate per round (order rotated): p50, p99 and
   requests/s per round, the median over rounds reported; then one client alone per side.
2. **Pull of the 384 MiB bundle** (``Registry.pull(ref, out)``: resolve, fetch the chunks,
   verify, rebuild the bundle file), each in a fresh home (cold cache), in three long-lived
   worker processes with their own environments, interleaved (order rotated) per repetition:
   * *via the server*: ``PT2REG_URL`` + a pull-only ``PT2REG_TOKEN``, no AWS variables and no
     AWS config files: every blob comes from SeaweedFS through a presigned GET;
   * *direct*: ``PT2REG_DB`` (PostgreSQL) + ``PT2REG_STORE=s3://...`` with AWS credentials
     (the mode before the server);
   * *raw*: boto3 ``download_file`` of the same bundle file stored as one object (client
     created inside the timing).
   The server's CPU time during the pulls via the server is reported: bytes proxied through it
   would cost it CPU in proportion to their size, presigning a URL costs milliseconds.

    .venv/bin/python benchmarks/bench_server.py                  # full: ~5 min on 2 cores
    .venv/bin/python benchmarks/bench_server.py --quick          # smoke test (~1-2 min)
    .venv/bin/python benchmarks/bench_server.py --quick --skip-mlflow   # ours only (~30 s)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import BENCH, PT2REG, PYTHON, Row, median, models, postgres, report, scratch, seaweed

VENV = BENCH / ".venv-mlflow"
MLFLOW_PY = str(VENV / "bin" / "python")
MLFLOW_BIN = str(VENV / "bin" / "mlflow")
ALIAS = "prod"
#: measured requests each client makes at least, whatever the mode: a round always has data
MIN_REQUESTS = 2
MODEL = "bench"        # the model with the many versions
BIG = "big"            # the model holding the 384 MiB bundle
TOKEN_SCOPES = ("model:*:pull",)  # pull-only: bench, big and warm (single-segment names)
#: a hang guard only: a server that exits while starting is reported at once (its exit code and
#: log); this is hit only by one that neither exits nor answers. Start-up is seconds on an idle
#: machine (imports, then migrations), so a generous multiple keeps a busy machine clear of it.
READY_TIMEOUT = 600.0


# -- arguments ---------------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2,000 versions, the 1.5 MiB model, rounds of 50 requests per client")
    p.add_argument("--reps", type=int, default=None, help="pull repetitions per side (default 5, quick 1)")
    p.add_argument("--rounds", type=int, default=None, help="resolve rounds per side (default 3, quick 1)")
    p.add_argument("--duration", type=float, default=None,
                   help="seconds of measured load per round (default 10)")
    p.add_argument("--requests", type=int, default=None,
                   help="measured requests per client per round instead of --duration (quick: 50): "
                        "the data points do not depend on how fast the machine is")
    p.add_argument("--warmup", type=float, default=None, help="seconds of warm-up load per round (default 3)")
    p.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    p.add_argument("--client-procs", type=int, default=4,
                   help="client processes the clients are spread over (threads in each; default 4)")
    p.add_argument("--workers", type=int, default=1,
                   help="server worker processes, the same on both sides (default 1)")
    p.add_argument("--versions", type=int, default=None, help="versions of the model (default 100,000)")
    p.add_argument("--skip-mlflow", action="store_true", help="ours only (no MLflow venv needed)")
    p.add_argument("--skip-pull", action="store_true", help="resolve only")
    p.add_argument("--skip-resolve", action="store_true", help="pull only (no MLflow)")
    args = p.parse_args()
    args.duration_given = args.duration is not None
    args.reps = args.reps or (1 if args.quick else 5)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.duration = args.duration or 10.0
    args.requests = args.requests if args.requests is not None else (50 if args.quick and not args.duration_given else 0)
    args.warmup = args.warmup if args.warmup is not None else (1.5 if args.quick else 3.0)
    args.versions = args.versions or (2_000 if args.quick else 100_000)
    if args.requests < 0 or (args.requests and args.requests < MIN_REQUESTS):
        p.error(f"--requests must be at least {MIN_REQUESTS} (a p99 needs data points)")
    if args.clients < 1 or not 1 <= args.client_procs <= args.clients:
        p.error("--clients must be >= 1 and --client-procs between 1 and --clients")
    return args


# -- processes ---------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the process group (uvicorn/gunicorn workers included), SIGKILL it if it lingers."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@contextlib.contextmanager
def http_server(what: str, cmd: list[str], ready_url: str, log: Path,
                env: dict[str, str]) -> Iterator[subprocess.Popen]:
    """Run ``cmd`` in its own process group until the block ends, once ``ready_url`` answers 200."""
    import httpx

    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with code {proc.returncode} while starting; log tail:\n"
                                   f"{tail(log)}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(ready_url, timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not ready at {ready_url} after {READY_TIMEOUT:.0f} s; log tail:\n"
                                   f"{tail(log)}")
            time.sleep(0.25)
        yield proc
    finally:
        stop(proc)


def tree_cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of ``pid`` and every live descendant (``/proc``)."""
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()   # after "pid (comm) "
        stats[int(entry.name)] = fields
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        if p in stats:
            total += int(stats[p][11]) + int(stats[p][12])   # utime, stime (clock ticks)
        todo.extend(children.get(p, []))
    return total / os.sysconf("SC_CLK_TCK")


def settle(pid: int, what: str, limit: float = 120.0) -> float:
    """Wait until the process tree of ``pid`` is idle (< 10% of a core over 2 s), so that start-up
    work in the background (MLflow's job runner starts 7 huey consumers after it answers /health)
    is not measured; seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        c0 = tree_cpu_seconds(pid)
        time.sleep(2.0)
        if tree_cpu_seconds(pid) - c0 < 0.2:
            return time.monotonic() - t0
    print(f"{what} still busy after {limit:.0f} s: measuring anyway", file=sys.stderr)
    return time.monotonic() - t0


class Worker:
    """A long-lived ``bench_server.py worker`` process with its own environment: send
    ``MODE JSON``, get one JSON line back. Its stderr goes to ``log``."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "wb") as err:
            self.proc = subprocess.Popen([PYTHON, str(Path(__file__).resolve()), "worker"], env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                                         cwd=str(BENCH))

    def __call__(self, mode: str, **cfg: Any) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{mode} {json.dumps({k: str(v) for k, v in cfg.items()})}\n")
        self.proc.stdin.flush()
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"worker died during {mode}; stderr tail:\n{tail(self.log)}")
            if line.startswith("{"):
                answer = json.loads(line)
                if "error" in answer:
                    raise RuntimeError(f"worker {mode} failed: {answer['error']}\nstderr tail:\n{tail(self.log)}")
                return answer

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def clean_env(**extra: str) -> dict[str, str]:
    """This environment less every registry and AWS variable (and AWS config files), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PT2REG_", "AWS_", "MLFLOW_"))}
    env.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull, **extra)
    return env


# -- worker side (a child process of this script) -----------------------------------------------

def cpu_seconds() -> float:
    """This process's user + system CPU time."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def worker_do(mode: str, cfg: dict) -> dict:
    """One operation in a worker process: push or pull (``Registry`` in whichever mode the
    worker's environment selects: direct stores or ``PT2REG_URL``), raw (boto3
    ``download_file``), upload (boto3 ``upload_file``). Returns {"seconds", "cpu"}, or
    {"error"} (the traceback on the worker's stderr)."""
    cpu = cpu_seconds
    try:
        from registry.client import Registry
        from registry.config import Settings

        t0, c0 = time.perf_counter(), cpu()
        if mode == "push":
            with Registry(Settings.resolve(home=cfg["home"])) as reg:
                reg.push(cfg["bundle"], cfg["name"])
        elif mode == "pull":
            with Registry(Settings.resolve(home=cfg["home"])) as reg:
                result = reg.pull(cfg["ref"], cfg["out"])
            size = os.path.getsize(cfg["out"])
            return {"seconds": time.perf_counter() - t0, "cpu": cpu() - c0, "size": size,
                    "result": type(result).__name__}
        elif mode == "raw":
            import boto3

            boto3.session.Session().client("s3").download_file(cfg["bucket"], cfg["key"], cfg["out"])
        elif mode == "upload":
            import boto3

            boto3.session.Session().client("s3").upload_file(cfg["file"], cfg["bucket"], cfg["key"])
        else:
            raise ValueError(f"unknown worker mode {mode}")
        return {"seconds": time.perf_counter() - t0, "cpu": cpu() - c0}
    except Exception as exc:  # reported to the parent, which stops with the worker's stderr
        import traceback

        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {exc}"}


def load_client(cfg: dict) -> dict:
    """One client process: ``threads`` keep-alive ``httpx.Client``s, each connected with one
    request; then it prints ``ready`` and reads the start time (wall clock) from stdin, so its
    imports and connections never eat into the schedule. Each client GETs ``url`` in a loop,
    warms up until ``start_at``, then records each request's latency: ``requests`` of them,
    or, when that is 0, until ``start_at + duration`` and at least ``MIN_REQUESTS``. Latencies
    in ms; non-200 answers counted (first one kept); ``span``: seconds from ``start_at`` to the
    end of the last measured request."""
    import threading

    import httpx

    threads, duration, count = int(cfg["threads"]), float(cfg["duration"]), int(cfg.get("requests") or 0)
    headers = json.loads(cfg["headers"])
    lat: list[list[float]] = [[] for _ in range(threads)]
    errors = [0] * threads
    sent = [0] * threads                 # every request, the warm-up's included
    ends = [0.0] * threads
    first_error: list[str] = []
    clients = [httpx.Client(headers=headers, timeout=60.0) for _ in range(threads)]
    for i, client in enumerate(clients):  # connected (and the server's first answer paid) before the start
        client.get(cfg["url"])
        sent[i] += 1
    print("ready", flush=True)
    start_at = float(json.loads(sys.stdin.readline())["start_at"])

    def done(i: int) -> bool:
        if count:
            return len(lat[i]) >= count
        return len(lat[i]) >= MIN_REQUESTS and time.time() > start_at + duration

    def run(i: int) -> None:
        client = clients[i]
        while time.time() < start_at:
            client.get(cfg["url"])
            sent[i] += 1
        while not done(i):
            t0 = time.perf_counter()
            r = client.get(cfg["url"])
            dt = time.perf_counter() - t0
            sent[i] += 1
            if r.status_code != 200:
                errors[i] += 1
                if not first_error:
                    first_error.append(f"{r.status_code} {r.text[:300]}")
            lat[i].append(dt * 1000)
        ends[i] = time.time()

    pool = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    for client in clients:
        client.close()
    return {"ms": [round(x, 4) for xs in lat for x in xs], "errors": sum(errors), "sent": sum(sent),
            "first_error": first_error[0] if first_error else None, "span": max(ends) - start_at}


def mlflow_populate(cfg: dict) -> dict:
    """(Run by MLflow's venv.) One registered model with ``versions`` versions through MLflow's
    own ORM tables in one transaction (``create_model_version`` one by one would take hours
    over 100,000), then alias ``prod`` on the middle one through MLflow's API."""
    import warnings

    warnings.filterwarnings("ignore")
    from mlflow import MlflowClient
    from mlflow.store.model_registry.dbmodels.models import SqlModelVersion
    from sqlalchemy import create_engine, insert

    t0 = time.perf_counter()
    client = MlflowClient(tracking_uri=cfg["uri"], registry_uri=cfg["uri"])
    client.create_registered_model(cfg["name"])      # runs MLflow's migrations on the empty database
    engine = create_engine(cfg["uri"])
    versions, now = int(cfg["versions"]), int(time.time() * 1000)
    with engine.begin() as conn:
        for start in range(1, versions + 1, 5000):
            conn.execute(insert(SqlModelVersion), [
                {"name": cfg["name"], "version": n, "creation_time": now, "last_updated_time": now,
                 "source": cfg["source"], "run_id": "0" * 32, "storage_location": cfg["source"]}
                for n in range(start, min(start + 5000, versions + 1))])
    engine.dispose()
    client.set_registered_model_alias(cfg["name"], ALIAS, str(versions // 2))
    return {"seconds": time.perf_counter() - t0}


# -- the MLflow venv ---------------------------------------------------------------------------

def ensure_mlflow_server() -> str | None:
    """MLflow's venv (``bench_mlflow.ensure_mlflow``) + psycopg for its PostgreSQL backend; its
    version, or None when it cannot be installed here."""
    from bench_mlflow import ensure_mlflow

    version = ensure_mlflow()
    if version is None:
        return None
    probe = subprocess.run([MLFLOW_PY, "-c", "import psycopg"], capture_output=True)
    if probe.returncode != 0:
        done = subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", "psycopg[binary]"],
                              capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            print(f"psycopg could not be installed into {VENV}: {done.stderr[-500:]}", file=sys.stderr)
            return None
    return version


# -- the measurements --------------------------------------------------------------------------

def resolve_round(url: str, headers: dict[str, str], args: argparse.Namespace) -> dict:
    """``args.clients`` clients over ``args.client_procs`` processes against ``url``: started,
    then (once every process says it is ready) given one start time, ``args.warmup`` s ahead.
    Throughput is the measured requests over the measured span (the last one's end), so a
    client that overruns a duration, or a count that takes long, is accounted for."""
    procs = args.client_procs
    per = [args.clients // procs + (1 if i < args.clients % procs else 0) for i in range(procs)]
    cfg = {"url": url, "headers": json.dumps(headers), "duration": args.duration, "requests": args.requests}
    children = [subprocess.Popen([PYTHON, str(Path(__file__).resolve()), "client",
                                  json.dumps({**cfg, "threads": n})], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(BENCH))
                for n in per]
    try:
        for child in children:  # however long imports take on this machine
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                child.wait()
                raise RuntimeError(f"load client failed while starting ({child.returncode}):\n"
                                   f"{child.stderr.read()[-2000:] if child.stderr else ''}")
        start = json.dumps({"start_at": time.time() + args.warmup}) + "\n"
        for child in children:
            assert child.stdin is not None
            child.stdin.write(start)
            child.stdin.flush()  # communicate() closes it
        ms: list[float] = []
        errors, sent, span, first_error = 0, 0, 0.0, None
        for child in children:
            # no wall-clock limit: each request is bounded by httpx's own timeout (60 s)
            out, err = child.communicate()
            if child.returncode != 0:
                raise RuntimeError(f"load client failed ({child.returncode}):\n{err[-2000:]}")
            doc = json.loads(out.strip().splitlines()[-1])
            ms += doc["ms"]
            errors += doc["errors"]
            sent += doc["sent"]
            span = max(span, doc["span"])
            first_error = first_error or doc["first_error"]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    if errors:
        raise RuntimeError(f"{errors} of {len(ms)} requests to {url} failed; first: {first_error}")
    return {"ms": ms, "rps": len(ms) / span, "sent": sent}


def quantile(ms: list[float], q: float) -> float:
    return statistics.quantiles(ms, n=1000, method="inclusive")[round(q * 1000) - 1]


def check_answers(ours_url: str, headers: dict[str, str], mlflow_url: str | None, versions: int) -> None:
    """One request each before the load: both must resolve the alias to the middle version, and
    ours must refuse the request without a token (401)."""
    import httpx

    r = httpx.get(ours_url, headers=headers, timeout=30)
    if r.status_code != 200 or r.json().get("number") != versions // 2:
        raise RuntimeError(f"our resolve answered {r.status_code} {r.text[:300]}")
    if httpx.get(ours_url, timeout=30).status_code != 401:
        raise RuntimeError("our resolve answered without a token: the server does not authenticate")
    if mlflow_url:
        r = httpx.get(mlflow_url, timeout=30)
        if r.status_code != 200 or r.json()["model_version"]["version"] != str(versions // 2):
            raise RuntimeError(f"MLflow's resolve answered {r.status_code} {r.text[:300]}")


def measure_resolve(sides: dict[str, tuple[str, dict[str, str]]], pids: dict[str, int],
                    args: argparse.Namespace) -> dict[str, dict]:
    """16 clients against each side in turn (order rotated per round) after one untimed warm-up
    round each; then one client alone per side. Per side: per-round p50/p99/throughput, the
    server's CPU time per request (its process tree, ``pids``: what a noisy machine moves least)
    and every latency."""
    names = list(sides)
    out: dict[str, dict] = {s: {"p50": [], "p99": [], "rps": [], "cpu_ms": [], "ms": []} for s in names}
    warm = argparse.Namespace(**{**vars(args), "duration": args.warmup})
    for side in names:                                  # once, untimed: caches, pools, lazy imports
        resolve_round(*sides[side], warm)
    for rnd in range(args.rounds):
        for side in names[rnd % len(names):] + names[:rnd % len(names)]:
            cpu0 = tree_cpu_seconds(pids[side])
            got = resolve_round(*sides[side], args)
            # the warm-up requests of the round count too: all of them, over what the server spent
            out[side]["cpu_ms"].append(1000 * (tree_cpu_seconds(pids[side]) - cpu0) / got["sent"])
            out[side]["ms"] += got["ms"]
            out[side]["p50"].append(quantile(got["ms"], 0.5))
            out[side]["p99"].append(quantile(got["ms"], 0.99))
            out[side]["rps"].append(got["rps"])
            print(f"round {rnd + 1} {side}: {len(got['ms'])} requests, {got['rps']:.0f}/s, "
                  f"p50 {statistics.median(got['ms']):.2f} ms", file=sys.stderr)
    single = argparse.Namespace(**{**vars(args), "clients": 1, "client_procs": 1,
                                   "duration": max(args.duration / 2, 1.0)})  # --requests: as many
    for side in names:                                  # one client alone: latency without queueing
        got = resolve_round(*sides[side], single)
        out[side]["one"] = {"p50": quantile(got["ms"], 0.5), "p99": quantile(got["ms"], 0.99), "rps": got["rps"]}
    return out


def measure_pulls(envs: dict[str, dict[str, str]], server_pid: int, bucket: str, size: int, work: Path,
                  reps: int) -> dict[str, Any]:
    """Pull ``big@1`` via the server and directly (each into a fresh home: cold cache) and
    ``download_file`` the same bundle, in three long-lived workers (``envs``), interleaved."""
    workers = {side: Worker(env, work / f"w-{side}.log") for side, env in envs.items()}
    seconds: dict[str, list[float]] = {side: [] for side in workers}
    client_cpu: dict[str, list[float]] = {side: [] for side in workers}
    server_cpu: list[float] = []
    homes = iter(range(1_000_000))
    out = work / "pulled.pt2b"

    def pull(side: str, ref: str) -> None:
        if side == "raw":
            got = workers["raw"]("raw", bucket=bucket, key="raw/base.pt2b", out=out)
        else:
            home = work / f"home{next(homes)}"          # a fresh, empty cache
            cpu0 = tree_cpu_seconds(server_pid)
            got = workers[side]("pull", home=home, ref=ref, out=out)
            if side == "server" and ref.startswith(BIG):
                server_cpu.append(tree_cpu_seconds(server_pid) - cpu0)
            shutil.rmtree(home, ignore_errors=True)
        if ref.startswith(BIG):
            if out.stat().st_size != size:
                raise RuntimeError(f"{side} pull wrote {out.stat().st_size} bytes, expected {size}")
            seconds[side].append(got["seconds"])
            client_cpu[side].append(got["cpu"])
        out.unlink()

    try:
        for side in workers:                            # warm-up: imports, connections, first token use
            pull(side, "warm@1")
        for rep in range(reps):
            names = list(workers)
            for side in names[rep % 3:] + names[:rep % 3]:
                pull(side, f"{BIG}@1")
    finally:
        for w in workers.values():
            w.close()
    return {"seconds": seconds, "client_cpu": client_cpu, "server_cpu": server_cpu}


def resolve_rows(resolve: dict[str, dict], args: argparse.Namespace) -> list[Row]:
    n, c = f"{args.versions:,}", args.clients
    # per round, then the median over rounds (one noisy round cannot move it); pooled in the JSON
    q = {s: {"p50": median(v["p50"]), "p99": median(v["p99"]), "rps": median(v["rps"]), "cpu_ms": median(v["cpu_ms"])}
         for s, v in resolve.items()}
    ours, mq = q["ours"], q.get("mlflow")
    one, m1 = resolve["ours"]["one"], resolve.get("mlflow", {}).get("one")

    def vs(a: float, b: float | None) -> str:
        return f"ours/MLflow {a / b:.2f}x; " if b else ""

    rows = [Row(f"resolve NAME@alias over HTTP, {c} clients, {n} versions: {stat}", ours[stat], unit="ms",
                mlflow=mq[stat] if mq else None,
                note=vs(ours[stat], mq[stat] if mq else None) + f"median of {args.rounds} rounds' {stat}")
            for stat in ("p50", "p99")]
    rows.append(Row(f"resolve NAME@alias over HTTP, {c} clients: throughput", ours["rps"], unit="req/s",
                    mlflow=mq["rps"] if mq else None,
                    note=vs(ours["rps"], mq["rps"] if mq else None)
                    + f"median of {args.rounds} rounds of "
                    + (f"{args.requests} requests per client" if args.requests else f"{args.duration:.0f} s")))
    rows.append(Row("server CPU per resolve request (its process tree)", ours["cpu_ms"], unit="ms",
                    mlflow=mq["cpu_ms"] if mq else None,
                    note=vs(ours["cpu_ms"], mq["cpu_ms"] if mq else None)
                    + "median over rounds; the figure a busy machine moves least"))
    rows.append(Row(f"resolve NAME@alias over HTTP, 1 client, {n} versions: p50", one["p50"], unit="ms",
                    mlflow=m1["p50"] if m1 else None,
                    note=vs(one["p50"], m1["p50"] if m1 else None)
                    + f"p99 {one['p99']:.2f}" + (f" / {m1['p99']:.2f}" if m1 else "") + " ms; "
                    + f"{one['rps']:.0f}" + (f" / {m1['rps']:.0f}" if m1 else "") + " req/s"))
    return rows


def pull_rows(pulls: dict[str, Any], size_mib: float) -> list[Row]:
    m = {k: median(v) for k, v in pulls["seconds"].items()}
    cc = {k: median(v) for k, v in pulls["client_cpu"].items()}
    s, d, r = m["server"], m["direct"], m["raw"]
    return [
        Row(f"pull {size_mib:.0f} MiB via the server (presigned URLs), cold cache", s, r,
            note=f"raw = boto3 download_file; server CPU {median(pulls['server_cpu']) * 1000:.0f} ms per pull; "
                 f"client CPU {cc['server']:.2f} s (raw {cc['raw']:.2f} s)"),
        Row(f"pull {size_mib:.0f} MiB direct from S3 (PT2REG_DB + PT2REG_STORE), cold cache", d, r,
            note=f"raw = boto3 download_file; client CPU {cc['direct']:.2f} s"),
        Row("pull via the server vs direct", s, d, note="ratio = server / direct"),
    ]


def main() -> None:
    args = parse_args()
    version = None if args.skip_mlflow or args.skip_resolve else ensure_mlflow_server()
    if version is None and not (args.skip_mlflow or args.skip_resolve):
        print("MLflow could not be installed here: measuring ours only", file=sys.stderr)
    ms = models(args.quick)
    manifest = zipfile.ZipFile(ms.bundle("base")).read("manifest.json").decode()
    extra: dict[str, Any] = {
        "mlflow": version, "versions": args.versions, "clients": args.clients, "client_procs": args.client_procs,
        "workers": args.workers, "duration_s": None if args.requests else args.duration,
        "requests_per_client": args.requests or None, "warmup_s": args.warmup, "rounds": args.rounds,
        "setup_seconds": {},
        "databases": {"ours": "postgresql: bench_resolve.fill (ORM bulk insert), one model",
                      "mlflow": "postgresql: MLflow's ORM tables (bulk insert), one model"},
        "ours_resolve": "GET /v1/resolve?ref=NAME@ALIAS with a pull-only bearer token",
        "mlflow_resolve": "GET /api/2.0/mlflow/registered-models/alias (get_model_version_by_alias)"}
    from bench_resolve import fill

    from registry.store import make_engine, open_metadata_store, upgrade

    t_start = time.perf_counter()
    rows: list[Row] = []
    with scratch("server-") as work, postgres() as pg, seaweed() as s3:
        # -- ours: schema from the migrations, 100,000 versions in bulk, the bundles, a token ----
        db = pg.new_database()
        engine = make_engine(db)
        upgrade(engine)                                   # what `pt2reg db upgrade` does
        engine.dispose()
        extra["setup_seconds"]["ours fill"] = fill(db, args.versions, manifest, auto_create=False)
        bucket = s3.new_bucket()
        store = f"s3://{bucket}/reg"
        direct_env = clean_env(**s3.env, PT2REG_DB=db, PT2REG_STORE=store)
        t0 = time.perf_counter()
        pusher = Worker(direct_env, work / "push.log")
        try:
            pusher("push", home=work / "push-home", bundle=ms.bundle("tiny"), name="warm")
            pusher("push", home=work / "push-home", bundle=ms.bundle("base"), name=BIG)
            pusher("upload", file=ms.bundle("base"), bucket=bucket, key="raw/base.pt2b")
        finally:
            pusher.close()
        extra["setup_seconds"]["push bundles"] = time.perf_counter() - t0
        meta = open_metadata_store(db, auto_create=False)
        _record, secret = meta.create_token("bench-pull", list(TOKEN_SCOPES), expires_at=None, actor="bench",
                                            host="bench")
        meta.close()

        # -- MLflow: its schema and 100,000 versions in its own PostgreSQL database -------------
        mlflow_db = None
        if version:
            mlflow_db = pg.new_database()
            done = subprocess.run([MLFLOW_PY, str(Path(__file__).resolve()), "mlflow-populate", json.dumps(
                {"uri": mlflow_db, "name": MODEL, "versions": args.versions,
                 "source": (work / "mlflow-artifacts" / "model").as_uri()})],
                capture_output=True, text=True, cwd=str(BENCH), stdin=subprocess.DEVNULL)
            if done.returncode != 0:
                raise RuntimeError(f"MLflow populate failed:\n{done.stderr[-3000:]}")
            extra["setup_seconds"]["mlflow fill"] = json.loads(done.stdout.strip().splitlines()[-1])["seconds"]

        # -- the servers -----------------------------------------------------------------------
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        ours_cmd = [PT2REG, "--db", db, "--store", store, "serve", "--host", "127.0.0.1", "--port", str(port),
                    "--workers", str(args.workers)]
        with contextlib.ExitStack() as stack:
            server = stack.enter_context(http_server("pt2reg serve", ours_cmd, f"{base}/readyz", work / "server.log",
                                                     clean_env(**s3.env, PT2REG_HOME=str(work / "server-home"))))
            mlflow_base = None
            if mlflow_db:
                mport = free_port()
                mlflow_base = f"http://127.0.0.1:{mport}"
                mlflow_cmd = [MLFLOW_BIN, "server", "--host", "127.0.0.1", "--port", str(mport),
                              "--backend-store-uri", mlflow_db,
                              "--default-artifact-root", (work / "mlflow-artifacts").as_uri(),
                              "--workers", str(args.workers)]
                mlflow_proc = stack.enter_context(http_server("mlflow server", mlflow_cmd, f"{mlflow_base}/health",
                                                              work / "mlflow.log", clean_env()))
                extra["setup_seconds"]["mlflow settle"] = settle(mlflow_proc.pid, "mlflow server")
            extra["setup_seconds"]["ours settle"] = settle(server.pid, "pt2reg serve")

            if not args.skip_resolve:
                headers = {"Authorization": f"Bearer {secret}"}
                sides = {"ours": (f"{base}/v1/resolve?ref={MODEL}@{ALIAS}", headers)}
                if mlflow_base:
                    sides["mlflow"] = (f"{mlflow_base}/api/2.0/mlflow/registered-models/alias"
                                       f"?name={MODEL}&alias={ALIAS}", {})
                check_answers(sides["ours"][0], headers, sides.get("mlflow", (None,))[0], args.versions)
                pids = {"ours": server.pid, **({"mlflow": mlflow_proc.pid} if mlflow_base else {})}
                resolve = measure_resolve(sides, pids, args)
                rows += resolve_rows(resolve, args)
                extra["resolve"] = {s: {k: v for k, v in r.items() if k != "ms"}
                                    | {"pooled_p50": quantile(r["ms"], 0.5), "pooled_p99": quantile(r["ms"], 0.99),
                                       "requests": len(r["ms"])} for s, r in resolve.items()}
            if not args.skip_pull:
                envs = {"server": clean_env(PT2REG_URL=base, PT2REG_TOKEN=secret),   # no AWS, no database
                        "direct": direct_env, "raw": clean_env(**s3.env)}
                pulls = measure_pulls(envs, server.pid, bucket, ms.bundle("base").stat().st_size, work, args.reps)
                rows += pull_rows(pulls, ms.bundle("base").stat().st_size / 2**20)
                extra["pull"] = pulls
    extra["total_seconds"] = time.perf_counter() - t_start
    title = f"Server: resolve under load{' vs MLflow ' + version if version else ''}, pull via presigned URLs"
    report("server", title, rows, args, extra)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        from _proc import serve

        serve(worker_do, ["serve"])
    elif len(sys.argv) > 1 and sys.argv[1] == "client":
        print(json.dumps(load_client(json.loads(sys.argv[2]))))
    elif len(sys.argv) > 1 and sys.argv[1] == "mlflow-populate":
        print(json.dumps(mlflow_populate(json.loads(sys.argv[2]))))
    else:
        main()
