"""The store contract: every port of ``registry.client.ports.MetadataStore`` runs the same cases
against SQLite, PostgreSQL and the HTTP store behind a real ``pt2reg serve`` (over SQLite and a
local blob directory). An implementation that diverges from the others fails here.

Each case publishes under a model name of its own, so the HTTP server (one per module, started
once) needs no reset between cases.
"""
from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from registry.blobs import LocalBlobStore
from registry.errors import NotFoundError, UsageError
from registry.refs import Ref
from registry.store.records import GcResult, LineageEdge, PublishRequest
from tests.services_server import make_token, manifest_text, registry_server

WHO = {"actor": "ana", "host": "contract-host"}


class Store:
    """One implementation under test: its metadata store, the blob store its publishes need."""

    def __init__(self, kind: str, meta: Any, blobs: Any) -> None:
        self.kind, self.meta, self.blobs = kind, meta, blobs

    def publish(self, name: str, salt: str = "", **fields: Any) -> Any:
        """Publish a valid one-blob version of ``name`` (the blob stored first, as a push does)."""
        payload = f"{name} {salt} {uuid.uuid4()}".encode()
        blob = "sha256:" + hashlib.sha256(payload).hexdigest()
        self.blobs.put_bytes(payload, blob)
        text = manifest_text(blob, len(payload), salt)
        from registry.format.manifest import Manifest

        manifest = Manifest.from_bytes(text.encode())
        self.blobs.put_bytes(manifest.canonical, manifest.digest)
        request = PublishRequest(name, manifest.digest, text, manifest.total_size,
                                 [(blob, len(payload)), (manifest.digest, len(manifest.canonical))],
                                 metadata=dict(manifest.metadata), **fields)
        return self.meta.publish(request, **WHO)


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    root = tmp_path_factory.mktemp("contract-server")
    db, store = f"sqlite:///{root / 'server.db'}", str(root / "blobs")
    with registry_server(db, store, log_dir=root / "logs") as server:
        yield server.url, make_token(db, "ana", ["admin"]), root


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.integration), "http"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "http":
        from registry.remote.blobs import HttpBlobStore
        from registry.remote.http import HttpClient
        from registry.remote.meta import HttpMetadataStore

        url, token, _ = request.getfixturevalue("http_server")
        client = HttpClient(url, token)
        yield Store("http", HttpMetadataStore(client), HttpBlobStore(client))
        client.close()
        return
    from registry.store import open_metadata_store

    url = (f"sqlite:///{tmp_path / 'registry.db'}" if request.param == "sqlite"
           else request.getfixturevalue("pg_db_url"))
    with open_metadata_store(url, auto_create=True) as meta:
        yield Store(request.param, meta, LocalBlobStore(tmp_path / "blobs"))


def fresh(prefix: str = "m") -> str:
    return f"contract/{prefix}-{uuid.uuid4().hex[:10]}"


# -- VersionStore ------------------------------------------------------------------------------

def test_publish_resolve_and_list(store: Store) -> None:
    name = fresh()
    v1, created = store.publish(name, "a", aliases=["prod"])
    assert created and (v1.name, v1.number, v1.aliases) == (name, 1, ["prod"])
    again, created_again = store.publish(name, "b")
    assert created_again and again.number == 2
    assert store.meta.resolve(Ref.parse(f"{name}@prod")).digest == v1.digest
    assert store.meta.resolve(Ref.parse(name)).number == 2
    assert store.meta.resolve(Ref.parse(f"{name}@{v1.digest}")).number == 1
    assert [v.number for v in store.meta.list_versions(name)] == [1, 2]
    [model] = [m for m in store.meta.list_models() if m.name == name]
    assert (model.version_count, model.latest, model.aliases) == (2, 2, {"prod": 1})
    with pytest.raises(NotFoundError):
        store.meta.resolve(Ref.parse(f"{name}@9"))


def test_alias_status_and_history(store: Store) -> None:
    name = fresh()
    store.publish(name, "a")
    store.publish(name, "b")
    before = store.meta.db_now()
    moved = store.meta.set_alias(name, "prod", 2, **WHO)
    assert (moved.alias, moved.number) == ("prod", 2)
    assert store.meta.alias_at(name, "prod", before - timedelta(days=1)) is None
    assert store.meta.alias_at(name, "prod", store.meta.db_now() + timedelta(seconds=5)) == 2
    assert store.meta.remove_alias(name, "prod", **WHO).number == 2
    yanked = store.meta.set_status(name, 2, "yanked", "bad", **WHO)
    assert (yanked.status, yanked.status_reason) == ("yanked", "bad")
    assert store.meta.resolve(Ref.parse(name)).number == 1   # latest non-yanked
    with pytest.raises(UsageError):
        store.meta.set_status(name, 1, "yanked", None, **WHO)


def test_lineage_and_build_info(store: Store) -> None:
    parent_name, child_name = fresh("p"), fresh("c")
    parent, _ = store.publish(parent_name, "a", lineage=[LineageEdge("dataset", "s3://contract/train")])
    child, _ = store.publish(child_name, "b", lineage=[LineageEdge("parent", f"{parent_name}@1", parent.digest)],
                             build={"tool": "contract"})
    assert [n.ref for n in store.meta.ancestors(child_name, 1)] == [f"{child_name}@1", f"{parent_name}@1"]
    assert [n.ref for n in store.meta.descendants(parent_name, 1)] == [f"{parent_name}@1", f"{child_name}@1"]
    refs = [n.ref for n in store.meta.versions_from_dataset("s3://contract/train")]
    assert refs[:2] == [f"{parent_name}@1", f"{child_name}@1"]
    assert store.meta.build_info(child_name, 1) == {"tool": "contract"}
    assert store.meta.build_info(parent_name, 1) is None
    assert store.meta.signatures(child_name, 1) == []


