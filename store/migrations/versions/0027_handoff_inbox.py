"""handoffs: the case a person works (status, owner, case summary, priority), its internal
notes, its event log (the customer's and the agent's streams), a message's author, and the
tenant's hand-off webhook: its secret and its delivery log

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-06 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

# As store/handoffs.py spells an open case, so the planner matches the indexes.
OPEN = "status IN ('waiting', 'claimed')"


def upgrade() -> None:
    op.add_column("handoffs", sa.Column("tenant_id", sa.String(length=64), nullable=True))
    op.add_column("handoffs", sa.Column("user_id", sa.String(length=64), nullable=True))
    op.execute(
        "UPDATE handoffs AS h SET tenant_id = s.tenant_id, user_id = s.user_id"
        " FROM sessions AS s WHERE s.id = h.session_id"
    )
    op.alter_column("handoffs", "tenant_id", nullable=False)
    op.alter_column("handoffs", "user_id", nullable=False)
    for name in ("priority", "last_event_id"):
        op.add_column(
            "handoffs",
            sa.Column(name, sa.Integer(), nullable=False, server_default=sa.text("0")),
        )
    op.add_column("handoffs", sa.Column("summary", sa.Text(), nullable=True))
    op.add_column("handoffs", sa.Column("summary_by", sa.String(length=16), nullable=True))
    op.add_column("handoffs", sa.Column("agent_id", sa.String(length=64), nullable=True))
    op.add_column("handoffs", sa.Column("agent_name", sa.String(length=200), nullable=True))
    for stamp in ("claimed_at", "unclaimed_at", "ended_at"):
        op.add_column("handoffs", sa.Column(stamp, sa.DateTime(timezone=True), nullable=True))
    # Hand-offs recorded before the inbox existed were never shown to anyone: they close,
    # so no session becomes held by a case nobody was told about.
    op.execute(
        "UPDATE handoffs SET status = 'resolved', ended_at = created_at WHERE status = 'queued'"
    )
    op.alter_column("handoffs", "status", server_default="waiting")
    # At most one open case per session: the session's owner while it is open.
    op.create_index(
        "uq_handoffs_open_session",
        "handoffs",
        ["session_id"],
        unique=True,
        postgresql_where=sa.text(OPEN),
    )
    op.create_index(
        "ix_handoffs_inbox", "handoffs", ["tenant_id", "created_at"], postgresql_where=sa.text(OPEN)
    )
    op.create_table(
        "handoff_notes",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("handoff_id", sa.String(length=40), nullable=False),
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("agent_name", sa.String(length=200), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(["handoff_id"], ["handoffs.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_handoff_notes_handoff", "handoff_notes", ["handoff_id"])
    op.create_table(
        "handoff_events",
        sa.Column("handoff_id", sa.String(length=40), nullable=False),
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(length=32), nullable=False),
        sa.Column("data", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(["handoff_id"], ["handoffs.id"]),
        sa.PrimaryKeyConstraint("handoff_id", "id"),
    )
    op.add_column("messages", sa.Column("author_name", sa.String(length=200), nullable=True))
    op.add_column("tenants", sa.Column("webhook_secret", sa.String(length=64), nullable=True))
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(length=120), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("session_id", sa.String(length=40), nullable=False),
        sa.Column("handoff_id", sa.String(length=40), nullable=False),
        sa.Column("event", sa.String(length=16), nullable=False),
        sa.Column("url", sa.String(length=500), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["handoff_id"], ["handoffs.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_webhook_deliveries_tenant", "webhook_deliveries", ["tenant_id", "created_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_webhook_deliveries_tenant", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_column("tenants", "webhook_secret")
    op.drop_column("messages", "author_name")
    op.drop_table("handoff_events")
    op.drop_index("ix_handoff_notes_handoff", table_name="handoff_notes")
    op.drop_table("handoff_notes")
    op.drop_index("ix_handoffs_inbox", table_name="handoffs")
    op.drop_index("uq_handoffs_open_session", table_name="handoffs")
    op.alter_column("handoffs", "status", server_default=None)
    for name in (
        "ended_at",
        "unclaimed_at",
        "claimed_at",
        "agent_name",
        "agent_id",
        "summary_by",
        "summary",
        "last_event_id",
        "priority",
        "user_id",
        "tenant_id",
    ):
        op.drop_column("handoffs", name)
