"""The CLI and the Python API through a registry server, in process: ``create_app`` over SQLite
and a local blob directory, served by uvicorn on a free loopback port in a thread, and clients
that hold only ``PT2REG_URL`` and a token (no database, no store).

The full CLI suite against real ``pt2reg serve`` processes is ``reg_env``'s ``server`` kind
(tests/integration/test_registry_cli.py); this file covers what a remote client adds: scopes
turned into exit 7, identity from the token, login/whoami, and pinned loads with the server gone.
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import urllib3

from tests.cli_inprocess import run_in_process
from tests.services_server import free_port, make_token, manifest_text


class _Server:
    """``create_app`` on uvicorn in a thread; ``store``: a blob store URL (default a directory)."""

    def __init__(self, tmp: Path, store: str | None = None) -> None:
        import uvicorn

        from registry.config import Settings
        from registry.server.app import create_app

        self.db = f"sqlite:///{tmp / 'server.db'}"
        settings = Settings.resolve(home=str(tmp / "server-home"), db=self.db,
                                    store=store or f"file://{tmp / 'server-store'}", env={})
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.app = create_app(settings)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="pt2reg-test-server", daemon=True)

    def __enter__(self) -> _Server:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[_Server]:
    with _Server(tmp_path) as srv:
        yield srv


def client(server: _Server, home: Path, token: str | None, **extra: str | None) -> dict[str, str | None]:
    """The environment of a client machine: the URL and a token, nothing else."""
    return {"PT2REG_HOME": str(home), "PT2REG_URL": server.url, "PT2REG_TOKEN": token, "PT2REG_DB": None,
            "PT2REG_STORE": None, "AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None,
            "PT2REG_ACTOR": None, **extra}


def ok(r) -> Any:
    assert r.returncode == 0, (r.args, r.returncode, r.stderr)
    return json.loads(r.stdout) if "--json" in r.args else r.stdout


def denied(r, *needles: str) -> str:
    assert r.returncode == 7, (r.args, r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_push_pull_lifecycle_lineage_audit_and_scopes_through_the_server(server, bundles, tmp_path, monkeypatch):
    push_token = make_token(server.db, "trainer", ["model:team/*:pull,push,alias,yank"])
    pull_token = make_token(server.db, "inference", ["model:team/*:pull"])
    audit_token = make_token(server.db, "auditor", ["audit:read", "model:team/*:pull"])
    admin_token = make_token(server.db, "ops", ["admin"])
    trainer = client(server, tmp_path / "trainer", push_token, PT2REG_ACTOR="somebody-else")
    inference = client(server, tmp_path / "inference", pull_token)
    auditor = client(server, tmp_path / "auditor", audit_token)
    admin = client(server, tmp_path / "admin", admin_token)

    # publish: two versions, the second with lineage, a signature and an alias
    key = tmp_path / "signer"
    ok(run_in_process("key", "generate", str(key)))
    first = ok(run_in_process("push", bundles["v0"], "--name", "team/translator", "--json", env=trainer))
    second = ok(run_in_process("push", bundles["ed"], "--name", "team/translator", "--alias", "staging",
                               "--parent", "team/translator@1", "--dataset", "s3://data/train",
                               "--run-id", "run-7", "--sign", f"{key}.key", "--json", env=trainer))
    assert (first["version"], second["version"]) == (1, 2)
    ok(run_in_process("alias", "set", "team/translator", "prod", "1", env=trainer))

    # the inference host: list, show (--at), pull pinned by digest with the signature required
    models = ok(run_in_process("list", "--json", env=inference))["models"]
    assert [m["name"] for m in models] == ["team/translator"]
    shown = ok(run_in_process("show", "team/translator@staging", "--json", env=inference))
    assert shown["version"] == 2 and shown["digest"] == second["digest"]
    at = ok(run_in_process("show", "team/translator@prod", "--at", "2999-01-01T00:00:00Z", "--json", env=inference))
    assert at["version"] == 1
    pinned = f"team/translator@{second['digest']}"
    out = tmp_path / "pulled.pt2b"
    pulled = ok(run_in_process("pull", pinned, "-o", out, "--require-signature", f"{key}.pub", "--json",
                               env=inference))
    assert pulled["digest"] == second["digest"] and out.stat().st_size > 0
    assert {p.name for p in (tmp_path / "inference").iterdir()}.isdisjoint({"registry.db", "store"})
    ok(run_in_process("verify", pinned, env=inference))
    import registry  # the Python API reads the same environment

    with monkeypatch.context() as m:
        for name, value in inference.items():
            m.setenv(name, value) if value is not None else m.delenv(name, raising=False)
        loaded = registry.load("team/translator@staging")
    assert loaded is not None

    # lineage (and --dot, --dataset) reads as it does against a direct store
    lineage = ok(run_in_process("lineage", "team/translator@2", "--json", env=inference))
    assert "team/translator@1" in json.dumps(lineage)
    assert "digraph" in ok(run_in_process("lineage", "team/translator@2", "--dot", env=inference))
    assert "team/translator@2" in json.dumps(ok(run_in_process("lineage", "--dataset", "s3://data/train",
                                                               "--json", env=inference)))

    # the pull-only token may do nothing else: each refusal is exit 7 naming the scope
    # (a push is refused at its first request, the claim on its blobs, before the name is sent)
    denied(run_in_process("push", bundles["v1"], "--name", "team/translator", env=inference), ":push")
    denied(run_in_process("alias", "set", "team/translator", "prod", "2", env=inference),
           "model:team/translator:alias")
    denied(run_in_process("yank", "team/translator@1", "--reason", "x", env=inference),
           "model:team/translator:yank")
    denied(run_in_process("audit", env=inference), "audit:read")
    denied(run_in_process("list", env=client(server, tmp_path / "nobody", None)))
    denied(run_in_process("gc", "--dry-run", env=trainer), "admin")
    denied(run_in_process("list", "other/model", env=inference), "model:other/model:pull")

    # lifecycle by the publisher
    ok(run_in_process("yank", "team/translator@1", "--reason", "regression", env=trainer))
    ok(run_in_process("alias", "rm", "team/translator", "staging", env=trainer))
    r = run_in_process("show", "team/translator@staging", env=inference)
    assert r.returncode == 3, r.stderr

    # the audit log names the token's owner, whatever PT2REG_ACTOR claims, and verifies
    events = ok(run_in_process("audit", "--model", "team/translator", "--json", env=auditor))["events"]
    by_action = {e["action"]: e["actor"] for e in events}
    assert by_action["publish"] == "trainer" and by_action["pull"] == "inference", by_action
    assert "somebody-else" not in json.dumps(events)
    ok(run_in_process("audit", "--verify", env=auditor))
    ok(run_in_process("audit", "--verify", env=auditor))  # against this machine's anchor now

    # gc with an admin token runs on the server; db upgrade never goes through it
    gc = ok(run_in_process("gc", "--dry-run", "--json", env=admin))
    assert gc["dry_run"] is True and gc["deleted"] == []
    r = run_in_process("db", "upgrade", env=admin)
    assert r.returncode == 2 and "database directly" in r.stderr

    # tokens through the server with an admin token: create (expiring), list, revoke
    made = ok(run_in_process("token", "create", "batch", "--scope", "model:team/*:pull", "--expires", "1d",
                             "--json", env=admin))
    batch = client(server, tmp_path / "batch", made["secret"])
    assert ok(run_in_process("list", "--json", env=batch))["models"]
    listed = ok(run_in_process("token", "list", "--json", env=admin))
    assert "batch" in json.dumps(listed) and made["secret"] not in json.dumps(listed)
    ok(run_in_process("token", "revoke", made["token"]["id"], env=admin))
    denied(run_in_process("list", env=batch))
    denied(run_in_process("token", "list", env=trainer), "admin")

    # the inference host's pin is served from its cache once the server is gone
    server.stop()
    from registry.client import Registry
    from registry.config import Settings

    env = {k: v for k, v in inference.items() if v is not None}
    with Registry(Settings.resolve(env=env)) as reg:
        src = reg.materialize(pinned)
        assert src.digest == second["digest"] and src.files
    r = run_in_process("list", env=inference)
    assert r.returncode == 1 and f"cannot reach the registry at {server.url}" in r.stderr


def test_login_whoami_and_logout(server, tmp_path):
    token = make_token(server.db, "ci", ["model:team/**:pull,push"])
    token_file = tmp_path / "ci.token"
    token_file.write_text(token + "\n")
    home = tmp_path / "home"
    env = client(server, home, None)

    r = run_in_process("login", server.url, "--token-file", token_file, env=env)
    assert r.returncode == 0, r.stderr
    assert "logged in to" in r.stdout and "ci" in r.stdout and token not in r.stdout + r.stderr
    assert ((home / "credentials.json").stat().st_mode & 0o777) == 0o600
    me = ok(run_in_process("whoami", "--json", env=env))
    assert me["owner"] == "ci" and me["scopes"] == ["model:team/**:pull,push"] and me["registry"] == server.url

    (home / "credentials.json").chmod(0o644)
    r = run_in_process("whoami", env=env)
    assert r.returncode == 2 and "chmod 600" in r.stderr
    (home / "credentials.json").chmod(0o600)

    ok(run_in_process("logout", env=env))
    denied(run_in_process("whoami", env=env))
    # --token-file works without a login; a refused token is never saved
    assert ok(run_in_process("--token-file", token_file, "whoami", "--json", env=env))["owner"] == "ci"
    bad = tmp_path / "bad.token"
    bad.write_text("pt2r_" + "x" * 43)
    denied(run_in_process("login", server.url, "--token-file", bad, env=env))
    assert json.loads((home / "credentials.json").read_text())["registries"] == {}


def test_with_an_s3_store_the_bytes_go_through_presigned_urls_never_through_the_server(
        moto_endpoint, bundles, tmp_path, monkeypatch):
    """The server over moto's S3: it signs, the client moves every byte itself (the server's
    own byte counters stay at zero), with no cloud credentials of its own."""
    import boto3

    aws = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": moto_endpoint}
    for name, value in aws.items():
        monkeypatch.setenv(name, value)
    bucket = f"remote-{tmp_path.name[-20:].lower().replace('_', '-')}".strip("-")
    boto3.session.Session().client("s3").create_bucket(Bucket=bucket)
    with _Server(tmp_path, store=f"s3://{bucket}/reg") as srv:
        state = srv.app.state.registry
        state.blobs._s3(), state.blobs._signer()  # made now: the clients below unset the AWS variables
        push = make_token(srv.db, "trainer", ["model:team/*:push"])
        pull = make_token(srv.db, "inference", ["model:team/*:pull"])
        no_cloud = dict.fromkeys(aws)
        pushed = ok(run_in_process("push", bundles["ed"], "--name", "team/ed", "--json",
                                   env={**client(srv, tmp_path / "trainer", push), **no_cloud}))
        out = tmp_path / "pulled.pt2b"
        ok(run_in_process("pull", f"team/ed@{pushed['digest']}", "-o", out, "--json",
                          env={**client(srv, tmp_path / "inference", pull), **no_cloud}))
        counters = state.counters.snapshot()
    assert counters.get("presigned_puts", 0) > 0 and counters.get("presigned_gets", 0) > 0, counters
    assert counters.get("blob_bytes_served", 0) == 0 and counters.get("blob_bytes_received", 0) == 0, counters
    stored = boto3.session.Session().client("s3").list_objects_v2(Bucket=bucket, Prefix="reg/blobs/")
    assert stored["KeyCount"] > 0 and out.stat().st_size > 0


@pytest.mark.parametrize("reg_env", ["server", pytest.param("team-server", marks=pytest.mark.integration)],
                         indirect=True)
def test_read_range_through_a_real_server(reg_env, monkeypatch):
    """``HttpBlobStore.read_range`` against a ``pt2reg serve`` process: over a local store the
    server answers the ``Range`` itself (206), over SeaweedFS the client GETs a presigned URL
    with it; a blob truncated behind the server's back, or shorter than the size first
    reported, is an IntegrityError naming the range."""
    from registry.blobs.base import blob_relpath
    from registry.errors import IntegrityError, NotFoundError, UsageError
    from registry.remote.blobs import HttpBlobStore, Target
    from registry.remote.http import HttpClient, same_origin
    from tests.unit.test_read_range import Sink, assert_short, pack_bytes

    data, digest = pack_bytes(1 << 20)
    store = HttpBlobStore(HttpClient(reg_env.url, reg_env.token))
    try:
        # the server serves only blobs a version references: publish one holding the pack
        manifest = manifest_text(digest, len(data), salt="packs").encode()
        mdigest = "sha256:" + hashlib.sha256(manifest).hexdigest()
        assert store.put_bytes(data, digest) is True and store.put_bytes(manifest, mdigest) is True
        store.client.post_json("/v1/publish", {
            "name": "team/packs", "digest": mdigest, "manifest_json": manifest.decode(), "size": len(data) + len(manifest),
            "blobs": [[digest, len(data)], [mdigest, len(manifest)]], "host": "ci"})
        seen: list[tuple[str, str | None, int]] = []   # (route, Range, status)
        real_send, real_presigned = store.client.send, store._get_presigned

        def send(method, url, **kwargs):
            response = real_send(method, url, **kwargs)
            if method == "GET" and "/v1/blobs/download" not in url:
                seen.append(("server" if same_origin(url, reg_env.url) else "bucket",
                             (kwargs.get("headers") or {}).get("Range"), response.status_code))
            return response

        def presigned(url, headers, **kwargs):
            response = real_presigned(url, headers, **kwargs)
            seen.append(("presigned", headers.get("Range"), response.status_code))
            return response

        monkeypatch.setattr(store.client, "send", send)
        monkeypatch.setattr(store, "_get_presigned", presigned)

        assert store.read_range(digest, 300_001, 200_000) == data[300_001:500_001]
        route = "server" if reg_env.kind == "server" else ("presigned" if store._bucket is not None else "bucket")
        assert seen == [(route, "bytes=300001-500000", 206)]
        assert store.read_range(digest, len(data) - 999, 999) == data[-999:]
        assert store.read_range(digest, 0, len(data)) == data
        sink = Sink()
        store.read_range_into(digest, 5, len(data) - 5, sink)     # what a pull's pack runs use
        assert b"".join(sink.pieces) == data[5:]
        # what the sink raises is its own, even an error of the kind a cut-off body raises
        for error in (ConnectionError("the sink's own"), httpx.ReadError("the sink's own"),
                      urllib3.exceptions.ProtocolError("the sink's own")):
            failing = Sink(fail_at=1, error=error)
            with pytest.raises(type(error)) as exc:
                store.read_range_into(digest, 0, len(data), failing)
            assert exc.value is error and failing.calls == 1

        for offset, length in ((len(data) - 10, 11), (len(data), 1), (len(data) + 5000, 10)):
            with pytest.raises(IntegrityError) as exc:
                store.read_range(digest, offset, length)
            assert_short(exc, digest, offset, offset + length - 1)
        _, missing = pack_bytes(100, seed=9)
        with pytest.raises(NotFoundError):
            store.read_range(missing, 0, 10)
        for offset, length in ((-1, 10), (0, 0), (5, -3)):
            with pytest.raises(UsageError):
                store.read_range(digest, offset, length)

        # the blob shrinks after the server reported its size: the answer is cut short (206 with
        # the real size) or refused (416), and the read says so, not returning fewer bytes
        real_targets = store.download_targets

        def stale(digests):
            return {d: Target(t.digest, t.url, t.size + 5000, t.method, t.headers)
                    for d, t in real_targets(digests).items()}

        monkeypatch.setattr(store, "download_targets", stale)
        store._range_targets.clear()     # the targets of ranged reads are reused for a minute
        seen.clear()
        with pytest.raises(IntegrityError) as exc:
            store.read_range(digest, len(data) - 10, 20)
        assert_short(exc, digest, len(data) - 10, len(data) + 9)
        with pytest.raises(IntegrityError) as exc:
            store.read_range(digest, len(data) + 100, 20)
        assert_short(exc, digest, len(data) + 100, len(data) + 119)
        assert [status for _r, _h, status in seen] == [206, 416]
        monkeypatch.setattr(store, "download_targets", real_targets)
        store._range_targets.clear()

        # truncated behind the server's back
        short = data[:4096]
        if reg_env.store.startswith("file://"):
            path = Path(reg_env.store[len("file://"):]) / blob_relpath(digest)
            path.chmod(0o644)
            path.write_bytes(short)
        else:
            bucket, key = reg_env.blob_location(digest)
            reg_env.s3_client().put_object(Bucket=bucket, Key=key, Body=short)
        assert store.read_range(digest, 96, 4000) == data[96:4096]
        with pytest.raises(IntegrityError) as exc:
            store.read_range(digest, 4000, 200)
        assert_short(exc, digest, 4000, 4199)

        # a pull reads a pack in several runs: the server is asked where it is once
        asked: list[list[str]] = []

        def counted(digests):
            asked.append(list(digests))
            return real_targets(digests)

        monkeypatch.setattr(store, "download_targets", counted)
        store._range_targets.clear()
        assert [store.read_range(digest, k * 1000, 1000) for k in range(4)] == [data[k * 1000:(k + 1) * 1000]
                                                                               for k in range(4)]
        assert asked == [[digest]]
    finally:
        store.client.close()
