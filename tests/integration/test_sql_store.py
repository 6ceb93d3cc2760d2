"""Contract of SqlMetadataStore, run on a SQLite file and on a real PostgreSQL server."""
from __future__ import annotations

import multiprocessing
import sqlite3
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text

from registry.errors import ConflictError, NotFoundError, StoreError, UsageError
from registry.refs import Ref
from registry.store import LineageEdge, SignatureRecord, SqlMetadataStore, make_engine, open_metadata_store
from tests.store_calls import publish as store_publish
from tests.until import HANG_GUARD_S

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.integration)]
WHO = {"actor": "ana", "host": "gpu-1"}
WORKERS = 6


def D(tag: str | int) -> str:
    """A digest made from a short tag, e.g. D('a1')."""
    return "sha256:" + str(tag).encode().hex().ljust(64, "0")[:64]


def open_store(url: str) -> SqlMetadataStore:
    return open_metadata_store(url, auto_create=True)


@pytest.fixture
def store(sql_store):  # tests.services_pg: once per backend (SQLite, PostgreSQL)
    return sql_store


def publish(store: SqlMetadataStore, name: str, tag: str, **kwargs):
    kwargs = {**WHO, **kwargs}
    blobs = kwargs.pop("blobs", [(D("blob-" + tag), 100)])
    return store_publish(store, name, D(tag), f'{{"tag": "{tag}"}}', 100, blobs, **kwargs)


# -- publish and resolve ---------------------------------------------------------------------

def test_publish_assigns_numbers_and_returns_a_full_record(store):
    v1, created = publish(store, "team/bert", "a", aliases=["prod"], metadata={"acc": 0.9},
                          build={"torch": "2.13.0"}, environment={"python": "3.11.9"},
                          ref_for_audit="bundle.pt2b")
    assert created and v1.number == 1 and v1.ref == "team/bert@1"
    assert (v1.digest, v1.size, v1.status, v1.status_reason) == (D("a"), 100, "active", None)
    assert (v1.created_by, v1.metadata, v1.build, v1.aliases) == (
        "ana", {"acc": 0.9}, {"torch": "2.13.0"}, ["prod"])
    assert v1.manifest_json == '{"tag": "a"}'
    assert v1.environment == {"python": "3.11.9"}
    assert store.build_info("team/bert", 1) == {"torch": "2.13.0"}
    assert v1.created_at.tzinfo is not None
    v2, _ = publish(store, "team/bert", "b")
    assert v2.number == 2
    assert publish(store, "other", "a")[0].number == 1  # numbering is per model


def test_republishing_identical_content_returns_the_existing_version(store):
    v1, _ = publish(store, "bert", "a")
    publish(store, "bert", "b")
    again, created = publish(store, "bert", "a", aliases=["staging"],
                             signatures=[("k" * 64, "ed25519", "c2ln")])
    assert not created and again.number == v1.number and again.digest == v1.digest
    assert again.aliases == ["staging"]
    assert [v.number for v in store.list_versions("bert")] == [1, 2]
    assert [s.key_id for s in store.signatures("bert", 1)] == ["k" * 64]
    actions = [e.action for e in store.events(model="bert")]
    assert actions == ["publish", "publish", "sign", "alias.set"]


def test_resolve_every_ref_kind(store):
    publish(store, "bert", "a")
    publish(store, "bert", "b", aliases=["prod"])
    publish(store, "bert", "c")
    assert store.resolve(Ref.parse("bert")).number == 3
    assert store.resolve(Ref.parse("bert@1")).digest == D("a")
    assert store.resolve(Ref.parse("bert@prod")).number == 2
    assert store.resolve(Ref.parse(f"bert@{D('c')}")).number == 3
    assert store.resolve("bert@prod").aliases == ["prod"]  # text refs are parsed too


def test_latest_skips_yanked_but_a_pinned_ref_still_resolves(store):
    publish(store, "bert", "a")
    publish(store, "bert", "b")
    store.set_status("bert", 2, "yanked", "NaNs on fp16", **WHO)
    assert store.resolve("bert").number == 1
    pinned = store.resolve("bert@2")
    assert (pinned.status, pinned.status_reason, pinned.status_by) == (
        "yanked", "NaNs on fp16", "ana")
    store.set_status("bert", 1, "yanked", "also bad", **WHO)
    with pytest.raises(NotFoundError, match="every version of model 'bert' is yanked"):
        store.resolve("bert")


