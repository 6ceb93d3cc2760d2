"""The remote client (``registry.remote``) against a scripted server (``httpx.MockTransport``):
error bodies become the same ``RegistryError`` and exit code, retries, the token only ever
sent to the server's own origin, the login file's mode, and blob transfers that verify, resume
and refuse wrong bytes."""
from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from registry import errors
from registry.blobs.base import Part
from registry.config import Settings
from registry.errors import (
    AccessDeniedError,
    IntegrityError,
    NotAuthenticatedError,
    NotFoundError,
    StoreError,
    UsageError,
)
from registry.remote.blobs import HttpBlobStore
from registry.remote.credentials import load_logins, remove_login, save_login, token_and_source
from registry.remote.http import ATTEMPTS, HttpClient, error_from_body
from registry.remote.meta import HttpMetadataStore
from tests.cli_inprocess import run_in_process
from tests.store_calls import publish

BASE = "http://registry.test:8710"
TOKEN = "pt2r_" + "s" * 43
BUCKET = "https://bucket.s3.test"


def resolve_token(settings: Settings) -> str | None:
    """The token for ``settings.url`` (was ``registry.remote.credentials.resolve_token``, used by
    no caller in the package): ``token_and_source`` without its source."""
    return token_and_source(settings)[0]


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def client_for(handler, **kwargs) -> HttpClient:
    return HttpClient(BASE, TOKEN, transport=httpx.MockTransport(handler), sleep=lambda s: None, **kwargs)


def error_answer(status: int, type_: str, exit_code: int, message: str, *, hint=None, scope=None) -> httpx.Response:
    return httpx.Response(status, json={"error": {"type": type_, "exit_code": exit_code, "message": message,
                                                  "hint": hint, "scope": scope}})


# -- errors --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(n for n in errors.__all__ if isinstance(getattr(errors, n), type)
                                        and issubclass(getattr(errors, n), errors.RegistryError)))
def test_every_error_class_comes_back_as_itself_with_its_exit_code_and_line(name):
    cls = getattr(errors, name)
    exc = error_from_body(400, {"error": {"type": name, "exit_code": cls.exit_code, "message": "it broke",
                                          "hint": "do this", "scope": "model:a:push"}}, BASE)
    assert type(exc) is cls and exc.exit_code == cls.exit_code
    assert exc.message == "it broke" and "it broke" in exc.one_line()
    if issubclass(cls, AccessDeniedError):
        assert exc.scope == "model:a:push" and exc.one_line() == "it broke; do this"


def test_an_unknown_type_is_rebuilt_by_its_exit_code_and_junk_is_a_store_error():
    assert type(error_from_body(409, {"error": {"type": "Weird", "exit_code": 6, "message": "m"}}, BASE)) \
        is errors.ConflictError
    assert type(error_from_body(401, {"error": {"type": "os.system", "exit_code": 7, "message": "m"}}, BASE)) \
        is NotAuthenticatedError
    assert type(error_from_body(403, {"error": {"type": "Exception", "exit_code": 7, "message": "m"}}, BASE)) \
        is AccessDeniedError
    junk = error_from_body(502, "<html>bad gateway</html>", BASE)
    assert type(junk) is StoreError and "HTTP 502" in junk.one_line()
    assert type(error_from_body(401, None, BASE)) is NotAuthenticatedError


def test_a_store_method_raises_what_the_server_said():
    def handler(request):
        if request.url.path == "/v1/resolve":
            return error_answer(404, "NotFoundError", 3, "model 'team/x' not found", hint="list models")
        return error_answer(403, "AccessDeniedError", 7, "token 'ci' (id 3) lacks scope model:team/x:yank",
                            scope="model:team/x:yank")

    from registry.refs import Ref

    meta = HttpMetadataStore(client_for(handler))
    with pytest.raises(NotFoundError, match="team/x"):
        meta.resolve(Ref.parse("team/x"))
    with pytest.raises(AccessDeniedError) as caught:
        meta.set_status("team/x", 1, "yanked", "bad", actor="me", host="h")
    assert caught.value.exit_code == 7 and caught.value.scope == "model:team/x:yank"


# -- retries and reachability ----------------------------------------------------------------------

