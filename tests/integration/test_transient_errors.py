"""Issue 6, point 4: transient S3 failures are retried with backoff, a permanent one is one line;
a blob corrupted at rest is refused, never cached, and served again once repaired; SQLite's
"database is locked" never reaches the user.

The S3 faults come from ``FaultProxy``: a small threaded HTTP proxy on 127.0.0.1 in front of the
S3 server (moto, or SeaweedFS in the integration tier). The CLI runs with ``AWS_ENDPOINT_URL``
pointing at the proxy, which fails requests on a deterministic schedule: 503 SlowDown
(throttling), 500 InternalError, a connection closed before any answer, a connection closed
after the server did the work (the client cannot know it succeeded), and a response cut off in
the middle of its body.
"""
from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from registry.blobs.s3 import S3BlobStore
from registry.format.bundle import BundleFile
from tests.cli_inprocess import Completed
from tests.fixtures_pt2 import ROOT, run_cli
from tests.fixtures_registry import RegistryEnv

# -- the fault-injecting proxy --------------------------------------------------------------------

SLOWDOWN = "slowdown"        # 503 SlowDown: S3's throttling answer
ERROR_500 = "error500"       # 500 InternalError
DROP = "drop"                # connection closed before the request body is read; the server never saw it
DROP_AFTER = "drop-after"    # forwarded (the server did the work), then closed with no answer
TRUNCATE = "truncate"        # forwarded, then the response body is cut off half way
FAULTS = (SLOWDOWN, ERROR_500, DROP, DROP_AFTER, TRUNCATE)

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
               "upgrade", "proxy-authorization", "proxy-authenticate"}
_ERROR_XML = ('<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
              '<Message>injected by the test proxy</Message><RequestId>fault-{n}</RequestId></Error>')

Plan = Callable[[int, str, str], "str | None"]   # (request index, method, path) -> fault or None


