"""Issue 14, class 8: store and log integrity, through the CLI (in process) on every backend.

- publish re-checks, inside its transaction, that its pending-push claim is still live and
  that every blob it references is stored; gc and publish agree under the gc lock;
- heartbeats, version/alias rows and audit events carry the database's clock, not the client's;
- push never trusts a stored blob by its size: same-size garbage is replaced (local and S3);
- created_by, metadata and lineage edges are covered by the audit chain (a migration attests
  the versions published before it);
- text from manifests and the database reaches the terminal escaped (rich markup literal,
  control characters shown as escapes).
"""
from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from registry.cli import cli
from registry.client import Registry
from registry.config import Settings
from registry.format.bundle import BundleFile
from registry.store.engine import WRITE_OPTION
from tests.store_calls import publish

HOSTILE = {
    "note": "[bold red]FAKE: compatible[/]",
    "close": "[/x] [/]",
    "ansi": "\x1b[2J\rFORGED\nsecond line",
    "[b]k[/b]": "\u202egnp",
}


def pt2reg(reg_env, *args, home: Path | None = None, actor: str | None = None):
    """``pt2reg ARGS`` in this process, with the backend's settings."""
    env = {**reg_env.env, "PT2REG_HOME": str(home or reg_env.home), "PT2REG_DB": reg_env.db,
           "PT2REG_STORE": reg_env.store}
    if actor is not None:
        env["PT2REG_ACTOR"] = actor
    return CliRunner().invoke(cli, [str(a) for a in args], env=env, catch_exceptions=False)


def one_error(result, code: int) -> str:
    assert result.exit_code == code, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def registry_of(reg_env) -> Registry:
    os.environ.update(reg_env.env)  # boto3 reads the endpoint and credentials from here
    return Registry(Settings.resolve(home=str(reg_env.home), db=reg_env.db, store=reg_env.store))


def sql(reg: Registry, *statements: str, **params):
    """Raw SQL in one write transaction from the start (a read upgraded to a write could race
    a running server's head signer on SQLite)."""
    with reg.meta.engine.execution_options(**{WRITE_OPTION: True}).begin() as conn:
        return [conn.execute(text(stmt), params) for stmt in statements][-1]


def first_chunk(bundle: Path) -> tuple[str, int]:
    m = BundleFile.open(bundle).manifest.members[0]
    return (f"sha256:{m.chunks[0][0]}", m.chunks[0][1]) if m.chunks else (m.digest, m.size)


@pytest.fixture
def aws_env(reg_env, monkeypatch):
    for k, v in reg_env.env.items():
        monkeypatch.setenv(k, v)
    return reg_env


# -- 1. publish re-checks its claim and its blobs -------------------------------------------------

def _stall_push_then(monkeypatch, during_upload):
    """Run ``during_upload()`` after push uploaded its blobs, before it publishes."""
    from registry.store import SqlMetadataStore

    real = SqlMetadataStore.publish
    seen = {}

    def publish(self, *args, **kwargs):
        seen["claims"] = during_upload()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SqlMetadataStore, "publish", publish)
    return seen


