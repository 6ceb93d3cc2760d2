"""The benchmark scripts still run (tiny model, one repetition). No timing is asserted here:
performance figures live in benchmarks/ and are measured side by side there.

One test per script, so the pytest-xdist workers share them (together they take ~90 s of CPU);
``run_all.py --table-only`` then renders whatever results exist."""
import json
import subprocess
import sys

import pytest

from tests.fixtures_pt2 import ROOT

SCRIPTS = ("push", "s3", "load", "resolve", "memory", "cli", "sandbox", "scale", "server")  # mlflow: needs its own venv
#: flags beyond --quick: MLflow's side of bench_server needs its own venv (built by bench_mlflow)
EXTRA = {"server": ["--skip-mlflow"]}


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~30 s alone for the slowest; far more on a machine shared with other work
@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_script_runs_in_quick_mode(name):
    r = subprocess.run([sys.executable, f"benchmarks/bench_{name}.py", "--quick", *EXTRA.get(name, [])],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads((ROOT / "benchmarks" / "out" / f"{name}-quick.json").read_text())
    assert result["rows"], name


def test_run_all_renders_the_table_of_every_script():
    r = subprocess.run([sys.executable, "benchmarks/run_all.py", "--quick", "--table-only"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| measurement | ours | raw | ratio |" in r.stdout
    for name in SCRIPTS:
        assert f"| {name}: not run |" in r.stdout or (ROOT / "benchmarks" / "out" / f"{name}-quick.json").exists()
