"""Registry setups for CLI-level tests: the same tests run on every backend combination.

- ``local``: SQLite file + local blob directory (the embedded default, zero services)
- ``moto``: SQLite + S3 served by moto's server (``tests.services_s3.moto_endpoint``)
- ``team``: real PostgreSQL + real SeaweedFS S3 (the integration tier)
- ``server``: SQLite + local blob directory behind ``pt2reg serve`` (a real uvicorn process);
  the CLI holds only ``PT2REG_URL`` and an admin token, never the database or store
- ``team-server``: real PostgreSQL + SeaweedFS behind ``pt2reg serve``; blobs move through
  presigned URLs and the client has no cloud credentials

The tests are the same for every kind: a test that runs against a direct store runs against the
server unchanged (only ``cli_env`` differs).
"""
from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.cli_inprocess import Completed
from tests.fixtures_pt2 import cli_process, run_cli
from tests.shared import built_once

_FAKE_AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
             "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
             "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


@dataclass
class RegistryEnv:
    kind: str
    home: Path
    db: str
    store: str
    env: dict[str, str] = field(default_factory=dict)
    url: str | None = None      # set: clients reach the registry through this server only
    token: str | None = None    # the clients' token (admin) when ``url`` is set

    def cli_env(self, home: Path | None = None) -> dict[str, str | None]:
        """The variables pointing ``pt2reg`` at this registry (``home``: another machine's home)."""
        if self.url:
            unset = dict.fromkeys(("PT2REG_DB", "PT2REG_STORE", *_FAKE_AWS, "AWS_ENDPOINT_URL"))
            return {**unset, "PT2REG_HOME": str(home or self.home), "PT2REG_URL": self.url,
                    "PT2REG_TOKEN": self.token}
        return {**self.env, "PT2REG_HOME": str(home or self.home), "PT2REG_DB": self.db,
                "PT2REG_STORE": self.store}

    def cli(self, *args: Any, home: Path | None = None, cwd: Path | None = None) -> Completed:
        """``pt2reg ARGS`` against this registry, in the test process."""
        return run_cli(*args, env=self.cli_env(home), cwd=cwd)

    def cli_process(self, *args: Any, home: Path | None = None, **kwargs: Any):
        """``pt2reg ARGS`` against this registry in a fresh process (kills, races, limits)."""
        env = {k: v for k, v in self.cli_env(home).items() if v is not None}
        return cli_process(*args, env=env, **kwargs)

    def sql(self, *statements: str, **params: Any) -> list[list[tuple]]:
        """Run raw SQL on the registry's database (the attacker's view); rows of each statement.
        One write transaction from the start (``BEGIN IMMEDIATE`` on SQLite), so a read followed by
        a write never races a running server's head signer ("database is locked")."""
        from sqlalchemy import text

        from registry.store.engine import WRITE_OPTION, make_engine

        engine = make_engine(self.db)
        try:
            with engine.execution_options(**{WRITE_OPTION: True}).begin() as conn:
                out = []
                for stmt in statements:
                    result = conn.execute(text(stmt), params)
                    out.append([tuple(row) for row in result] if result.returns_rows else [])
                return out
        finally:
            engine.dispose()

    def s3_client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.env["AWS_ENDPOINT_URL"],
                            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
                            region_name="us-east-1")

    def blob_location(self, digest: str) -> tuple[str, str] | Path:
        hexd = digest.split(":", 1)[1]
        rel = f"blobs/sha256/{hexd[:2]}/{hexd}"
        if self.store.startswith("file://"):
            return Path(self.store[len("file://"):]) / rel
        bucket, _, prefix = self.store[len("s3://"):].partition("/")
        return bucket, f"{prefix}/{rel}" if prefix else rel

    def corrupt_blob(self, digest: str) -> None:
        loc = self.blob_location(digest)
        if isinstance(loc, Path):
            os.chmod(loc, 0o644)
            data = bytearray(loc.read_bytes())
            data[len(data) // 2] ^= 0xFF
            loc.write_bytes(bytes(data))
        else:
            client = self.s3_client()
            body = bytearray(client.get_object(Bucket=loc[0], Key=loc[1])["Body"].read())
            body[len(body) // 2] ^= 0xFF
            client.put_object(Bucket=loc[0], Key=loc[1], Body=bytes(body))

    def put_orphan(self, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        loc = self.blob_location(digest)
        if isinstance(loc, Path):
            loc.parent.mkdir(parents=True, exist_ok=True)
            loc.write_bytes(data)
        else:
            self.s3_client().put_object(Bucket=loc[0], Key=loc[1], Body=data)
        return digest

    def blob_exists(self, digest: str) -> bool:
        loc = self.blob_location(digest)
        if isinstance(loc, Path):
            return loc.exists()
        resp = self.s3_client().list_objects_v2(Bucket=loc[0], Prefix=loc[1])
        return resp.get("KeyCount", 0) > 0


def make_env(kind: str, tmp: Path, request: pytest.FixtureRequest) -> RegistryEnv:
    home = tmp / "home"
    if kind in ("server", "team-server"):
        return _behind_server(make_env(kind.replace("server", "").strip("-") or "local", tmp, request),
                              kind, request)
    if kind == "local":
        return RegistryEnv(kind, home, f"sqlite:///{tmp / 'registry.db'}", f"file://{tmp / 'store'}")
    if kind == "moto":
        endpoint = request.getfixturevalue("moto_endpoint")
        reg = RegistryEnv(kind, home, f"sqlite:///{tmp / 'registry.db'}", "",
                          {**_FAKE_AWS, "AWS_ENDPOINT_URL": endpoint})
        bucket = f"b-{uuid.uuid4().hex[:12]}"
        reg.s3_client().create_bucket(Bucket=bucket)
        reg.store = f"s3://{bucket}/reg"
        return reg
    if kind == "team":
        pg = request.getfixturevalue("pg_db_url")
        s3 = request.getfixturevalue("seaweed_s3")
        return RegistryEnv(kind, home, pg, f"s3://{s3.new_bucket()}/team", dict(s3.env))
    raise ValueError(kind)


def _behind_server(direct: RegistryEnv, kind: str, request: pytest.FixtureRequest) -> RegistryEnv:
    """``direct``'s database and store served by a real ``pt2reg serve`` process for the test."""
    from tests.services_server import make_token, registry_server

    if direct.kind != "local":  # the server refuses a database behind head
        r = direct.cli("db", "upgrade")
        assert r.returncode == 0, r.stderr
    server_env = {**direct.env, "PT2REG_HOME": str(direct.home.parent / "server-home")}
    ctx = registry_server(direct.db, direct.store, env=server_env, log_dir=direct.home.parent / "server-log")
    server = ctx.__enter__()
    request.addfinalizer(lambda: ctx.__exit__(None, None, None))
    token = make_token(direct.db, "ci-admin", ["admin"])
    return RegistryEnv(kind, direct.home, direct.db, direct.store, direct.env, url=server.url, token=token)


@pytest.fixture(params=["local", "moto", "server", pytest.param("team", marks=pytest.mark.integration),
                        pytest.param("team-server", marks=pytest.mark.integration)])
def reg_env(request: pytest.FixtureRequest, tmp_path: Path) -> RegistryEnv:
    reg = make_env(request.param, tmp_path, request)
    if reg.kind in ("moto", "team"):  # shared databases are never migrated silently
        r = reg.cli("db", "upgrade")
        assert r.returncode == 0, r.stderr
    return reg


@pytest.fixture(scope="session")
def bundles(pt2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``ed``: encoder/decoder with samples; ``v0``..``v5``: six distinct small bundles (built
    once per run, read only)."""
    def build(out: Path) -> None:
        from registry.bundler import ProgramInput, SampleInput, build_bundle

        build_bundle(out / "ed.pt2b", [ProgramInput("encoder", pt2_dir / "encoder.pt2"),
                                       ProgramInput("decoder", pt2_dir / "decoder.pt2")],
                     samples=[SampleInput("encoder", pt2_dir / "encoder_inputs.pt"),
                              SampleInput("decoder", pt2_dir / "decoder_inputs.pt")],
                     metadata={"owner": "nlp"})
        for i in range(6):
            build_bundle(out / f"v{i}.pt2b", [ProgramInput("decoder", pt2_dir / "decoder.pt2")],
                         metadata={"variant": str(i)})

    out = built_once(tmp_path_factory, "bundles", build)
    return {name: out / f"{name}.pt2b" for name in ("ed", *(f"v{i}" for i in range(6)))}


@pytest.fixture
def clean_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty registry home, the process's only one: ``PT2REG_HOME`` points at it and no
    other registry setting (a database, a store, a server, a token, a trust policy) leaks in."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("PT2REG_HOME", str(h))
    for var in ("PT2REG_DB", "PT2REG_STORE", "PT2REG_TRUST", "PT2REG_URL", "PT2REG_TOKEN",
                "PT2REG_ALLOWED_REGISTRIES"):
        monkeypatch.delenv(var, raising=False)
    return h


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    """A file a hostile payload would create if it ever ran; the test fails if it exists."""
    path = tmp_path / "PWNED"
    yield path
    assert not path.exists(), "code from a crafted artifact was executed"