@pytest.mark.parametrize("ref, what, message", [
    ("nope", "model", "model 'nope' not found"),
    ("nope@1", "model", "model 'nope' not found"),
    ("bert@7", "version", "model 'bert' has no version 7 (latest is 2)"),
    ("bert@canary", "alias", "model 'bert' has no alias 'canary'"),
    (f"bert@{D('zz')}", "digest", "model 'bert' has no version with digest"),
])
def test_not_found_names_what_is_missing(store, ref, what, message):
    publish(store, "bert", "a", aliases=["prod"])
    publish(store, "bert", "b")
    with pytest.raises(NotFoundError) as caught:
        store.resolve(ref)
    assert caught.value.what == what and caught.value.exit_code == 3
    assert caught.value.one_line().startswith(message)
    assert "\n" not in caught.value.one_line()


def test_lookups_by_number_report_missing_models_and_versions(store):
    with pytest.raises(NotFoundError, match="model 'ghost' not found"):
        store.list_versions("ghost")
    publish(store, "bert", "a")
    for lookup in (store.get_manifest, store.version_blobs, store.signatures):
        with pytest.raises(NotFoundError, match=r"no version 5 \(latest is 1\)"):
            lookup("bert", 5)


def test_manifest_blobs_and_signatures_round_trip(store):
    blobs = [(D("x"), 10), (D("y"), 20), (D("x"), 10)]
    sig = SignatureRecord(D("key1"), "ed25519", "c2lnbmF0dXJl")
    entry = {"algorithm": "ed25519", "key_id": D("key2"), "digest": D("a"), "signature": "c2ln"}
    publish(store, "bert", "a", blobs=blobs, signatures=[sig, entry])
    assert store.get_manifest("bert", 1) == '{"tag": "a"}'
    assert store.version_blobs("bert", 1) == [(D("x"), 10), (D("y"), 20)]
    got = store.signatures("bert", 1)
    assert [(s.key_id, s.algorithm, s.signature) for s in got] == [
        (D("key1"), "ed25519", sig.signature), (D("key2"), "ed25519", "c2ln")]
    assert got[1].to_json() == entry and got[0].digest == D("a")
    with pytest.raises(NotFoundError, match="has no version 2"):
        store.signatures("bert", 2)
    with pytest.raises(NotFoundError, match="model 'nobody' not found"):
        store.signatures("nobody", 1)
    assert store.referenced_blobs() == {D("x"), D("y")}
    with pytest.raises(UsageError, match="not for this version"):
        publish(store, "bert", "b", signatures=[{**entry, "digest": D("zz")}])


def test_bad_input_is_a_usage_error_before_any_write(store):
    with pytest.raises(UsageError):
        store_publish(store, "Bad Name", D("a"), "{}", 1, [], **WHO)
    with pytest.raises(UsageError):
        store_publish(store, "bert", "sha256:nothex", "{}", 1, [], **WHO)
    with pytest.raises(UsageError):
        publish(store, "bert", "a", aliases=["123"])
    with pytest.raises(UsageError):
        publish(store, "bert", "a", lineage=[LineageEdge("weights", "x")])
    with pytest.raises(UsageError):
        publish(store, "bert", "a", blobs=[(D("x"), 1), (D("x"), 2)])
    with pytest.raises(UsageError):
        publish(store, "bert", "a", metadata={"t": object()})
    assert store.list_models() == []


# -- listing, aliases, lifecycle ---------------------------------------------------------------

def test_list_models_and_versions(store):
    publish(store, "bert", "a")
    publish(store, "bert", "b", aliases=["prod", "staging"])
    publish(store, "alpha", "c")
    models = store.list_models()
    assert [(m.name, m.version_count, m.latest) for m in models] == [("alpha", 1, 1),
                                                                       ("bert", 2, 2)]
    assert models[1].aliases == {"prod": 2, "staging": 2}
    versions = store.list_versions("bert")
    assert [(v.number, v.aliases) for v in versions] == [(1, []), (2, ["prod", "staging"])]
    assert all(v.manifest_json is None for v in versions)


