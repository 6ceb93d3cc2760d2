"""Packs: each version's pack index.

Revision ID: 0006_packs
Revises: 0005_webhooks
Create Date: 2026-11-24

``version_packs`` holds a version's pack index (``registry.format.packs``): for each pack blob
it reads chunks from, the pack's digest and size and where each chunk lies in it (no row: every
chunk is a blob of its own, as for every version pushed before packs). A push to a model looks
up its chunks in the indexes of the model's latest versions.
"""
from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0006_packs"
down_revision: Union[str, Sequence[str], None] = "0005_webhooks"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

DIGEST = sa.String(71)


def upgrade() -> None:
    op.create_table(
        "version_packs",
        sa.Column("version_id", sa.Integer(), nullable=False),
        sa.Column("packs_json", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["version_id"], ["versions.id"], name=op.f("fk_version_packs_version_id_versions")),
        sa.PrimaryKeyConstraint("version_id", name=op.f("pk_version_packs")),
    )


def downgrade() -> None:
    # a version with a pack index cannot be pulled without it: refuse rather than lose it
    if op.get_bind().execute(sa.text("SELECT COUNT(*) FROM version_packs")).scalar():
        raise RuntimeError("cannot downgrade below 0006_packs: versions were pushed with packs, and without "
                           "their pack indexes their small tensors could not be pulled")
    op.drop_table("version_packs")
