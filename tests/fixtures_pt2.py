"""Session fixtures: tiny `.pt2` files exported once per run, in a separate process; how tests
run ``pt2reg``: in process (``run_cli``) or as a real process (``cli_process``)."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.cli_inprocess import Completed, run_in_process
from tests.shared import built_once

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def pt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tests.make_models`` run once per test run (shared by the xdist workers), in its own
    process so the custom op it registers stays out of the test processes."""
    def make(out: Path) -> None:
        subprocess.run([sys.executable, "-m", "tests.make_models", str(out)], cwd=ROOT, check=True,
                       capture_output=True, timeout=300)

    return built_once(tmp_path_factory, "pt2", make)


def run_cli(*args: Any, env: Mapping[str, str | None] | None = None,
            cwd: str | os.PathLike | None = None) -> Completed:
    """``pt2reg ARGS`` in this process (``tests.cli_inprocess.run_in_process``): the default."""
    return run_in_process(*args, env=env, cwd=cwd)


def cli_process(*args: Any, env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
                timeout: float = 300, preexec_fn=None) -> subprocess.CompletedProcess:
    """``pt2reg ARGS`` in a fresh process, as a user would run it (``preexec_fn``: e.g. set
    limits). Only where the process is what is tested: a kill, concurrent writers, what
    start-up imports, resource limits, custom ops that must not register in the test process."""
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "registry.cli", *map(str, args)], capture_output=True,
                          text=True, env=full_env, cwd=cwd or ROOT, timeout=timeout, preexec_fn=preexec_fn)