def test_a_refused_connection_is_retried_then_succeeds():
    calls = []

    def handler(request):
        calls.append(request.method)
        if len(calls) < 3:
            raise httpx.ConnectError("connection refused")
        return httpx.Response(200, json={"models": []})

    assert HttpMetadataStore(client_for(handler)).list_models() == []
    assert calls == ["GET"] * 3


def test_503_is_retried_for_reads_but_a_publish_is_sent_once():
    calls = []

    def handler(request):
        calls.append(request.url.path)
        return httpx.Response(503, json={"error": {"type": "StoreError", "exit_code": 1,
                                                   "message": "database unavailable"}})

    meta = HttpMetadataStore(client_for(handler))
    with pytest.raises(StoreError, match="database unavailable"):
        meta.list_models()
    assert calls == ["/v1/models"] * ATTEMPTS
    calls.clear()
    with pytest.raises(StoreError):
        publish(meta, "a", "sha256:" + "0" * 64, "{}", 1, [], actor="x", host="h")
    assert calls == ["/v1/publish"]


def test_an_unreachable_server_is_one_line_naming_the_url_and_the_setting_never_the_token():
    def handler(request):
        raise httpx.ConnectError("[Errno 111] Connection refused")

    with pytest.raises(StoreError) as caught:
        HttpMetadataStore(client_for(handler)).list_models()
    line = caught.value.one_line()
    assert line.startswith(f"cannot reach the registry at {BASE}: ") and "PT2REG_URL / --registry" in line
    assert TOKEN not in line and "\n" not in line and caught.value.exit_code == 1


