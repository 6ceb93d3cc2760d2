"""Issue 5: lineage and the tamper-evident audit trail, proven through the CLI contract.

Every test drives ``pt2reg`` (in the test process; concurrent writers as real processes), on
SQLite + a local directory and (integration tier) on real PostgreSQL + SeaweedFS. Raw SQL is
used only to play the attacker who edits the database behind the registry's back, and to
inject database failures.
"""
from __future__ import annotations

import getpass
import json
import os
import shutil
import socket
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone

import pytest

from tests.fixtures_pt2 import cli_process, run_cli
from tests.store_calls import publish

BACKENDS = pytest.mark.parametrize(
    "reg_env", ["local", pytest.param("team", marks=pytest.mark.integration)], indirect=True)
HOST = socket.gethostname()
DEFAULT_ACTOR = f"{getpass.getuser()}@{HOST}"
WIKI_DIGEST = "sha256:" + "5a" * 32
COMMIT = "3f2c9e1a" * 5


# -- helpers ----------------------------------------------------------------------------------

def _json(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _one_line_error(r: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    """Assert the contract for a failure: exit ``code``, one clear line on stderr, no traceback."""
    lines = r.stderr.strip().splitlines()
    assert r.returncode == code, (r.returncode, r.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def _parallel(reg_env, *calls: tuple[str, ...]) -> list:
    """Run independent CLI calls (in process, one after the other); results in call order."""
    return [reg_env.cli(*args) for args in calls]


@contextmanager
def _actor(reg_env, who: str | None) -> Iterator[None]:
    """CLI calls inside the block act as ``who`` (``PT2REG_ACTOR``); None: the default identity
    (user@host), even if the test runner's own environment sets ``PT2REG_ACTOR``."""
    saved = reg_env.env.get("PT2REG_ACTOR")
    reg_env.env["PT2REG_ACTOR"] = who or ""
    try:
        yield
    finally:
        reg_env.env.pop("PT2REG_ACTOR", None)
        if saved is not None:
            reg_env.env["PT2REG_ACTOR"] = saved


def _events(reg_env, *args: str) -> list[dict]:
    return _json(reg_env.cli("audit", *args, "--json"))["events"]


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _iso(when: datetime) -> str:
    return when.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _env_for(reg_env) -> dict[str, str]:
    return {**os.environ, **reg_env.env, "PT2REG_HOME": str(reg_env.home), "PT2REG_DB": reg_env.db,
            "PT2REG_STORE": reg_env.store}


# -- 1. lineage: a three-generation chain -----------------------------------------------------

def _svg_texts_and_edges(dot_source: str) -> tuple[list[str], set[tuple[str, str]]]:
    """Render with the real Graphviz ``dot``; the SVG's text lines and its edges."""
    dot = shutil.which("dot")
    if dot is None:
        pytest.fail("Graphviz `dot` is not installed: scripts/test.sh installs it "
                    "(apt-get install -y graphviz); the --dot output must be proven to render",
                    pytrace=False)
    rendered = subprocess.run([dot, "-Tsvg"], input=dot_source, capture_output=True, text=True,
                              timeout=60)
    assert rendered.returncode == 0 and not rendered.stderr.strip(), rendered.stderr
    ns = {"svg": "http://www.w3.org/2000/svg"}
    root = ET.fromstring(rendered.stdout)
    texts = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")]
    edges = set()
    for g in root.iterfind(".//svg:g[@class='edge']", ns):
        tail, _, head = g.find("svg:title", ns).text.partition("->")
        edges.add((tail, head))
    return texts, edges


@BACKENDS
def test_three_generation_lineage_from_grandchild_parent_and_dataset(reg_env, bundles):
    with _actor(reg_env, None):
        base1 = _json(reg_env.cli("push", str(bundles["v0"]), "--name", "base", "--alias", "prod",
                                  "--dataset", f"s3://data/wiki@{WIKI_DIGEST}", "--run-id",
                                  "run-1", "--git-commit", COMMIT, "--json"))
        base2 = _json(reg_env.cli("push", str(bundles["v1"]), "--name", "base", "--alias", "prod",
                                  "--parent", "base@1", "--run-id", "run-2", "--json"))
        small = _json(reg_env.cli("push", str(bundles["v2"]), "--name", "small", "--alias",
                                  "canary", "--parent", "base@2", "--json"))
    assert (base1["version"], base2["version"], small["version"]) == (1, 2, 1)
    digest = {"base@1": base1["digest"], "base@2": base2["digest"], "small@1": small["digest"]}

    up, up_text, down, from_data, data_text, other_snapshot, up_dot = _parallel(
        reg_env,
        ("lineage", "small@1", "--json"), ("lineage", "small@1"),
        ("lineage", "base@1", "--descendants", "--json"),
        ("lineage", "--dataset", "s3://data/wiki", "--json"),
        ("lineage", "--dataset", "s3://data/wiki"),
        ("lineage", "--dataset", "s3://data/wiki@sha256:" + "00" * 32, "--json"),
        ("lineage", "small@1", "--dot"))

    # The grandchild's whole ancestry: versions, the dataset with its digest, runs, the commit.
    up = _json(up)
    assert (up["ref"], up["direction"], up["digest"]) == ("small@1", "ancestors", small["digest"])
    nodes = {n["ref"]: n for n in up["nodes"]}
    assert [(n["ref"], n["depth"]) for n in up["nodes"]] == [
        ("small@1", 0), ("base@2", 1), ("base@1", 2)]
    for ref, node in nodes.items():
        assert node["digest"] == digest[ref] and node["status"] == "active"
        assert node["created_by"] == DEFAULT_ACTOR
        assert {"python", "torch", "cuda"} <= set(node["environment"])  # the publisher's env

    def edges(ref: str, kind: str) -> list[tuple]:
        return [(e["value"], e["digest"]) for e in nodes[ref]["edges"] if e["kind"] == kind]

    assert edges("small@1", "parent") == [("base@2", digest["base@2"])]
    assert edges("base@2", "parent") == [("base@1", digest["base@1"])]
    assert edges("base@2", "run") == [("run-2", None)]
    assert edges("base@1", "dataset") == [("s3://data/wiki", WIKI_DIGEST)]
    assert edges("base@1", "run") == [("run-1", None)]
    assert edges("base@1", "commit") == [(COMMIT, None)]
    assert edges("base@1", "parent") == []
    text = up_text.stdout
    assert up_text.returncode == 0, up_text.stderr
    for needle in ("small@1", "base@2", "base@1", "s3://data/wiki", WIKI_DIGEST, "run: run-1",
                   "run: run-2", f"commit: {COMMIT}", "[canary]"):
        assert needle in text, (needle, text)
    assert text.index("small@1") < text.index("base@2") < text.index("base@1")  # a tree, root first

    # The root's descendants, nearest first.
    down = _json(down)
    assert down["direction"] == "descendants"
    assert [(n["ref"], n["depth"]) for n in down["nodes"]] == [
        ("base@1", 0), ("base@2", 1), ("small@1", 2)]

    # Everything derived from the dataset, directly or transitively, with the aliases of *now*:
    # prod moved from base@1 to base@2 at the second push.
    from_data = _json(from_data)
    assert from_data["dataset"] == "s3://data/wiki"
    assert [(n["ref"], n["depth"], n["aliases"]) for n in from_data["versions"]] == [
        ("base@1", 0, []), ("base@2", 1, ["prod"]), ("small@1", 2, ["canary"])]
    assert data_text.returncode == 0, data_text.stderr
    rows = {line.split()[0]: line for line in data_text.stdout.splitlines()[1:] if line.strip()}
    assert set(rows) == {"base@1", "base@2", "small@1"}
    assert "direct" in rows["base@1"] and "prod" in rows["base@2"] and "canary" in rows["small@1"]
    assert _json(other_snapshot)["versions"] == []  # another snapshot of the URI: nothing

    # The digraph renders with Graphviz; every version, input and derivation is drawn.
    assert up_dot.returncode == 0 and up_dot.stdout.startswith("digraph"), up_dot.stderr
    texts, drawn = _svg_texts_and_edges(up_dot.stdout)
    for needle in ("small@1", "base@2", "base@1", "[canary]", "[prod]", "run: run-1",
                   "run: run-2", "dataset: s3://data/wiki", f"commit: {COMMIT}"):
        assert needle in texts, (needle, texts)
    assert not any("\\n" in t for t in texts)  # line breaks render as breaks, not "\n"
    assert (digest["base@1"], digest["base@2"]) in drawn
    assert (digest["base@2"], digest["small@1"]) in drawn
    assert (f"dataset:s3://data/wiki@{WIKI_DIGEST}", digest["base@1"]) in drawn
    assert ("run:run-1", digest["base@1"]) in drawn and ("run:run-2", digest["base@2"]) in drawn


# -- 2. time travel -------------------------------------------------------------------------

@BACKENDS
def test_show_alias_at_a_time_answers_from_history(reg_env, bundles):
    def push_to_prod(bundle: str) -> None:  # publishing with --alias moves the alias too
        r = reg_env.cli("push", str(bundles[bundle]), "--name", "tt", "--alias", "prod")
        assert r.returncode == 0, r.stderr

    before = _now()
    push_to_prod("v3")
    at_v1 = _now()
    push_to_prod("v4")
    at_v2 = _now()
    assert reg_env.cli("alias", "set", "tt", "prod", "tt@1").returncode == 0
    push_to_prod("v5")
    at_v3 = _now()
    assert reg_env.cli("alias", "rm", "tt", "prod").returncode == 0
    after_rm = _now()
    moves = [e for e in _events(reg_env, "--model", "tt") if e["action"].startswith("alias.")]
    assert [(e["action"], e["version"], e["details"].get("from")) for e in moves] == [
        ("alias.set", 1, None), ("alias.move", 2, 1), ("alias.move", 1, 2), ("alias.move", 3, 1),
        ("alias.remove", 3, None)]
    first_move = datetime.fromisoformat(moves[1]["time"])
    assert before < datetime.fromisoformat(moves[0]["time"]) < at_v1 < first_move < at_v2

    at = {  # --at value -> expected version (None: exit 3)
        _iso(before): None,
        _iso(first_move - timedelta(microseconds=1)): 1,
        _iso(first_move): 2,  # "at T" includes a move made at exactly T
        at_v2.astimezone(timezone(timedelta(hours=5, minutes=30))).isoformat(): 2,
        _iso(at_v3): 3,
        _iso(after_rm): None,  # removed since; history still answers for earlier times
    }
    calls = [("show", "tt@prod", "--at", when, "--json") for when in at]
    results = _parallel(reg_env, *calls, ("show", "tt@prod", "--at", _iso(at_v2)))
    for (when, expected), r in zip(at.items(), results):
        if expected is None:
            _one_line_error(r, 3, "tt@prod", "did not point anywhere", when)
        else:
            shown = _json(r)
            assert (when, shown["name"], shown["version"]) == (when, "tt", expected)
    human = results[-1]
    assert human.returncode == 0 and human.stdout.startswith("tt@2 "), human.stderr


# -- 3. tamper evidence ------------------------------------------------------------------------

def _verify(reg_env) -> tuple[int, int | None, str]:
    """``audit --verify --json``: exit code, the first bad event, the one-line error."""
    r = reg_env.cli("audit", "--verify", "--json")
    verdict = json.loads(r.stdout)
    assert verdict["intact"] is (r.returncode == 0)
    assert r.returncode == 0 or len(r.stderr.strip().splitlines()) == 1, r.stderr
    return r.returncode, verdict["first_bad_event"], r.stderr.strip()


@BACKENDS
def test_audit_verify_detects_an_edited_or_deleted_event(reg_env, bundles, tmp_path):
    assert reg_env.cli("push", str(bundles["v0"]), "--name", "m", "--alias", "prod").returncode == 0
    assert reg_env.cli("push", str(bundles["v1"]), "--name", "m").returncode == 0
    assert reg_env.cli("pull", "m@prod", "-o", str(tmp_path / "p.pt2b")).returncode == 0
    assert reg_env.cli("alias", "set", "m", "prod", "2").returncode == 0
    # seq: 1 publish m@1, 2 alias.set prod, 3 publish m@2, 4 pull m@prod, 5 alias.move prod
    intact = reg_env.cli("audit", "--verify")
    assert intact.returncode == 0 and "intact" in intact.stdout and "5 events" in intact.stdout

    # An edited field (who published m@2) is named. (Each attack is undone after it is caught,
    # so the next verdict naming a different event also proves the undo restored the chain.)
    [[(actor,)]] = reg_env.sql("SELECT actor FROM audit_events WHERE seq = 3")
    reg_env.sql("UPDATE audit_events SET actor = 'mallory' WHERE seq = 3")
    code, bad, err = _verify(reg_env)
    assert (code, bad) == (5, 3) and "event 3" in err and "altered" in err
    reg_env.sql("UPDATE audit_events SET actor = :actor WHERE seq = 3", actor=actor)

    # prod moved back in the tables, without an event: the registry and its log disagree.
    [[(v1_id,)], [(v2_id,)]] = reg_env.sql("SELECT min(id) FROM versions",
                                    "SELECT max(id) FROM versions")
    reg_env.sql("UPDATE aliases SET version_id = :v", v=v1_id)
    code, bad, err = _verify(reg_env)
    assert (code, bad) == (5, 5) and "alias m@prod points at m@1" in err and "m@2" in err
    reg_env.sql("UPDATE aliases SET version_id = :v", v=v2_id)

    # A deleted event in the middle: the gap is named at the event after it.
    [row] = reg_env.sql("SELECT * FROM audit_events WHERE seq = 2")[0]
    reg_env.sql("DELETE FROM audit_events WHERE seq = 2")
    code, bad, err = _verify(reg_env)
    assert (code, bad) == (5, 3) and "event 3 follows event 1" in err and "missing" in err
    placeholders = ", ".join(f":c{i}" for i in range(len(row)))
    reg_env.sql(f"INSERT INTO audit_events VALUES ({placeholders})",
         **{f"c{i}": v for i, v in enumerate(row)})

    # The newest event deleted (nothing links to it): prod no longer matches the log, which
    # now ends with it set at event 2.
    reg_env.sql("DELETE FROM audit_events WHERE seq = 5")
    code, bad, err = _verify(reg_env)
    assert (code, bad) == (5, 2) and "m@prod" in err

    # An event's time rewritten (to fake when the pull happened).
    reg_env.sql("UPDATE audit_events SET ts = '2020-01-01T00:00:00.000000Z' WHERE seq = 4")
    assert _verify(reg_env)[:2] == (5, 4)


def _rewrite_chain_from(reg_env, seq: int, **changes) -> None:
    """What a database writer can do: change event ``seq`` and recompute every hash after it,
    so the chain itself is intact again."""
    from registry.store.audit_chain import seal

    cols = "seq, ts, actor, host, action, model, version, digest, ref, details_json, prev_hash, hash"
    [rows] = reg_env.sql(f"SELECT {cols} FROM audit_events ORDER BY seq")
    prev = None
    for row in rows:
        event = dict(zip(cols.split(", "), row))
        if event["seq"] < seq:
            prev = event["hash"]
            continue
        if event["seq"] == seq:
            event.update(changes)
        sealed = seal({**event, "details": event["details_json"]}, prev_hash=prev)
        reg_env.sql("UPDATE audit_events SET actor = :actor, ts = :ts, prev_hash = :p, hash = :h "
                      "WHERE seq = :seq", actor=event["actor"], ts=event["ts"], p=sealed["prev_hash"],
             h=sealed["hash"], seq=event["seq"])
        prev = sealed["hash"]


@BACKENDS
def test_a_rewritten_or_truncated_log_is_caught_by_this_machines_anchor(reg_env, bundles, tmp_path):
    """A writer who recomputes the chain after an edit defeats the chain alone; each verify
    anchors the newest event in HOME, so what this machine already verified cannot change."""
    assert reg_env.cli("push", str(bundles["v0"]), "--name", "m", "--alias", "prod").returncode == 0
    assert reg_env.cli("push", str(bundles["v1"]), "--name", "m").returncode == 0
    assert reg_env.cli("pull", "m@1", "-o", str(tmp_path / "p.pt2b")).returncode == 0
    # seq: 1 publish m@1, 2 alias.set prod, 3 publish m@2, 4 pull m@1
    assert _verify(reg_env)[0] == 0
    anchors = reg_env.home / "audit-anchors.json"
    assert anchors.stat().st_mode & 0o777 == 0o600
    assert [a["seq"] for a in json.loads(anchors.read_text()).values()] == [4]

    # Who published m@2, rewritten with every later hash recomputed: the chain is whole again,
    # but the anchored event's hash changed.
    _rewrite_chain_from(reg_env, 3, actor="mallory")
    code, bad, err = _verify(reg_env)
    assert (code, bad) == (5, 4) and "event 4 has a different hash" in err and "rewritten" in err
    fresh = reg_env.cli("audit", "--verify", home=tmp_path / "new-machine")
    assert fresh.returncode == 0, fresh.stderr          # the limit: a machine that never looked

    # A machine that verified after the rewrite trusts the log from there on; appends are fine.
    anchors.unlink()
    assert _verify(reg_env)[0] == 0
    assert reg_env.cli("pull", "m@2", "-o", str(tmp_path / "q.pt2b")).returncode == 0   # seq 5
    assert _verify(reg_env)[0] == 0
    assert [a["seq"] for a in json.loads(anchors.read_text()).values()] == [5]

    # The newest events deleted when they change no state (a pull): the chain and the state
    # cannot see it, the anchor can.
    reg_env.sql("DELETE FROM audit_events WHERE seq = 5")
    code, bad, err = _verify(reg_env)
    assert (code, bad) == (5, 5) and "event 5 is gone" in err


# -- 4. every state change and pull is audited ---------------------------------------------------

@pytest.mark.slow
@BACKENDS
def test_every_change_and_pull_is_audited_with_actor_host_ref_and_digest(reg_env, bundles,
                                                                          tmp_path):
    with _actor(reg_env, "ana@ci"):
        v1 = _json(reg_env.cli("push", str(bundles["v0"]), "--name", "m", "--alias", "staging",
                               "--json"))["digest"]
    with _actor(reg_env, None):  # the default identity: user@host
        v2 = _json(reg_env.cli("push", str(bundles["v1"]), "--name", "m", "--json"))["digest"]
    with _actor(reg_env, "ana@ci"):
        for args in (("alias", "set", "m", "prod", "1"), ("alias", "set", "m", "prod", "m@2"),
                     ("alias", "rm", "m", "staging")):
            assert reg_env.cli(*args).returncode == 0
    since = _now()
    with _actor(reg_env, "bob"):
        assert reg_env.cli("deprecate", "m@1", "--reason", "superseded").returncode == 0
        assert reg_env.cli("yank", "m@1", "--reason", "data leak").returncode == 0
    with _actor(reg_env, "svc-inference"):  # the third pull is served from the local cache
        for i, (ref, home) in enumerate((("m@prod", "h1"), (f"m@{v1}", "h2"), (f"m@{v1}", "h2"))):
            r = reg_env.cli("pull", ref, "-o", str(tmp_path / f"{i}.pt2b"), home=tmp_path / home)
            assert r.returncode == 0, r.stderr
    orphan = reg_env.put_orphan(b"blob of an interrupted push")
    with _actor(reg_env, "janitor"):
        assert [d["digest"] for d in _json(reg_env.cli("gc", "--json"))["deleted"]] == [orphan]

    everything, of_m, of_m_since = (_json(r)["events"] for r in _parallel(
        reg_env, ("audit", "--json"), ("audit", "--model", "m", "--json"),
        ("audit", "--model", "m", "--since", _iso(since), "--json")))

    def row(e: dict) -> tuple:
        return (e["action"], e["actor"], e["name"], e["version"], e["digest"],
                {k: v for k, v in e["details"].items() if k in ("alias", "from", "reason")})

    expected_m = [
        ("publish", "ana@ci", "m", 1, v1, {}),
        ("alias.set", "ana@ci", "m", 1, v1, {"alias": "staging"}),
        ("publish", DEFAULT_ACTOR, "m", 2, v2, {}),
        ("alias.set", "ana@ci", "m", 1, v1, {"alias": "prod"}),
        ("alias.move", "ana@ci", "m", 2, v2, {"alias": "prod", "from": 1}),
        ("alias.remove", "ana@ci", "m", 1, v1, {"alias": "staging"}),
        ("deprecate", "bob", "m", 1, v1, {"reason": "superseded"}),
        ("yank", "bob", "m", 1, v1, {"reason": "data leak"}),
        ("pull", "svc-inference", "m", 2, v2, {}),
        ("pull", "svc-inference", "m", 1, v1, {}),
        ("pull", "svc-inference", "m", None, v1, {}),  # from the cache: no number, same digest
    ]
    assert [row(e) for e in of_m] == expected_m
    # A pull records the ref as asked next to the digest it resolved to.
    assert [e["ref"] for e in of_m if e["action"] == "pull"] == ["m@prod", f"m@{v1}", f"m@{v1}"]
    assert all(e["host"] == HOST for e in everything)
    assert [e["seq"] for e in everything] == list(range(1, len(everything) + 1))
    others = [row(e)[:4] for e in everything if e["name"] != "m"]
    assert others == [("gc.delete", "janitor", None, None)]
    gc_event = everything[-1]
    assert (gc_event["digest"], gc_event["details"]["size"]) == (orphan, 27)
    # --since keeps exactly the events at or after the time, still in chain order.
    assert [row(e) for e in of_m_since] == expected_m[6:]
    times = [datetime.fromisoformat(e["time"]) for e in everything]
    assert times == sorted(times)


# -- 5. concurrent writers keep one valid chain ------------------------------------------------

def _run(job: tuple[dict, list[str]]) -> subprocess.CompletedProcess:
    env, args = job
    return cli_process(*args, env=env)   # concurrent writers: real processes


@BACKENDS
def test_concurrent_publishers_and_alias_moves_leave_one_valid_chain(reg_env, bundles, tmp_path):
    for seed in ("v0", "v1"):
        r = reg_env.cli("push", str(bundles[seed]), "--name", "race", "--alias", "prod")
        assert r.returncode == 0, r.stderr
    env = _env_for(reg_env)
    jobs = []
    for i in range(2, 6):  # four publishers, each with lineage, ...
        jobs.append((env, ["push", str(bundles[f"v{i}"]), "--name", "race", "--parent", "race@1",
                           "--run-id", f"run-{i}", "--json"]))
    for i in range(3):  # ... three alias sets and moves back and forth, and a pull, all at once
        jobs.append((env, ["alias", "set", "race", "prod" if i % 2 else "canary",
                           str(1 + (i // 2) % 2)]))
    jobs.append((env, ["pull", "race@prod", "-o", str(tmp_path / "pulled.pt2b")]))
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(_run, jobs))
    for r in results:
        assert r.returncode == 0 and r.stderr.strip() == "", r.stderr
    assert sorted(json.loads(r.stdout)["version"] for r in results[:4]) == [3, 4, 5, 6]

    verified, events, shown = _parallel(reg_env, ("audit", "--verify", "--json"),
                                        ("audit", "--json"), ("list", "race", "--json"))
    assert _json(verified)["intact"] is True
    events = _json(events)["events"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert len({e["hash"] for e in events}) == len(events)
    assert all(e["prev_hash"] == p["hash"] for p, e in zip(events, events[1:]))
    published = sorted(e["version"] for e in events if e["action"] == "publish")
    assert published == list(range(1, 7))
    assert sum(e["action"] == "pull" for e in events) == 1
    # Replaying the alias events in chain order gives exactly where the aliases point now.
    replay: dict[str, int | None] = {}
    for e in events:
        if e["action"].startswith("alias."):
            replay[e["details"]["alias"]] = None if e["action"] == "alias.remove" else e["version"]
    now = {a: v["version"] for v in _json(shown)["versions"] for a in v["aliases"]}
    assert replay == now and set(now) == {"prod", "canary"}


# -- 6. an event is written in the same transaction as its change ------------------------------

def _refuse_inserts(reg_env, table: str) -> None:
    """A database trigger that fails every insert into ``table`` (an injected fault)."""
    if reg_env.db.startswith("sqlite"):
        reg_env.sql(f"CREATE TRIGGER refuse_{table} BEFORE INSERT ON {table} "
                      f"BEGIN SELECT RAISE(ABORT, 'injected fault'); END")
    else:
        reg_env.sql("CREATE OR REPLACE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
                      "$$ BEGIN RAISE EXCEPTION 'injected fault'; END $$",
             f"CREATE TRIGGER refuse_{table} BEFORE INSERT ON {table} "
             f"FOR EACH ROW EXECUTE FUNCTION refuse()")


def _allow_inserts(reg_env, table: str) -> None:
    on = "" if reg_env.db.startswith("sqlite") else f" ON {table}"
    reg_env.sql(f"DROP TRIGGER refuse_{table}{on}")


@BACKENDS
def test_a_failed_change_leaves_no_event_and_a_failed_event_leaves_no_change(reg_env, bundles):
    assert reg_env.cli("push", str(bundles["v0"]), "--name", "m").returncode == 0

    def counts() -> tuple[int, int, int]:
        [[(versions,)], [(events,)], [(aliases,)]] = reg_env.sql(
            "SELECT count(*) FROM versions", "SELECT count(*) FROM audit_events",
            "SELECT count(*) FROM aliases")
        return versions, events, aliases

    assert counts() == (1, 1, 0)
    # The alias insert fails after the version row and its publish event were written.
    _refuse_inserts(reg_env, "aliases")
    r = reg_env.cli("push", str(bundles["v1"]), "--name", "m", "--alias", "prod")
    _one_line_error(r, r.returncode, "injected fault")
    assert r.returncode != 0 and counts() == (1, 1, 0)
    _allow_inserts(reg_env, "aliases")

    # The event append fails: neither a version nor a status change survives without it.
    _refuse_inserts(reg_env, "audit_events")
    failed = [reg_env.cli("push", str(bundles["v1"]), "--name", "m"),
              reg_env.cli("yank", "m@1", "--reason", "x")]
    for r in failed:
        assert r.returncode != 0 and "injected fault" in r.stderr, r.stderr
    [[(status,)]] = reg_env.sql("SELECT status FROM versions")
    assert counts() == (1, 1, 0) and status == "active"
    _allow_inserts(reg_env, "audit_events")

    again = _json(reg_env.cli("push", str(bundles["v1"]), "--name", "m", "--alias", "prod",
                              "--json"))
    assert again["version"] == 2 and counts() == (2, 3, 1)  # no gap left by the failures
    assert reg_env.cli("audit", "--verify").returncode == 0


# -- push: lineage arguments as a user meets them ------------------------------------------------

@pytest.mark.parametrize("reg_env", ["local"], indirect=True)
def test_bad_lineage_arguments_fail_with_one_line_and_push_uploads_nothing(reg_env, bundles):
    assert reg_env.cli("push", str(bundles["v0"]), "--name", "base").returncode == 0
    hexd = "ab" * 32
    bundle = str(bundles["v1"])
    cases = [  # (extra args, exit code, words the one error line must contain)
        (("--parent", "nope@1"), 3, ("parent nope@1", "model 'nope' not found")),
        (("--parent", "base@9"), 3, ("parent base@9", "no version 9", "latest is 1")),
        (("--parent", f"base@sha256:{'00' * 32}"), 3, ("parent base@sha256:000",)),
        (("--parent", "Base@1"), 2, ("--parent 'Base@1'", "invalid model name")),
        (("--dataset", "s3://d@sha256:xyz"), 2, ("invalid dataset digest", "s3://d@sha256:xyz")),
        (("--dataset", f"@sha256:{hexd}"), 2, ("empty dataset URI",)),
        (("--dataset", ""), 2, ("empty dataset URI",)),
        (("--git-commit", "not-a-sha"), 2, ("invalid git commit", "not-a-sha")),
    ]
    calls = [("push", bundle, "--name", "child", *args) for args, _, _ in cases]
    queries = [  # the query side of the same contract
        (("lineage", "base@7"), 3, ("no version 7",)),
        (("lineage", "nope", "--descendants"), 3, ("model 'nope' not found",)),
        (("lineage", "--dataset", "s3://d@sha256:xyz", "--json"), 2, ("invalid dataset digest",)),
        (("audit", "--model", "Not A Name"), 2, ("invalid model name",)),
        (("audit", "--since", "yesterday"), 2, ("invalid time",)),
        (("show", "base@1", "--at", "2026-01-01T00:00:00Z"), 2, ("--at needs an alias",)),
        (("show", "base@prod", "--at", "last tuesday"), 2, ("invalid time", "last tuesday")),
    ]
    results = _parallel(reg_env, *calls, *[args for args, _, _ in queries])
    for (_args, code, needles), r in zip(cases + queries, results):
        _one_line_error(r, code, *needles)
    events, dry_gc = _parallel(reg_env, ("audit", "--json"), ("gc", "--dry-run", "--json"))
    assert [e["action"] for e in _json(events)["events"]] == ["publish"]  # nothing published ...
    assert _json(dry_gc)["deleted"] == []  # ... and nothing uploaded


@pytest.mark.parametrize("reg_env", ["local"], indirect=True)
def test_push_records_git_head_and_dirty_tree_unless_a_commit_is_given(reg_env, bundles, tmp_path):
    repo = tmp_path / "train"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    (repo / "train.py").write_text("print('train')\n")
    for args in (["init", "-q"], ["add", "train.py"], ["commit", "-q", "-m", "init"]):
        subprocess.run(git + args, check=True, capture_output=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    env = _env_for(reg_env)

    def push(bundle: str, *args: str) -> None:
        r = run_cli("push", str(bundles[bundle]), "--name", "g", *args, env=env, cwd=repo)
        assert r.returncode == 0, r.stderr

    push("v0")
    (repo / "train.py").write_text("print('tuned')\n")
    push("v1", "--parent", "g@1")
    push("v2", "--parent", "g@2", "--git-commit", COMMIT.upper(), "--code-uri",
         "https://git.example.com/train")
    nodes = {n["ref"]: n for n in _json(reg_env.cli("lineage", "g@3", "--json"))["nodes"]}

    def commit(ref: str) -> list[tuple]:
        return [(e["value"], e["extra"]) for e in nodes[ref]["edges"] if e["kind"] == "commit"]

    assert commit("g@1") == [(head, {"detected": True, "dirty": False})]
    assert commit("g@2") == [(head, {"detected": True, "dirty": True})]
    assert commit("g@3") == [(COMMIT, None)]  # given explicitly: stored as given, lowercased
    assert [e["value"] for e in nodes["g@3"]["edges"] if e["kind"] == "code"] == [
        "https://git.example.com/train"]
    tree = reg_env.cli("lineage", "g@3").stdout
    assert f"commit: {head} (dirty)" in tree and f"commit: {COMMIT}" in tree


# -- store level: what the state check behind `audit --verify` catches ---------------------------

@pytest.mark.parametrize("backend", ["sqlite",
                                     pytest.param("postgres", marks=pytest.mark.integration)])
def test_verify_checks_versions_statuses_and_aliases_against_the_log(backend, request, tmp_path):
    from sqlalchemy import text

    from registry.store import open_metadata_store

    url = (f"sqlite:///{tmp_path / 'r.db'}" if backend == "sqlite"
           else request.getfixturevalue("pg_db_url"))
    who = {"actor": "ana", "host": "h"}

    def digest(tag: str) -> str:
        return "sha256:" + tag.encode().hex().ljust(64, "0")

    with open_metadata_store(url, auto_create=True) as store:
        for tag in ("a", "b"):
            publish(store, "m", digest(tag), "{}", 1, [(digest("blob" + tag), 1)], **who)
        store.set_status("m", 1, "yanked", "leak", **who)  # seq 3
        assert store.verify_audit_chain().ok

        def attack(*statements: str):
            with store.engine.begin() as conn:
                for stmt in statements:
                    conn.execute(text(stmt))
            return store.verify_audit_chain()

        verdict = attack("UPDATE versions SET status = 'active' WHERE number = 1")  # un-yank
        assert (verdict.ok, verdict.first_bad_seq) == (False, 3)
        assert "m@1 is active but the log says yanked" in verdict.reason
        attack("UPDATE versions SET status = 'yanked' WHERE number = 1")
        assert store.verify_audit_chain().ok

        verdict = attack("DELETE FROM audit_events WHERE seq = 3")  # the newest event
        assert (verdict.ok, verdict.first_bad_seq) == (False, None)
        assert "m@1 is yanked but the log says active" in verdict.reason

        attack("UPDATE versions SET status = 'active' WHERE number = 1")
        assert store.verify_audit_chain().ok  # consistent again without the yank
        verdict = attack("DELETE FROM audit_events WHERE seq = 2")  # m@2's publish, now newest
        assert (verdict.ok, verdict.first_bad_seq) == (False, None)
        assert "m@2" in verdict.reason and "has no publish event" in verdict.reason


@BACKENDS
def test_blob_records_and_manifests_edited_behind_the_log_are_caught_and_gc_keeps_live_data(
        reg_env, bundles, tmp_path):
    """The version_blobs rows and the stored manifest text are checked against each other and
    against the version's digest; gc keeps what a version's manifest needs even when its
    version_blobs rows were deleted."""
    assert reg_env.cli("push", str(bundles["v0"]), "--name", "m", "--alias", "prod").returncode == 0
    assert reg_env.cli("push", str(bundles["v1"]), "--name", "m").returncode == 0
    assert _verify(reg_env)[0] == 0
    [[(v1_id,)]] = reg_env.sql("SELECT min(id) FROM versions")

    # the manifest of m@1 replaced by m@2's: the log still says m@1 is its old digest
    [[(text1,)], [(text2,)]] = reg_env.sql("SELECT manifest_json FROM versions WHERE id = :v",
                                    "SELECT manifest_json FROM versions WHERE id <> :v", v=v1_id)
    reg_env.sql("UPDATE versions SET manifest_json = :t WHERE id = :v", t=text2, v=v1_id)
    code, bad, err = _verify(reg_env)
    assert code == 5 and bad == 1 and "m@1" in err and "does not hash to its digest" in err, err
    reg_env.sql("UPDATE versions SET manifest_json = :t WHERE id = :v", t=text1, v=v1_id)

    # m@1's blob records deleted: named by audit, and gc still keeps every blob of m@1
    rows = reg_env.sql("SELECT version_id, blob_digest, size FROM version_blobs WHERE version_id = :v",
                v=v1_id)[0]
    reg_env.sql("DELETE FROM version_blobs WHERE version_id = :v", v=v1_id)
    code, bad, err = _verify(reg_env)
    assert code == 5 and bad == 1 and "m@1 lacks the blob record" in err, err
    r = reg_env.cli("gc")
    assert r.returncode == 0, r.stderr
    assert all(reg_env.blob_exists(d) for _v, d, _n in rows)
    out = tmp_path / "p.pt2b"
    assert reg_env.cli("pull", "m@prod", "-o", str(out)).returncode == 0
    assert out.read_bytes() == bundles["v0"].read_bytes()
    for v, d, n in rows:
        reg_env.sql("INSERT INTO version_blobs (version_id, blob_digest, size) VALUES (:v, :d, :n)",
             v=v, d=d, n=n)
    assert _verify(reg_env)[0] == 0
