"""actions: the approvals' clock (issue 42): when the expiry warning was shown, which expired
card a renewal renews, and `superseded` as a status of its own

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-06 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

# As store/actions.py spells the sweeps' predicates, so the planner matches the indexes.
UNDELIVERED_BEFORE = "decision_delivered_at IS NULL AND status IN ('confirmed', 'declined')"
UNDELIVERED = "decision_delivered_at IS NULL AND status IN ('confirmed', 'declined', 'superseded')"
UNWARNED = "status = 'pending' AND warned_at IS NULL"
UNSTARTED = "renewed_from IS NOT NULL AND renewal_started_at IS NULL"


def upgrade() -> None:
    op.add_column("actions", sa.Column("warned_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("actions", sa.Column("renewed_from", sa.String(40), nullable=True))
    op.add_column(
        "actions", sa.Column("renewal_started_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.create_unique_constraint("uq_actions_renewed_from", "actions", ["renewed_from"])
    op.create_index(
        "ix_actions_renewal_unstarted",
        "actions",
        ["created_at"],
        postgresql_where=sa.text(UNSTARTED),
    )
    op.create_index(
        "ix_actions_unwarned", "actions", ["expires_at"], postgresql_where=sa.text(UNWARNED)
    )
    # A card the user moved on from was stored declined, with the reason beside it.
    op.execute(
        "UPDATE actions SET status = 'superseded'"
        " WHERE status = 'declined' AND decline_reason = 'superseded'"
    )
    op.drop_index("ix_actions_undelivered", table_name="actions")
    op.create_index(
        "ix_actions_undelivered",
        "actions",
        ["resolved_at"],
        postgresql_where=sa.text(UNDELIVERED),
    )


def downgrade() -> None:
    op.drop_index("ix_actions_undelivered", table_name="actions")
    op.execute("UPDATE actions SET status = 'declined' WHERE status = 'superseded'")
    op.create_index(
        "ix_actions_undelivered",
        "actions",
        ["resolved_at"],
        postgresql_where=sa.text(UNDELIVERED_BEFORE),
    )
    op.drop_index("ix_actions_unwarned", table_name="actions")
    op.drop_index("ix_actions_renewal_unstarted", table_name="actions")
    op.drop_constraint("uq_actions_renewed_from", "actions", type_="unique")
    op.drop_column("actions", "renewal_started_at")
    op.drop_column("actions", "renewed_from")
    op.drop_column("actions", "warned_at")