# -- PushStore ---------------------------------------------------------------------------------

def test_claims_and_the_declared_capabilities(store: Store) -> None:
    digest = "sha256:" + hashlib.sha256(uuid.uuid4().bytes).hexdigest()
    claim = store.meta.begin_pending([digest], "contract-host", 4242, name=fresh())
    assert store.meta.heartbeat_pending(claim) is True
    store.meta.end_pending(claim)
    store.meta.end_pending(claim)   # idempotent
    assert store.meta.heartbeat_pending(claim) is False
    now = store.meta.db_now()
    assert now.tzinfo is not None and abs(now - datetime.now(timezone.utc)) < timedelta(minutes=5)
    assert store.meta.extends_claims is (store.kind != "http")
    if not store.meta.extends_claims:
        with pytest.raises(UsageError):
            store.meta.extend_pending(claim, [digest])


def test_locate_chunks_and_gc_have_one_shape(store: Store) -> None:
    name = fresh()
    store.publish(name, "a")
    assert store.meta.locate_chunks(["sha256:" + "ab" * 32], name=name) == {}
    result = store.meta.gc(store.blobs, dry_run=True, grace_seconds=3600.0, **WHO)
    assert isinstance(result, GcResult) and result.dry_run and result.deleted == []


# -- AuditLog ----------------------------------------------------------------------------------

def test_audit_events_chain_and_hashes(store: Store) -> None:
    name = fresh()
    store.publish(name, "a", aliases=["prod"])
    event = store.meta.record_event("pull", model=name, number=1, ref=f"{name}@prod", **WHO)
    actions = [e.action for e in store.meta.events(model=name)]
    assert actions == ["publish", "alias.set", "pull"]
    head, found = store.meta.audit_hashes([event.seq])
    assert head is not None and head[0] >= event.seq and found == {event.seq: event.hash}
    assert store.meta.verify_audit_chain().ok
    assert store.meta.verify_version_contents() is None


# -- AccessStore -------------------------------------------------------------------------------

def test_tokens(store: Store) -> None:
    record, secret = store.meta.create_token("ci-" + uuid.uuid4().hex[:6], ["model:team/*:pull"],
                                             expires_at=None, **WHO)
    assert secret.startswith("pt2r_") and record.scopes == ["model:team/*:pull"]
    assert record.id in [t.id for t in store.meta.list_tokens()]
    assert store.meta.revoke_token(record.id, **WHO).revoked_at is not None
    identity = store.meta.whoami()
    assert (identity is None) is (store.kind != "http")


# -- GovernanceStore ---------------------------------------------------------------------------

def test_policies_and_attestations(store: Store) -> None:
    name = fresh()
    store.publish(name, "a")
    policy = store.meta.set_policy(name, "prod", attestations=["cpu-ci"], **WHO)
    assert (policy.alias, list(policy.attestations)) == ("prod", ["cpu-ci"])
    assert [p.alias for p in store.meta.policies(name)] == ["prod"]
    attestation = store.meta.record_attestation(name, 1, label="cpu-ci", passed=True, device="cpu",
                                                target={"device": "cpu"}, results=[], **WHO)
    assert (attestation.label, attestation.passed) == ("cpu-ci", True)
    assert [a.label for a in store.meta.attestations(name, 1)] == ["cpu-ci"]
    assert store.meta.remove_policy(name, "prod", **WHO).alias == "prod"
    assert store.meta.policies(name) == []


# -- WebhookStore ------------------------------------------------------------------------------

def test_webhooks(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    import base64

    if store.kind != "http":   # the SQL store seals with a key its opener gives it (server, Registry)
        store.meta.secret_sealer = lambda url, secret: ("sealed:" + url, "key-1")
    secret = "whsec_" + base64.b64encode(b"k" * 32).decode()
    hook = store.meta.add_webhook("https://hooks.example.com/x", ["version.published"], "contract/*",
                                  secret=secret, **WHO)
    assert (hook.url, hook.events, hook.model_glob) == ("https://hooks.example.com/x", ["version.published"],
                                                         "contract/*")
    assert hook.id in [h.id for h in store.meta.list_webhooks()]
    assert store.meta.remove_webhook(hook.id, **WHO).id == hook.id
    assert hook.id not in [h.id for h in store.meta.list_webhooks()]
    assert isinstance(store.meta.webhook_deliveries(limit=5), list)


# -- OciArtifacts ------------------------------------------------------------------------------

def test_oci_artifacts(store: Store) -> None:
    name = fresh()
    store.publish(name, "a")
    manifest = "sha256:" + "cd" * 32
    first = store.meta.record_oci_artifact(name, 1, location="oci.example.com/team/m", tag="v1",
                                           manifest_digest=manifest, **WHO)
    again = store.meta.record_oci_artifact(name, 1, location="oci.example.com/team/m", tag="v1",
                                           manifest_digest=manifest, **WHO)
    assert first == again   # idempotent
    assert [(a.location, a.tag) for a in store.meta.oci_artifacts(name, 1)] == [("oci.example.com/team/m", "v1")]
    assert "team/m" in store.meta.oci_repositories("oci.example.com")
