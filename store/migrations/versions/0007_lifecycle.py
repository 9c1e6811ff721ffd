"""lifecycle: a turn's recorded cancel decision

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "turns", sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True)
    )
    # The sweep for turns whose workflow closed looks only at turns that have not ended.
    op.create_index(
        "ix_turns_open",
        "turns",
        ["updated_at"],
        postgresql_where=sa.text(
            "state NOT IN ('completed', 'failed', 'cancelled', 'expired')"
            " AND workflow_started_at IS NOT NULL"
        ),
    )


def downgrade() -> None:
    op.drop_index("ix_turns_open", table_name="turns")
    op.drop_column("turns", "cancel_requested_at")
