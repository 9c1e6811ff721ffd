"""Sessions and their messages, and the owner-scoped reads the API answers from.

What leaves this module is a typed row (`SessionRow`, `SessionSummary`, `StoredMessage`,
`MessageView`), never an ORM object. `lock_session` is the one exception, for the store's
own writers (posting, queue, forget): they hold the locked row and move its counters
(`lock_session_row` locks it as a typed row, for a plain post).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Select, bindparam, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from parley.errors import NotFound
from parley.ids import new_id
from parley.store import limits
from parley.store.db import session_conn
from parley.store.identity import Identity
from parley.store.models import ChatSession, Message, Tenant, Turn
from parley.store.rows import typed_row
from parley.wire import MessageView

SESSION_NOT_FOUND = "session not found"
TURN_NOT_FOUND = "turn not found"
# A session's title is the start of its first message, cut to this many characters.
TITLE_CHARS = 80


@dataclass(frozen=True)
class SessionRow:
    """A session as its owner sees it, and which turns hold it."""

    id: str
    tenant_id: str
    user_id: str
    last_seq: int
    active_turn_id: str | None
    queued_turn_id: str | None
    created_at: datetime


@dataclass(frozen=True)
class SessionSummary:
    """A session as its owner's list shows it: titled by its first message (None while it
    has none) and dated by its latest message."""

    id: str
    last_seq: int
    created_at: datetime
    title: str | None
    last_activity_at: datetime


@dataclass(frozen=True)
class StoredMessage:
    """A stored message as the steps read it: its text, and its token count when the window
    counted it already (store/memory.py)."""

    id: str
    session_id: str
    seq: int
    role: str
    turn_id: str | None
    status: str
    text: str
    file_ids: list[str] | None
    token_count: int | None
    token_counter: str | None
    created_at: datetime


async def create_session(
    db: AsyncSession, *, owner: Identity, per_day: int | None = None
) -> SessionRow:
    """A new session; with `per_day`, refused (429) once the user made that many today."""
    if per_day is not None:
        await limits.admit_session(db, owner=owner, per_day=per_day)
    session = ChatSession(id=new_id("ses"), tenant_id=owner.tenant_id, user_id=owner.user_id)
    db.add(session)
    await db.flush()
    await db.refresh(session)  # the server's defaults (created_at, last_seq)
    return typed_row(SessionRow, session)


async def list_sessions(
    db: AsyncSession, *, owner: Identity, limit: int = 100
) -> list[SessionSummary]:
    first_text = (
        select(func.left(Message.text, TITLE_CHARS))
        .where(Message.session_id == ChatSession.id, Message.role == "user")
        .order_by(Message.seq)
        .limit(1)
        .scalar_subquery()
    )
    latest = (
        select(func.max(Message.created_at))
        .where(Message.session_id == ChatSession.id)
        .scalar_subquery()
    )
    rows = await db.execute(
        select(ChatSession, first_text, func.coalesce(latest, ChatSession.created_at))
        .where(
            ChatSession.tenant_id == owner.tenant_id,
            ChatSession.user_id == owner.user_id,
            ChatSession.deleted_at.is_(None),
        )
        .order_by(ChatSession.created_at.desc())
        .limit(limit)
    )
    return [
        SessionSummary(session.id, session.last_seq, session.created_at, title, last)
        for session, title, last in rows
    ]


async def get_session(db: AsyncSession, *, owner: Identity, session_id: str) -> SessionRow:
    """The owner's session; NotFound (404) for anyone else's, or a deleted one."""
    return typed_row(SessionRow, await _owned(db, _SESSION, owner=owner, session_id=session_id))


async def lock_session(db: AsyncSession, *, owner: Identity, session_id: str) -> ChatSession:
    """The owner's session row, locked for this transaction: for the store's writers, which
    move its counters (`last_seq`, `active_turn_id`, `queued_turn_id`) under that lock."""
    return await _owned(db, _SESSION_FOR_UPDATE, owner=owner, session_id=session_id)


async def lock_session_row(db: AsyncSession, *, owner: Identity, session_id: str) -> SessionRow:
    """`lock_session` as a typed row, on the session's own connection: for a writer that
    moves the counters in statements of its own (a plain post's new turn, store/turns/birth.py),
    which need no ORM object; one that does loads it (`db.get`), the row already locked."""
    conn = await session_conn(db)
    params = {"session_id": session_id, "tenant_id": owner.tenant_id, "user_id": owner.user_id}
    session = await conn.row(_LOCK_SESSION_ROW, params, SessionRow)
    if session is None:
        raise NotFound(SESSION_NOT_FOUND)
    return session


# Plain SQL (see store/identity.py `_IDENTITY`): every post runs it.
_LOCK_SESSION_ROW = """
    SELECT id, tenant_id, user_id, last_seq, active_turn_id, queued_turn_id, created_at
    FROM sessions
    WHERE id = %(session_id)s AND tenant_id = %(tenant_id)s AND user_id = %(user_id)s
        AND deleted_at IS NULL
    FOR UPDATE
"""


async def _owned(
    db: AsyncSession, query: Select[ChatSession], *, owner: Identity, session_id: str
) -> ChatSession:
    params = {"session_id": session_id, "tenant_id": owner.tenant_id, "user_id": owner.user_id}
    session = await db.scalar(query, params)
    if session is None:
        raise NotFound(SESSION_NOT_FOUND)
    return session


# Built once (every post and stream runs them): see store/identity.py `_IDENTITY`.
_SESSION = select(ChatSession).where(
    ChatSession.id == bindparam("session_id"),
    ChatSession.tenant_id == bindparam("tenant_id"),
    ChatSession.user_id == bindparam("user_id"),
    ChatSession.deleted_at.is_(None),
)
_SESSION_FOR_UPDATE = _SESSION.with_for_update()


async def list_messages(
    db: AsyncSession, *, owner: Identity, session_id: str, after_seq: int, limit: int
) -> list[MessageView]:
    await get_session(db, owner=owner, session_id=session_id)
    rows = await db.scalars(
        select(Message)
        .where(
            Message.session_id == session_id,
            Message.seq > after_seq,
            Message.replaced_by.is_(None),
        )
        .order_by(Message.seq)
        .limit(limit)
    )
    return [MessageView.from_row(row) for row in rows]


async def delete_session(db: AsyncSession, *, owner: Identity, session_id: str) -> str | None:
    """Hide the session from its owner for good; returns the turn still active in it, which
    the caller cancels once this is committed (its workflow then ends it as usual)."""
    session = await lock_session(db, owner=owner, session_id=session_id)
    session.deleted_at = datetime.now(UTC)
    await db.flush()
    return session.active_turn_id


@dataclass(frozen=True)
class TurnRow:
    """A turn as its owner reads it: where it stands, and the messages it answers with."""

    id: str
    session_id: str
    state: str
    user_seq: int
    user_message_id: str
    assistant_message_id: str | None
    created_at: datetime
    updated_at: datetime


async def get_turn(db: AsyncSession, *, owner: Identity, session_id: str, turn_id: str) -> TurnRow:
    """The owner's turn as it stands now (read again, whatever this unit of work held)."""
    params = {"turn_id": turn_id, "session_id": session_id}
    turn = await db.scalar(_TURN, params | {"tenant_id": owner.tenant_id, "user_id": owner.user_id})
    if turn is None:
        raise NotFound(TURN_NOT_FOUND)
    return typed_row(TurnRow, turn)


_TURN = (
    select(Turn)
    .join(ChatSession, ChatSession.id == Turn.session_id)
    .where(
        Turn.id == bindparam("turn_id"),
        Turn.session_id == bindparam("session_id"),
        Turn.tenant_id == bindparam("tenant_id"),
        Turn.user_id == bindparam("user_id"),
        ChatSession.deleted_at.is_(None),
    )
    .execution_options(populate_existing=True)
)


async def get_message(db: AsyncSession, *, message_id: str) -> StoredMessage | None:
    """The message (from the session's identity map when it holds it)."""
    row = await db.get(Message, message_id)
    return None if row is None else typed_row(StoredMessage, row)


async def get_chat_session(db: AsyncSession, *, session_id: str) -> SessionRow | None:
    """The session (from the session's identity map when it holds it)."""
    row = await db.get(ChatSession, session_id)
    return None if row is None else typed_row(SessionRow, row)


async def with_tenant(db: AsyncSession, *, session_id: str) -> SessionRow | None:
    """The session, its tenant's row read in the same round trip (later reads of the tenant
    are then answered from the session's identity map)."""
    held = (await db.execute(_WITH_TENANT, {"session_id": session_id})).one_or_none()
    return None if held is None else typed_row(SessionRow, held[0])


_WITH_TENANT = (
    select(ChatSession, Tenant)
    .select_from(ChatSession)
    .outerjoin(Tenant, Tenant.id == ChatSession.tenant_id)
    .where(ChatSession.id == bindparam("session_id"))
)
