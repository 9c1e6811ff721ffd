"""What users bring and say back: uploaded files and feedback on answers; and what they take
away: the archives of their own data they export."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from parley.store.models.core import Base, now_column


class SessionFile(Base):
    """An upload into a session: its bytes and the text extracted once (parley/file_text.py)."""

    __tablename__ = "files"
    __table_args__ = (Index("ix_files_session", "session_id"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"))
    tenant_id: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(255))
    content_type: Mapped[str] = mapped_column(String(100))
    size: Mapped[int] = mapped_column("bytes", BigInteger)  # `bytes` would shadow the type
    content: Mapped[bytes] = mapped_column(LargeBinary)
    text: Mapped[str] = mapped_column(Text)
    meta: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default="{}")  # pages, rows
    created_at: Mapped[datetime] = now_column()


class Feedback(Base):
    """A user's rating of an answer, linked to the turn (trace spans) that produced it."""

    __tablename__ = "feedback"
    __table_args__ = (Index("ix_feedback_recent", "tenant_id", "rating", "updated_at"),)

    message_id: Mapped[str] = mapped_column(ForeignKey("messages.id"), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(40))
    turn_id: Mapped[str | None] = mapped_column(ForeignKey("turns.id"))
    rating: Mapped[str] = mapped_column(String(8))
    comment: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = now_column()
    updated_at: Mapped[datetime] = now_column()


class Export(Base):
    """A user's archive of their own data (store/lifecycle/exports.py), written by the export
    workflow; downloadable by its owner until `expires_at`."""

    __tablename__ = "exports"
    __table_args__ = (Index("ix_exports_owner", "tenant_id", "user_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[str] = mapped_column(String(64))
    # pending (asked for) → running (the workflow is writing it) → ready | failed
    state: Mapped[str] = mapped_column(String(16))
    # Progress: sessions written so far of all the user's sessions.
    sessions_total: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    sessions_done: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # What the archive holds, by kind (sessions, messages, files...), once it is ready.
    counts: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict, server_default="{}")
    archive: Mapped[bytes | None] = mapped_column(LargeBinary)
    size: Mapped[int | None] = mapped_column("bytes", BigInteger)
    created_at: Mapped[datetime] = now_column()
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
