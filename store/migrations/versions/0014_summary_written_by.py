"""who wrote each summary version: the model's name, or `fallback` (the code summarizer)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01 22:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Versions written before this column were the model's (a bad answer wrote nothing).
    op.add_column(
        "conversation_summaries",
        sa.Column("written_by", sa.String(length=100), server_default="", nullable=False),
    )
    op.execute("UPDATE conversation_summaries SET written_by = model")


def downgrade() -> None:
    op.drop_column("conversation_summaries", "written_by")
