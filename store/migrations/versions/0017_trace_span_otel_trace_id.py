"""trace spans name their OpenTelemetry trace, when tracing is on

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02 02:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("trace_spans", sa.Column("otel_trace_id", sa.String(length=32), nullable=True))


def downgrade() -> None:
    op.drop_column("trace_spans", "otel_trace_id")
