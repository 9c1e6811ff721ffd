"""message embeddings for recall by meaning (pgvector, where the server has it)

Revision ID: 0012
Revises: 0008
Create Date: 2026-11-30 14:15:00

The `vector` extension is optional: a server without it gets no table, and recall stays
full-text (store/embeddings.py checks for the table). The column has no fixed dimension, so
vectors of any model fit; each row names its model and only vectors of the configured model
are compared. A session holds hundreds to a few thousand messages, so the nearest ones are
found by an exact scan of the session's rows (no approximate index needed).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    available = bind.execute(
        sa.text("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")
    ).scalar()
    if not available:
        return
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    op.execute(
        """
        CREATE TABLE message_embeddings (
            message_id varchar(40) NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
            model varchar(64) NOT NULL,
            session_id varchar(40) NOT NULL,
            seq integer NOT NULL,
            embedding vector NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (message_id, model)
        )
        """
    )
    op.create_index(
        "ix_message_embeddings_session", "message_embeddings", ["session_id", "model", "seq"]
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS message_embeddings")
