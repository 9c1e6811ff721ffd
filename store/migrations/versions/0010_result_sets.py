"""result sets: a search's query and ordered ids, kept as a referent

Revision ID: 0010
Revises: 0008
Create Date: 2026-11-30 13:45:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "result_sets",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("session_id", sa.String(length=40), nullable=False),
        sa.Column("turn_id", sa.String(length=40), nullable=False),
        sa.Column("tool_call_id", sa.String(length=80), nullable=False),
        sa.Column("user_seq", sa.Integer(), nullable=False),
        sa.Column("query", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("order_ids", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("rows", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.id"]),
        sa.ForeignKeyConstraint(["turn_id"], ["turns.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_result_sets_session", "result_sets", ["session_id", "user_seq"])


def downgrade() -> None:
    op.drop_index("ix_result_sets_session", table_name="result_sets")
    op.drop_table("result_sets")
