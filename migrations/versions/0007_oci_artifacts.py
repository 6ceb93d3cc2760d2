"""OCI artifacts: where each version was pushed as a CNCF ModelPack artifact.

Revision ID: 0007_oci_artifacts
Revises: 0006_packs
Create Date: 2026-12-04

``oci_artifacts`` holds one row per ``pt2reg oci push`` of a version: the OCI repository
(``HOST/REPOSITORY``), the tag (NULL: pushed by digest alone) and the OCI manifest's digest,
which ``pt2reg show`` prints and ``pt2reg oci pull`` pins. A later push looks up the
repositories of the same host here to mount blobs across repositories instead of uploading them.
"""
from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0007_oci_artifacts"
down_revision: Union[str, Sequence[str], None] = "0006_packs"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

TS = sa.String(32)
DIGEST = sa.String(71)


def upgrade() -> None:
    op.create_table(
        "oci_artifacts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("version_id", sa.Integer(), nullable=False),
        sa.Column("location", sa.String(255), nullable=False),
        sa.Column("tag", sa.String(128), nullable=True),
        sa.Column("manifest_digest", DIGEST, nullable=False),
        sa.Column("pushed_at", TS, nullable=False),
        sa.Column("pushed_by", sa.String(256), nullable=False),
        sa.ForeignKeyConstraint(["version_id"], ["versions.id"], name=op.f("fk_oci_artifacts_version_id_versions")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_oci_artifacts")),
    )
    op.create_index(op.f("ix_oci_artifacts_version_id"), "oci_artifacts", ["version_id"])
    op.create_index(op.f("ix_oci_artifacts_location"), "oci_artifacts", ["location"])


def downgrade() -> None:
    op.drop_index(op.f("ix_oci_artifacts_location"), table_name="oci_artifacts")
    op.drop_index(op.f("ix_oci_artifacts_version_id"), table_name="oci_artifacts")
    op.drop_table("oci_artifacts")