def every(n: int, faults: tuple[str, ...] = FAULTS) -> Plan:
    """Fail every ``n``-th request, cycling through ``faults``."""
    def plan(index: int, _method: str, _path: str) -> str | None:
        return faults[(index // n) % len(faults)] if index % n == 0 else None
    return plan


def always(fault: str) -> Plan:
    return lambda _i, _m, _p: fault


class FaultProxy:
    """A threaded HTTP/1.1 proxy to ``upstream`` that injects faults according to ``plan``.

    All traffic stays on 127.0.0.1; every socket has a timeout, and ``close()`` stops the
    server and its threads, so nothing outlives the test.
    """

    def __init__(self, upstream: str, plan: Plan | None = None) -> None:
        parts = urllib.parse.urlsplit(upstream)
        assert parts.hostname == "127.0.0.1", "loopback only"
        self.upstream = (parts.hostname, parts.port)
        self.plan = plan or (lambda *_: None)
        self.injected: Counter[str] = Counter()
        self.requests = 0
        self.methods: Counter[str] = Counter()
        self._lock = threading.Lock()
        proxy = self

        class Handler(_ProxyHandler):
            owner = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def decide(self, method: str, path: str) -> str | None:
        with self._lock:
            index = self.requests
            self.requests += 1
            fault = self.plan(index, method, path)
            self.methods[method] += 1
            if fault:
                self.injected[fault] += 1
        return fault


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: FaultProxy
    timeout = 60

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        try:
            self._proxy()
        except ConnectionError:  # the client hung up (a transfer cancelled after another failed)
            self.close_connection = True

    do_PUT = do_POST = do_HEAD = do_DELETE = do_GET

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _proxy(self) -> None:
        fault = self.owner.decide(self.command, self.path)
        if fault == DROP:   # hang up on the request before reading its body (a reset mid-upload)
            self._hang_up()
            return
        body = self._read_body()
        if fault in (SLOWDOWN, ERROR_500):
            status, code = (503, "SlowDown") if fault == SLOWDOWN else (500, "InternalError")
            payload = b"" if self.command == "HEAD" else \
                _ERROR_XML.format(code=code, n=self.owner.requests).encode()
            self.send_response_only(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        status, reason, headers, upstream_body = self._forward(body)
        if fault == DROP_AFTER or (fault == TRUNCATE and (self.command == "HEAD" or len(upstream_body) < 2)):
            self._hang_up()
            return
        self.send_response_only(status, reason)
        for key, value in headers:
            if key.lower() not in _HOP_BY_HOP and key.lower() != "content-length":
                self.send_header(key, value)
        length = int(dict((k.lower(), v) for k, v in headers).get("content-length", len(upstream_body)))
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if self.command == "HEAD":
            return
        if fault == TRUNCATE:
            self.wfile.write(upstream_body[: len(upstream_body) // 2])
            self.wfile.flush()
            self._hang_up()
            return
        self.wfile.write(upstream_body)

    def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self.owner.upstream, timeout=60)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for key, value in self.headers.items():
                if key.lower() not in _HOP_BY_HOP and key.lower() != "content-length":
                    conn.putheader(key, value)
            if body or self.command in ("PUT", "POST"):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body or None)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.reason, resp.getheaders(), data
        finally:
            conn.close()

    def _hang_up(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)


def first_of(method: str, query: str, fault: str, then: Plan) -> Plan:
    """``fault`` for the first ``method`` request whose URL contains ``query``; ``then`` after."""
    fired = threading.Event()

    def plan(index: int, m: str, path: str) -> str | None:
        if m == method and query in path and not fired.is_set():
            fired.set()
            return fault
        return then(index, m, path)
    return plan


# -- fixtures and helpers -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mid_bundles(tmp_path_factory: pytest.TempPathFactory):
    """Small chunked bundles (~5 MiB, 7 stored blobs each), built on demand."""
    from tests.big_bundle import BigBundles

    return BigBundles(tmp_path_factory.mktemp("mid"), hidden=64, small=1)


@pytest.fixture(scope="module")
def multipart_bundle(big_bundles) -> Path:
    """A ~107 MiB bundle whose largest blob (66 MiB) S3 uploads in multipart parts."""
    return big_bundles.make(1000)


def _through(reg: RegistryEnv, proxy: FaultProxy, *args: str, home: Path | None = None,
             extra: dict[str, str] | None = None) -> Completed:
    """Run the CLI (in this process) with S3 traffic going through ``proxy``."""
    return run_cli(*args, env={**reg.cli_env(home), "AWS_ENDPOINT_URL": proxy.endpoint, **(extra or {})})


def _one_error_line(r: Completed) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def _leftover_files(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*")
            if p.is_file() and (".incomplete" in p.name or p.name.endswith(".tmp"))]


s3_envs = pytest.mark.parametrize("reg_env", ["moto", pytest.param("team", marks=pytest.mark.integration)],
                                  indirect=True)


# -- transient S3 faults ----------------------------------------------------------------------------

@pytest.mark.slow
@s3_envs
def test_transient_s3_faults_are_retried(reg_env: RegistryEnv, multipart_bundle: Path, tmp_path: Path):
    """Throttling, 5xx, dropped connections and cut-off bodies on a third of all requests
    (and on the multipart create/complete and a download in particular): push and pull still
    succeed, byte for byte."""
    plan = first_of("POST", "?uploads", DROP_AFTER,               # CreateMultipartUpload
                    first_of("POST", "uploadId=", DROP_AFTER,       # CompleteMultipartUpload
                             first_of("GET", "/", TRUNCATE, every(3))))
    digest = BundleFile.open(multipart_bundle).digest
    with FaultProxy(reg_env.env["AWS_ENDPOINT_URL"], plan) as proxy:
        started = time.monotonic()
        r = _through(reg_env, proxy, "push", str(multipart_bundle), "--name", "flaky")
        pushed_in = time.monotonic() - started
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["flaky@1", digest]
        assert "error" not in r.stderr
        push_faults = dict(proxy.injected)
        assert set(push_faults) == set(FAULTS), push_faults
        assert proxy.methods["POST"] >= 2            # the big blob went up in parts
        requests = proxy.requests
    # the pull makes fewer requests (a dozen GETs: the small chunks come in one ranged read of
    # their pack): every second one fails, so each kind of fault still lands at least once
    with FaultProxy(reg_env.env["AWS_ENDPOINT_URL"], first_of("GET", "/", TRUNCATE, every(2))) as proxy:
        out = tmp_path / "pulled.pt2b"
        started = time.monotonic()
        r = _through(reg_env, proxy, "pull", "flaky@1", "-o", str(out))
        pulled_in = time.monotonic() - started
        assert r.returncode == 0, r.stderr
        pull_faults = dict(proxy.injected)
        assert all(pull_faults.get(f, 0) >= 1 for f in FAULTS), pull_faults
        requests += proxy.requests
    assert out.read_bytes() == multipart_bundle.read_bytes()
    print(f"\n[{reg_env.kind}] push {pushed_in:.1f}s with faults {push_faults}; pull {pulled_in:.1f}s "
          f"with faults {pull_faults}; {requests} requests in all")


def _assert_bounded_attempts(requests: int, attempts: int = 3) -> None:
    """The blob that gave up was tried ``attempts`` times, and no more requests were made than
    ``attempts`` for each blob transferred at once: once one gives up, no other blob starts
    (those in flight are cancelled, possibly before their last attempt)."""
    parallel = S3BlobStore("s3://bucket")._max_concurrency
    assert attempts <= requests <= attempts * parallel, requests


@s3_envs
@pytest.mark.parametrize("fault", [SLOWDOWN, DROP])
def test_permanent_s3_failure_is_one_clear_line(reg_env: RegistryEnv, mid_bundles, tmp_path: Path,
                                                fault: str):
    """A store that never recovers: a bounded number of attempts, then exit 1 with one line,
    no version recorded and no output file or partial download left anywhere."""
    bundle = mid_bundles.make(1)
    assert reg_env.cli("push", str(bundle), "--name", "ok").returncode == 0   # direct, no proxy
    attempts = {"AWS_MAX_ATTEMPTS": "3"}   # the user's standard AWS setting is honoured
    with FaultProxy(reg_env.env["AWS_ENDPOINT_URL"], always(fault)) as proxy:
        r = _through(reg_env, proxy, "push", str(mid_bundles.make(2)), "--name", "down", extra=attempts)
        assert r.returncode == 1, r.stderr
        line = _one_error_line(r)
        assert "S3" in line and proxy.endpoint in line, line
        _assert_bounded_attempts(proxy.requests)  # it gives up: counted in requests, not timed

        home = tmp_path / "home"
        out = tmp_path / "out" / "x.pt2b"
        out.parent.mkdir()
        before = proxy.requests
        r = _through(reg_env, proxy, "pull", "ok@1", "-o", str(out), home=home, extra=attempts)
        assert r.returncode == 1, r.stderr
        line = _one_error_line(r)
        assert "S3" in line, line
        _assert_bounded_attempts(proxy.requests - before)
    assert not out.exists() and not list(out.parent.iterdir())
    assert not _leftover_files(home)
    assert not [p for p in home.rglob("*") if p.is_file() and "cache" in p.parts]   # nothing cached
    r = reg_env.cli("show", "down")
    assert r.returncode == 3, r.stderr          # nothing was published
    print(f"\n[{reg_env.kind}/{fault}] gave up: {line}")


# -- blobs corrupted at rest ----------------------------------------------------------------------

def _read_blob(reg: RegistryEnv, digest: str) -> bytes:
    loc = reg.blob_location(digest)
    if isinstance(loc, Path):
        return loc.read_bytes()
    return reg.s3_client().get_object(Bucket=loc[0], Key=loc[1])["Body"].read()


def _write_blob(reg: RegistryEnv, digest: str, data: bytes) -> None:
    loc = reg.blob_location(digest)
    if isinstance(loc, Path):
        os.chmod(loc, 0o644)
        loc.write_bytes(data)
        os.chmod(loc, 0o444)
    else:
        reg.s3_client().put_object(Bucket=loc[0], Key=loc[1], Body=data)


@pytest.mark.slow
def test_corrupt_blob_is_never_cached_or_served_and_recovers(reg_env: RegistryEnv, bundles, mid_bundles,
                                                             tmp_path: Path):
    """A whole-member blob and a weight chunk, each corrupted in the store: every pull (by
    number and by digest, again and again, with one home) fails with exit 5 and caches
    nothing of it; once the blob is repaired in the store the same home pulls fine."""
    chunked = mid_bundles.make(7)
    cases = []
    for name, path in (("whole", bundles["ed"]), ("chunked", chunked)):
        bundle = BundleFile.open(path)
        r = reg_env.cli("push", str(path), "--name", f"rot/{name}", "--json")
        assert r.returncode == 0, r.stderr
        member = max(bundle.manifest.members, key=lambda m: m.size)
        if name == "chunked":
            assert member.chunks
            sha, _size = max(member.chunks, key=lambda c: c[1])
            target = "sha256:" + sha
        else:
            assert not member.chunks
            target = member.digest
        cases.append((name, path, bundle, target, member.digest))

    home = tmp_path / "home"
    for name, path, bundle, target, member in cases:
        original = _read_blob(reg_env, target)
        reg_env.corrupt_blob(target)
        out = tmp_path / f"{name}.pt2b"
        for ref in (f"rot/{name}@1", f"rot/{name}@{bundle.digest}", f"rot/{name}@1"):
            r = reg_env.cli("pull", ref, "-o", str(out), home=home)
            assert r.returncode == 5, (ref, r.stderr)
            line = _one_error_line(r)
            assert "corrupt" in line and target[7:19] in line, line
            assert not out.exists()
            cached = [p for p in home.rglob("*") if p.is_file() and "cache" in p.parts]
            hit = [p for p in cached if any(d[7:] in p.name for d in (target, member, bundle.digest))]
            assert not hit, hit
            assert not _leftover_files(home)
        r = reg_env.cli("verify", f"rot/{name}@1", home=home)
        assert r.returncode == 5, r.stderr                           # never served to a loader either

        _write_blob(reg_env, target, original)                       # repaired in the store
        r = reg_env.cli("pull", f"rot/{name}@1", "-o", str(out), home=home)
        assert r.returncode == 0, r.stderr
        assert out.read_bytes() == path.read_bytes()


# -- SQLite under concurrency -----------------------------------------------------------------------

WORKERS = 8


def _session(i: int, bundle: str, outdir: str) -> None:
    """One user's session, run in a process of its own (``_worker``), its commands one after
    the other in that process: push, alias, pull, race the others for one alias, yank, list.
    Prints ``[[argv, exit code, stderr], ...]`` as JSON."""
    from tests.cli_inprocess import run_in_process

    results = []

    def cli(*argv: str):
        r = run_in_process(*argv)
        results.append((list(argv), r.returncode, r.stderr))
        return r

    r = cli("push", bundle, "--name", "conc/model", "--alias", f"w{i}", "--json")
    number = json.loads(r.stdout)["version"] if r.returncode == 0 else 0
    cli("pull", f"conc/model@w{i}", "-o", f"{outdir}/w{i}.pt2b")
    cli("alias", "set", "conc/model", "shared", str(number))        # all of them race on one alias
    cli("yank", f"conc/model@{number}", "--reason", f"worker {i} yanks")
    cli("list", "conc/model", "--json")
    print(json.dumps(results))


def _worker(args: tuple[int, dict[str, str], str, str]) -> list[tuple[list[str], int, str]]:
    """One process running ``_session``: the processes of all workers run at once."""
    i, env, bundle, outdir = args
    code = f"from tests.integration.test_transient_errors import _session; _session({i}, {bundle!r}, {outdir!r})"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return [tuple(result) for result in json.loads(r.stdout)]


@pytest.mark.slow
@pytest.mark.parametrize("reg_env", ["local"], indirect=True)
def test_sqlite_locked_is_retried_never_shown(reg_env: RegistryEnv, mid_bundles, tmp_path: Path):
    """Eight processes push, pull, alias, yank and list against one fresh SQLite file at once
    (the first of them create it): every command succeeds and none mentions a locked or busy
    database."""
    paths = [str(mid_bundles.make(100 + i)) for i in range(WORKERS)]
    env = {**os.environ, **reg_env.env, "PT2REG_HOME": str(reg_env.home), "PT2REG_DB": reg_env.db,
           "PT2REG_STORE": reg_env.store, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    with ThreadPoolExecutor(WORKERS) as pool:
        sessions = list(pool.map(_worker, [(i, env, paths[i], str(tmp_path)) for i in range(WORKERS)]))
    elapsed = time.monotonic() - started
    for results in sessions:
        for argv, code, err in results:
            assert code == 0, (argv, err)
            words = ("locked", "busy", "sqlite", "traceback")
            assert not any(word in err.lower() for word in words), (argv, err)
    listing = json.loads(reg_env.cli("list", "conc/model", "--json").stdout)
    assert sorted(v["version"] for v in listing["versions"]) == list(range(1, WORKERS + 1))
    assert all(v["status"] == "yanked" for v in listing["versions"])
    assert reg_env.cli("audit", "--verify").returncode == 0
    print(f"\n{WORKERS} workers x {len(sessions[0])} commands in {elapsed:.1f}s")
