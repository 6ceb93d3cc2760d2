"""The benchmark scripts still run (tiny model, one repetition). No timing is asserted here:
performance figures live in benchmarks/ and are measured side by side there."""
import json
import subprocess
import sys

import pytest

from tests.fixtures_pt2 import ROOT


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~80 s alone; far more on a machine shared with other work
def test_every_benchmark_script_runs_in_quick_mode():
    r = subprocess.run([sys.executable, "benchmarks/run_all.py", "--quick", "--skip", "mlflow"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for name in ("push", "s3", "load", "resolve", "memory", "cli", "sandbox"):
        result = json.loads((ROOT / "benchmarks" / "out" / f"{name}-quick.json").read_text())
        assert result, name
