"""A real OCI registry for the tests: the CNCF distribution server (Debian's ``docker-registry``),
on a free loopback port, its storage a directory the tests may read (and damage, to play a
registry that serves altered content). One per run, shared by the xdist workers
(``tests.shared``); each test pushes to repositories of its own.

``skopeo`` (Debian) is the independent OCI client the interop tests drive.
"""
from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.shared import shared_service

__all__ = ["OciRegistry", "oci_registry", "oci_registry_server", "registry_binary"]

#: a registry that has not answered /v2/ by then is reported with its log (a loaded machine
#: may take long to start a process; nothing here depends on how fast it is)
START_TIMEOUT = 300.0


@dataclass(frozen=True)
class OciRegistry:
    host: str            # 127.0.0.1:PORT
    root: str            # the filesystem driver's root directory
    log_path: str

    def blob_path(self, digest: str) -> Path:
        hex_ = digest.split(":", 1)[1]
        return Path(self.root) / "docker/registry/v2/blobs/sha256" / hex_[:2] / hex_ / "data"


def registry_binary() -> str:
    found = shutil.which("docker-registry") or shutil.which("registry")
    if found is None:
        raise RuntimeError("the OCI registry server is missing: apt-get install docker-registry "
                           "(scripts/test.sh installs it)")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def oci_registry_server() -> Iterator[OciRegistry]:
    """``docker-registry serve`` with the filesystem driver and deletes on, until the block ends."""
    binary = registry_binary()
    workdir = Path(tempfile.mkdtemp(prefix="pt2reg-oci-"))
    port = _free_port()
    config = workdir / "config.yml"
    config.write_text(f"""version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {workdir / 'data'}
  delete:
    enabled: true
  cache:
    blobdescriptor: ""
http:
  addr: 127.0.0.1:{port}
""")
    log_path = workdir / "registry.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"docker-registry did not start (exit {proc.poll()}):\n"
                                   + log_path.read_text(errors="replace")[-3000:])
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        yield OciRegistry(host=f"127.0.0.1:{port}", root=str(workdir / "data"), log_path=str(log_path))
    finally:
        from tests.services_s3 import stop_group

        stop_group(proc)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def oci_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OciRegistry]:
    """The run's OCI registry (see the module)."""
    try:
        yield from shared_service(tmp_path_factory, "oci-registry", "tests.services_oci:oci_registry_server",
                                  lambda doc: OciRegistry(**doc))
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
