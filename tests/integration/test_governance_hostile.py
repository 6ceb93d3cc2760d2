"""Issue 19 under attack (review R2): attestations forged, replayed onto another version or
label, or signed by a key the policy does not name; immutable aliases on every direct path
(publish of identical content included); hostile webhook URLs; receivers that hang, fail,
redirect or answer a huge body, checked with a Standard Webhooks reference verifier; the
secret nowhere in what the registry shows; a server signing key open to others refused.

Everything here runs in process on SQLite (the delivery loop is driven tick by tick), fast.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from registry.access.policy import attestation_digest, attestation_statement
from registry.errors import PolicyError, SignatureError, UsageError
from registry.format.signing import generate_keypair, load_private_key, public_pem_of, sign_digest
from registry.store import open_metadata_store
from registry.store.outbox import validate_webhook_url
from tests.store_calls import publish
from tests.until import HANG_GUARD_S, wait_until

MODEL = "team/m"
WHO = {"actor": "ana", "host": "ci"}
SECRET = "whsec_" + base64.b64encode(bytes(range(100, 132))).decode()


@pytest.fixture()
def store(tmp_path):
    s = open_metadata_store(f"sqlite:///{tmp_path / 'r.db'}", auto_create=True)
    yield s
    s.close()


def _publish(store: Any, n: int, *, key: Any = None, aliases: tuple[str, ...] = ()) -> str:
    digest = "sha256:" + hashlib.sha256(f"v{n}".encode()).hexdigest()
    sigs = [sign_digest(key, digest)] if key is not None else []
    publish(store, MODEL, digest, "{}", 1, [], signatures=sigs, aliases=list(aliases), **WHO)
    return digest


def _attest(store: Any, number: int, digest: str, key: Any, *, label: str = "cpu-ci",
            passed: bool = True, signed_digest: str | None = None, signed_label: str | None = None,
            pub_of: Any = None) -> Any:
    fields = {"passed": passed, "device": "cpu", "target": {"torch": "x"}, "results": [], "error": None}
    statement = attestation_statement(digest=signed_digest or digest, label=signed_label or label, **fields)
    return store.record_attestation(MODEL, number, label=label, **fields,
                                    signature=sign_digest(key, attestation_digest(statement)),
                                    public_key=public_pem_of(pub_of or key), **WHO)


def _one_line(exc: BaseException, *needles: str) -> None:
    text = str(exc)
    assert "\n" not in text, text
    for n in needles:
        assert n in text, text


def test_attestations_forged_replayed_or_by_another_key_never_satisfy(store, tmp_path):
    k, k_pub = generate_keypair(tmp_path / "k")
    other, _ = generate_keypair(tmp_path / "other")
    d1, d2 = _publish(store, 1, key=k), _publish(store, 2, key=k)
    store.set_policy(MODEL, "prod", signers=[k_pub.read_text()], attestations=["cpu-ci"], **WHO)

    # v1's valid attestation replayed onto v2, and a 'gpu' statement recorded as 'cpu-ci'
    _attest(store, 1, d1, k)
    with pytest.raises(SignatureError):
        _attest(store, 2, d2, k, signed_digest=d1)
    with pytest.raises(SignatureError):
        _attest(store, 2, d2, k, signed_label="gpu")
    # a signature by one key sent with another key's public key; flipped verdict
    with pytest.raises(SignatureError):
        _attest(store, 2, d2, other, pub_of=k)
    with pytest.raises(SignatureError):
        fields = {"device": "cpu", "target": {"torch": "x"}, "results": [], "error": None}
        sig = sign_digest(k, attestation_digest(attestation_statement(
            digest=d2, label="cpu-ci", passed=False, **fields)))
        store.record_attestation(MODEL, 2, label="cpu-ci", passed=True, **fields, signature=sig,
                                 public_key=public_pem_of(k), **WHO)
    assert store.attestations(MODEL, 2) == []
    with pytest.raises(PolicyError) as e:
        store.set_alias(MODEL, "prod", 2, **WHO)
    _one_line(e.value, "alias prod of team/m needs an attestation for 'cpu-ci'", "version 2 has none")

    # signed by a key the policy does not name; a failed one signed by K
    _attest(store, 2, d2, other)
    with pytest.raises(PolicyError) as e:
        store.set_alias(MODEL, "prod", 2, **WHO)
    _one_line(e.value, "version 2 has none so signed")
    store.set_policy(MODEL, "prod", attestations=["gpu"], **WHO)
    _attest(store, 2, d2, k, label="gpu", passed=False)
    with pytest.raises(PolicyError) as e:
        store.set_alias(MODEL, "prod", 2, **WHO)
    _one_line(e.value, "needs an attestation for 'gpu'; version 2 has only failed ones")
    assert store.aliases(MODEL) == []
    with pytest.raises(PolicyError):  # v1 has no 'gpu' attestation at all
        store.set_alias(MODEL, "prod", 1, **WHO)


def test_immutable_alias_on_every_direct_path(store, tmp_path):
    d1 = _publish(store, 1)
    _publish(store, 2)
    store.set_policy(MODEL, "stable", immutable=True, **WHO)
    store.set_alias(MODEL, "stable", 1, **WHO)
    store.set_alias(MODEL, "stable", 1, **WHO)  # where it is already: a no-op, not a move
    for attempt in (
            lambda: store.set_alias(MODEL, "stable", 2, **WHO),
            lambda: store.remove_alias(MODEL, "stable", **WHO),
            # identical content published again with the alias, and a new version with it
            lambda: _publish(store, 2, aliases=("stable",)),
            lambda: _publish(store, 3, aliases=("stable",)),
            lambda: store.set_policy(MODEL, "stable", **WHO),
            lambda: store.remove_policy(MODEL, "stable", **WHO)):
        with pytest.raises(PolicyError) as e:
            attempt()
        _one_line(e.value, "alias stable of team/m is immutable")
    assert [(a.alias, a.number) for a in store.aliases(MODEL)] == [("stable", 1)]
    assert [v.number for v in store.list_versions(MODEL)] == [1, 2]  # version 3 refused whole
    _publish(store, 1, aliases=("stable",))  # identical content, where it already points: fine
    assert store.resolve(f"{MODEL}@stable").digest == d1
    assert store.verify_audit_chain().ok


@pytest.mark.parametrize("url", [
    "file:///etc/passwd", "gopher://127.0.0.1:70/_x", "ftp://h/x", "javascript:alert(1)",
    "http://user:hunter2@h/x", "https://:hunter2@h/", "https://@h/", "http:///nohost",
    "http://" + "a" * 3000 + ".example/", "http://h\u00e9llo.example/", "http://h/\u200bx",
    "http://h/a b", "http://h:99999/", "http://h/\n", "dict://h:11211/"])
def test_hostile_webhook_urls_are_refused_without_echoing_credentials(url):
    with pytest.raises(UsageError) as e:
        validate_webhook_url(url)
    assert "hunter2" not in str(e.value) and len(str(e.value)) < 400


# -- delivery --------------------------------------------------------------------------------

def verify_standard_webhook(secret: str, headers: dict[str, str], body: bytes) -> None:
    """A receiver's check from the spec, written here independently of the registry."""
    msg_id, ts, sig = headers["webhook-id"], headers["webhook-timestamp"], headers["webhook-signature"]
    assert abs(time.time() - int(ts)) < 300
    key = base64.b64decode(secret[len("whsec_"):])
    want = base64.b64encode(hmac.new(key, f"{msg_id}.{ts}.{body.decode()}".encode(), hashlib.sha256).digest())
    assert any(hmac.compare_digest(want, s.split(",", 1)[1].encode())
               for s in sig.split(" ") if s.startswith("v1,")), sig


