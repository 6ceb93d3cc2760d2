"""``pt2reg serve`` as a real process (uvicorn on a free loopback port), for the tests that
drive the registry through its HTTP API.

    with registry_server(db_url, store_url, env=s3.env) as server:
        admin = make_token(db_url, "ci-admin", ["admin"])
        run_cli("list", env={"PT2REG_URL": server.url, "PT2REG_TOKEN": admin})

The server gets the database and store credentials; clients get only the URL and a token.
Its stdout/stderr (uvicorn's log, the access log) go to ``server.log_path``.
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from tests.services_s3 import stop_group
from tests.until import HANG_GUARD_S

__all__ = ["RunningServer", "registry_server", "make_token", "free_port", "manifest_text"]


def manifest_text(sha256: str, size: int, salt: str = "") -> str:
    """The canonical JSON text of a valid manifest (``tests.unit.test_manifest.minimal``) whose
    one member, the program, is the blob ``sha256`` (``sha256:<hex>``) of ``size`` bytes: what
    a publish through the HTTP API must send. ``salt`` goes into its metadata, so that two
    calls name two versions."""
    from registry.format.manifest import Manifest
    from tests.unit.test_manifest import minimal

    raw = minimal()
    raw["members"][0].update(sha256=sha256[7:], size=size)
    raw["metadata"] = {"salt": salt}
    return Manifest.from_raw(raw).canonical.decode("utf-8")


ROOT = Path(__file__).resolve().parent.parent
#: a hang guard, never a speed limit: start-up takes seconds on an idle machine
READY_TIMEOUT = HANG_GUARD_S


@dataclass
class RunningServer:
    url: str
    proc: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        try:
            return self.log_path.read_text("utf-8", errors="replace")
        except OSError:
            return ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def registry_server(db: str, store: str, *, env: Mapping[str, str] | None = None,
                    extra_args: Sequence[str] = (), log_dir: Path | None = None,
                    timeout: float = READY_TIMEOUT) -> Iterator[RunningServer]:
    """Run ``pt2reg serve --db DB --store STORE`` until the block ends; ready when /readyz
    answers 200."""
    port = free_port()
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="pt2reg-serve-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"serve-{port}.log"
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    for var in ("PT2REG_URL", "PT2REG_TOKEN", "PT2REG_DB", "PT2REG_STORE"):
        full_env.pop(var, None)
    full_env.setdefault("PT2REG_HOME", str(log_dir / f"server-home-{port}"))
    cmd = [sys.executable, "-m", "registry.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--db", db, "--store", store, *extra_args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    server = RunningServer(f"http://127.0.0.1:{port}", proc, log_path)
    try:
        _wait_ready(server, timeout)
        yield server
    finally:
        stop_group(proc)  # SIGTERM the process group, SIGKILL what lingers


def _wait_ready(server: RunningServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"pt2reg serve exited with {server.proc.returncode}:\n{server.log()[-3000:]}")
        try:
            with urllib.request.urlopen(server.url + "/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"pt2reg serve not ready after {timeout:.0f} s:\n{server.log()[-3000:]}")


def make_token(db: str, owner: str, scopes: Sequence[str], *, expires_at: datetime | None = None,
               env: Mapping[str, str] | None = None) -> str:
    """A token made directly in the database (as an operator with database access would);
    returns its secret."""
    from registry.store import open_metadata_store

    store = open_metadata_store(db, auto_create=db.startswith("sqlite"))
    try:
        _, secret = store.create_token(owner, list(scopes), expires_at=expires_at, actor="ci-operator",
                                       host="ci")
    finally:
        store.close()
    return secret
