"""Issue 18: two ``pt2reg serve`` replicas over real PostgreSQL + SeaweedFS, clients that hold
only the server's URL and a scoped token.

- a ``push`` token publishes with lineage and a signature; a ``pull`` token with no cloud
  credentials pulls it pinned by digest, verifies it and runs its samples, and the blob bytes
  come from SeaweedFS through presigned URLs (the servers' own byte counters stay at zero and
  their access logs show the redirects);
- the pull token cannot push, move an alias, yank or read the audit log (exit 7 naming the
  scope); no token, an expired one and a revoked one are refused; ``team/*`` does not reach
  ``team2/x`` or ``team/a/b``;
- eight concurrent publishers spread over both replicas get eight versions, the audit chain
  verifies and every event names the token's owner.
"""
from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

from registry.format.bundle import BundleFile
from tests.fixtures_pt2 import cli_process, run_cli
from tests.services_server import make_token, registry_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]

_NO_DIRECT = dict.fromkeys(("PT2REG_DB", "PT2REG_STORE", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
                            "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_CONFIG_FILE",
                            "AWS_SHARED_CREDENTIALS_FILE", "PT2REG_TOKEN"))


@pytest.fixture
def team(pg_db_url, seaweed_s3, tmp_path):
    """Two replicas of one registry (PostgreSQL + a SeaweedFS bucket), tokens made by an operator."""
    db, store = pg_db_url, f"s3://{seaweed_s3.new_bucket()}/team"
    r = run_cli("db", "upgrade", env={"PT2REG_DB": db, "PT2REG_HOME": str(tmp_path / "op")})
    assert r.returncode == 0, r.stderr
    env = {**seaweed_s3.env, "PT2REG_HOME": str(tmp_path / "server-home")}
    with registry_server(db, store, env=env, log_dir=tmp_path / "a") as a, \
            registry_server(db, store, env=env, log_dir=tmp_path / "b") as b:
        yield {"db": db, "store": store, "replicas": [a, b], "tmp": tmp_path, "s3": seaweed_s3}


def client(url: str, token: str | None, home: Path, **extra: str) -> dict[str, str | None]:
    """The environment of a machine that knows only the server's URL and its token."""
    return {**_NO_DIRECT, "PT2REG_URL": url, "PT2REG_TOKEN": token, "PT2REG_HOME": str(home), **extra}


def _ok(r):
    assert r.returncode == 0, (r.args, r.stderr)
    return r


def _denied(r, scope: str) -> str:
    assert r.returncode == 7, (r.args, r.returncode, r.stdout, r.stderr)
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith("error: "), r.stderr
    assert scope in line, line
    return line


def _served_blob_bytes(url: str, admin: str) -> int:
    stats = httpx.get(f"{url}/v1/stats", headers={"Authorization": f"Bearer {admin}"}, timeout=10)
    assert stats.status_code == 200, stats.text
    return int(stats.json()["blob_bytes_served"])


def test_push_and_pull_tokens_through_two_replicas_bytes_via_presigned_urls(team, bundles, tmp_path):
    a, b = team["replicas"]
    db = team["db"]
    pusher = make_token(db, "trainer", ["model:team/*:pull,push,alias"])
    puller = make_token(db, "inference", ["model:team/*:pull"])
    admin = make_token(db, "ops", ["admin"])
    key = tmp_path / "signer"
    _ok(run_cli("key", "generate", str(key)))

    train = client(a.url, pusher, tmp_path / "train-home")
    parent = json.loads(_ok(run_cli("push", bundles["v0"], "--name", "team/base", "--json", env=train)).stdout)
    pushed = json.loads(_ok(run_cli(
        "push", bundles["ed"], "--name", "team/translator", "--parent", f"team/base@{parent['version']}",
        "--dataset", "s3://corpus/wmt@sha256:" + "ab" * 32, "--run-id", "run-42",
        "--sign", f"{key}.key", "--alias", "staging", "--json", env=train)).stdout)
    digest = BundleFile.open(bundles["ed"]).digest
    assert pushed["digest"] == digest and pushed["version"] == 1

    # the inference host: the other replica, a pull-only token, no database, no cloud credentials
    infer_home = tmp_path / "infer-home"
    infer = client(b.url, puller, infer_home)
    pinned = f"team/translator@{digest}"
    out = tmp_path / "pulled.pt2b"
    _ok(run_cli("pull", pinned, "-o", out, "--require-signature", f"{key}.pub", env=infer))
    assert BundleFile.open(out).digest == digest  # the same content (plus the recorded signature)
    _ok(run_cli("verify", pinned, env=infer))
    ran = _ok(run_cli("run", pinned, "--samples", "--json", env=infer))
    assert json.loads(ran.stdout)
    lineage = _ok(run_cli("lineage", pinned, "--json", env=infer))
    assert "team/base" in lineage.stdout and "run-42" in lineage.stdout

    # the bytes came from SeaweedFS: neither replica streamed a blob byte, and their access logs
    # show the redirects to presigned URLs without the signature
    assert _served_blob_bytes(a.url, admin) == 0 and _served_blob_bytes(b.url, admin) == 0
    logs = a.log() + b.log()
    assert "X-Amz-Signature" not in logs and pusher not in logs and puller not in logs

    # a fresh process with the pull token only: a pinned load works offline from its cache too
    code = ("import registry, sys; m = registry.load(sys.argv[1]); print(type(m).__name__)")
    r = cli_process_python(code, pinned, env=infer)
    assert r.returncode == 0, r.stderr


