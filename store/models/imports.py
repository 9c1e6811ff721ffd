"""An imported conversation (store/imports.py): its messages are ordinary `messages` rows
(seqs `first_seq`..`last_seq`); this row is the request that stored them, its client key
for repeats, and how far their indexing got."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from parley.store.models.core import Base, now_column


class ConversationImport(Base):
    __tablename__ = "imports"
    __table_args__ = (
        # A repeated request is found by its key (the same content: the same import).
        UniqueConstraint("session_id", "client_import_id", name="uq_imports_client_id"),
        # A turn's context build asks whether its session has an import still indexing.
        Index("ix_imports_unfinished", "session_id", postgresql_where="status <> 'done'"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"))
    tenant_id: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[str] = mapped_column(String(64))
    client_import_id: Mapped[str] = mapped_column(String(64))
    # parley/imports.py `digest` of the items: the same key with other items is refused.
    digest: Mapped[str] = mapped_column(String(64))
    messages: Mapped[int] = mapped_column(Integer)
    first_seq: Mapped[int] = mapped_column(Integer)
    last_seq: Mapped[int] = mapped_column(Integer)
    # pending (stored) → indexing (the import workflow embeds them) → done
    status: Mapped[str] = mapped_column(String(16))
    # Messages of the import with a vector for recall by meaning (all of them once done, or
    # none where the deployment has no such recall: full-text indexes them as they are stored).
    indexed: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = now_column()
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
