"""API tokens for the registry server: owner, scopes, expiry, revocation; the secret's hash only.

Revision ID: 0003_tokens
Revises: 0002_audit_version_fields
Create Date: 2026-11-24

``secret_hash`` is the SHA-256 hex of the token's secret (``registry.access.tokens``), unique so
the server finds a request's token by it; the secret itself is never stored. ``scopes_json`` is
the canonical JSON list of canonical scope texts. Timestamps are canonical UTC text like every
other table (see ``registry/store/orm.py``). Token creation and revocation are audited
(``token.create`` / ``token.revoke``), and ``audit --verify`` replays those events against this
table.
"""
from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0003_tokens"
down_revision: Union[str, Sequence[str], None] = "0002_audit_version_fields"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

TS = sa.String(32)
WHO = sa.String(256)


def upgrade() -> None:
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("scopes_json", sa.Text(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("created_by", WHO, nullable=False),
        sa.Column("expires_at", TS, nullable=True),
        sa.Column("revoked_at", TS, nullable=True),
        sa.Column("last_used_at", TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tokens")),
        sa.UniqueConstraint("secret_hash", name=op.f("uq_tokens_secret_hash")),
    )


def downgrade() -> None:
    # token.create / token.revoke events stay in the (append-only) log; 0002 software ignores
    # actions it does not replay.
    op.drop_table("tokens")
