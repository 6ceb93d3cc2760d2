"""The benchmark scripts still run (tiny model, one repetition). No timing is asserted here:
performance figures live in benchmarks/ and are measured side by side there.

One test per script, so the pytest-xdist workers share them (together they take ~90 s of CPU);
``run_all.py --table-only`` then renders whatever results exist."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.fixtures_pt2 import ROOT
from tests.shared import _as_json

SCRIPTS = ("push", "s3", "load", "resolve", "memory", "cli", "commands", "hashing", "sandbox", "scale", "server",
           "webhooks", "gpu_load")  # mlflow: needs its own venv; gpu_load --quick runs on the CPU here
#: flags beyond --quick: MLflow's side of bench_server needs its own venv (built by bench_mlflow)
EXTRA = {"server": ["--skip-mlflow"]}


#: the run's own services, which these scripts use rather than start their own (~10 s each)
SERVICES = {"s3": ("seaweed",), "memory": ("seaweed",), "scale": ("seaweed",), "server": ("seaweed", "postgres")}


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~30 s alone for the slowest; far more on a machine shared with other work
@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_script_runs_in_quick_mode(name, request):
    fixtures = {"seaweed": "seaweed_s3", "postgres": "pg_server"}
    # as tests.shared hands a service to the xdist workers; benchmarks/_common.py rebuilds it
    shared = {s: _as_json(request.getfixturevalue(fixtures[s])) for s in SERVICES.get(name, ())}
    env = {**os.environ, "PT2REG_BENCH_SERVICES": json.dumps(shared)} if shared else None
    r = subprocess.run([sys.executable, f"benchmarks/bench_{name}.py", "--quick", *EXTRA.get(name, [])],
                       cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for service in SERVICES.get(name, ()):  # used the run's own, started none
        assert {"seaweed": "shared SeaweedFS at ", "postgres": "shared PostgreSQL on port "}[service] in r.stderr
    result = json.loads((ROOT / "benchmarks" / "out" / f"{name}-quick.json").read_text())
    assert result["rows"], name


def test_run_all_renders_the_table_of_every_script():
    r = subprocess.run([sys.executable, "benchmarks/run_all.py", "--quick", "--table-only"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| measurement | ours | raw | ratio |" in r.stdout
    for name in SCRIPTS:
        assert f"| {name}: not run |" in r.stdout or (ROOT / "benchmarks" / "out" / f"{name}-quick.json").exists()


def test_run_all_makes_its_output_folder(tmp_path):
    """On a fresh clone ``benchmarks/out/`` does not exist: run_all.py makes it (a copy of the
    two files it needs, run where nothing was ever written)."""
    for name in ("run_all.py", "_common.py"):
        shutil.copy(ROOT / "benchmarks" / name, tmp_path / name)
    r = subprocess.run([sys.executable, "run_all.py", "--quick", "--table-only"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| push: not run |" in (tmp_path / "out" / "results-quick.md").read_text()


@pytest.mark.parametrize("mode", ["requests", "duration"])
def test_bench_server_rounds_always_have_data_points(mode, tmp_path):
    """bench_server's load clients start measuring only once every client process has imported
    and connected, and each records a number of requests (``--quick``: a count; a duration:
    still at least MIN_REQUESTS), so a round has its data points however slow the machine is
    (a round of 4.5 s on a busy machine once had none: ``StatisticsError``). The server here
    answers after 50 ms, and the duration asked for is far shorter than one request."""
    import argparse
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_server
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    class Slow(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            threading.Event().wait(0.05)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        args = argparse.Namespace(clients=3, client_procs=2, warmup=0.0, duration=0.001,
                                  requests=4 if mode == "requests" else 0)
        got = bench_server.resolve_round(f"http://127.0.0.1:{server.server_address[1]}/", {}, args)
    finally:
        server.shutdown()
    if mode == "requests":
        assert len(got["ms"]) == 3 * 4
    else:
        assert len(got["ms"]) >= 3 * bench_server.MIN_REQUESTS
    assert all(ms >= 50 for ms in got["ms"]) and got["rps"] > 0
    assert bench_server.quantile(got["ms"], 0.99) >= bench_server.quantile(got["ms"], 0.5)


def test_drop_cached_evicts_all_but_the_kept_inputs(tmp_path, monkeypatch):
    """bench_commands evicts the run's own files before each case but the case's input
    (``_common.drop_cached``): every file under the roots is advised DONTNEED once, except those
    at or under a kept path (a file, or a directory such as a pull's store)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import _common
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    (tmp_path / "work" / "pull-home" / "store" / "ab").mkdir(parents=True)
    (tmp_path / "models").mkdir()
    files = {"work/bundle.pt2b": 5, "work/vetted.pt2b": 7, "work/pull-home/registry.db": 3,
             "work/pull-home/store/ab/blob": 11, "models/program.pt2": 13}
    for name, size in files.items():
        (tmp_path / name).write_bytes(b"x" * size)
    advised = []
    real = os.posix_fadvise

    def record(fd, offset, length, advice):
        advised.append((os.readlink(f"/proc/self/fd/{fd}"), advice))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", record)
    dropped = _common.drop_cached(tmp_path / "work", tmp_path / "models",
                                  keep=[tmp_path / "work" / "bundle.pt2b", tmp_path / "work" / "pull-home" / "store"])
    assert sorted(advised) == sorted((str((tmp_path / n).resolve()), os.POSIX_FADV_DONTNEED)
                                     for n in ("work/vetted.pt2b", "work/pull-home/registry.db", "models/program.pt2"))
    assert dropped == 7 + 3 + 13