class Hostile:
    """One receiver; its path says how it behaves."""

    def __init__(self) -> None:
        self.got: list[tuple[str, dict[str, str], bytes]] = []
        #: /hang and /trickle go on until this is set: past any deadline, however slow the machine
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["content-length"]))
                outer.got.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                if self.path == "/hang":   # until released: only the registry's timeout ends the wait
                    outer.release.wait(HANG_GUARD_S)
                if self.path == "/trickle":  # headers a byte at a time: each read is quick
                    try:
                        self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                        while not outer.release.wait(0.25):   # until released: only the deadline ends it
                            self.wfile.write(b"x")
                            self.wfile.flush()
                    except OSError:
                        pass
                    self.close_connection = True
                    return
                if self.path == "/redirect":
                    self.send_response(307)
                    self.send_header("location", "/target")
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                code = 500 if self.path == "/fail" else 200
                payload = b"x" * (8 << 20) if self.path == "/huge" else b"{\"ok\": true}"
                self.send_response(code)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                try:
                    self.wfile.write(payload)
                except OSError:
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_hostile_receivers_filters_and_the_secret(store, tmp_path, monkeypatch, caplog):
    import logging

    from registry.access import server_key
    from registry.server.audit_head import ServerKey
    from registry.server.webhooks import Background

    monkeypatch.setenv("PT2REG_WEBHOOK_TIMEOUT", "1.5")  # /hang and /trickle wait until released
    monkeypatch.setenv("PT2REG_WEBHOOK_RETRY_BASE", "100")
    monkeypatch.setenv("PT2REG_WEBHOOK_ALLOW", "127.0.0.1")  # the receivers are on loopback
    key_path, _ = generate_keypair(tmp_path / "srv")
    key = ServerKey(private=load_private_key(key_path), path=key_path)
    rx = Hostile()
    try:
        hooks = {}
        for path, events, glob in (("/ok", ["version.published", "alias.moved"], "team/*"),
                                   ("/fail", ["version.published"], None),
                                   ("/redirect", ["version.published"], None),
                                   ("/huge", ["version.published"], None),
                                   ("/hang", ["version.published"], None),
                                   ("/trickle", ["version.published"], None),
                                   ("/filtered-event", ["version.yanked"], None),
                                   ("/filtered-model", ["version.published"], "other/*")):
            url = rx.base + path
            store.secret_sealer = server_key.secret_sealer(key.secrets_key, key.key_id)
            hooks[path] = store.add_webhook(url, events, glob, secret=SECRET, **WHO).id
        _publish(store, 1, aliases=("prod",))
        bg = Background(store.engine, key)
        caplog.set_level(logging.DEBUG)
        try:
            # every endpoint's due deliveries, each endpoint in its own lane; /hang and /trickle
            # answer only when released, after this: it returns only if their timeouts cut them
            bg.tick(wait=True)
        finally:
            bg.stop()
            rx.release.set()

        paths = sorted(p for p, _, _ in rx.got)
        # one publish and one alias move to /ok; never the redirect target, nothing filtered
        assert paths == ["/fail", "/hang", "/huge", "/ok", "/ok", "/redirect", "/trickle"], paths
        for _, headers, body in rx.got:
            verify_standard_webhook(SECRET, headers, body)
        types = sorted(json.loads(b)["type"] for p, _, b in rx.got if p == "/ok")
        assert types == ["alias.moved", "version.published"]

        by_hook = {d.webhook_id: d for d in store.webhook_deliveries()}
        assert by_hook[hooks["/ok"]].status == "delivered"
        for path in ("/fail", "/redirect", "/hang", "/trickle"):
            assert by_hook[hooks[path]].status == "failing", path
        assert "within 3 s" in by_hook[hooks["/trickle"]].history[0].error  # cut by the whole-response deadline
        assert by_hook[hooks["/fail"]].history[0].status_code == 500
        assert by_hook[hooks["/redirect"]].history[0].status_code == 307
        assert "timeout" in (by_hook[hooks["/hang"]].history[0].error or "").lower()
        huge = by_hook[hooks["/huge"]]
        assert huge.status == "delivered" and len(huge.history[0].response_excerpt) <= 256
        failed = {d.webhook_id for d in store.webhook_deliveries(failed=True)}
        assert failed == {hooks["/fail"], hooks["/redirect"], hooks["/hang"], hooks["/trickle"]}

        # the secret (and its key bytes) in nothing the registry shows or logs
        raw = base64.b64decode(SECRET[6:])
        shown = repr(store.list_webhooks()) + repr(store.webhook_deliveries()) + repr(store.events()) \
            + caplog.text
        for needle in (SECRET, SECRET[6:], raw.hex(), base64.b64encode(raw).decode()[:20]):
            assert needle not in shown
    finally:
        rx.close()


