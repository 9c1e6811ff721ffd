"""knowledge: tenant documents (versioned), their chunks, full-text and optional vector search

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "knowledge_documents",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("doc", sa.String(length=100), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("content_hash", sa.String(length=64), nullable=False),
        sa.Column("current", sa.Boolean(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("tenant_id", "doc", "version", name="uq_knowledge_doc_version"),
    )
    op.create_index(
        "ix_knowledge_documents_current", "knowledge_documents", ["tenant_id", "current"]
    )
    op.create_table(
        "knowledge_chunks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("document_id", sa.String(length=40), nullable=False),
        # Copied from the document so the tenant filter sits on the searched table itself.
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("section", sa.Text(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("embedding_model", sa.String(length=100), nullable=True),
        sa.Column(
            "tsv",
            postgresql.TSVECTOR(),
            sa.Computed(
                "setweight(to_tsvector('english', coalesce(section, '')), 'A') || "
                "to_tsvector('english', coalesce(text, ''))",
                persisted=True,
            ),
            nullable=True,
        ),
        sa.ForeignKeyConstraint(["document_id"], ["knowledge_documents.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("document_id", "position", name="uq_knowledge_chunk_position"),
    )
    op.create_index("ix_knowledge_chunks_tenant_id", "knowledge_chunks", ["tenant_id"])
    op.create_index("ix_knowledge_chunks_tsv", "knowledge_chunks", ["tsv"], postgresql_using="gin")
    # Embeddings need pgvector. The embedded PostgreSQL ships it; an external server without
    # it still migrates, and retrieval is full-text only there (store/knowledge.py checks).
    available = op.get_bind().scalar(
        sa.text("SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'")
    )
    if available:
        op.execute("CREATE EXTENSION IF NOT EXISTS vector")
        # No fixed dimension: the embedding model decides it (rows record their model).
        op.execute("ALTER TABLE knowledge_chunks ADD COLUMN embedding vector")


def downgrade() -> None:
    op.drop_index("ix_knowledge_chunks_tsv", table_name="knowledge_chunks")
    op.drop_index("ix_knowledge_chunks_tenant_id", table_name="knowledge_chunks")
    op.drop_table("knowledge_chunks")
    op.drop_index("ix_knowledge_documents_current", table_name="knowledge_documents")
    op.drop_table("knowledge_documents")
