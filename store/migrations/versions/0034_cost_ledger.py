"""model_costs: the ledger, one row per model call with its tokens and its cost;
budget_spend: what each budget's period has spent and holds reserved; budget_holds: each
model call's reservation until it settles; budget_notices: a budget's soft threshold crossed

Revision ID: 0034
Revises: 0033
Create Date: 2026-12-06 15:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_costs",
        sa.Column("key", sa.String(120), primary_key=True),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("user_id", sa.String(64), nullable=True),
        sa.Column("session_id", sa.String(40), nullable=True),
        sa.Column("turn_id", sa.String(40), nullable=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("provider", sa.String(32), nullable=False),
        sa.Column("model", sa.String(100), nullable=False),
        sa.Column("input_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("cache_write_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("estimated", sa.Boolean(), nullable=False),
        sa.Column("cost_usd", sa.Numeric(20, 10), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
    )
    op.create_index("ix_model_costs_tenant_time", "model_costs", ["tenant_id", "created_at"])
    op.create_index("ix_model_costs_turn", "model_costs", ["turn_id"])
    op.create_table(
        "budget_spend",
        sa.Column("subject", sa.String(140), primary_key=True),
        sa.Column("period", sa.String(8), primary_key=True),
        sa.Column("period_start", sa.Date(), primary_key=True),
        sa.Column("spent_usd", sa.Numeric(20, 10), server_default="0", nullable=False),
        sa.Column("reserved_usd", sa.Numeric(20, 10), server_default="0", nullable=False),
        sa.Column("limit_usd", sa.Numeric(20, 10), nullable=False),
    )
    op.create_table(
        "budget_holds",
        sa.Column("call_id", sa.String(40), primary_key=True),
        sa.Column("subject", sa.String(140), primary_key=True),
        sa.Column("period", sa.String(8), primary_key=True),
        sa.Column("period_start", sa.Date(), primary_key=True),
        sa.Column("amount_usd", sa.Numeric(20, 10), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
    )
    op.create_table(
        "budget_notices",
        sa.Column("subject", sa.String(140), primary_key=True),
        sa.Column("period", sa.String(8), primary_key=True),
        sa.Column("period_start", sa.Date(), primary_key=True),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("spent_usd", sa.Numeric(20, 10), nullable=False),
        sa.Column("limit_usd", sa.Numeric(20, 10), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("budget_notices")
    op.drop_table("budget_holds")
    op.drop_table("budget_spend")
    op.drop_index("ix_model_costs_turn", table_name="model_costs")
    op.drop_index("ix_model_costs_tenant_time", table_name="model_costs")
    op.drop_table("model_costs")
