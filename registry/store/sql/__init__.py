"""The SQL metadata store: one class per concern over one engine, and their composite.

``SqlMetadataStore`` fills every port of ``registry.client.ports.MetadataStore`` on SQLite and
PostgreSQL alike; each concern is a class of its own over the shared engine and session helpers
(``_base.SqlStoreBase``), usable alone over the same engine:

==========================  ====================================================================
``SqlVersionStore``         models, versions, aliases, status, signatures, lineage (``versions``)
``SqlPushStore``            pending-push claims, chunk lookups, gc (``pushes``)
``SqlAuditLog``             the audit chain, its checks, signed heads (``audit``)
``SqlAccessStore``          API tokens (``access``)
``SqlGovernanceStore``      alias policies and attestations (``policies``)
``SqlWebhookStore``         webhook subscriptions and deliveries (``webhooks``)
``SqlOciArtifacts``         pushes of versions to OCI registries (``oci``)
==========================  ====================================================================

Callers get frozen records (:mod:`registry.store.records`) and registry errors, never sessions
or SQLAlchemy exceptions; every state change appends its audit event in the same transaction
(how concurrent writers stay correct: ``_base``). For example::

    store = SqlMetadataStore(make_engine("sqlite:////tmp/reg/registry.db"))
    version, created = store.publish(PublishRequest("bert", digest, manifest, 1234, [(blob, 1234)],
                                                    aliases=["prod"]), actor="ana", host="gpu-1")
    store.resolve(Ref.parse("bert@prod")).number   # -> 1
"""
from __future__ import annotations

from ._base import LOCATE_VERSIONS, SqlStoreBase
from .access import SqlAccessStore
from .audit import SqlAuditLog
from .oci import SqlOciArtifacts
from .policies import SqlGovernanceStore
from .pushes import SqlPushStore
from .versions import SqlVersionStore
from .webhooks import SecretSealer, SqlWebhookStore

__all__ = ["SqlMetadataStore", "SqlStoreBase", "SqlVersionStore", "SqlPushStore", "SqlAuditLog", "SqlAccessStore",
           "SqlGovernanceStore", "SqlWebhookStore", "SqlOciArtifacts", "SecretSealer", "LOCATE_VERSIONS"]


class SqlMetadataStore(SqlVersionStore, SqlPushStore, SqlAuditLog, SqlAccessStore, SqlGovernanceStore,
                       SqlWebhookStore, SqlOciArtifacts):
    """Registry metadata in a SQL database (SQLite file or PostgreSQL): every concern's class
    over one engine (``registry.client.ports.MetadataStore``).

    Takes an engine from :func:`registry.store.engine.make_engine` (or a URL) whose schema is at
    head (see :func:`registry.store.migrate.ensure_schema`); creating tables is not its job.
    """
