"""sessions: the seq of the newest message that steered the running turn (issue 42)

Revision ID: 0026
Revises: 0023
Create Date: 2026-12-06 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Null until a session's first steer: no turn before this column was steered.
    op.add_column("sessions", sa.Column("steer_seq", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("sessions", "steer_seq")
