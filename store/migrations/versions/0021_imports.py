"""imports: earlier conversation stored as history, and how far its indexing got

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-10 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The imported messages are ordinary `messages` rows; this is the request that stored
    # them (its client key answers a repeat) and its indexing's progress.
    op.create_table(
        "imports",
        sa.Column("id", sa.String(length=40), primary_key=True),
        sa.Column("session_id", sa.String(length=40), sa.ForeignKey("sessions.id"), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.String(length=64), nullable=False),
        sa.Column("client_import_id", sa.String(length=64), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("messages", sa.Integer(), nullable=False),
        sa.Column("first_seq", sa.Integer(), nullable=False),
        sa.Column("last_seq", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("indexed", sa.Integer(), server_default="0", nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("session_id", "client_import_id", name="uq_imports_client_id"),
    )
    op.create_index(
        "ix_imports_unfinished",
        "imports",
        ["session_id"],
        postgresql_where=sa.text("status <> 'done'"),
    )


def downgrade() -> None:
    op.drop_index("ix_imports_unfinished", table_name="imports")
    op.drop_table("imports")
