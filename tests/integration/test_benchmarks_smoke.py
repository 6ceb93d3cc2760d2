"""The benchmark scripts still run (tiny model, one repetition). No timing is asserted here:
performance figures live in benchmarks/ and are measured side by side there.

One test per script, so the pytest-xdist workers share them (together they take ~90 s of CPU);
``run_all.py --table-only`` then renders whatever results exist."""
import json
import os
import subprocess
import sys

import pytest

from tests.fixtures_pt2 import ROOT
from tests.shared import _as_json

SCRIPTS = ("push", "s3", "load", "resolve", "memory", "cli", "commands", "sandbox", "scale", "server",
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
