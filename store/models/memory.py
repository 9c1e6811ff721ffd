"""What Parley remembers: rolling summaries and pinned facts per session, and durable,
consented memory per user."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    DateTime,
    ForeignKey,
    ForeignKeyConstraint,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from parley.store.models.core import Base, now_column


class ConversationSummary(Base):
    """One version of a session's rolling summary: the lines that fold in every message up
    to `through_seq`, written off the hot path by the summary workflow."""

    __tablename__ = "conversation_summaries"
    __table_args__ = (
        UniqueConstraint("session_id", "branch", "through_seq", name="uq_summary_through"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"), index=True)
    through_seq: Mapped[int] = mapped_column(Integer)
    # [{"seq", "text", "refs"}]: each line knows where it came from and what it is about.
    lines: Mapped[list[dict[str, Any]]] = mapped_column(JSONB)
    token_count: Mapped[int] = mapped_column(Integer)
    provider: Mapped[str] = mapped_column(String(32))
    model: Mapped[str] = mapped_column(String(100))
    # Who wrote the lines: the model's name, or "fallback" when its answer was unusable even
    # after one repair and the code summarizer wrote them (parley/fold.py).
    written_by: Mapped[str] = mapped_column(String(100), default="", server_default="")
    # What writing this version cost (the summarizer's own model call).
    input_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    output_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = now_column()
    # Provenance: keys of durable memory items whose hints were in the prompts of the turns
    # this version folds in (parley/consented.py); such a version is deleted with the item.
    memory_keys: Mapped[list[str]] = mapped_column(JSONB, default=list, server_default="[]")
    # The seqs of every message the lines were written from (this version's pass and the
    # versions it carries forward); forgetting one of them deletes the version
    # (store/lifecycle/forget.py).
    # NULL on versions older than the column: they folded every message up to `through_seq`.
    folded_seqs: Mapped[list[int] | None] = mapped_column(JSONB)
    # The branch whose path it folds, and whether that path, up to `through_seq`, is not the
    # active one's (store/branches.py): a version is never read across branches.
    branch: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    off_path: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")


class PinnedFactRow(Base):
    """What the user said about themselves, kept across every summary; one value per key."""

    __tablename__ = "pinned_facts"

    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"), primary_key=True)
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    source_seq: Mapped[int] = mapped_column(Integer)
    # "pattern" (code matched the user's words) or "summarizer" (checked against them).
    source: Mapped[str] = mapped_column(String(16))
    updated_at: Mapped[datetime] = now_column()
    # Provenance: set when the fact was written with a durable memory item of this key (the
    # same statement); deleting the item or turning consent off deletes the fact too.
    memory_key: Mapped[str | None] = mapped_column(String(64))


class MemoryConsent(Base):
    """A user's consent to durable memory (no row: not given)."""

    __tablename__ = "memory_consents"

    tenant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    consent: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    updated_at: Mapped[datetime] = now_column()


class UserMemoryItem(Base):
    """One remembered preference of a user, across sessions (parley/consented.py); one value
    per key, written only by server code from a validated event named in `source`."""

    __tablename__ = "user_memory"
    __table_args__ = (
        ForeignKeyConstraint(["tenant_id", "user_id"], ["users.tenant_id", "users.id"]),
    )

    tenant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    # "message:<id>" or "action:<id>": the event that wrote it.
    source: Mapped[str] = mapped_column(String(80))
    created_at: Mapped[datetime] = now_column()
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