def test_gc_reaps_a_stalled_push_and_its_publish_then_records_nothing(aws_env, bundles,
                                                                      monkeypatch, tmp_path):
    """The push's process is alive but looks stalled (another host, no heartbeat for ages):
    gc reaps its claim and deletes its blobs, and the push then fails with exit 6 instead of
    publishing a version that can never be pulled."""
    reg = registry_of(aws_env)
    chunk, _ = first_chunk(bundles["v1"])

    def stall():
        # what another host's push looks like after it stopped heartbeating for 5 minutes
        sql(reg, "UPDATE pending_pushes SET host = 'far-away', "
                 "heartbeat_at = '2000-01-01T00:00:00.000000Z'")
        result = registry_of(aws_env).gc()
        assert result.released_claims == 1 and any(d == chunk for d, _ in result.deleted), result
        return len(reg.meta.pending_claims())

    seen = _stall_push_then(monkeypatch, stall)
    line = one_error(pt2reg(aws_env, "push", bundles["v1"], "--name", "stalled"), 6)
    assert seen["claims"] == 0
    assert "claim" in line and "gc" in line and "nothing was recorded" in line
    monkeypatch.undo()
    assert pt2reg(aws_env, "show", "stalled").exit_code == 3  # no unpullable version
    assert not aws_env.blob_exists(chunk)
    assert [e.action for e in reg.meta.events() if e.action == "publish"] == []
    assert pt2reg(aws_env, "audit", "--verify").exit_code == 0
    # pushing again uploads what gc deleted, and the version pulls
    assert pt2reg(aws_env, "push", bundles["v1"], "--name", "stalled").exit_code == 0
    out = tmp_path / "p.pt2b"
    assert pt2reg(aws_env, "pull", "stalled@1", "-o", out).exit_code == 0
    assert out.read_bytes() == bundles["v1"].read_bytes()


@pytest.mark.parametrize("reg_env", ["local", "moto"], indirect=True)
def test_publish_refuses_a_version_whose_blob_vanished_even_with_a_live_claim(aws_env, bundles,
                                                                              monkeypatch):
    """A blob deleted behind the push's back (a foreign gc, an operator): exit 5 naming it."""
    reg = registry_of(aws_env)
    chunk, _ = first_chunk(bundles["v2"])
    _stall_push_then(monkeypatch, lambda: reg.blobs.delete(chunk))
    line = one_error(pt2reg(aws_env, "push", bundles["v2"], "--name", "gone"), 5)
    assert "missing from the blob store" in line and chunk in line
    monkeypatch.undo()
    assert pt2reg(aws_env, "show", "gone").exit_code == 3
    assert reg.meta.pending_claims() == []  # the claim was released


@pytest.mark.parametrize("reg_env", ["local", "moto"], indirect=True)
def test_gc_spares_a_remote_push_that_heartbeats_and_its_publish_succeeds(aws_env, bundles,
                                                                          monkeypatch):
    """The other side of the agreement: a claim gc sees alive keeps every blob."""
    reg = registry_of(aws_env)

    def remote_but_alive():
        sql(reg, "UPDATE pending_pushes SET host = 'far-away'")  # heartbeat is fresh
        result = registry_of(aws_env).gc()
        assert result.deleted == [] and result.released_claims == 0, result
        return len(reg.meta.pending_claims())

    seen = _stall_push_then(monkeypatch, remote_but_alive)
    r = pt2reg(aws_env, "push", bundles["v3"], "--name", "alive")
    assert r.exit_code == 0, r.output
    assert seen["claims"] == 1
    assert pt2reg(aws_env, "pull", "alive@1", "-o", aws_env.home / "a.pt2b").exit_code == 0


@pytest.mark.parametrize("reg_env", ["local"], indirect=True)
def test_a_reaped_claim_also_fails_an_identical_republish(aws_env, bundles, monkeypatch):
    """Even when the content is already a version (nothing new to record), a push whose claim
    was reaped does not move aliases: the whole publish is refused."""
    assert pt2reg(aws_env, "push", bundles["v4"], "--name", "same").exit_code == 0
    reg = registry_of(aws_env)
    _stall_push_then(monkeypatch, lambda: sql(reg, "DELETE FROM pending_pushes"))
    one_error(pt2reg(aws_env, "push", bundles["v4"], "--name", "same", "--alias", "prod"), 6)
    monkeypatch.undo()
    assert pt2reg(aws_env, "show", "same@prod").exit_code == 3


# -- 2. the database's clock --------------------------------------------------------------------

class _Skewed(datetime):
    offset = timedelta(0)

    @classmethod
    def now(cls, tz=None):
        return datetime.now(tz) + cls.offset


