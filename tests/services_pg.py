"""A real PostgreSQL server for the integration tier.

A pytest plugin (``-p tests.services_pg``); the server also runs outside pytest::

    with postgres_server() as pg:
        url = pg.new_database()      # postgresql+psycopg://postgres@127.0.0.1:PORT/test_...

Fixtures:
    pg_url      session: one PostgreSQL (Debian's 15) on a free loopback port, in a temp dir
                removed at the end, shared by the run's xdist workers (``tests.shared``);
                yields the URL of its ``postgres`` database. Fails (never skips) when
                ``initdb`` is missing.
    pg_db_url   function: a fresh database per test, dropped afterwards.

PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` user in a
directory it owns (see ENVIRONMENT.md). It runs with fsync off: a test server, not a store.
"""
from __future__ import annotations

import contextlib
import glob
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.shared import shared_service
from tests.until import HANG_GUARD_S

__all__ = ["PostgresServer", "postgres_server", "find_pg_bin", "pg_server", "pg_url", "pg_db_url"]

#: a hang guard, never a speed limit: start-up takes seconds on an idle machine
READY_TIMEOUT = HANG_GUARD_S
PG_USER = "postgres"


@dataclass
class PostgresServer:
    """A running server: its admin URL (SQLAlchemy form) and how to make databases on it."""

    port: int
    url: str
    log_path: Path
    startup_seconds: float = 0.0

    def _admin(self):
        import psycopg

        return psycopg.connect(host="127.0.0.1", port=self.port, user=PG_USER,
                               dbname="postgres", autocommit=True)

    def new_database(self) -> str:
        """Create an empty database; returns its SQLAlchemy URL."""
        name = f"test_{uuid.uuid4().hex[:16]}"
        with self._admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url.rsplit("/", 1)[0] + "/" + name

    def drop_database(self, url: str) -> None:
        """Drop a database made by :meth:`new_database`, closing leftover sessions."""
        name = url.rsplit("/", 1)[1]
        with self._admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def find_pg_bin() -> Path:
    """Directory holding ``initdb`` and ``pg_ctl``; RuntimeError if PostgreSQL is not installed."""
    candidates = [os.environ.get("PT2REG_PG_BIN", ""), "/usr/lib/postgresql/15/bin",
                  *sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    which = shutil.which("initdb")
    if which:
        candidates.append(str(Path(which).parent))
    for candidate in filter(None, candidates):
        if (Path(candidate) / "initdb").is_file() and (Path(candidate) / "pg_ctl").is_file():
            return Path(candidate)
    raise RuntimeError("PostgreSQL `initdb` not found (looked in /usr/lib/postgresql/*/bin and "
                       "PATH); install it with `apt-get install -y postgresql`")


def _as_postgres(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["su", PG_USER, "-s", "/bin/sh", "-c", shlex.join(cmd)]


def _run(cmd: list[str], what: str) -> None:
    done = subprocess.run(_as_postgres(cmd), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}): {done.stderr or done.stdout}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def postgres_server(*, timeout: float = READY_TIMEOUT) -> Iterator[PostgresServer]:
    """initdb + pg_ctl start on a free loopback port until the block ends."""
    bindir = find_pg_bin()
    workdir = Path(tempfile.mkdtemp(prefix="pt2reg-pg-"))
    data, log_path = workdir / "data", workdir / "server.log"
    if os.geteuid() == 0:
        shutil.chown(workdir, user=PG_USER)
    started = time.monotonic()
    try:
        _run([str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", PG_USER,
              "-E", "UTF8", "--locale=C", "--no-sync"], "initdb")
        port = _start(bindir, data, log_path, workdir, timeout)
        server = PostgresServer(port=port, log_path=log_path,
                                url=f"postgresql+psycopg://{PG_USER}@127.0.0.1:{port}/postgres")
        _wait_ready(server, log_path, timeout)
        server.startup_seconds = time.monotonic() - started
        yield server
    finally:
        if (data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError):
                _run([str(bindir / "pg_ctl"), "-D", str(data), "stop", "-m", "fast", "-w"],
                     "pg_ctl stop")
        shutil.rmtree(workdir, ignore_errors=True)


def _start(bindir: Path, data: Path, log_path: Path, sockdir: Path, timeout: float) -> int:
    """Start on a free port, retrying if another process grabbed the port meanwhile."""
    error: RuntimeError | None = None
    for _ in range(3):
        port = _free_port()
        options = (f"-p {port} -k {sockdir} -c listen_addresses=127.0.0.1 -c fsync=off "
                   f"-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        try:
            _run([str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log_path), "-o", options,
                  "-w", "-t", str(int(timeout)), "start"], "pg_ctl start")
            return port
        except RuntimeError as exc:
            error = RuntimeError(f"{exc}\nserver log tail:\n{_tail(log_path)}")
    raise error  # type: ignore[misc]


def _wait_ready(server: PostgresServer, log_path: Path, timeout: float) -> None:
    import psycopg

    deadline = time.monotonic() + timeout
    while True:
        try:
            with server._admin() as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.OperationalError as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL on port {server.port} not ready: {exc}\n"
                                   f"log tail:\n{_tail(log_path)}") from exc
            time.sleep(0.2)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _load(doc: dict) -> PostgresServer:
    return PostgresServer(port=doc["port"], url=doc["url"], log_path=Path(doc["log_path"]),
                          startup_seconds=doc["startup_seconds"])


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    """The run's PostgreSQL server, one for all the xdist workers (``tests.shared``)."""
    try:
        yield from shared_service(tmp_path_factory, "postgres", "tests.services_pg:postgres_server", _load)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def pg_url(pg_server: PostgresServer) -> str:
    """``postgresql+psycopg://postgres@127.0.0.1:PORT/postgres`` of a real PostgreSQL."""
    return pg_server.url


@pytest.fixture
def pg_db_url(pg_server: PostgresServer) -> Iterator[str]:
    """A fresh, empty database for one test (dropped afterwards, connections or not)."""
    url = pg_server.new_database()
    try:
        yield url
    finally:
        pg_server.drop_database(url)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh metadata database URL, once per backend: an SQLite file, and a PostgreSQL
    database on the shared server (the integration tier)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry.db'}"
    return request.getfixturevalue("pg_db_url")


@pytest.fixture
def sql_store(db_url: str):
    """A ``SqlMetadataStore`` at head on ``db_url``, closed after the test."""
    from registry.store import open_metadata_store

    with open_metadata_store(db_url, auto_create=True) as store:
        yield store
