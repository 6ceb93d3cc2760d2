"""Bearer-token auth per the distribution spec, against the real registry (issue 43, point 4).

The CNCF distribution server is configured with ``auth: token``: it answers anonymous requests
with ``401`` and a ``Bearer realm=...`` challenge, and accepts only JWTs (ES256, the signing
certificate in the ``x5c`` header, chained to the ``rootcertbundle`` it trusts) that a token
service issued for the repository and actions asked. The token service here is a small HTTP
server of the test's: it checks HTTP basic auth (``alice``/``pw``) and records what it was sent.
The login comes from a docker config (``DOCKER_CONFIG``), as ``docker login`` writes it.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.cli_inprocess import refused
from tests.services_oci import START_TIMEOUT, _free_port, registry_binary

pytestmark = pytest.mark.integration

USER, PASSWORD = "alice", "pw-" + "x" * 20


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class _TokenService:
    """Issues registry JWTs to ``alice`` for the scopes asked; records each request's headers."""

    def __init__(self, issuer: str, service: str) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pt2reg test token issuer")])
        now = datetime.now(timezone.utc)
        self.cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(self.key.public_key())
                     .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(days=1))
                     .not_valid_after(now + timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.cert_pem = self.cert.public_bytes(serialization.Encoding.PEM)
        self.issuer, self.service = issuer, service
        self.seen: list[dict[str, str | None]] = []
        service_self = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                service_self.seen.append({"path": self.path, "authorization": self.headers.get("Authorization")})
                if self.headers.get("Authorization") != "Basic " + base64.b64encode(
                        f"{USER}:{PASSWORD}".encode()).decode():
                    self.send_response(401)
                    self.end_headers()
                    return
                query = parse_qs(urlsplit(self.path).query)
                body = json.dumps({"token": service_self.token(query.get("scope", []))}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def token(self, scopes: list[str]) -> str:
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        access = []
        for scope in scopes:
            for part in scope.split(" "):
                kind, _, rest = part.partition(":")
                name, _, actions = rest.rpartition(":")
                access.append({"type": kind, "name": name, "actions": actions.split(",")})
        der = self.cert.public_bytes(serialization.Encoding.DER)
        header = {"typ": "JWT", "alg": "ES256", "x5c": [base64.b64encode(der).decode()]}
        now = int(time.time())
        claims = {"iss": self.issuer, "sub": USER, "aud": self.service, "exp": now + 3600, "nbf": now - 60,
                  "iat": now, "jti": os.urandom(8).hex(), "access": access}
        signing = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self.key.sign(signing.encode(), ec.ECDSA(hashes.SHA256())))
        return f"{signing}.{_b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


@pytest.fixture(scope="module")
def token_registry() -> Iterator[tuple[str, _TokenService]]:
    service = _TokenService("pt2reg-test-issuer", "pt2reg-test-registry")
    workdir = Path(tempfile.mkdtemp(prefix="pt2reg-oci-auth-"))
    (workdir / "root.pem").write_bytes(service.cert_pem)
    port = _free_port()
    (workdir / "config.yml").write_text(f"""version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {workdir / 'data'}
http:
  addr: 127.0.0.1:{port}
auth:
  token:
    realm: {service.url}
    service: {service.service}
    issuer: {service.issuer}
    rootcertbundle: {workdir / 'root.pem'}
""")
    log = open(workdir / "registry.log", "wb")
    proc = subprocess.Popen([registry_binary(), "serve", str(workdir / "config.yml")], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, (workdir / "registry.log").read_text()
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=5)
            except urllib.error.HTTPError as exc:
                if exc.code == 401:
                    break
            except OSError:
                time.sleep(0.1)
        yield f"127.0.0.1:{port}", service
    finally:
        from tests.services_s3 import stop_group

        stop_group(proc)
        log.close()
        service.server.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def bundle(pt2reg, bundles) -> str:
    assert pt2reg("push", bundles["v1"], "--name", "team/m").exit_code == 0
    return "team/m@1"


def test_a_login_from_the_docker_config_gets_a_token_and_only_the_token_goes_to_the_registry(
        pt2reg, bundle, token_registry, tmp_path, monkeypatch):
    host, service = token_registry
    config = tmp_path / "docker"
    config.mkdir()
    (config / "config.json").write_text(json.dumps({"auths": {host: {
        "auth": base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
    r = pt2reg("oci", "push", bundle, f"{host}/team/m:v1", "--json")
    assert r.exit_code == 0, r.output
    pinned = f"{host}/team/m@{json.loads(r.stdout)['manifest_digest']}"
    r = pt2reg("oci", "pull", pinned, "-o", tmp_path / "back.pt2b")
    assert r.exit_code == 0, r.output
    assert service.seen and {s["authorization"] for s in service.seen} == {
        "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}
    # the push asked for push and pull on team/m (the registry lists the actions in either order)
    asked = [scope for seen in service.seen for scope in parse_qs(urlsplit(seen["path"]).query).get("scope", [])]
    assert {"pull", "push"} in [set(a.rpartition(":")[2].split(",")) for a in asked
                                if a.startswith("repository:team/m:")], asked

    # no login: one line, exit 7, saying how to log in
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(empty))
    r = pt2reg("oci", "pull", pinned, "-o", tmp_path / "no.pt2b")
    refused(r, "login", code=7)
    # a wrong password: exit 7 naming where the login came from, never the password
    (empty / "config.json").write_text(json.dumps({"auths": {host: {
        "auth": base64.b64encode(f"{USER}:wrong-secret".encode()).decode()}}}))
    r = pt2reg("oci", "pull", pinned, "-o", tmp_path / "no.pt2b")
    line = refused(r, "refused the login", str(empty / "config.json"), code=7)
    assert "wrong-secret" not in line
    assert not (tmp_path / "no.pt2b").exists()


def test_registry_auth_file_is_used_as_podman_and_skopeo_do(pt2reg, bundle, token_registry, tmp_path, monkeypatch):
    host, _service = token_registry
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"auths": {f"{host}/team": {
        "auth": base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}}}))
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(auth))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "nowhere"))
    r = pt2reg("oci", "push", bundle, f"{host}/team/m2:v1")
    assert r.exit_code == 0, r.output
    # the entry is for repositories under team/: another one gets no login
    r = pt2reg("oci", "push", bundle, f"{host}/other/m:v1")
    refused(r, "login", code=7)
