"""context memory: token counts, full-text index, rolling summaries, pinned facts

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30 11:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Counts are written with each message from now on; older rows are counted when read.
    op.add_column("messages", sa.Column("token_count", sa.Integer(), nullable=True))
    op.add_column("messages", sa.Column("token_counter", sa.String(length=32), nullable=True))
    op.add_column(
        "messages",
        sa.Column(
            "tsv",
            postgresql.TSVECTOR(),
            sa.Computed("to_tsvector('english', coalesce(text, ''))", persisted=True),
            nullable=True,
        ),
    )
    op.create_index("ix_messages_tsv", "messages", ["tsv"], postgresql_using="gin")
    op.create_table(
        "conversation_summaries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(length=40), nullable=False),
        sa.Column("through_seq", sa.Integer(), nullable=False),
        sa.Column("lines", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("token_count", sa.Integer(), nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("model", sa.String(length=100), nullable=False),
        sa.Column("input_tokens", sa.Integer(), server_default="0", nullable=False),
        sa.Column("output_tokens", sa.Integer(), server_default="0", nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("session_id", "through_seq", name="uq_summary_through"),
    )
    op.create_index(
        "ix_conversation_summaries_session_id", "conversation_summaries", ["session_id"]
    )
    op.create_table(
        "pinned_facts",
        sa.Column("session_id", sa.String(length=40), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("source_seq", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.ForeignKeyConstraint(["session_id"], ["sessions.id"]),
        sa.PrimaryKeyConstraint("session_id", "key"),
    )
    # The message-count window is retired in favour of token budgets.
    op.execute("UPDATE tenants SET config = config - 'context_window_messages'")


def downgrade() -> None:
    op.drop_table("pinned_facts")
    op.drop_index("ix_conversation_summaries_session_id", table_name="conversation_summaries")
    op.drop_table("conversation_summaries")
    op.drop_index("ix_messages_tsv", table_name="messages")
    op.drop_column("messages", "tsv")
    op.drop_column("messages", "token_counter")
    op.drop_column("messages", "token_count")