def test_alias_set_move_remove_are_audited(store):
    publish(store, "bert", "a")
    publish(store, "bert", "b")
    assert store.set_alias("bert", "prod", 1, **WHO).number == 1
    moved = store.set_alias("bert", "prod", 2, actor="bob", host="laptop")
    assert (moved.number, moved.digest, moved.updated_by) == (2, D("b"), "bob")
    store.set_alias("bert", "prod", 2, **WHO)  # no change, no event
    assert [(a.alias, a.number) for a in store.aliases("bert")] == [("prod", 2)]
    removed = store.remove_alias("bert", "prod", **WHO)
    assert removed.number == 2
    with pytest.raises(NotFoundError) as caught:
        store.remove_alias("bert", "prod", **WHO)
    assert caught.value.what == "alias"
    events = [(e.action, e.version, e.details) for e in store.events(model="bert")][2:]
    assert events == [("alias.set", 1, {"alias": "prod"}),
                      ("alias.move", 2, {"alias": "prod", "from": 1}),
                      ("alias.remove", 2, {"alias": "prod"})]


def test_alias_to_missing_or_yanked_version_is_refused(store):
    publish(store, "bert", "a")
    with pytest.raises(NotFoundError, match="no version 4"):
        store.set_alias("bert", "prod", 4, **WHO)
    store.set_status("bert", 1, "yanked", "broken", **WHO)
    with pytest.raises(ConflictError, match="yanked"):
        store.set_alias("bert", "prod", 1, **WHO)


def test_deprecate_yank_restore(store):
    publish(store, "bert", "a")
    with pytest.raises(UsageError, match="reason"):
        store.set_status("bert", 1, "deprecated", "  ", **WHO)
    with pytest.raises(UsageError):
        store.set_status("bert", 1, "deleted", "x", **WHO)
    assert store.set_status("bert", 1, "deprecated", "use v2", **WHO).status == "deprecated"
    assert store.resolve("bert").number == 1  # deprecated is still eligible as latest
    store.set_status("bert", 1, "yanked", "leak", **WHO)
    restored = store.set_status("bert", 1, "active", None, **WHO)
    assert (restored.status, restored.status_reason) == ("active", None)
    assert [e.action for e in store.events(model="bert")][1:] == ["deprecate", "yank",
                                                                   "restore"]


def test_alias_at_answers_from_history(store):
    publish(store, "bert", "a")
    publish(store, "bert", "b")
    publish(store, "bert", "c")
    before = datetime.now(timezone.utc)
    time.sleep(0.002)
    store.set_alias("bert", "prod", 1, **WHO)
    t1 = datetime.now(timezone.utc)
    time.sleep(0.002)
    store.set_alias("bert", "prod", 2, **WHO)
    t2 = datetime.now(timezone.utc)
    time.sleep(0.002)
    store.set_alias("bert", "prod", 3, **WHO)
    t3 = datetime.now(timezone.utc)
    time.sleep(0.002)
    store.remove_alias("bert", "prod", **WHO)
    assert store.alias_at("bert", "prod", before) is None
    assert [store.alias_at("bert", "prod", t) for t in (t1, t2, t3)] == [1, 2, 3]
    assert store.alias_at("bert", "prod", datetime.now(timezone.utc)) is None
    assert store.alias_at("bert", "staging", t3) is None
    with pytest.raises(NotFoundError):
        store.alias_at("ghost", "prod", t3)


# -- lineage -----------------------------------------------------------------------------------

def three_generations(store):
    dataset = LineageEdge("dataset", "s3://data/train", D("ds"))
    publish(store, "bert", "v1", lineage=[dataset, LineageEdge("run", "run-1"),
                                          LineageEdge("commit", "abc123", extra={"dirty": True})])
    publish(store, "bert", "v2", aliases=["prod"],
            lineage=[LineageEdge("parent", "bert@1", D("v1")), LineageEdge("run", "run-2")])
    publish(store, "distil", "d1", lineage=[{"kind": "parent", "value": "bert@2",
                                             "digest": D("v2")}])


def test_ancestors_descendants_and_dataset_query(store):
    three_generations(store)
    up = store.ancestors("distil", 1)
    assert [(n.ref, n.depth) for n in up] == [("distil@1", 0), ("bert@2", 1), ("bert@1", 2)]
    assert up[0].parents == [D("v2")] and up[1].aliases == ["prod"]
    kinds = {e.kind: e for e in up[2].edges}
    assert kinds["dataset"].value == "s3://data/train" and kinds["commit"].extra == {
        "dirty": True}
    down = store.descendants("bert", 1)
    assert [(n.ref, n.depth) for n in down] == [("bert@1", 0), ("bert@2", 1), ("distil@1", 2)]
    assert [n.ref for n in store.descendants("distil", 1)] == ["distil@1"]
    found = store.versions_from_dataset("s3://data/train")
    assert [(n.ref, n.depth, n.aliases) for n in found] == [
        ("bert@1", 0, []), ("bert@2", 1, ["prod"]), ("distil@1", 2, [])]
    assert [n.ref for n in store.versions_from_dataset("s3://data/train", digest=D("ds"))] \
        == ["bert@1", "bert@2", "distil@1"]
    assert store.versions_from_dataset("s3://data/train", digest=D("other")) == []
    assert store.versions_from_dataset("s3://unused") == []


