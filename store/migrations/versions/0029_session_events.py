"""session_events: a session's own event log, and its counter on the session row; the
session a session stream's lease follows

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-06 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "sessions",
        sa.Column("last_event_id", sa.Integer(), server_default="0", nullable=False),
    )
    op.add_column("stream_leases", sa.Column("session_id", sa.String(40), nullable=True))
    op.create_table(
        "session_events",
        sa.Column("session_id", sa.String(40), sa.ForeignKey("sessions.id"), primary_key=True),
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("turn_id", sa.String(40), nullable=True),
        sa.Column("message_id", sa.String(40), nullable=True),
        sa.Column("data", postgresql.JSONB(), server_default="{}", nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
    )


def downgrade() -> None:
    op.drop_table("session_events")
    op.drop_column("stream_leases", "session_id")
    op.drop_column("sessions", "last_event_id")
