"""What users bring and say back: uploaded files and feedback on answers."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ForeignKey,
    Index,
    LargeBinary,
    String,
    Text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from store.models.core import Base, now_column


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
