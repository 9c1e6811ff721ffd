"""specialist answers as an outbox: one committed but never signalled is delivered by a sweep

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01 23:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "specialist_answers",
        sa.Column("id", sa.String(length=40), primary_key=True),
        sa.Column("turn_id", sa.String(length=40), sa.ForeignKey("turns.id"), nullable=False),
        sa.Column("interaction_id", sa.String(length=100), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index(
        "ix_specialist_answers_undelivered",
        "specialist_answers",
        ["created_at"],
        postgresql_where=sa.text("delivered_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_specialist_answers_undelivered", table_name="specialist_answers")
    op.drop_table("specialist_answers")