def test_parent_must_exist(store):
    with pytest.raises(NotFoundError, match="not in this registry"):
        publish(store, "bert", "a", lineage=[LineageEdge("parent", "x@1", D("missing"))])
    with pytest.raises(UsageError, match="digest"):
        publish(store, "bert", "a", lineage=[LineageEdge("parent", "x@1")])


# -- audit ---------------------------------------------------------------------------------------

def test_events_and_filters(store):
    publish(store, "bert", "a", aliases=["prod"])
    cut = datetime.now(timezone.utc)
    time.sleep(0.002)
    publish(store, "other", "b")
    pulled = store.record_event("pull", actor="svc", host="inf-3", model="bert", number=1,
                                digest=D("a"), ref="bert@prod", details={"cache": "miss"})
    assert (pulled.seq, pulled.ref, pulled.details) == (4, "bert@prod", {"cache": "miss"})
    assert [e.action for e in store.events()] == ["publish", "alias.set", "publish", "pull"]
    assert [e.seq for e in store.events(model="bert")] == [1, 2, 4]
    assert [e.seq for e in store.events(since=cut)] == [3, 4]
    assert [e.seq for e in store.events(model="bert", since=cut)] == [4]
    events = store.events()
    assert all(b.ts >= a.ts and b.prev_hash == a.hash for a, b in zip(events, events[1:]))


def audit_sql(store: SqlMetadataStore, statement: str) -> None:
    with store.engine.begin() as conn:
        conn.execute(text(statement))


def fill_log(store):
    three_generations(store)  # 4 events
    store.set_alias("bert", "prod", 1, **WHO)
    store.record_event("pull", actor="svc", host="inf", model="bert", number=1)
    assert store.verify_audit_chain() == (True, None, "6 events, chain intact")


def test_audit_verify_detects_an_edited_field(store):
    fill_log(store)
    audit_sql(store, "UPDATE audit_events SET actor = 'mallory' WHERE seq = 3")
    ok, seq, reason = store.verify_audit_chain()
    assert (ok, seq) == (False, 3) and "altered" in reason


def test_audit_verify_detects_an_edited_timestamp_or_details(store):
    fill_log(store)
    audit_sql(store, "UPDATE audit_events SET ts = '2020-01-01T00:00:00.000000Z' WHERE seq = 5")
    assert store.verify_audit_chain()[:2] == (False, 5)


def test_audit_verify_detects_a_deleted_event(store):
    fill_log(store)
    audit_sql(store, "DELETE FROM audit_events WHERE seq = 2")
    ok, seq, reason = store.verify_audit_chain()
    assert (ok, seq) == (False, 3) and "missing" in reason


def test_audit_verify_detects_reordering(store):
    fill_log(store)
    audit_sql(store, "UPDATE audit_events SET seq = 100 WHERE seq = 2")
    audit_sql(store, "UPDATE audit_events SET seq = 2 WHERE seq = 3")
    audit_sql(store, "UPDATE audit_events SET seq = 3 WHERE seq = 100")
    assert store.verify_audit_chain()[:2] == (False, 2)


# -- crash-safe gc support -----------------------------------------------------------------------

def test_pending_push_claims(store):
    claim = store.begin_pending([D("x"), D("y"), D("x")], "gpu-1", 4242)
    [pending] = store.pending_claims()
    assert (pending.id, pending.host, pending.pid, pending.blobs) == (
        claim, "gpu-1", 4242, [D("x"), D("y")])
    time.sleep(0.01)  # heartbeats carry the database's clock (SQLite: millisecond precision)
    assert store.heartbeat_pending(claim)
    assert store.pending_claims()[0].heartbeat_at > pending.heartbeat_at
    store.end_pending(claim)
    store.end_pending(claim)
    assert store.pending_claims() == [] and not store.heartbeat_pending(claim)


