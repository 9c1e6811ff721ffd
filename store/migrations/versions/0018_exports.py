"""exports: a user's archive of their own data, written by the export workflow

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02 02:45:00

The archive is kept in the row, as uploads are (`files.content`), so whichever API process
answers the download has it; the retention purge deletes rows whose link has expired.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "exports",
        sa.Column("id", sa.String(length=40), primary_key=True),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("sessions_total", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("sessions_done", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("counts", postgresql.JSONB(), nullable=False, server_default="{}"),
        sa.Column("archive", sa.LargeBinary(), nullable=True),
        sa.Column("bytes", sa.BigInteger(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_exports_owner", "exports", ["tenant_id", "user_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_exports_owner", table_name="exports")
    op.drop_table("exports")
