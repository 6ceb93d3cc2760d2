"""The ``pt2reg`` CLI driven in process (click's CliRunner), and what its errors must look like.

A pytest plugin (listed in ``tests/conftest.py``): the ``pt2reg`` fixture runs commands against
an embedded registry under ``tmp_path/home`` (``pt2reg.home``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


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
    import registry.client.api as client_mod
    from registry.client import Registry
    from registry.config import Settings

    with monkeypatch.context() as m:
        m.setattr(client_mod, "check_bundle_programs", lambda bundle: None)
        m.setenv("PT2REG_HOME", str(home))
        Registry(Settings.resolve()).push(bundle, name)
