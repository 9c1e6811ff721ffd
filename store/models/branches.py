"""A session's branches: the versions an edit or a regenerate made (store/branches.py).

A session is a tree of messages. Branch 0 is the conversation as first written; each edit of
a user message and each regenerate of an answer opens the next number, forked from the
branch that was active, and makes it the session's active branch (`sessions.branch`). A
message, a turn and a summary version carry the branch they were written on; `off_path`
marks the rows the active path does not show, so the reads stay a plain filter. A session
that never branched has no row here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, ForeignKey, Index, Integer, String
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from parley.store.models.core import Base, now_column


class Branch(Base):
    __tablename__ = "branches"
    __table_args__ = (Index("ix_branches_point", "session_id", "point"),)

    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id"), primary_key=True)
    # 0: the conversation as first written (its row is written at the first fork).
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    # The branch it forked from, and the first seq of that branch's path it does not share.
    parent: Mapped[int | None] = mapped_column(Integer)
    fork_seq: Mapped[int | None] = mapped_column(Integer)
    # Which versions this one is one of: "msg:<id of the first version of the user message>"
    # (an edit) or "ans:<id of the user message answered>" (a regenerate); `version` its
    # number among them (the first version, on the parent's path, is 1).
    point: Mapped[str | None] = mapped_column(String(48))
    version: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    # What the fork wrote first: the edited message's id, or the regenerating turn's.
    head: Mapped[str | None] = mapped_column(String(40))
    # The session's slots and pinned facts as the branch left them, restored on its return.
    saved: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # When it last became the active branch: a switch back to a version shows the
    # continuation of it that was shown last.
    shown_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = now_column()
