"""which messages each summary version folded: the seqs its lines were written from

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02 02:40:00

Forgetting one message deletes every version that folded it, and the summary workflow then
rewrites the summary from the messages that remain. Versions written before this column have
none (NULL): they folded every message up to `through_seq`.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("conversation_summaries", sa.Column("folded_seqs", JSONB, nullable=True))


def downgrade() -> None:
    op.drop_column("conversation_summaries", "folded_seqs")
