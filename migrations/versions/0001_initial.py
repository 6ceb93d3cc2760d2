"""Initial schema: models, versions, blobs, aliases, signatures, lineage, pending pushes, audit.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-22

Timestamps are canonical UTC text and JSON values canonical JSON text (see
``registry/store/orm.py`` for why). Constraint names follow ``orm.NAMING``.
"""
from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0001_initial"
down_revision: Union[str, Sequence[str], None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

TS = sa.String(32)
DIGEST = sa.String(71)
WHO = sa.String(256)


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_models")),
        sa.UniqueConstraint("name", name=op.f("uq_models_name")),
    )
    op.create_table(
        "versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("digest", DIGEST, nullable=False),
        sa.Column("manifest_json", sa.Text(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("status_reason", sa.Text(), nullable=True),
        sa.Column("status_by", WHO, nullable=True),
        sa.Column("status_at", TS, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("created_by", WHO, nullable=False),
        sa.Column("build_json", sa.Text(), nullable=True),
        sa.Column("environment_json", sa.Text(), nullable=True),
        sa.Column("metadata_json", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_versions")),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"],
                                name=op.f("fk_versions_model_id_models")),
        sa.UniqueConstraint("model_id", "number", name=op.f("uq_versions_model_id_number")),
        sa.UniqueConstraint("model_id", "digest", name=op.f("uq_versions_model_id_digest")),
        sa.CheckConstraint("status IN ('active', 'deprecated', 'yanked')",
                           name=op.f("ck_versions_status")),
        sa.CheckConstraint("number >= 1", name=op.f("ck_versions_number")),
    )
    op.create_index(op.f("ix_versions_digest"), "versions", ["digest"])
    op.create_table(
        "version_blobs",
        sa.Column("version_id", sa.Integer(), nullable=False),
        sa.Column("blob_digest", DIGEST, nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("version_id", "blob_digest", name=op.f("pk_version_blobs")),
        sa.ForeignKeyConstraint(["version_id"], ["versions.id"],
                                name=op.f("fk_version_blobs_version_id_versions")),
    )
    op.create_index(op.f("ix_version_blobs_blob_digest"), "version_blobs", ["blob_digest"])
    op.create_table(
        "aliases",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("alias", sa.String(64), nullable=False),
        sa.Column("version_id", sa.Integer(), nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("updated_by", WHO, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_aliases")),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"],
                                name=op.f("fk_aliases_model_id_models")),
        sa.ForeignKeyConstraint(["version_id"], ["versions.id"],
                                name=op.f("fk_aliases_version_id_versions")),
        sa.UniqueConstraint("model_id", "alias", name=op.f("uq_aliases_model_id_alias")),
    )
    op.create_index(op.f("ix_aliases_version_id"), "aliases", ["version_id"])
    op.create_table(
        "signatures",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("version_id", sa.Integer(), nullable=False),
        sa.Column("key_id", DIGEST, nullable=False),
        sa.Column("algorithm", sa.String(16), nullable=False),
        sa.Column("signature", sa.Text(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_signatures")),
        sa.ForeignKeyConstraint(["version_id"], ["versions.id"],
                                name=op.f("fk_signatures_version_id_versions")),
        sa.UniqueConstraint("version_id", "key_id",
                            name=op.f("uq_signatures_version_id_key_id")),
    )
    op.create_table(
        "lineage_edges",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("version_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("digest", DIGEST, nullable=True),
        sa.Column("extra_json", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_lineage_edges")),
        sa.ForeignKeyConstraint(["version_id"], ["versions.id"],
                                name=op.f("fk_lineage_edges_version_id_versions")),
        sa.CheckConstraint("kind IN ('parent', 'dataset', 'run', 'commit', 'code')",
                           name=op.f("ck_lineage_edges_kind")),
    )
    op.create_index(op.f("ix_lineage_edges_version_id"), "lineage_edges", ["version_id"])
    op.create_index(op.f("ix_lineage_edges_kind_value"), "lineage_edges", ["kind", "value"])
    op.create_index(op.f("ix_lineage_edges_kind_digest"), "lineage_edges", ["kind", "digest"])
    op.create_table(
        "pending_pushes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("host", WHO, nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("heartbeat_at", TS, nullable=False),
        sa.Column("blobs_json", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pending_pushes")),
    )
    op.create_table(
        "audit_events",
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("ts", TS, nullable=False),
        sa.Column("actor", WHO, nullable=False),
        sa.Column("host", WHO, nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("model", sa.String(128), nullable=True),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("digest", DIGEST, nullable=True),
        sa.Column("ref", sa.Text(), nullable=True),
        sa.Column("details_json", sa.Text(), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_audit_events")),
        sa.UniqueConstraint("hash", name=op.f("uq_audit_events_hash")),
    )
    op.create_index(op.f("ix_audit_events_model_seq"), "audit_events", ["model", "seq"])
    op.create_index(op.f("ix_audit_events_ts"), "audit_events", ["ts"])


def downgrade() -> None:
    for table in ("audit_events", "pending_pushes", "lineage_edges", "signatures", "aliases",
                  "version_blobs", "versions", "models"):
        op.drop_table(table)
