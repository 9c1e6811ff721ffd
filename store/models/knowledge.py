"""Knowledge documents per tenant, versioned, and their searchable chunks."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    Computed,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import TSVECTOR
from sqlalchemy.orm import Mapped, mapped_column

from parley.store.models.core import Base, now_column


class KnowledgeDocument(Base):
    """One version of a tenant's knowledge document; only the `current` one is searched.
    Loading a file whose content changed adds a version, so an old citation still names
    the text it quoted."""

    __tablename__ = "knowledge_documents"
    __table_args__ = (
        UniqueConstraint("tenant_id", "doc", "version", name="uq_knowledge_doc_version"),
        Index("ix_knowledge_documents_current", "tenant_id", "current"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    doc: Mapped[str] = mapped_column(String(100))
    version: Mapped[int] = mapped_column(Integer)
    title: Mapped[str] = mapped_column(Text)
    # "always" (whole, every turn) or "retrieved" (best chunks only): parley/knowledge.py
    mode: Mapped[str] = mapped_column(String(16))
    content_hash: Mapped[str] = mapped_column(String(64))
    current: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[datetime] = now_column()


class KnowledgeChunk(Base):
    """A searchable piece of a document (a section, or part of a long one). The `embedding`
    column exists only where pgvector does; store/knowledge.py reaches it with SQL text."""

    __tablename__ = "knowledge_chunks"
    __table_args__ = (
        UniqueConstraint("document_id", "position", name="uq_knowledge_chunk_position"),
        Index("ix_knowledge_chunks_tsv", "tsv", postgresql_using="gin"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    document_id: Mapped[str] = mapped_column(ForeignKey("knowledge_documents.id"))
    # The document's tenant, on the searched row: every search filters on it in SQL.
    tenant_id: Mapped[str] = mapped_column(String(64), index=True)
    position: Mapped[int] = mapped_column(Integer)
    section: Mapped[str] = mapped_column(Text)
    text: Mapped[str] = mapped_column(Text)
    embedding_model: Mapped[str | None] = mapped_column(String(100))
    tsv: Mapped[Any] = mapped_column(
        TSVECTOR,
        Computed(
            "setweight(to_tsvector('english', coalesce(section, '')), 'A') || "
            "to_tsvector('english', coalesce(text, ''))",
            persisted=True,
        ),
    )