def test_the_cli_against_a_closed_port_prints_one_line_and_exits_1(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once it is closed
    r = run_in_process("list", env={"PT2REG_HOME": str(tmp_path), "PT2REG_URL": f"http://127.0.0.1:{port}",
                                    "PT2REG_TOKEN": TOKEN, "PT2REG_DB": None, "PT2REG_STORE": None})
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot reach the registry at http://127.0.0.1:{port}")
    assert TOKEN not in r.stderr and not (tmp_path / "registry.db").exists()


# -- the token goes to the server's own origin only ------------------------------------------------

def test_the_token_goes_to_the_server_only_never_to_a_presigned_url_or_a_redirect_elsewhere():
    seen: dict[str, str | None] = {}
    blob = b"hello blob"
    digest = digest_of(blob)

    def handler(request):
        seen[f"{request.url.host}{request.url.path}"] = request.headers.get("authorization")
        if request.url.path == "/v1/blobs/download":
            return httpx.Response(200, json={"urls": {digest: {"url": f"{BASE}/v1/blobs/{digest}",
                                                               "size": len(blob), "headers": {}}}})
        if request.url.host == "registry.test":  # the server redirects to the bucket
            return httpx.Response(307, headers={"location": f"{BUCKET}/o?X-Amz-Signature=abc"})
        return httpx.Response(200, content=blob)

    store = HttpBlobStore(client_for(handler))
    assert store.read_bytes(digest, max_size=100) == blob
    assert seen["registry.test/v1/blobs/download"] == f"Bearer {TOKEN}"
    assert seen[f"registry.test/v1/blobs/{digest}"] == f"Bearer {TOKEN}"
    assert seen["bucket.s3.test/o"] is None


def test_upload_headers_from_the_server_are_sent_but_an_authorization_among_them_is_not():
    data = b"x" * 1000
    digest = digest_of(data)
    got = {}

    def handler(request):
        if request.url.path == "/v1/blobs/upload":
            return httpx.Response(200, json={"present": [], "missing": [{
                "digest": digest, "size": len(data), "url": f"{BUCKET}/k?sig=1", "method": "PUT",
                "headers": {"x-amz-checksum-sha256": "abc", "Authorization": "Bearer stolen"}}]})
        got.update(headers=dict(request.headers), body=request.read())
        return httpx.Response(200)

    assert HttpBlobStore(client_for(handler)).put_bytes(data, digest) is True
    assert got["body"] == data and got["headers"]["x-amz-checksum-sha256"] == "abc"
    assert "authorization" not in got["headers"] and got["headers"]["content-length"] == "1000"


# -- the login file ------------------------------------------------------------------------------

def test_login_file_is_0600_and_refused_when_others_may_read_it(tmp_path):
    home = tmp_path / "home"
    path = save_login(home, BASE + "/", TOKEN, owner="ci", token_id=3)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_logins(home)[BASE]["token"] == TOKEN
    settings = Settings.resolve(home=str(home), env={"PT2REG_URL": BASE})
    assert resolve_token(settings) == TOKEN
    os.chmod(path, 0o644)
    with pytest.raises(UsageError) as caught:
        resolve_token(settings)
    assert f"chmod 600 {path}" in caught.value.one_line() and TOKEN not in caught.value.one_line()
    os.chmod(path, 0o600)
    assert remove_login(home, BASE) == [BASE] and resolve_token(settings) is None


def test_token_precedence_env_then_token_file_then_login(tmp_path):
    home = tmp_path / "home"
    save_login(home, BASE, TOKEN, owner="ci", token_id=3)
    token_file = tmp_path / "t"
    token_file.write_text("pt2r_" + "f" * 43 + "\n")
    env = {"PT2REG_URL": BASE, "PT2REG_TOKEN": "pt2r_" + "e" * 43}
    assert resolve_token(Settings.resolve(home=str(home), env=env, token_file=str(token_file))) == env["PT2REG_TOKEN"]
    assert resolve_token(Settings.resolve(home=str(home), env={"PT2REG_URL": BASE},
                                          token_file=str(token_file))) == "pt2r_" + "f" * 43
    assert "PT2REG_TOKEN" not in repr(Settings.resolve(home=str(home), env=env)) and \
        env["PT2REG_TOKEN"] not in repr(Settings.resolve(home=str(home), env=env))


def test_registry_with_db_or_store_is_a_usage_error_and_db_upgrade_refuses_remotely(tmp_path):
    env = {"PT2REG_HOME": str(tmp_path), "PT2REG_URL": None, "PT2REG_DB": None, "PT2REG_STORE": None}
    r = run_in_process("--registry", BASE, "--db", f"sqlite:///{tmp_path}/x.db", "list", env=env)
    assert r.returncode == 2 and "--registry cannot be combined with --db or --store" in r.stderr
    r = run_in_process("db", "upgrade", env={**env, "PT2REG_URL": BASE, "PT2REG_TOKEN": TOKEN})
    assert r.returncode == 2 and "pt2reg db upgrade" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run_in_process("--registry", "ftp://x", "list", env=env)
    assert r.returncode == 2 and "invalid registry URL" in r.stderr


# -- blob transfers ------------------------------------------------------------------------------

class _BucketHandler(BaseHTTPRequestHandler):
    """One GET to the stand-in bucket: ``server.answer(headers)`` gives (status, headers, body,
    bytes sent before the connection drops or None)."""

    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.server.seen.append((self.path, dict(self.headers)))
        status, headers, body, cut = self.server.answer(self.path, self.headers)
        self.send_response(status)
        for k, v in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body if cut is None else body[:cut])
        self.close_connection = cut is not None

    def log_message(self, *args):
        pass


@pytest.fixture
def bucket():
    """A real HTTP server standing in for S3: presigned URLs are read with urllib3, not httpx."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _BucketHandler)
    server.seen, server.url = [], f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _serving(blob: bytes, bucket, *, break_at: int | None = None, lie: bool = False, extra: bytes = b""):
    """A server handing out a ``bucket`` URL for ``blob`` (with an ``Authorization`` among its
    headers, which must never reach the bucket); the first GET breaks after ``break_at`` bytes;
    ``lie`` serves other bytes of the same size, ``extra`` more bytes. Returns each GET's Range."""
    digest = digest_of(blob)

    def handler(request):
        assert request.url.path == "/v1/blobs/download"
        return httpx.Response(200, json={"urls": {digest: {"url": f"{bucket.url}/blob?sig=1", "size": len(blob),
                                                           "headers": {"Authorization": "Bearer stolen"}}}})

    def answer(path, headers):
        body = (bytes(len(blob)) if lie else blob) + extra
        if len(bucket.seen) == 1 and break_at is not None:
            return 200, {}, body, break_at
        if headers.get("range"):
            start = int(headers["range"].split("=")[1].split("-")[0])
            return 206, {"Content-Range": f"bytes {start}-{len(blob) - 1}/{len(blob)}"}, body[start:], None
        return 200, {}, body, None

    bucket.answer = answer

    def ranges():
        assert all("authorization" not in {k.lower() for k in h} for _, h in bucket.seen)
        return [h.get("Range") for _, h in bucket.seen]

    return digest, ranges, handler


