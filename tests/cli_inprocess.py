"""The ``pt2reg`` CLI driven in process (click's CliRunner), and what its errors must look like.

A pytest plugin (listed in ``tests/conftest.py``): the ``pt2reg`` fixture runs commands against
an embedded registry under ``tmp_path/home`` (``pt2reg.home``).

Tests drive the CLI here, in the test process, by default: a command then costs what it does,
not an interpreter start-up and a torch import (~0.5 to 2 s each). A real process
(``tests.fixtures_pt2.cli_process``) is kept for what only a process shows: SIGKILL and crash
safety, concurrent writers, custom-op libraries that must not register in the test process,
import-time checks, resource limits and the first-load sandbox.

What a command could leak into the next one in process, and how it is kept out:

- environment variables: ``env`` is laid over ``os.environ`` for the call only (CliRunner);
- the working directory: ``cwd`` is entered for the call only;
- stdout/stderr: captured per call, apart, as a subprocess's would be;
- the registry's connections: the CLI closes its ``Registry`` when the command ends;
- torch custom ops and ``--import``/``--library`` modules: never in process (they would stay
  registered for every later test), see ``cli_process``.
"""
from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

__all__ = ["Completed", "run_in_process", "invoker", "pt2reg", "one_error_line", "refused",
           "push_unchecked"]


@dataclass(frozen=True)
class Completed:
    """A finished ``pt2reg`` command: the fields tests read from ``subprocess.CompletedProcess``."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


@contextlib.contextmanager
def _working_directory(cwd: str | os.PathLike | None) -> Iterator[None]:
    if cwd is None:
        yield
        return
    before = os.getcwd()
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(before)


def run_in_process(*args: Any, env: Mapping[str, str | None] | None = None,
                   cwd: str | os.PathLike | None = None) -> Completed:
    """``pt2reg ARGS`` in this process, as a user would run it: ``env`` laid over the process
    environment for the call (a ``None`` value unsets a variable), ``cwd`` the working directory
    during it. An exception the CLI lets escape (a bug) propagates with its traceback.

    CliRunner swaps ``sys.stdout``/``sys.stderr`` and ``os.environ`` for the whole process, so
    commands cannot run side by side in threads: concurrent commands need real processes."""
    from click.testing import CliRunner

    from registry.cli import cli

    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("pt2reg runs in process on the main thread only; run concurrent "
                           "commands as processes (tests.fixtures_pt2.cli_process)")
    argv = tuple(str(a) for a in args)
    with _working_directory(cwd):
        result = CliRunner().invoke(cli, list(argv), env=dict(env or {}), catch_exceptions=False,
                                    prog_name="pt2reg")
    return Completed(argv, result.exit_code, result.stdout, result.stderr)


def invoker(home: Path):
    """A function running ``pt2reg --home HOME ARGS...`` in this process; returns click's Result."""
    from click.testing import CliRunner

    from registry.cli import cli

    runner = CliRunner()

    def invoke(*args: Any):
        return runner.invoke(cli, ["--home", str(home), *map(str, args)], catch_exceptions=False)

    invoke.home = home  # type: ignore[attr-defined]
    return invoke


@pytest.fixture
def pt2reg(tmp_path: Path):
    return invoker(tmp_path / "home")


def one_error_line(result) -> str:
    """The single ``error: ...`` line a failed command printed (no traceback, nothing else)."""
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def refused(result, *needles: str, code: int = 5) -> str:
    """Assert the command exited ``code`` with one error line containing every needle."""
    assert result.exit_code == code, (result.exit_code, result.output)
    line = one_error_line(result)
    for needle in needles:
        assert needle in line, line
    return line


def push_unchecked(home: Path, bundle: Path, name: str, monkeypatch) -> None:
    """Publish without the push-time program checks: what a hostile or older client, or anyone
    with write access to the database and store, can leave in a registry."""
    import registry.client.push as push_mod
    from registry.client import Registry
    from registry.config import Settings

    with monkeypatch.context() as m:
        m.setattr(push_mod, "check_bundle_programs", lambda bundle, **kw: None)
        m.setenv("PT2REG_HOME", str(home))
        Registry(Settings.resolve()).push(bundle, name)
