"""sessions.deleted_at: a session its owner deleted is hidden from every route

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 11:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sessions", sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("sessions", "deleted_at")
