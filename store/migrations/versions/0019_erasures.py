"""erasures and their receipts (a user's, or a deleted session's, rows deleted for good)

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02 02:45:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "erasures",
        sa.Column("id", sa.String(length=40), primary_key=True),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("subject_hash", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.String(length=64), nullable=True),
        sa.Column("session_id", sa.String(length=40), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("grace_s", sa.Float(), server_default="0", nullable=False),
        sa.Column("counts", JSONB(), server_default="{}", nullable=False),
        sa.Column(
            "requested_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("workflow_started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_erasures_subject", "erasures", ["subject_hash"])
    op.create_index(
        "ix_erasures_unstarted",
        "erasures",
        ["requested_at"],
        postgresql_where=sa.text("workflow_started_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_erasures_unstarted", table_name="erasures")
    op.drop_index("ix_erasures_subject", table_name="erasures")
    op.drop_table("erasures")
