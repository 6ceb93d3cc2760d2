"""Webhooks (subscriptions, the delivery outbox, every attempt) and signed audit heads.

Revision ID: 0005_webhooks
Revises: 0004_governance
Create Date: 2026-11-24

``webhooks`` holds one subscription: its URL, the event types and model glob it wants, and its
secret *encrypted* (AES-256-GCM under a key derived from the server's signing key: the secret
must be usable for signing, so it cannot be hashed). ``webhook_deliveries`` is the outbox: one
row per (event, subscribed webhook), inserted in the transaction that appends the audit event,
claimed by one server replica at a time (``claimed_until``). ``webhook_attempts`` logs every
attempt with its HTTP status and a short excerpt of the response. ``audit_heads`` holds the
audit chain heads the server signed with its Ed25519 key.
"""
from __future__ import annotations

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0005_webhooks"
down_revision: Union[str, Sequence[str], None] = "0004_governance"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

TS = sa.String(32)
WHO = sa.String(256)
DIGEST = sa.String(71)


def upgrade() -> None:
    op.create_table(
        "webhooks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("events_json", sa.Text(), nullable=False),
        sa.Column("model_glob", sa.String(128), nullable=True),
        sa.Column("secret_enc", sa.Text(), nullable=False),
        sa.Column("key_id", DIGEST, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("created_by", WHO, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhooks")),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("webhook_id", sa.Integer(), nullable=False),
        sa.Column("message_id", sa.String(64), nullable=False),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("audit_seq", sa.Integer(), nullable=False),
        sa.Column("payload_json", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", TS, nullable=False),
        sa.Column("claimed_by", sa.String(128), nullable=True),
        sa.Column("claimed_until", TS, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("delivered_at", TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
        sa.UniqueConstraint("message_id", name=op.f("uq_webhook_deliveries_message_id")),
    )
    op.create_index(op.f("ix_webhook_deliveries_status_next_attempt_at"), "webhook_deliveries",
                    ["status", "next_attempt_at"])
    op.create_table(
        "webhook_attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("delivery_id", sa.Integer(), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("replica", sa.String(128), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("response_excerpt", sa.Text(), nullable=True),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_attempts")),
    )
    op.create_index(op.f("ix_webhook_attempts_delivery_id"), "webhook_attempts", ["delivery_id"])
    op.create_table(
        "audit_heads",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("signed_at", TS, nullable=False),
        sa.Column("key_id", DIGEST, nullable=False),
        sa.Column("signature", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_heads")),
        sa.UniqueConstraint("seq", "key_id", name=op.f("uq_audit_heads_seq_key_id")),
    )


def downgrade() -> None:
    op.drop_table("audit_heads")
    op.drop_index(op.f("ix_webhook_attempts_delivery_id"), table_name="webhook_attempts")
    op.drop_table("webhook_attempts")
    op.drop_index(op.f("ix_webhook_deliveries_status_next_attempt_at"), table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_table("webhooks")