def test_a_server_signing_key_open_to_others_is_refused(tmp_path):
    from registry.access.server_key import load_or_create

    key, _ = generate_keypair(tmp_path / "srv")
    assert load_or_create(key, False) is not None
    os.chmod(key, 0o644)
    with pytest.raises(UsageError, match="accessible by group or others"):
        load_or_create(key, False)
    assert load_or_create(tmp_path / "home" / "server-signing.key", True) is not None  # made 0600
    assert (tmp_path / "home" / "server-signing.key").stat().st_mode & 0o777 == 0o600


# -- the signed audit head -------------------------------------------------------------------

def test_rewrite_with_its_heads_deleted_is_caught_through_the_server_even_after_restart(tmp_path):
    """The attacker edits an old event, recomputes the chain, and deletes every signed head
    from that event on: the heads left all match. The server remembers (under its home, out of
    the database's reach) the newest head it signed, serves it, and never signs the rewrite."""
    from sqlalchemy import text

    from registry.store import open_metadata_store as open_store
    from tests.fixtures_pt2 import run_cli
    from tests.integration.test_audit_head import FAST, _broken, _ok, publish, recompute_chain_after_editing
    from tests.services_server import make_token, registry_server

    db = f"sqlite:///{tmp_path / 'registry.db'}"
    store = open_store(db, auto_create=True)
    home = tmp_path / "server-home"
    env = {**FAST, "PT2REG_HOME": str(home)}
    auditor = make_token(db, "auditor", ["audit:read"])
    try:
        with registry_server(db, "file://" + str(tmp_path / "store"), log_dir=tmp_path / "srv1", env=env) as srv:
            remote = {"PT2REG_URL": srv.url, "PT2REG_TOKEN": auditor, "PT2REG_DB": None,
                      "PT2REG_HOME": str(tmp_path / "h-remote")}
            pub = home / "server-signing.pub"
            seqs = []
            for change in (lambda: publish(store, MODEL, 1),
                           lambda: store.record_event("pull", actor="eve", host="laptop", model=MODEL,
                                                      number=1, details={"via": "cli"}),
                           lambda: publish(store, MODEL, 2)):
                change()
                newest = store.audit_hashes()[0][0]
                seqs.append(newest)
                wait_until(lambda: any(h.seq == newest for h in store.audit_heads()), f"event {newest} signed")  # noqa: B023
            _ok(run_cli("audit", "--verify", "--server-key", str(pub), env=remote))
            edited = seqs[1]  # eve's pull
            recompute_chain_after_editing(store.engine, edited, {"via": "cli", "note": "routine"})
            with store.engine.begin() as conn:
                conn.execute(text("DELETE FROM audit_heads WHERE seq >= :s"), {"s": edited})
            _broken(run_cli("audit", "--verify", "--server-key", str(pub), env=remote), edited, "recomputed")
        publish(store, MODEL, 3)  # a change while the server is down
        with registry_server(db, "file://" + str(tmp_path / "store"), log_dir=tmp_path / "srv2", env=env) as srv:
            remote["PT2REG_URL"] = srv.url
            # its first signing round has looked at the rewritten chain and refused it
            wait_until(lambda: "not signing the audit head" in srv.log(), "the restarted signer's refusal")
            assert all(h.seq < edited for h in store.audit_heads())  # the rewrite is never signed
            _broken(run_cli("audit", "--verify", "--server-key", str(pub), env=remote), edited, "recomputed")
    finally:
        store.close()


