"""The OCI client's edges (issue 43): where logins come from and where they go, challenges,
errors, uploads that break and resume, a damaged source. A registry played by
``httpx.MockTransport`` (the real one, with the happy paths, is ``tests/integration/test_oci.py``).
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from pathlib import Path

import httpx
import pytest

from registry.errors import (
    AccessDeniedError,
    IntegrityError,
    NotAuthenticatedError,
    NotFoundError,
    StoreError,
    UsageError,
)
from registry.oci.auth import Credential, find_credential, parse_challenges
from registry.oci.client import OciClient
from registry.oci.reference import OciReference

REF = OciReference.parse("reg.example.com/team/m:v1")


@pytest.fixture
def docker_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    (tmp_path / "docker").mkdir()
    return tmp_path / "docker" / "config.json"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_logins_are_found_by_host_and_port_only(docker_config: Path):
    docker_config.write_text(json.dumps({"auths": {
        "https://reg.example.com": {"auth": _b64("alice:pw1")},
        "reg.example.com:5000/v2/": {"username": "bob", "password": "pw2"},
        "other.example.com/team": {"auth": _b64("carol:pw3")},
        "other.example.com/team/deep": {"auth": _b64("dave:pw4")},
    }}))
    assert find_credential("reg.example.com", "x").username == "alice"
    assert find_credential("REG.example.com", "x").password == "pw1"
    assert find_credential("reg.example.com:5000", "x").username == "bob"
    assert find_credential("reg.example.com.evil.net", "x") is None
    assert find_credential("other.example.com", "team/m").username == "carol"
    assert find_credential("other.example.com", "team/deep/m").username == "dave"   # the longest prefix
    assert find_credential("other.example.com", "teamx/m") is None
    assert "pw1" not in repr(find_credential("reg.example.com", "x"))


def test_registry_auth_file_wins_and_must_exist(docker_config: Path, tmp_path: Path, monkeypatch):
    docker_config.write_text(json.dumps({"auths": {"reg.example.com": {"auth": _b64("docker:pw")}}}))
    podman = tmp_path / "auth.json"
    podman.write_text(json.dumps({"auths": {"reg.example.com": {"auth": _b64("podman:pw")}}}))
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(podman))
    assert find_credential("reg.example.com").username == "podman"
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(tmp_path / "missing.json"))
    with pytest.raises(NotFoundError, match="REGISTRY_AUTH_FILE"):
        find_credential("reg.example.com")


@pytest.mark.parametrize("content, needle", [
    ("{not json", "cannot read"), ("[1]", "not a JSON object"),
    (json.dumps({"auths": {"reg.example.com": {"auth": "%%%"}}}), "not base64"),
    (json.dumps({"auths": {"reg.example.com": {"auth": _b64("no-colon")}}}), "not base64"),
    (json.dumps({"credHelpers": {"reg.example.com": "../../bin/sh"}}), "not a helper name"),
    (json.dumps({"credHelpers": {"reg.example.com": "absent-helper"}}), "not on PATH"),
])
def test_broken_credential_files_are_one_clear_line(docker_config: Path, content: str, needle: str):
    docker_config.write_text(content)
    with pytest.raises(UsageError, match=needle):
        find_credential("reg.example.com")


def _helper(tmp_path: Path, monkeypatch, name: str, answer: dict, code: int = 0) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    script = bindir / f"docker-credential-{name}"
    script.write_text(f"#!/bin/sh\nread host\necho \"$host\" > {tmp_path}/asked-{name}\n"
                      f"echo '{json.dumps(answer)}'\nexit {code}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path / f"asked-{name}"


def test_credential_helpers(docker_config: Path, tmp_path: Path, monkeypatch):
    asked = _helper(tmp_path, monkeypatch, "fake", {"Username": "ci", "Secret": "s3cret"})
    _helper(tmp_path, monkeypatch, "tok", {"Username": "<token>", "Secret": "refresh-me"})
    _helper(tmp_path, monkeypatch, "none", {"message": "credentials not found"}, code=1)
    docker_config.write_text(json.dumps({"credHelpers": {"reg.example.com": "fake", "t.example.com": "tok"},
                                         "credsStore": "none", "auths": {"x.example.com": {"auth": _b64("a:b")}}}))
    cred = find_credential("reg.example.com")
    assert (cred.username, cred.password) == ("ci", "s3cret") and asked.read_text().strip() == "reg.example.com"
    assert find_credential("t.example.com").identity_token == "refresh-me"
    # the store has nothing for this host: the auths entry is used
    assert find_credential("x.example.com").username == "a"
    assert find_credential("y.example.com") is None


def test_challenges_parse():
    (b,) = parse_challenges('Bearer realm="https://auth.example/token",service="reg",scope="repository:a:pull,push"')
    assert b.scheme == "bearer" and b.params == {"realm": "https://auth.example/token", "service": "reg",
                                                 "scope": "repository:a:pull,push"}
    both = parse_challenges('Basic realm="r", Bearer realm="https://a/t",service="s"')
    assert [c.scheme for c in both] == ["basic", "bearer"] and both[1].params["service"] == "s"


class _Registry:
    """A registry behind a token service, serving one manifest and one blob (the blob through a
    redirect to a CDN); records every request's Authorization header."""

    def __init__(self, realm: str = "https://auth.example.com/token") -> None:
        self.seen: list[tuple[str, str | None]] = []
        self.realm = realm
        self.blob = b"weights" * 100
        self.blob_digest = "sha256:" + hashlib.sha256(self.blob).hexdigest()
        self.uploads: dict[str, bytearray] = {}
        self.stored: dict[str, bytes] = {}
        self.fail_patch: int | None = None
        self.patches = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        auth = request.headers.get("authorization")
        url = request.url
        self.seen.append((f"{request.method} {url.host}{url.path}", auth))
        if url.host == "auth.example.com":
            if auth != "Basic " + _b64("alice:pw"):
                return httpx.Response(401)
            return httpx.Response(200, json={"token": "T0KEN"})
        if url.host == "cdn.example.com":
            return httpx.Response(200, content=self.blob)
        if auth != "Bearer T0KEN":
            return httpx.Response(401, headers={"WWW-Authenticate": f'Bearer realm="{self.realm}",service="reg",'
                                                                   f'scope="repository:team/m:pull"'},
                                  json={"errors": [{"code": "UNAUTHORIZED", "message": "auth required"}]})
        path = url.path
        if path.endswith("/manifests/v1") or "/manifests/sha256:" in path:
            return httpx.Response(200, content=b"{}", headers={"Content-Type": "application/json"})
        if path.endswith("/manifests/missing"):
            return httpx.Response(404, json={"errors": [{"code": "MANIFEST_UNKNOWN", "message": "unknown"}]})
        if path.endswith("/manifests/denied"):
            return httpx.Response(403, json={"errors": [{"code": "DENIED", "message": "no"}]})
        if path.endswith(f"/blobs/{self.blob_digest}"):
            return httpx.Response(307, headers={"Location": "https://cdn.example.com/b?sig=1"})
        if request.method == "POST" and path.endswith("/blobs/uploads/"):
            uid = f"u{len(self.uploads)}"
            self.uploads[uid] = bytearray()
            return httpx.Response(202, headers={"Location": f"/v2/team/m/blobs/uploads/{uid}?_state=abc"})
        if "/blobs/uploads/" in path:
            uid = path.rsplit("/", 1)[1]
            if url.params.get("_state") != "abc":
                return httpx.Response(404, json={"errors": [{"code": "BLOB_UPLOAD_UNKNOWN", "message": "state"}]})
            data = self.uploads[uid]
            if request.method == "GET":
                return httpx.Response(204, headers={"Range": f"0-{len(data) - 1}"})
            if request.method == "PATCH":
                self.patches += 1
                body = request.read()
                if self.fail_patch == self.patches:
                    data += body[:len(body) // 2]     # half of it arrived, then the connection broke
                    raise httpx.WriteError("connection reset")
                start = int(request.headers["content-range"].split("-")[0])
                if start != len(data):
                    return httpx.Response(416)
                data += body
                return httpx.Response(202, headers={"Location": f"/v2/team/m/blobs/uploads/{uid}?_state=abc"})
            if request.method == "PUT":
                data += request.read()
                digest = url.params["digest"]
                if "sha256:" + hashlib.sha256(bytes(data)).hexdigest() != digest:
                    return httpx.Response(400, json={"errors": [{"code": "DIGEST_INVALID", "message": "x"}]})
                self.stored[digest] = bytes(data)
                return httpx.Response(201)
        return httpx.Response(404)


def _client(registry: _Registry, cred: Credential | None = Credential("reg.example.com", "alice", "pw")) -> OciClient:
    return OciClient(REF, credential=cred, transport=httpx.MockTransport(registry), sleep=lambda s: None)


def test_a_bearer_challenge_gets_a_token_from_the_realm_with_the_login():
    reg = _Registry()
    with _client(reg) as c:
        data, _ = c.get_manifest("v1")
        assert data == b"{}"
    sent = dict(reg.seen)
    assert sent["GET auth.example.com/token"] == "Basic " + _b64("alice:pw")
    assert reg.seen[-1] == ("GET reg.example.com/v2/team/m/manifests/v1", "Bearer T0KEN")


def test_the_token_never_follows_a_redirect():
    reg = _Registry()
    with _client(reg) as c:
        c.get_manifest("v1")
        response = c.send("GET", f"/blobs/{reg.blob_digest}", stream=True)
        assert response.read() == reg.blob
    (cdn,) = [a for what, a in reg.seen if what.startswith("GET cdn.example.com")]
    assert cdn is None


def test_no_login_goes_to_a_realm_over_plain_http():
    reg = _Registry(realm="http://auth.example.com/token")
    with _client(reg) as c, pytest.raises(StoreError, match="not over HTTPS"):
        c.get_manifest("v1")
    assert not [w for w, _ in reg.seen if "auth.example.com" in w]


def test_a_refused_login_is_exit_7_naming_where_it_came_from():
    reg = _Registry()
    with _client(reg, Credential("reg.example.com", "alice", "wrong", source="/x/config.json")) as c:
        with pytest.raises(NotAuthenticatedError) as exc:
            c.get_manifest("v1")
    assert exc.value.exit_code == 7 and "/x/config.json" in str(exc.value) and "wrong" not in str(exc.value)
    with _client(_Registry(), None) as c, pytest.raises(NotAuthenticatedError, match="docker login"):
        c.get_manifest("v1")


def test_a_login_for_another_host_is_refused():
    with pytest.raises(UsageError, match="cannot be used"):
        OciClient(REF, credential=Credential("evil.example.com", "a", "b"))


def test_registry_errors_map_to_the_contract():
    with _client(_Registry()) as c:
        with pytest.raises(NotFoundError) as nf:
            c.get_manifest("missing")
        assert nf.value.exit_code == 3 and "MANIFEST_UNKNOWN" in str(nf.value)
        with pytest.raises(AccessDeniedError) as denied:
            c.get_manifest("denied")
        assert denied.value.exit_code == 7


def test_a_manifest_that_does_not_match_its_pin_is_refused():
    with _client(_Registry()) as c:
        assert c.get_manifest("sha256:" + hashlib.sha256(b"{}").hexdigest())[0] == b"{}"
        with pytest.raises(IntegrityError, match="altered"):
            c.get_manifest("sha256:" + "1" * 64)


def _source(data: bytes):
    return lambda offset, n: iter([data[offset + i:offset + min(n, i + 1000)] for i in range(0, n, 1000)])


def test_a_chunked_upload_resumes_after_a_broken_connection():
    reg = _Registry()
    reg.fail_patch = 2
    data = os.urandom(10_000)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with _client(reg) as c:
        c.upload_blob(digest, len(data), _source(data), chunk=3_000, monolithic_max=1_000)
    assert reg.stored[digest] == data
    assert any(w.startswith("GET reg.example.com/v2/team/m/blobs/uploads/") for w, _ in reg.seen)


def test_a_damaged_source_never_completes_an_upload():
    reg = _Registry()
    data = os.urandom(5_000)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    damaged = bytearray(data)
    damaged[-1] ^= 1
    for chunked in (False, True):
        with _client(reg) as c, pytest.raises(IntegrityError, match="does not match"):
            c.upload_blob(digest, len(data), _source(bytes(damaged)), chunk=2_000,
                          monolithic_max=1_000 if chunked else 10_000)
    assert digest not in reg.stored


def test_429_is_retried_after_its_delay():
    calls, waits = [], []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 1:
            return httpx.Response(429, headers={"Retry-After": "2"})
        return httpx.Response(200, content=b"{}")

    with OciClient(REF, credential=None, transport=httpx.MockTransport(handler), sleep=waits.append) as c:
        assert c.get_manifest("v1")[0] == b"{}"
    assert waits == [2.0] and len(calls) == 2


def test_the_referrers_api_is_used_where_the_registry_has_it_and_no_tag_is_written():
    """A registry with the referrers API (OCI 1.1): its list is read, and a pushed referrer it
    indexed (``OCI-Subject``) gets no fallback tag."""
    subject = "sha256:" + "5" * 64
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:" + "6" * 64, "size": 10,
         "artifactType": "application/vnd.dev.sigstore.bundle.v0.3+json"}]}
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        if request.url.path.endswith(f"/referrers/{subject}"):
            return httpx.Response(200, json=index, headers={"Content-Type": "application/vnd.oci.image.index.v1+json"})
        if request.method == "PUT" and "/manifests/sha256:" in request.url.path:
            return httpx.Response(201, headers={"OCI-Subject": subject})
        return httpx.Response(404)

    with OciClient(REF, credential=None, transport=httpx.MockTransport(handler)) as c:
        (found,) = c.referrers(subject)
        assert found.artifact_type == "application/vnd.dev.sigstore.bundle.v0.3+json"
        c.add_referrer(subject, b'{"subject": 1}', "application/x", {})
    assert not [s for s in seen if "sha256-" in s]   # the tag schema was neither read nor written


def test_without_the_api_the_tag_schema_is_read_and_extended():
    subject = "sha256:" + "7" * 64
    tag = "sha256-" + "7" * 64
    stored: dict[str, bytes] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if "/referrers/" in path:
            return httpx.Response(404)
        name = path.rsplit("/", 1)[1]
        if request.method == "PUT":
            stored[name] = request.read()
            return httpx.Response(201)
        if name in stored:
            return httpx.Response(200, content=stored[name],
                                  headers={"Content-Type": "application/vnd.oci.image.index.v1+json"})
        return httpx.Response(404)

    with OciClient(REF, credential=None, transport=httpx.MockTransport(handler)) as c:
        assert c.referrers(subject) == []
        first = c.add_referrer(subject, b'{"a": 1}', "application/x", {"k": "v"})
        second = c.add_referrer(subject, b'{"b": 2}', "application/y", {})
        again = c.add_referrer(subject, b'{"a": 1}', "application/x", {"k": "v"})
        listed = c.referrers(subject)
    assert [d.digest for d in listed] == [first, second] and again == first
    assert json.loads(stored[tag])["mediaType"] == "application/vnd.oci.image.index.v1+json"
