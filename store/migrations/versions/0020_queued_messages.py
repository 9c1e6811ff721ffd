"""queued messages: one message per session waits for the running turn to end

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-02 02:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The session's queued turn, on the row every writer locks: the statement that releases
    # the session reads it under that lock (a snapshot read could miss one just queued).
    op.add_column("sessions", sa.Column("queued_turn_id", sa.String(length=40), nullable=True))
    # The queued message itself joins the conversation (takes a seq) only when its turn
    # starts, so the running turn's prompts never see it.
    op.create_table(
        "queued_messages",
        sa.Column("turn_id", sa.String(length=40), sa.ForeignKey("turns.id"), primary_key=True),
        sa.Column("session_id", sa.String(length=40), sa.ForeignKey("sessions.id"), nullable=False),
        sa.Column("message_id", sa.String(length=40), nullable=False),
        sa.Column("client_message_id", sa.String(length=64), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("file_ids", sa.dialects.postgresql.JSONB(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.UniqueConstraint("session_id", name="uq_queued_messages_session"),
    )


def downgrade() -> None:
    op.drop_table("queued_messages")
    op.drop_column("sessions", "queued_turn_id")