@pytest.fixture
def skew(monkeypatch):
    """Set the client's clock ``offset`` away from the truth (every registry module that reads
    ``datetime.now``; the store used to stamp rows and events with it)."""
    import registry.client.gc
    import registry.client.provenance
    import registry.client.sources
    import registry.store.audit_chain
    import registry.store.gc
    import registry.store.orm

    def set_offset(offset: timedelta):
        _Skewed.offset = offset
        for mod in (registry.client.gc, registry.store.gc, registry.client.provenance, registry.client.sources,
                    registry.store.orm, registry.store.audit_chain):
            monkeypatch.setattr(mod, "datetime", _Skewed, raising=False)

    yield set_offset
    _Skewed.offset = timedelta(0)


def _close_to_now(when: datetime, slack: float = 120.0) -> bool:
    return abs((when - datetime.now(timezone.utc)).total_seconds()) < slack


@pytest.mark.parametrize("reg_env", ["local", pytest.param("team", marks=pytest.mark.integration)],
                         indirect=True)
@pytest.mark.parametrize("offset", [timedelta(days=3650), -timedelta(days=400)], ids=["ahead", "behind"])
def test_a_skewed_client_clock_stamps_nothing_and_show_at_still_works(reg_env, bundles, skew,
                                                                     offset):
    skew(offset)
    assert pt2reg(reg_env, "push", bundles["v0"], "--name", "clock", "--alias", "prod").exit_code == 0
    assert pt2reg(reg_env, "alias", "set", "clock", "staging", "1").exit_code == 0
    skew(timedelta(0))
    assert pt2reg(reg_env, "push", bundles["v1"], "--name", "clock").exit_code == 0
    assert pt2reg(reg_env, "alias", "set", "clock", "prod", "2").exit_code == 0
    reg = registry_of(reg_env)
    events = reg.meta.events()
    assert events and all(_close_to_now(e.ts) for e in events), [e.ts for e in events]
    v1 = reg.meta.resolve("clock@1")
    assert _close_to_now(v1.created_at)
    assert all(_close_to_now(a.updated_at) for a in reg.meta.aliases("clock"))
    # time travel answers from database time: prod is at 2 now, whatever the skewed client said
    now = datetime.now(timezone.utc) + timedelta(seconds=5)
    r = pt2reg(reg_env, "show", "clock@prod", "--at", now.strftime("%Y-%m-%dT%H:%M:%SZ"), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["version"] == 2
    assert pt2reg(reg_env, "audit", "--verify").exit_code == 0


@pytest.mark.parametrize("reg_env", ["local", pytest.param("team", marks=pytest.mark.integration)],
                         indirect=True)
@pytest.mark.parametrize("offset", [timedelta(hours=1), -timedelta(hours=1)], ids=["ahead", "behind"])
def test_claim_liveness_is_judged_by_database_time(aws_env, skew, offset):
    """A remote claim's heartbeat is stamped by the database and judged against it: a client
    clock an hour ahead cannot reap a live push, one an hour behind cannot keep a dead one."""
    reg = registry_of(aws_env)
    data = f"orphan {offset}".encode()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    reg.blobs.put_bytes(data, digest)
    skew(offset)
    claim = reg.meta.begin_pending([digest], host="far-away", pid=1)
    [pending] = reg.meta.pending_claims()
    assert _close_to_now(pending.heartbeat_at, slack=60)
    if offset < timedelta(0):  # the push stopped heartbeating two minutes ago (database time)
        sql(reg, "UPDATE pending_pushes SET heartbeat_at = :t",
            t=(reg.meta.db_now() - timedelta(minutes=2)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
    result = registry_of(aws_env).gc()
    if offset > timedelta(0):
        assert result.deleted == [] and reg.blobs.exists(digest)
        assert [c.id for c in reg.meta.pending_claims()] == [claim]
    else:
        assert result.deleted == [(digest, len(data))] and not reg.blobs.exists(digest)
        assert reg.meta.pending_claims() == [] and result.released_claims == 1


# -- 3. a stored blob is trusted only once it is proven to be the right bytes ----------------------

def _plant(reg_env, digest: str, data: bytes, *, with_checksum: bool = False) -> None:
    loc = reg_env.blob_location(digest)
    if isinstance(loc, Path):
        loc.parent.mkdir(parents=True, exist_ok=True)
        if loc.exists():
            os.chmod(loc, 0o644)
        loc.write_bytes(data)
    else:
        extra = {"ChecksumAlgorithm": "SHA256"} if with_checksum else {}
        reg_env.s3_client().put_object(Bucket=loc[0], Key=loc[1], Body=data, **extra)


def _stored(reg_env, digest: str) -> bytes:
    loc = reg_env.blob_location(digest)
    if isinstance(loc, Path):
        return loc.read_bytes()
    return reg_env.s3_client().get_object(Bucket=loc[0], Key=loc[1])["Body"].read()


@pytest.mark.parametrize("variant", ["chunk", "chunk-with-own-checksum", "manifest"])
def test_same_size_garbage_planted_in_the_store_is_replaced_by_push(aws_env, bundles, tmp_path,
                                                                    variant):
    good = bundles["ed"]
    manifest = BundleFile.open(good).manifest
    digest, size = ((manifest.digest, len(manifest.canonical)) if variant == "manifest"
                    else first_chunk(good))
    # planted before anyone pushes (a shared store) and again after a push (a later attack)
    _plant(aws_env, digest, os.urandom(size), with_checksum=variant.endswith("checksum"))
    members = BundleFile.open(good).manifest.members
    everything = sum(dict([("sha256:" + h, n) for m in members for h, n in m.chunks]
                          + [(m.digest, m.size) for m in members if not m.chunks]).values())
    r = pt2reg(aws_env, "push", good, "--name", "a", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["uploaded_bytes"] == everything  # the planted chunk too
    assert hashlib.sha256(_stored(aws_env, digest)).hexdigest() == digest[7:]
    _plant(aws_env, digest, os.urandom(size), with_checksum=variant.endswith("checksum"))
    assert pt2reg(aws_env, "push", good, "--name", "b").exit_code == 0
    assert hashlib.sha256(_stored(aws_env, digest)).hexdigest() == digest[7:]
    out = tmp_path / "b.pt2b"
    r = pt2reg(aws_env, "pull", "b@1", "-o", out, home=tmp_path / "fresh-home")
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == good.read_bytes()


@pytest.mark.parametrize("reg_env", ["local", "moto"], indirect=True)
def test_an_intact_stored_blob_is_still_skipped(aws_env, bundles):
    """Proof by content is not a re-upload: a second push of the same bytes uploads nothing."""
    assert pt2reg(aws_env, "push", bundles["ed"], "--name", "a").exit_code == 0
    r = pt2reg(aws_env, "push", bundles["ed"], "--name", "b", "--json")
    doc = json.loads(r.stdout)
    assert (doc["uploaded_bytes"], doc["skipped_bytes"] > 0) == (0, True), doc


@pytest.mark.parametrize("server", ["moto", pytest.param("seaweed", marks=pytest.mark.integration)])
def test_s3_checksums_prove_stored_objects_single_and_multipart(server, request, tmp_path,
                                                                monkeypatch):
    """Objects uploaded by the store carry a SHA-256 checksum; a re-push skips them only when
    it matches (multipart: S3's composite of part checksums), and replaces same-size garbage."""
    from registry.blobs.base import Part
    from registry.blobs.s3 import S3BlobStore

    if server == "moto":
        endpoint = request.getfixturevalue("moto_endpoint")
        from tests.fixtures_registry import _FAKE_AWS

        env = {**_FAKE_AWS, "AWS_ENDPOINT_URL": endpoint}
    else:
        env = dict(request.getfixturevalue("seaweed_s3").env)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    import boto3

    client = boto3.client("s3", region_name="us-east-1")
    bucket = f"ck-{os.urandom(6).hex()}"
    client.create_bucket(Bucket=bucket)
    store = S3BlobStore(f"s3://{bucket}/p", multipart_threshold=5 << 20, multipart_chunksize=5 << 20)
    small, big = os.urandom(4096), os.urandom((11 << 20) + 7)
    src = tmp_path / "src.bin"
    src.write_bytes(small + big)
    parts = [Part("sha256:" + hashlib.sha256(small).hexdigest(), 0, len(small)),
             Part("sha256:" + hashlib.sha256(big).hexdigest(), len(small), len(big))]
    assert store.put_parts(src, parts) == (len(small) + len(big), 0)
    assert store._checksum_state(parts[0].digest, len(small)) is True
    uploaded, skipped = store.put_parts(src, parts)
    assert (uploaded, skipped) == (0, len(small) + len(big))
    for part, size in ((parts[0], len(small)), (parts[1], len(big))):
        client.put_object(Bucket=bucket, Key=store._key(part.digest), Body=os.urandom(size))
        assert store._checksum_state(part.digest, size) is None  # no usable checksum: unproven
    assert store.put_parts(src, parts) == (len(small) + len(big), 0)
    for part in parts:
        body = client.get_object(Bucket=bucket, Key=store._key(part.digest))["Body"].read()
        assert hashlib.sha256(body).hexdigest() == part.digest[7:]


# -- 4. lineage, created_by and metadata are covered by the audit chain ----------------------------

EDITS = [
    ("created_by", "UPDATE versions SET created_by = 'mallory@evil'"),
    ("metadata", """UPDATE versions SET metadata_json = '{"variant":"9"}'"""),
    ("metadata-added", """UPDATE versions SET metadata_json = '{"approved":"yes","variant":"0"}'"""),
    ("lineage-value", "UPDATE lineage_edges SET value = 's3://other/data' WHERE kind = 'dataset'"),
    ("lineage-deleted", "DELETE FROM lineage_edges WHERE kind = 'run'"),
    ("lineage-added", "INSERT INTO lineage_edges (version_id, kind, value) "
                      "SELECT id, 'run', 'forged-run' FROM versions"),
]


@pytest.mark.parametrize("reg_env", ["local", pytest.param("team", marks=pytest.mark.integration)],
                         indirect=True)
def test_database_edits_of_lineage_created_by_and_metadata_fail_audit_verify(reg_env, bundles):
    assert pt2reg(reg_env, "push", bundles["v0"], "--name", "lin", "--dataset", "s3://corp/data",
                  "--run-id", "run-7", "--git-commit", "c" * 40).exit_code == 0
    assert pt2reg(reg_env, "audit", "--verify").exit_code == 0
    reg = registry_of(reg_env)
    with reg.meta.engine.connect() as conn:
        saved_versions = conn.execute(text("SELECT id, created_by, metadata_json FROM versions")).all()
        saved_edges = conn.execute(text("SELECT id, version_id, kind, value, digest, extra_json "
                                        "FROM lineage_edges")).all()
    for what, statement in EDITS:
        sql(reg, statement)
        line = one_error(pt2reg(reg_env, "audit", "--verify"), 5)
        assert "lin@1" in line and "created_by" in line, (what, line)
        # put the tables back exactly as they were: intact again
        sql(reg, "DELETE FROM lineage_edges")
        with reg.meta.engine.begin() as conn:
            for vid, by, meta in saved_versions:
                conn.execute(text("UPDATE versions SET created_by = :by, metadata_json = :m "
                                  "WHERE id = :id"), {"by": by, "m": meta, "id": vid})
            for row in saved_edges:
                conn.execute(text("INSERT INTO lineage_edges (id, version_id, kind, value, digest, "
                                  "extra_json) VALUES (:id, :v, :k, :val, :d, :e)"),
                             dict(zip(("id", "v", "k", "val", "d", "e"), row)))
        assert pt2reg(reg_env, "audit", "--verify").exit_code == 0, what


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def test_migration_attests_versions_published_before_it(backend, request, tmp_path, monkeypatch):
    """A database at 0001 whose publish events predate ``fields`` upgrades; its chain still
    verifies, the new attest events vouch for each version, and later edits are caught."""
    from alembic import command

    from registry.store import audit_log as audit_log_mod
    from registry.store import make_engine, migrate
    from registry.store.sql import SqlMetadataStore

    url = (f"sqlite:///{tmp_path / 'old.db'}" if backend == "sqlite"
           else request.getfixturevalue("pg_db_url"))
    engine = make_engine(url)
    with engine.begin() as conn:
        command.upgrade(migrate._config(conn), "0001_initial")
    real_append = audit_log_mod.append_event

    def old_append(session, action, **kw):  # what 0001 software wrote: no "fields"
        kw["details"] = {k: v for k, v in (kw.get("details") or {}).items() if k != "fields"}
        return real_append(session, action, **kw)

    store = SqlMetadataStore(engine)
    who = {"actor": "ana", "host": "h"}
    monkeypatch.setattr(audit_log_mod, "append_event", old_append)
    monkeypatch.setattr(audit_log_mod.outbox, "enqueue", lambda *a, **k: 0)  # 0001 had no webhooks
    for i in range(3):
        d = "sha256:" + hashlib.sha256(b"v%d" % i).hexdigest()
        publish(store, "old", d, "{}", 1, [("sha256:" + hashlib.sha256(b"b%d" % i).hexdigest(), 1)],
                      metadata={"i": str(i)}, lineage=[("run", f"r{i}")], **who)
    monkeypatch.undo()
    verdict = store.verify_audit_chain()
    assert not verdict.ok and "created_by" in verdict.reason  # at 0001 nothing vouches for them
    before = [e.hash for e in store.events()]
    assert migrate.upgrade(engine) == ("0001_initial", migrate.HEAD_REVISION)
    events = store.events()
    assert [e.hash for e in events[:len(before)]] == before  # nothing rewritten
    assert [(e.action, e.version) for e in events[len(before):]] == [("attest", n) for n in (1, 2, 3)]
    assert store.verify_audit_chain().ok
    with engine.begin() as conn:
        conn.execute(text("UPDATE lineage_edges SET value = 'forged' WHERE value = 'r2'"))
    verdict = store.verify_audit_chain()
    assert not verdict.ok and "old@3" in verdict.reason and verdict.first_bad_seq == events[-1].seq
    engine.dispose()


# -- 5. text from manifests and the database is escaped before the terminal ------------------------

@pytest.fixture(scope="module")
def hostile_bundle(pt2_dir, tmp_path_factory) -> Path:
    from registry.bundler import ProgramInput, build_bundle

    path = tmp_path_factory.mktemp("markup") / "[red]evil[/red] [/x].pt2b"
    build_bundle(path, [ProgramInput("decoder", pt2_dir / "decoder.pt2")], metadata=HOSTILE)
    return path


def _assert_literal(output: str) -> None:
    assert "[bold red]FAKE: compatible[/]" in output, output
    assert "[/x] [/]" in output and "[b]k[/b]" in output
    assert "\x1b" not in output and "\r" not in output and "\u202e" not in output
    assert "\\x1b[2J" in output and "\\rFORGED" in output and "\\u202e" in output
    assert not any(line.startswith(("FORGED", "second line")) for line in output.splitlines())


@pytest.mark.parametrize("reg_env", ["local"], indirect=True)
def test_markup_and_control_characters_print_literally_in_every_view(reg_env, hostile_bundle):
    actor = "[b]root[/b]\x1b[0m"
    r = pt2reg(reg_env, "inspect", hostile_bundle)
    assert r.exit_code == 0, r.output
    _assert_literal(r.stdout)
    assert "[red]evil[/red] [/x].pt2b" in r.stdout  # the file name too

    r = pt2reg(reg_env, "push", hostile_bundle, "--name", "mk", "--run-id", "[/run]\x1b[2J",
               "--dataset", "s3://[bold]d[/bold]", "--git-commit", "c" * 40, actor=actor)
    assert r.exit_code == 0, r.output
    r = pt2reg(reg_env, "show", "mk@1")
    assert r.exit_code == 0, r.output
    _assert_literal(r.stdout)
    assert "[b]root[/b]\\x1b[0m" in r.stdout
    r = pt2reg(reg_env, "yank", "mk@1", "--reason", "[/] \x1b[2J[green]ok[/green]")
    assert r.exit_code == 0, r.output
    r = pt2reg(reg_env, "list", "mk")
    assert r.exit_code == 0, r.output
    assert "[/] \\x1b[2J[green]ok[/green]" in r.stdout and "[b]root[/b]" in r.stdout
    r = pt2reg(reg_env, "audit")
    assert r.exit_code == 0, r.output
    assert "[b]root[/b]\\x1b[0m" in r.stdout and "\x1b" not in r.stdout
    r = pt2reg(reg_env, "lineage", "mk@1")
    assert r.exit_code == 0, r.output
    assert "[/run]\\x1b[2J" in r.stdout and "s3://[bold]d[/bold]" in r.stdout
    assert "\x1b" not in r.stdout
    r = pt2reg(reg_env, "lineage", "mk@1", "--dot")
    assert r.exit_code == 0 and "\x1b" not in r.stdout and "[/run]\\\\x1b[2J" in r.stdout, r.stdout
    r = pt2reg(reg_env, "lineage", "--dataset", "s3://[bold]d[/bold]")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("reg_env", ["local"], indirect=True)
def test_database_text_edited_to_markup_prints_literally(reg_env, bundles):
    """Values only the database holds (an edited status reason, action, digest) are escaped."""
    assert pt2reg(reg_env, "push", bundles["v5"], "--name", "db").exit_code == 0
    reg = registry_of(reg_env)
    sql(reg, "UPDATE versions SET status = 'deprecated', status_reason = '[/x]\r[bold]FAKE[/]', "
             "digest = '[red]sha256:forged[/red]'")
    sql(reg, "UPDATE audit_events SET action = '[/]\x1b[31m', digest = '[/z]'")
    for args in (("list", "db"), ("show", "db@1"), ("audit",)):
        r = pt2reg(reg_env, *args)
        assert r.exit_code == 0, (args, r.output)
        assert "\x1b" not in r.stdout and "\r" not in r.stdout
    assert "[/x]\\r[bold]FAKE[/]" in pt2reg(reg_env, "show", "db@1").stdout
    assert "[red]sha256:forged[/red]" in pt2reg(reg_env, "show", "db@1").stdout
    assert "[/]\\x1b[31m" in pt2reg(reg_env, "audit").stdout


def test_verify_report_prints_manifest_text_literally(hostile_bundle, tmp_path):
    r = CliRunner().invoke(cli, ["--home", str(tmp_path / "h"), "verify", str(hostile_bundle)],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "[red]evil[/red] [/x].pt2b" in r.stdout
    assert "compatible" in r.stdout


def test_clean_and_esc_units():
    from rich.console import Console

    from registry.cli.render import clean, esc

    for hostile in ("[bold red]FAKE[/]", "[/x]", "[/]", "x\\", "[link=file:///etc/passwd]a[/link]",
                    "\x1b]8;;http://evil\x07click\x1b]8;;\x07", "a\rb\nc\x00\x7f\x9b"):
        console = Console(width=200, record=True, file=open(os.devnull, "w"))
        console.print(f"[bold]{esc(hostile)}[/bold]")
        shown = console.export_text()
        assert shown.rstrip("\n") == clean(hostile), (hostile, shown)
        assert not any(ord(c) < 32 or 0x7f <= ord(c) <= 0x9f for c in shown.rstrip("\n"))