def test_truncated_newest_events_are_caught_and_never_signed(store, tmp_path):
    """Direct path, the signer driven in process: truncating the newest events is named by
    ``audit --verify --server-key``; with their heads deleted too, a restarted signer (same
    home) still refuses to sign the shortened chain."""
    from sqlalchemy import text

    from registry.server.audit_head import load_key, sign_newest
    from tests.fixtures_pt2 import run_cli
    from tests.integration.test_audit_head import _broken, _ok, publish

    home = tmp_path / "server-home"
    key = load_key(home)
    seqs = []
    for n in (1, 2, 3):
        publish(store, MODEL, n)
        assert sign_newest(store.engine, key) is not None  # one head per change
        store.record_event("pull", actor="eve", host="laptop", model=MODEL, number=n, details={})
        assert sign_newest(store.engine, key) is not None
        seqs.append(store.audit_hashes()[0][0])
    env = {"PT2REG_DB": str(store.engine.url), "PT2REG_URL": None, "PT2REG_HOME": str(tmp_path / "h")}
    pub = str(home / "server-signing.pub")
    _ok(run_cli("audit", "--verify", "--server-key", pub, env=env))
    with store.engine.begin() as conn:  # the newest pull is gone
        conn.execute(text("DELETE FROM audit_events WHERE seq = :s"), {"s": seqs[-1]})
    _broken(run_cli("audit", "--verify", "--server-key", pub, env=env), seqs[-1], "is gone", "truncated")
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM audit_heads WHERE seq >= :s"), {"s": seqs[-1]})
    publish(store, MODEL, 4)
    assert sign_newest(store.engine, key) is None and "no longer has the hash" in key.refused
    restarted = load_key(home)
    assert restarted.last_signed == (seqs[-1], key.last_signed[1])
    assert sign_newest(store.engine, restarted) is None and restarted.refused
    # the remembered head is only trusted when this key signed it, for this database
    kept = json.loads((home / "audit-head.json").read_text())
    assert kept["db"] == key.db_id and kept["head"] == key.last_head
    other = open_metadata_store(f"sqlite:///{tmp_path / 'other.db'}", auto_create=True)
    try:
        elsewhere = load_key(home)
        publish(other, MODEL, 1)
        assert sign_newest(other.engine, elsewhere) is not None  # a new database: starts afresh
    finally:
        other.close()
    (home / "audit-head.json").write_text(json.dumps({**kept, "head": {**kept["head"], "hash": "ab" * 32}}))
    assert load_key(home).last_head is None


