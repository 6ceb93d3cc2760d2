"""Session fixtures: tiny `.pt2` files exported once, in a separate process."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def pt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pt2")
    subprocess.run([sys.executable, "-m", "tests.make_models", str(out)], cwd=ROOT, check=True,
                   capture_output=True, timeout=300)
    return out


def run_cli(*args: str, env: dict | None = None, cwd: Path | None = None,
            timeout: float = 300, preexec_fn=None) -> subprocess.CompletedProcess:
    """Run ``pt2reg`` in a fresh process, as a user would (``preexec_fn``: e.g. set limits)."""
    import os

    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "registry.cli", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd or ROOT, timeout=timeout, preexec_fn=preexec_fn)
