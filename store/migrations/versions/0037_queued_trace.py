"""queued_messages.trace: the trace context (W3C traceparent) of the POST that queued the
message, named by the ring that promotes its turn, so the turn's start joins the POST's trace
as a posted turn's does; null without tracing, and on rows queued before (their turn starts
a trace of its own, as before)

Revision ID: 0037
Revises: 0036
Create Date: 2026-12-07 09:15:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0037"
down_revision = "0036"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("queued_messages", sa.Column("trace", sa.String(200), nullable=True))


def downgrade() -> None:
    op.drop_column("queued_messages", "trace")
