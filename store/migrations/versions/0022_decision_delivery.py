"""actions: when the user's decision reached the waiting turn (the decisions' outbox)

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-14 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

# As store/actions.py spells the sweep's predicate, so the planner matches the index.
UNDELIVERED = "decision_delivered_at IS NULL AND status IN ('confirmed', 'declined')"


def upgrade() -> None:
    op.add_column(
        "actions", sa.Column("decision_delivered_at", sa.DateTime(timezone=True), nullable=True)
    )
    # Decisions made before this column were delivered or read from the store long ago.
    op.execute(
        "UPDATE actions SET decision_delivered_at = resolved_at WHERE resolved_at IS NOT NULL"
    )
    op.create_index(
        "ix_actions_undelivered",
        "actions",
        ["resolved_at"],
        postgresql_where=sa.text(UNDELIVERED),
    )


def downgrade() -> None:
    op.drop_index("ix_actions_undelivered", table_name="actions")
    op.drop_column("actions", "decision_delivered_at")
