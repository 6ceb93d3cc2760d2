"""Build once per test run, share across the pytest-xdist workers.

The suite runs on two xdist workers (``scripts/test.sh``); a session fixture runs once per
worker. What is slow to make and safe to share is made once per run instead, by the first
worker that asks, while the others wait on a file lock (the pattern of pytest-xdist's docs,
"Making session-scoped fixtures execute only once"):

- ``built_once``: a directory of artifacts (exported ``.pt2`` files, bundles, an AOTInductor
  package), built under ``tmp_path_factory.getbasetemp().parent`` (the run's directory, which
  every worker of the run shares) and then only read;
- ``shared_service``: a server (PostgreSQL, SeaweedFS, moto) started by a *keeper* process that
  the first worker spawns: the keeper enters the service's context manager, writes where the
  server listens to a file the workers read, and leaves it (stopping the server, removing its
  files) as soon as the xdist controller process has exited, whatever way the run ended. Each
  test still makes its own database or bucket on it.

Without xdist (``-n 0``) both simply build or start in the test process, as before.

    python -m tests.shared keep MODULE:FUNCTION STATE_FILE CONTROLLER_PID    (the keeper)
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.until import HANG_GUARD_S

__all__ = ["built_once", "value_built_once", "shared_service"]

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
#: a hang guard for a keeper's service: longer than a service's own ready guard (tests/until.py),
#: which fails with the service's log; a keeper that exits is reported at once
START_TIMEOUT = 2 * HANG_GUARD_S
_DONE = ".complete"


def _run_dir(factory: pytest.TempPathFactory) -> Path | None:
    """The directory every xdist worker of this run shares; None without xdist."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return None
    return factory.getbasetemp().parent


def _lock(path: Path):
    from filelock import FileLock

    return FileLock(str(path))


def built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """The directory ``build(DIR)`` filled: made by the first worker of the run that asks for
    it, reused by the others (read only). A build that failed or was interrupted is redone."""
    run_dir = _run_dir(factory)
    if run_dir is None:
        out = factory.mktemp(name)
        build(out)
        return out
    out = run_dir / f"shared-{name}"
    with _lock(run_dir / f"shared-{name}.lock"):
        if not (out / _DONE).exists():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            build(out)
            (out / _DONE).touch()
    return out


def value_built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], T]) -> T:
    """``build(DIR)``'s return value (pickled beside the files it wrote in DIR), made once per run."""
    def build_and_save(out: Path) -> None:
        with open(out / "value.pickle", "wb") as f:
            pickle.dump(build(out), f)

    out = built_once(factory, name, build_and_save)
    with open(out / "value.pickle", "rb") as f:
        return pickle.load(f)


def _as_json(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)
                 if not f.name.startswith("_")}
    return json.loads(json.dumps(value, default=str))


def shared_service(factory: pytest.TempPathFactory, name: str, target: str,
                   load: Callable[[Any], T]) -> Iterator[T]:
    """Yield the run's server: ``target`` (``"module:function"``) is a context manager yielding
    a server; ``load`` rebuilds that server's description from its JSON (dataclass fields not
    starting with ``_``, or the value itself). Used as ``yield from`` in a session fixture."""
    run_dir = _run_dir(factory)
    if run_dir is None:
        module, _, function = target.partition(":")
        with getattr(importlib.import_module(module), function)() as server:
            yield server
        return
    state = run_dir / f"service-{name}.json"
    with _lock(run_dir / f"service-{name}.lock"):
        if not state.exists():
            _spawn_keeper(target, state, run_dir / f"service-{name}.log")
    yield load(json.loads(state.read_text()))


def _spawn_keeper(target: str, state: Path, log_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open(log_path, "wb") as log:
        # its own session, no pipe of the worker's: it outlives the worker, not the controller
        keeper = subprocess.Popen([sys.executable, "-m", "tests.shared", "keep", target, str(state),
                                   str(os.getppid())], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT
    while not state.exists():
        if keeper.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                keeper.kill()
            tail = log_path.read_text(errors="replace")[-3000:]
            pytest.fail(f"{target} did not start (keeper exit {keeper.returncode}):\n{tail}", pytrace=False)
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def keep(target: str, state: Path, controller: int) -> None:
    """Run ``target``'s server until process ``controller`` (the xdist controller) is gone."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))   # a TERM still stops the server
    module, _, function = target.partition(":")
    with getattr(importlib.import_module(module), function)() as server:
        tmp = state.with_suffix(".tmp")
        tmp.write_text(json.dumps(_as_json(server)))
        tmp.replace(state)
        while _alive(controller):
            time.sleep(0.25)
        state.unlink(missing_ok=True)


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "keep":
        sys.exit(__doc__)
    keep(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]))
