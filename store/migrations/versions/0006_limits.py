"""limits: token expiry, usage counters, stream leases, unfinished turns per user

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

UNFINISHED = "state NOT IN ('completed', 'failed', 'cancelled', 'expired')"


def upgrade() -> None:
    op.add_column("api_tokens", sa.Column("expires_at", sa.DateTime(timezone=True)))
    op.create_table(
        "usage_counters",
        sa.Column("scope", sa.String(length=32), nullable=False),
        sa.Column("subject", sa.String(length=200), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used", sa.Integer(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("scope", "subject", "window_start"),
    )
    op.create_table(
        "stream_leases",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.String(length=64), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_stream_leases_owner", "stream_leases", ["tenant_id", "user_id"])
    op.create_index(
        "ix_turns_user_unfinished",
        "turns",
        ["tenant_id", "user_id"],
        postgresql_where=sa.text(UNFINISHED),
    )


def downgrade() -> None:
    op.drop_index("ix_turns_user_unfinished", table_name="turns")
    op.drop_index("ix_stream_leases_owner", table_name="stream_leases")
    op.drop_table("stream_leases")
    op.drop_table("usage_counters")
    op.drop_column("api_tokens", "expires_at")