def test_moves_racing_a_policy_change_never_land_after_it(store, tmp_path):
    """Threads move prod back and forth (and push with it) while another sets a policy it
    breaks: in the audit order, no move of prod follows the policy."""
    _publish(store, 1)
    _publish(store, 2)
    stop = threading.Event()
    errors: list[BaseException] = []
    tries = [0, 0, 0]  # per mover: counted, so the race is as long on a busy machine as on an idle one

    def mover(i: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            tries[i] = n
            try:
                if n % 5 == 0:
                    _publish(store, 100 + 10 * i + n % 10, aliases=("prod",))
                else:
                    store.set_alias(MODEL, "prod", 1 + n % 2, **WHO)
            except PolicyError:
                pass
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

    threads = [threading.Thread(target=mover, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    wait_until(lambda: sum(e.action.startswith("alias.") for e in store.events(MODEL)) >= 10 or errors,
               "moves before the policy")
    store.set_policy(MODEL, "prod", attestations=["cpu-ci"], **WHO)
    after = list(tries)
    wait_until(lambda: all(t >= a + 10 for t, a in zip(tries, after)) or errors, "each mover's tries after the policy")
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors
    events = store.events(MODEL)
    policy_at = next(e.seq for e in events if e.action == "policy.set")
    assert not [e for e in events if e.seq > policy_at and e.action.startswith("alias.")]
    assert any(e.seq < policy_at and e.action.startswith("alias.") for e in events)


def test_webhook_model_globs_follow_the_scope_grammar(store):
    """``--model team/*`` means what it means in a scope: ``team/x``, never ``team/a/b``."""
    store.secret_sealer = lambda url, secret: ("x", "k")   # sealed as given: only the glob is under test
    hook = store.add_webhook("http://127.0.0.1:9/h", ["version.published"], "team/*", secret="whsec_x", **WHO)
    for name in ("team/x", "team/a/b", "team2/x"):
        publish(store, name, "sha256:" + hashlib.sha256(name.encode()).hexdigest(), "{}", 1, [], **WHO)
    model_of = {e.seq: e.model for e in store.events()}
    got = [model_of[d.audit_seq] for d in store.webhook_deliveries() if d.webhook_id == hook.id]
    assert got == ["team/x"]
    for bad in ("team/[ab]", "team//x", "Team/*", "team/**x"):
        with pytest.raises(UsageError, match="invalid model glob"):
            store.add_webhook("http://127.0.0.1:9/h", ["version.published"], bad, secret="whsec_x", **WHO)