def test_a_broken_download_resumes_from_the_next_byte_and_verifies(tmp_path, bucket):
    blob = os.urandom(3 * 1024 * 1024 + 17)
    digest, ranges, handler = _serving(blob, bucket, break_at=1024 * 1024 + 5)
    store = HttpBlobStore(client_for(handler))
    out = tmp_path / "blob"
    store.get_file(digest, out)
    assert out.read_bytes() == blob
    assert ranges() == [None, f"bytes={1024 * 1024 + 5}-{len(blob) - 1}"]


def test_get_parts_writes_each_blob_at_its_offset_after_a_break(tmp_path, bucket):
    blob = os.urandom(200_000)
    digest, ranges, handler = _serving(blob, bucket, break_at=70_000)
    store = HttpBlobStore(client_for(handler))
    done = []
    with open(tmp_path / "f", "wb+") as fp:
        store.get_parts(fp.fileno(), [Part(digest, 10, len(blob))], on_done=done.append)
        fp.seek(10)
        assert fp.read() == blob
    assert done == [0] and ranges()[1] == f"bytes=70000-{len(blob) - 1}"


def test_wrong_bytes_from_the_store_are_an_integrity_error_and_leave_no_file(tmp_path, bucket):
    digest, _ranges, handler = _serving(b"the real content", bucket, lie=True)
    store = HttpBlobStore(client_for(handler))
    with pytest.raises(IntegrityError, match=digest):
        store.get_file(digest, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_more_bytes_than_the_blob_has_are_an_integrity_error(tmp_path, bucket):
    digest, _ranges, handler = _serving(b"the real content", bucket, extra=b"!")
    with pytest.raises(IntegrityError, match="larger than the 16 bytes expected"):
        HttpBlobStore(client_for(handler)).get_file(digest, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_push_uploads_the_missing_ranges_hashes_the_present_ones_and_refuses_a_damaged_file(tmp_path):
    a, b = os.urandom(300_000), os.urandom(5000)
    bundle = tmp_path / "bundle"
    bundle.write_bytes(a + b)
    parts = [Part(digest_of(a), 0, len(a)), Part(digest_of(b), len(a), len(b))]
    received: dict[str, bytes] = {}

    def handler(request):
        if request.url.path == "/v1/blobs/upload":
            asked = json.loads(request.read())["blobs"]
            assert asked == [{"digest": p.digest, "size": p.size} for p in parts]
            return httpx.Response(200, json={"present": [parts[1].digest], "missing": [{
                "digest": parts[0].digest, "size": len(a), "url": f"{BASE}/v1/blobs/{parts[0].digest}",
                "method": "PUT", "headers": {}}]})
        assert request.headers["authorization"] == f"Bearer {TOKEN}"
        received[request.url.path] = request.read()
        return httpx.Response(200, json={"stored": True})

    store = HttpBlobStore(client_for(handler))
    seen = []
    assert store.put_parts(bundle, parts, progress=seen.append) == (len(a), len(b))
    assert received == {f"/v1/blobs/{parts[0].digest}": a} and sum(seen) == len(a) + len(b)

    received.clear()
    bundle.write_bytes(a[:-1] + bytes([a[-1] ^ 1]) + b)  # the chunk to upload is damaged: its last piece never leaves
    with pytest.raises(IntegrityError, match="does not match its digest"):
        store.put_parts(bundle, parts)
    assert all(len(body) < len(a) for body in received.values())
    bundle.write_bytes(a + b[:-1] + bytes([b[-1] ^ 1]))  # the stored chunk's range is damaged: still refused
    with pytest.raises(IntegrityError, match="does not match its digest"):
        store.put_parts(bundle, parts)


def test_gc_methods_say_gc_runs_on_the_server():
    store = HttpBlobStore(client_for(lambda r: httpx.Response(500)))
    for call in (lambda: store.delete("sha256:" + "0" * 64), lambda: list(store.list()),
                 lambda: store.abort_stale_uploads()):
        with pytest.raises(UsageError, match="gc runs on the server"):
            call()


def test_a_token_that_cannot_be_a_header_is_a_usage_error_that_does_not_echo_it():
    with pytest.raises(UsageError) as caught:
        HttpClient(BASE, "pt2r_séc\u00e9ret")
    assert "séc" not in caught.value.one_line()


@pytest.mark.parametrize("proxied", [False, True], ids=["urllib3", "httpx-behind-a-proxy"])
def test_an_expired_presigned_url_is_asked_for_afresh(tmp_path, bucket, monkeypatch, proxied):
    blob = os.urandom(10_000)
    digest = digest_of(blob)
    handed: list[str] = []
    if proxied:  # behind a proxy presigned GETs stay on httpx (here the scripted transport)
        monkeypatch.setenv("HTTPS_PROXY", "http://proxy.test:3128")
    where = BUCKET if proxied else bucket.url

    def handler(request):
        if request.url.path == "/v1/blobs/download":
            handed.append(f"{where}/blob?sig={len(handed)}")
            return httpx.Response(200, json={"urls": {digest: {"url": handed[-1], "size": len(blob)}}})
        if request.url.params["sig"] == "0":  # the first URL has expired
            return httpx.Response(403, content=b"<Error><Code>AccessDenied</Code></Error>")
        return httpx.Response(200, content=blob)

    def answer(path, headers):
        if path.endswith("sig=0"):
            return 403, {}, b"<Error><Code>AccessDenied</Code></Error>", None
        return 200, {}, blob, None

    bucket.answer = answer
    store = HttpBlobStore(client_for(handler))
    assert (store._bucket is None) == proxied
    store.get_file(digest, tmp_path / "b")
    assert (tmp_path / "b").read_bytes() == blob and len(handed) == 2
    assert len(bucket.seen) == (0 if proxied else 2)


def test_exists_and_stat_are_one_head_each():
    digest = digest_of(b"abc")

    def handler(request):
        assert request.method == "HEAD" and request.headers["authorization"] == f"Bearer {TOKEN}"
        if request.url.path.endswith(digest):
            return httpx.Response(200, headers={"content-length": "3",
                                                "last-modified": "Tue, 24 Nov 2026 08:00:00 GMT"})
        return httpx.Response(404)

    store = HttpBlobStore(client_for(handler))
    assert store.exists(digest) and not store.exists(digest_of(b"other"))
    info = store.stat(digest)
    assert info.size == 3 and info.mtime > 0
    with pytest.raises(NotFoundError):
        store.stat(digest_of(b"other"))


def test_a_publish_cut_off_is_not_sent_twice_and_says_it_may_have_happened():
    calls = []

    def handler(request):
        calls.append(request.url.path)
        raise httpx.ReadTimeout("timed out")

    with pytest.raises(StoreError) as caught:
        publish(HttpMetadataStore(client_for(handler)), "a", "sha256:" + "0" * 64, "{}", 1, [], actor="x", host="h")
    assert calls == ["/v1/publish"] and "may have been made" in caught.value.one_line()


def test_plain_http_to_another_machine_warns_and_loopback_does_not(tmp_path):
    env = {"PT2REG_HOME": str(tmp_path), "PT2REG_TOKEN": TOKEN, "PT2REG_DB": None, "PT2REG_STORE": None}
    # a malformed ref fails before any request goes out
    r = run_in_process("--registry", "http://registry.example.com", "show", "Bad Ref!", env={**env, "PT2REG_URL": None})
    assert r.returncode == 2 and "plain HTTP" in r.stderr and TOKEN not in r.stderr
    r = run_in_process("--registry", "http://127.0.0.1:1", "show", "Bad Ref!", env={**env, "PT2REG_URL": None})
    assert r.returncode == 2 and "plain HTTP" not in r.stderr
