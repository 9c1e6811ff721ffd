"""budget_approvals: a tenant's monthly budget exhausted, an operator asked whether its turns
may go on for the rest of the month (the row is the approval workflow's start outbox and
holds the decision); webhook_deliveries also carries budget events (no case, no session)

Revision ID: 0035
Revises: 0034
Create Date: 2026-12-06 18:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "budget_approvals",
        sa.Column("id", sa.String(120), primary_key=True),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("period_start", sa.Date(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("timeout_s", sa.Float(), nullable=False),
        sa.Column("limit_usd", sa.Numeric(20, 10), nullable=True),
        sa.Column("decided_by", sa.String(64), nullable=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("workflow_started_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("tenant_id", "period_start", name="uq_budget_approvals_period"),
    )
    op.alter_column("webhook_deliveries", "handoff_id", nullable=True)
    op.alter_column("webhook_deliveries", "session_id", nullable=True)


def downgrade() -> None:
    op.execute("DELETE FROM webhook_deliveries WHERE handoff_id IS NULL")
    op.alter_column("webhook_deliveries", "session_id", nullable=False)
    op.alter_column("webhook_deliveries", "handoff_id", nullable=False)
    op.drop_table("budget_approvals")