def cli_process_python(code: str, *args: str, env: dict[str, str | None]):
    import os
    import subprocess

    full = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    full["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=full,
                          timeout=300)


def test_scopes_deny_by_default_and_name_the_missing_scope(team, bundles, tmp_path):
    a, b = team["replicas"]
    db = team["db"]
    pusher = make_token(db, "trainer", ["model:team/*:pull,push"])
    puller = make_token(db, "inference", ["model:team/*:pull"])
    train = client(a.url, pusher, tmp_path / "t")
    _ok(run_cli("push", bundles["v1"], "--name", "team/m", env=train))

    infer = client(b.url, puller, tmp_path / "i")
    _denied(run_cli("push", bundles["v2"], "--name", "team/m", env=infer), "model:team/m:push")
    _denied(run_cli("alias", "set", "team/m", "prod", "1", env=infer), "model:team/m:alias")
    _denied(run_cli("yank", "team/m@1", "--reason", "x", env=infer), "model:team/m:yank")
    _denied(run_cli("audit", env=infer), "audit:read")
    _denied(run_cli("gc", env=infer), "admin")
    _denied(run_cli("token", "list", env=infer), "admin")

    # no token, an unknown one, an expired one and a revoked one
    assert run_cli("list", env=client(b.url, None, tmp_path / "n")).returncode == 7
    assert run_cli("list", env=client(b.url, "pt2r_" + "x" * 43, tmp_path / "n")).returncode == 7
    expired = make_token(db, "old", ["model:team/*:pull"],
                         expires_at=datetime.now(timezone.utc) + timedelta(seconds=1))
    time.sleep(1.5)  # expiry is judged by the database's clock
    line = _denied(run_cli("show", "team/m@1", env=client(a.url, expired, tmp_path / "e")), "expired")
    assert expired not in line
    revoked = make_token(db, "gone", ["model:team/*:pull"])
    admin = make_token(db, "ops", ["admin"])
    ops = client(a.url, admin, tmp_path / "o")
    listed = json.loads(_ok(run_cli("token", "list", "--json", env=ops)).stdout)
    gone = [t for t in listed["tokens"] if t["owner"] == "gone"]
    assert len(gone) == 1 and revoked not in json.dumps(listed)
    _ok(run_cli("token", "revoke", str(gone[0]["id"]), env=ops))
    _denied(run_cli("show", "team/m@1", env=client(b.url, revoked, tmp_path / "r")), "revoked")

    # team/* is one segment: not team2/x, not team/a/b
    _ok(run_cli("push", bundles["v3"], "--name", "team2/x", env=ops))
    _ok(run_cli("push", bundles["v4"], "--name", "team/a/b", env=ops))
    _denied(run_cli("push", bundles["v5"], "--name", "team2/x", env=train), "model:team2/x:push")
    _denied(run_cli("push", bundles["v5"], "--name", "team/a/b", env=train), "model:team/a/b:push")
    _denied(run_cli("show", "team2/x", env=infer), "model:team2/x:pull")
    _denied(run_cli("pull", "team/a/b", "-o", tmp_path / "x.pt2b", env=infer), "model:team/a/b:pull")
    names = [m["name"] for m in json.loads(_ok(run_cli("list", "--json", env=infer)).stdout)["models"]]
    assert names == ["team/m"]


def test_eight_concurrent_publishers_over_two_replicas(team, pt2_dir, tmp_path):
    from registry.bundler import ProgramInput, build_bundle

    a, b = team["replicas"]
    db = team["db"]
    tokens = [make_token(db, f"trainer-{i}", ["model:race/**:push,pull"]) for i in range(8)]
    sources = []
    for i in range(8):  # eight versions: same program, different metadata (so shared blobs race too)
        sources.append(tmp_path / f"r{i}.pt2b")
        build_bundle(sources[-1], [ProgramInput("decoder", pt2_dir / "decoder.pt2")], metadata={"run": str(i)})

    def publish(i: int):
        server = (a, b)[i % 2]
        env = {k: v for k, v in client(server.url, tokens[i], tmp_path / f"h{i}",
                                       PT2REG_ACTOR="someone-else").items() if v is not None}
        return cli_process("push", sources[i], "--name", "race/model", "--json", env=env)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(publish, range(8)))
    for r in results:
        assert r.returncode == 0 and r.stderr.strip() == "", r.stderr
    assert sorted(json.loads(r.stdout)["version"] for r in results) == list(range(1, 9))

    admin = make_token(db, "auditor", ["audit:read"])
    auditor = client(b.url, admin, tmp_path / "aud")
    _ok(run_cli("audit", "--verify", env=auditor))
    events = json.loads(_ok(run_cli("audit", "--model", "race/model", "--json", env=auditor)).stdout)["events"]
    publishes = [e for e in events if e["action"] == "publish"]
    assert len(publishes) == 8
    assert sorted(e["actor"] for e in publishes) == sorted(f"trainer-{i}" for i in range(8))
    assert all(e["details"].get("token_id") for e in publishes)
