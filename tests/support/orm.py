"""An ORM session for a test's own arrangements and checks.

The product reaches PostgreSQL one way, through store/'s named statements on a `Db`
(store/db.py). A test may instead arrange and read rows through the schema's models, which
says what it checks more plainly than SQL would: `async with orm(sessions) as db`, on the
same pool, committed by the test itself.
"""

from __future__ import annotations

import uuid

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from parley.store.db import Database
from parley.store.models import ChatSession, Message


def orm(database: Database) -> AsyncSession:
    """A session on `database`'s engine."""
    return AsyncSession(database.engine, expire_on_commit=False)


async def add_transcript(db: AsyncSession, session_id: str, texts: list[str]) -> None:
    """A transcript as earlier turns would have stored it: seq 1..n, user then assistant,
    complete, no vectors; the session's `last_seq` moved to its end (not committed)."""
    for seq, body in enumerate(texts, start=1):
        db.add(
            Message(
                id=f"msg_{uuid.uuid4().hex[:20]}",
                session_id=session_id,
                seq=seq,
                role="user" if seq % 2 else "assistant",
                status="complete",
                text=body,
            )
        )
    await db.execute(
        update(ChatSession).where(ChatSession.id == session_id).values(last_seq=len(texts))
    )