def test_a_claim_grows_while_it_lives_and_not_after(store):
    """A push names its new packs once written and claims them then: the claim's blobs grow
    (each digest once, sorted); a claim gc already reaped grows no more (False), so the push
    stops before its packs become visible."""
    claim = store.begin_pending([D("x"), D("y")], "gpu-1", 4242)
    assert store.extend_pending(claim, [D("z"), D("x"), D("z")])
    assert store.pending_claims()[0].blobs == [D("x"), D("y"), D("z")]
    with pytest.raises(UsageError):
        store.extend_pending(claim, ["not-a-digest"])
    assert store.pending_claims()[0].blobs == [D("x"), D("y"), D("z")]
    store.end_pending(claim)
    assert not store.extend_pending(claim, [D("w")])
    assert store.pending_claims() == []


def test_database_errors_are_translated(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")  # no schema on purpose
    with SqlMetadataStore(engine) as store:
        with pytest.raises(StoreError, match="no such table"):
            store.list_models()


# -- concurrency ---------------------------------------------------------------------------------

def test_sqlite_writer_queues_for_the_lock_while_readers_proceed(tmp_path):
    path = tmp_path / "registry.db"
    with open_store(f"sqlite:///{path}") as store:
        publish(store, "bert", "a")
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")  # another process in the middle of a write
        # the lock is held until COMMIT below, however long anything here takes (no timer)
        assert store.resolve("bert").number == 1  # WAL: reads do not wait for the writer
        published: list[int] = []
        writer = threading.Thread(target=lambda: published.append(publish(store, "bert", "b")[0].number))
        writer.start()
        writer.join(0.5)
        assert published == [] and writer.is_alive()  # queued for the lock: neither done nor failed
        holder.execute("COMMIT")
        writer.join(HANG_GUARD_S)
        assert published == [2]  # then it succeeds
        holder.close()


def _concurrent_publisher(url: str, index: int, barrier, results) -> None:
    try:
        with open_store(url) as store:  # several processes may create a fresh schema at once
            barrier.wait(timeout=60)
            version, created = publish(store, "shared", f"w{index}", aliases=["prod"],
                                       actor=f"worker{index}")
            store.set_alias("shared", "latest-ci", version.number, actor=f"worker{index}",
                            host="ci")
            results.put((index, version.number, version.digest, created, None))
    except Exception as exc:  # reported to the parent, which fails the test with it
        results.put((index, None, None, None, f"{type(exc).__name__}: {exc}"))


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_six_processes_publish_to_one_model_at_once(backend, request, tmp_path):
    url = (f"sqlite:///{tmp_path / 'registry.db'}" if backend == "sqlite"
           else request.getfixturevalue("pg_db_url"))
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(WORKERS), ctx.Queue()
    procs = [ctx.Process(target=_concurrent_publisher, args=(url, i, barrier, results))
             for i in range(WORKERS)]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    assert [o[4] for o in outcomes] == [None] * WORKERS, outcomes
    assert sorted(o[1] for o in outcomes) == list(range(1, WORKERS + 1))
    assert all(o[3] for o in outcomes)
    with open_store(url) as store:
        versions = store.list_versions("shared")
        assert [v.number for v in versions] == list(range(1, WORKERS + 1))
        assert {v.digest for v in versions} == {D(f"w{i}") for i in range(WORKERS)}
        assert {o[2]: o[1] for o in outcomes} == {v.digest: v.number for v in versions}
        assert store.verify_audit_chain().ok
        actions = [e.action for e in store.events(model="shared")]
        assert actions.count("publish") == WORKERS
        assert [e.seq for e in store.events()] == list(range(1, len(actions) + 1))
        prod = store.resolve("shared@prod").number
        assert prod in range(1, WORKERS + 1)
        assert store.alias_at("shared", "prod", datetime.now(timezone.utc) + timedelta(1)) == prod


def test_recorded_blobs_answers_for_thousands_of_digests_at_once(store):
    """``recorded_blobs`` (a push asks about every chunk): the digests some version records,
    found among thousands asked for at once, in batches, on each database's own query."""
    from registry.store import engine

    publish(store, "team/rec", "r1", blobs=[(D("rec-a"), 10), (D("rec-b"), 20)])
    publish(store, "team/rec", "r2", blobs=[(D("rec-b"), 20), (D("rec-c"), 30)])
    asked = [D(f"none-{i}") for i in range(2 * engine.IN_BATCH + 7)] + [D("rec-a"), D("rec-c"), D("rec-d")]
    assert store.recorded_blobs(asked) == {D("rec-a"), D("rec-c")}
    assert store.recorded_blobs([]) == set()
    with pytest.raises(UsageError):
        store.recorded_blobs([D("rec-a"), "sha256:nope"])
