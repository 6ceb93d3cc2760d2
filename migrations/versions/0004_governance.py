"""Governance: alias policies and conformance attestations.

Revision ID: 0004_governance
Revises: 0003_tokens
Create Date: 2026-11-24

``alias_policies`` holds the rules on one alias of one model (``registry.access.policy``),
keyed by the model's name so a policy can exist before the model's first publish:
``signers_json`` is the canonical JSON list of ``[key id, public key PEM]`` pairs,
``attestations_json`` the labels a version must have passed. ``attestations`` holds what
``pt2reg attest`` recorded for a version: the probed target and per-output errors as JSON, the
verdict, and (signed ones) the Ed25519 signature with the public key that verified it. Policy
changes and attestations are audited (``policy.set``, ``policy.remove``, ``attestation.record``).
"""
from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0004_governance"
down_revision: Union[str, Sequence[str], None] = "0003_tokens"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

TS = sa.String(32)
WHO = sa.String(256)
DIGEST = sa.String(71)


def upgrade() -> None:
    op.create_table(
        "alias_policies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("alias", sa.String(64), nullable=False),
        sa.Column("role_scope", sa.String(16), nullable=True),
        sa.Column("signers_json", sa.Text(), nullable=False),
        sa.Column("attestations_json", sa.Text(), nullable=False),
        sa.Column("immutable", sa.Boolean(), nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("updated_by", WHO, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alias_policies")),
        sa.UniqueConstraint("model", "alias", name=op.f("uq_alias_policies_model_alias")),
    )
    op.create_table(
        "attestations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("version_id", sa.Integer(), nullable=False),
        sa.Column("label", sa.String(64), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.Column("device", sa.String(64), nullable=False),
        sa.Column("target_json", sa.Text(), nullable=False),
        sa.Column("results_json", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("key_id", DIGEST, nullable=True),
        sa.Column("signature", sa.Text(), nullable=True),
        sa.Column("public_key", sa.Text(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("created_by", WHO, nullable=False),
        sa.ForeignKeyConstraint(["version_id"], ["versions.id"],
                                name=op.f("fk_attestations_version_id_versions")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attestations")),
    )
    op.create_index(op.f("ix_attestations_version_id_label"), "attestations", ["version_id", "label"])


def downgrade() -> None:
    # policy.* and attestation.record events stay in the (append-only) log; 0003 software
    # ignores actions it does not replay.
    op.drop_index(op.f("ix_attestations_version_id_label"), table_name="attestations")
    op.drop_table("attestations")
    op.drop_table("alias_policies")
