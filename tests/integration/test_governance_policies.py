"""Alias policies and conformance attestations (issue 19, points 1-2), on every path that moves
an alias: the CLI on a direct SQLite registry, the CLI through a registry server (in process,
uvicorn in a thread, tokens with scopes), and the store on PostgreSQL after the migration.

The policy of the issue: ``prod`` of ``team/m`` needs a signature by key K and a passed
attestation ``cpu-ci`` (signed by K). Moving ``prod`` to an unsigned version, to a signed but
unattested one, or with a token lacking the alias scope exits 7 with one line naming the rule
and the version; after ``pt2reg attest REF --label cpu-ci --sign K`` the move succeeds.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli_inprocess import run_in_process
from tests.integration.test_remote_e2e import _Server, client
from tests.services_server import make_token
from tests.store_calls import publish

MODEL = "team/m"


def ok(r) -> Any:
    assert r.returncode == 0, (r.args, r.returncode, r.stdout, r.stderr)
    return json.loads(r.stdout) if "--json" in r.args else r.stdout


def refused(r, code: int, *needles: str) -> str:
    assert r.returncode == code, (r.args, r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _keys(tmp: Path) -> tuple[Path, Path]:
    for name in ("k", "other"):
        ok(run_in_process("key", "generate", str(tmp / name)))
    return tmp / "k", tmp / "other"


def test_policy_and_attestations_on_the_direct_store(tmp_path, bundles):
    env = {"PT2REG_HOME": str(tmp_path / "home"), "PT2REG_DB": None, "PT2REG_STORE": None,
           "PT2REG_URL": None, "PT2REG_TOKEN": None}

    def cli(*args: Any):
        return run_in_process(*args, env=env)

    k, other = _keys(tmp_path)
    assert ok(cli("push", bundles["v0"], "--name", MODEL, "--json"))["version"] == 1            # unsigned
    assert ok(cli("push", bundles["ed"], "--name", MODEL, "--sign", f"{k}.key", "--json"))["version"] == 2
    assert ok(cli("push", bundles["v1"], "--name", MODEL, "--sign", f"{k}.key", "--json"))["version"] == 3
    shown = ok(cli("policy", "set", MODEL, "prod", "--require-signature", f"{k}.pub",
                   "--require-attestation", "cpu-ci", "--json"))["policy"]
    assert shown["require_attestation"] == ["cpu-ci"] and len(shown["require_signature"]) == 1

    # an unsigned version, then a signed but unattested one: exit 7 naming the rule and version
    refused(cli("alias", "set", MODEL, "prod", "1"), 7, "alias prod of team/m needs a signature by",
            "version 1 has none")
    refused(cli("alias", "set", MODEL, "prod", "2"), 7,
            "alias prod of team/m needs an attestation for 'cpu-ci'; version 2 has none")
    # publish-with-alias is refused as a whole: no version 4 appears
    refused(cli("push", bundles["v2"], "--name", MODEL, "--sign", f"{k}.key", "--alias", "prod"), 7,
            "version 4 has none")
    assert [v["version"] for v in ok(cli("list", MODEL, "--json"))["versions"]] == [1, 2, 3]

    # a failing run records a failed attestation (exit 1): v3 has no golden samples
    failed = cli("attest", f"{MODEL}@3", "--label", "cpu-ci", "--sign", f"{k}.key", "--json")
    assert failed.returncode == 1, failed.stderr
    assert "no golden samples" in failed.stderr.strip().splitlines()[-1]
    listed = ok(cli("attestations", f"{MODEL}@3", "--json"))["attestations"]
    assert [(a["label"], a["passed"]) for a in listed] == [("cpu-ci", False)]
    refused(cli("alias", "set", MODEL, "prod", "3"), 7, "version 3 has only failed ones")

    # a passed but unsigned attestation does not count for a policy that names keys
    unsigned = ok(cli("attest", f"{MODEL}@2", "--label", "cpu-ci", "--device", "cpu", "--json"))["attestation"]
    assert unsigned["passed"] is True and unsigned["signed_by"] is None
    refused(cli("alias", "set", MODEL, "prod", "2"), 7, "signed by", "version 2 has none so signed")
    # signed by another key: the version is not signed by it either way
    ok(cli("attest", f"{MODEL}@2", "--label", "cpu-ci", "--sign", f"{other}.key"))
    refused(cli("alias", "set", MODEL, "prod", "2"), 7, "version 2 has none so signed")

    signed = ok(cli("attest", f"{MODEL}@2", "--label", "cpu-ci", "--sign", f"{k}.key", "--json"))["attestation"]
    assert signed["passed"] and signed["signed_by"].startswith("sha256:")
    assert signed["target"]["device_type"] == "cpu" and signed["target"]["torch"]
    samples = [r for r in signed["results"] if r["check"] == "sample"]
    assert samples and all(o["max_abs"] is not None for r in samples for o in r["outputs"])
    ok(cli("alias", "set", MODEL, "prod", "2"))
    assert ok(cli("show", f"{MODEL}@prod", "--json"))["version"] == 2

    # show lists the attestations (human and JSON)
    shown = ok(cli("show", f"{MODEL}@2", "--json"))
    assert [a["passed"] for a in shown["attestations"]] == [True, True, True]
    assert "cpu-ci" in ok(cli("show", f"{MODEL}@2")) and "passed" in ok(cli("attestations", f"{MODEL}@2"))

    # immutable: set once, then never moved, removed, or its policy relaxed
    ok(cli("policy", "set", MODEL, "stable", "--immutable"))
    ok(cli("alias", "set", MODEL, "stable", "1"))
    refused(cli("alias", "set", MODEL, "stable", "2"), 7, "alias stable of team/m is immutable",
            "cannot be moved to version 2")
    refused(cli("alias", "rm", MODEL, "stable"), 7, "immutable", "cannot be removed")
    refused(cli("policy", "rm", MODEL, "stable"), 7, "immutable")
    refused(cli("policy", "set", MODEL, "stable"), 7, "immutable")
    assert ok(cli("show", f"{MODEL}@stable", "--json"))["version"] == 1

    policies = ok(cli("policy", "show", MODEL, "--json"))["policies"]
    assert [(p["alias"], p["immutable"]) for p in policies] == [("prod", False), ("stable", True)]
    ok(cli("policy", "rm", MODEL, "prod"))
    ok(cli("alias", "set", MODEL, "prod", "1"))  # no policy: any version again

    events = ok(cli("audit", "--model", MODEL, "--json"))["events"]
    actions = [e["action"] for e in events]
    assert actions.count("policy.set") == 2 and "policy.remove" in actions
    assert actions.count("attestation.record") == 4
    ok(cli("audit", "--verify"))


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Any:
    with _Server(tmp_path_factory.mktemp("governance-server")) as srv:
        yield srv


def test_policy_and_attestations_through_the_server(server, bundles, tmp_path):
    admin = client(server, tmp_path / "admin", make_token(server.db, "ops", ["admin"]))
    trainer = client(server, tmp_path / "trainer",
                     make_token(server.db, "trainer", ["model:team/*:pull,push,alias"]))
    ci = client(server, tmp_path / "ci", make_token(server.db, "ci", ["model:team/*:pull,attest"]))
    reader = client(server, tmp_path / "reader", make_token(server.db, "reader", ["model:team/*:pull"]))
    k, _ = _keys(tmp_path)

    # policy changes need admin, and are audited with the token's owner
    refused(run_in_process("policy", "set", MODEL, "prod", "--require-signature", f"{k}.pub", env=trainer), 7,
            "admin")
    ok(run_in_process("policy", "set", MODEL, "prod", "--require-signature", f"{k}.pub",
                      "--require-attestation", "cpu-ci", env=admin))
    ok(run_in_process("push", bundles["v0"], "--name", MODEL, env=trainer))
    ok(run_in_process("push", bundles["ed"], "--name", MODEL, "--sign", f"{k}.key", env=trainer))
    assert ok(run_in_process("policy", "show", MODEL, "--json", env=reader))["policies"][0]["alias"] == "prod"

    refused(run_in_process("alias", "set", MODEL, "prod", "1", env=trainer), 7,
            "alias prod of team/m needs a signature by", "version 1 has none")
    refused(run_in_process("alias", "set", MODEL, "prod", "2", env=trainer), 7,
            "alias prod of team/m needs an attestation for 'cpu-ci'; version 2 has none")
    refused(run_in_process("alias", "set", MODEL, "prod", "2", env=reader), 7, "model:team/m:alias")
    refused(run_in_process("attest", f"{MODEL}@2", "--label", "cpu-ci", env=trainer), 7, "model:team/m:attest")

    made = ok(run_in_process("attest", f"{MODEL}@2", "--label", "cpu-ci", "--sign", f"{k}.key", "--json",
                             env=ci))["attestation"]
    assert made["passed"] and made["created_by"] == "ci"
    ok(run_in_process("alias", "set", MODEL, "prod", "2", env=trainer))
    assert [a["label"] for a in ok(run_in_process("show", f"{MODEL}@prod", "--json", env=reader))["attestations"]] \
        == ["cpu-ci"]

    # immutable: by no token, admin included
    ok(run_in_process("policy", "set", MODEL, "stable", "--immutable", env=admin))
    ok(run_in_process("alias", "set", MODEL, "stable", "1", env=trainer))
    for who in (trainer, admin):
        refused(run_in_process("alias", "set", MODEL, "stable", "2", env=who), 7, "immutable")
        refused(run_in_process("alias", "rm", MODEL, "stable", env=who), 7, "immutable")
    refused(run_in_process("policy", "rm", MODEL, "stable", env=admin), 7, "immutable")

    # --role-scope: only a token holding that action moves the alias
    ok(run_in_process("policy", "set", MODEL, "canary", "--role-scope", "admin", env=admin))
    refused(run_in_process("alias", "set", MODEL, "canary", "1", env=trainer), 7,
            "may be moved only by a token with scope admin", "'trainer'")
    ok(run_in_process("alias", "set", MODEL, "canary", "1", env=admin))

    # a signature that does not cover what is recorded is refused (exit 5), nothing recorded
    from registry.client import Registry
    from registry.config import Settings
    from registry.errors import SignatureError
    from registry.format.signing import public_pem_of, sign_digest

    with Registry(Settings.resolve(env={k_: v for k_, v in ci.items() if v is not None})) as reg:
        version = reg.resolve(f"{MODEL}@1")
        forged = sign_digest(f"{k}.key", "sha256:" + "00" * 32)
        with pytest.raises(SignatureError):
            reg.meta.record_attestation(MODEL, 1, label="cpu-ci", passed=True, device="cpu", target={},
                                        results=[], signature=forged, public_key=public_pem_of(f"{k}.key"),
                                        actor="x", host="y")
        assert reg.attestations(version)[1] == []

    events = ok(run_in_process("audit", "--model", MODEL, "--json", env=admin))["events"]
    assert [e["actor"] for e in events if e["action"] == "policy.set"] == ["ops", "ops", "ops"]
    assert [e["actor"] for e in events if e["action"] == "attestation.record"] == ["ci"]
    ok(run_in_process("audit", "--verify", env=admin))


@pytest.mark.integration
def test_policies_on_postgresql(pg_db_url, tmp_path):
    """Migration 0004 on PostgreSQL, and the store enforcing a policy in its transactions."""
    from registry.access.policy import attestation_digest, attestation_statement
    from registry.errors import PolicyError
    from registry.format.signing import generate_keypair, public_pem_of, sign_digest
    from registry.store import SqlMetadataStore
    from registry.store.engine import make_engine
    from registry.store.migrate import HEAD_REVISION, upgrade

    engine = make_engine(pg_db_url)
    assert upgrade(engine)[1] == HEAD_REVISION
    key, pub = generate_keypair(tmp_path / "k")
    who = {"actor": "ana", "host": "ci"}
    with SqlMetadataStore(engine) as store:
        digests = ["sha256:" + c * 64 for c in "ab"]
        for d in digests:
            publish(store, MODEL, d, "{}", 1, [], signatures=[sign_digest(key, d)], **who)
        store.set_policy(MODEL, "prod", signers=[pub.read_text()], attestations=["cpu-ci"], **who)
        with pytest.raises(PolicyError, match="version 2 has none"):
            store.set_alias(MODEL, "prod", 2, **who)
        with pytest.raises(PolicyError, match="version 3 has none"):  # unsigned: refused whole
            publish(store, MODEL, "sha256:" + "c" * 64, "{}", 1, [], aliases=["prod"], **who)
        fields = {"label": "cpu-ci", "passed": True, "device": "cpu", "target": {"torch": "x"},
                  "results": [], "error": None}
        statement = attestation_statement(digest=digests[1], **fields)
        store.record_attestation(MODEL, 2, **fields, signature=sign_digest(key, attestation_digest(statement)),
                                 public_key=public_pem_of(key), **who)
        assert store.set_alias(MODEL, "prod", 2, **who).number == 2
        assert [a.passed for a in store.attestations(MODEL, 2)] == [True]
        assert [v.number for v in store.list_versions(MODEL)] == [1, 2]
        assert store.verify_audit_chain().ok
