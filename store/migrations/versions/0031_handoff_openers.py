"""handoffs: what opened a case (`opened_by`: the model's tool call, the customer's own
words or a tenant's policy), a case with no turn (the customer asked in a message that
started none), when the customer was told the team is away (`away_told_at`), and the
inbox's order (priority, then age) as an index

Revision ID: 0031
Revises: 0029
Create Date: 2026-12-06 15:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0031"
down_revision = "0029"
branch_labels = None
depends_on = None

# As store/handoffs.py spells an open case, so the planner matches the index.
OPEN = "status IN ('waiting', 'claimed')"


def upgrade() -> None:
    op.add_column(
        "handoffs",
        sa.Column("opened_by", sa.String(16), nullable=False, server_default="tool"),
    )
    op.alter_column("handoffs", "turn_id", nullable=True)
    op.add_column("handoffs", sa.Column("away_told_at", sa.DateTime(timezone=True), nullable=True))
    op.drop_index("ix_handoffs_inbox", table_name="handoffs")
    op.create_index(
        "ix_handoffs_inbox",
        "handoffs",
        ["tenant_id", sa.text("priority DESC"), "created_at"],
        postgresql_where=sa.text(OPEN),
    )


def downgrade() -> None:
    op.drop_index("ix_handoffs_inbox", table_name="handoffs")
    op.create_index(
        "ix_handoffs_inbox", "handoffs", ["tenant_id", "created_at"], postgresql_where=sa.text(OPEN)
    )
    # Refused while a case without a turn is stored: nothing stored is dropped to go back.
    op.alter_column("handoffs", "turn_id", nullable=False)
    op.drop_column("handoffs", "away_told_at")
    op.drop_column("handoffs", "opened_by")
