"""queued_messages.task_queue: the task queue of the API that queued the message, named by
the ring that promotes its turn, so only a worker of that queue starts it (a database that
several deployments share, each with its own queue and settings); null on rows queued before
(their ring names none, and any worker starts them, as before)

Revision ID: 0036
Revises: 0035
Create Date: 2026-12-07 06:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0036"
down_revision = "0035"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("queued_messages", sa.Column("task_queue", sa.String(200), nullable=True))


def downgrade() -> None:
    op.drop_column("queued_messages", "task_queue")
