"""branches: a session is a tree of versions with one active path (issue 42)

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06 12:00:00

Every column has a default that describes a session without branches (branch 0, on the
path), so existing rows and every plain turn need nothing written for them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def _branch() -> sa.Column[int]:
    return sa.Column("branch", sa.Integer(), nullable=False, server_default="0")


def _off_path() -> sa.Column[bool]:
    return sa.Column("off_path", sa.Boolean(), nullable=False, server_default="false")


def upgrade() -> None:
    op.create_table(
        "branches",
        sa.Column("session_id", sa.String(40), sa.ForeignKey("sessions.id"), primary_key=True),
        sa.Column("number", sa.Integer(), primary_key=True),
        sa.Column("parent", sa.Integer(), nullable=True),
        sa.Column("fork_seq", sa.Integer(), nullable=True),
        sa.Column("point", sa.String(48), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False, server_default="1"),
        sa.Column("head", sa.String(40), nullable=True),
        sa.Column("saved", postgresql.JSONB(), nullable=True),
        sa.Column("shown_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
    )
    op.create_index("ix_branches_point", "branches", ["session_id", "point"])
    op.add_column("sessions", _branch())
    op.add_column("turns", _branch())
    op.add_column("messages", _branch())
    op.add_column("messages", _off_path())
    op.add_column("result_sets", _off_path())
    op.add_column("conversation_summaries", _branch())
    op.add_column("conversation_summaries", _off_path())
    # A version is a branch's: two branches may each fold their own path to the same seq.
    op.drop_constraint("uq_summary_through", "conversation_summaries", type_="unique")
    op.create_unique_constraint(
        "uq_summary_through", "conversation_summaries", ["session_id", "branch", "through_seq"]
    )


def downgrade() -> None:
    op.drop_constraint("uq_summary_through", "conversation_summaries", type_="unique")
    op.execute("DELETE FROM conversation_summaries WHERE off_path")
    op.create_unique_constraint(
        "uq_summary_through", "conversation_summaries", ["session_id", "through_seq"]
    )
    op.drop_column("conversation_summaries", "off_path")
    op.drop_column("conversation_summaries", "branch")
    op.drop_column("result_sets", "off_path")
    op.drop_column("messages", "off_path")
    op.drop_column("messages", "branch")
    op.drop_column("turns", "branch")
    op.drop_column("sessions", "branch")
    op.drop_index("ix_branches_point", table_name="branches")
    op.drop_table("branches")
