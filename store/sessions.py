"""Sessions and their messages, and the owner-scoped reads the API answers from.

What leaves this module is a typed row (`SessionRow`, `SessionSummary`, `StoredMessage`,
`MessageView`), read on a `Db` (store/db.py). `lock_session` locks the owner's session row for
a writer that moves its counters (a post's new turn, a queued message, an import).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from parley.errors import NotFound
from parley.ids import new_id
from parley.live import SessionEventType
from parley.store import limits
from parley.store.db import Db, Sent
from parley.store.identity import Identity
from parley.store.live import COUNTED, LIVE_RUNG, announce_params, announced
from parley.store.messages import MESSAGE_COLUMNS, MessageRow
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
    # The active branch (store/branches.py): 0 until the conversation is first edited.
    branch: int


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


# A session's columns as `SessionRow` reads them.
_SESSION_COLUMNS = (
    "id, tenant_id, user_id, last_seq, active_turn_id, queued_turn_id, created_at, branch"
)


async def create_session(db: Db, *, owner: Identity, per_day: int | None = None) -> SessionRow:
    """A new session; with `per_day`, refused (429) once the user made that many today."""
    if per_day is not None:
        await limits.admit_session(db, owner=owner, per_day=per_day)
    params = {"id": new_id("ses"), "tenant_id": owner.tenant_id, "user_id": owner.user_id}
    session = await db.row(_CREATE_SESSION, params, SessionRow)
    assert session is not None  # an INSERT … RETURNING without conditions
    return session


_CREATE_SESSION = f"""
    INSERT INTO sessions (id, tenant_id, user_id, last_seq)
    VALUES (%(id)s, %(tenant_id)s, %(user_id)s, 0)
    RETURNING {_SESSION_COLUMNS}
"""


async def list_sessions(db: Db, *, owner: Identity, limit: int = 100) -> list[SessionSummary]:
    params = {"tenant_id": owner.tenant_id, "user_id": owner.user_id, "limit": limit}
    return await db.rows(_LIST_SESSIONS, params, SessionSummary)


_LIST_SESSIONS = f"""
    SELECT s.id, s.last_seq, s.created_at,
        (SELECT left(m.text, {TITLE_CHARS}) FROM messages AS m
            WHERE m.session_id = s.id AND m.role = 'user' AND NOT m.off_path
            ORDER BY m.seq LIMIT 1) AS title,
        coalesce((SELECT max(m.created_at) FROM messages AS m WHERE m.session_id = s.id),
            s.created_at) AS last_activity_at
    FROM sessions AS s
    WHERE s.tenant_id = %(tenant_id)s AND s.user_id = %(user_id)s AND s.deleted_at IS NULL
    ORDER BY s.created_at DESC
    LIMIT %(limit)s
"""


async def get_session(db: Db, *, owner: Identity, session_id: str) -> SessionRow:
    """The owner's session; NotFound (404) for anyone else's, or a deleted one."""
    return await _owned(db, _SESSION, owner=owner, session_id=session_id)


async def lock_session(db: Db, *, owner: Identity, session_id: str) -> SessionRow:
    """The owner's session, its row locked for this transaction: for a writer that moves its
    counters in statements of its own (a plain post's new turn, store/turns/birth.py)."""
    return await _owned(db, _LOCK_SESSION_ROW, owner=owner, session_id=session_id)


async def send_lock(db: Db, *, owner: Identity, session_id: str) -> Sent[SessionRow]:
    """`lock_session`, sent (or queued in `Db.together`, ahead of the statements the lock
    orders); `owned` reads what it found."""
    params = {"session_id": session_id, "tenant_id": owner.tenant_id, "user_id": owner.user_id}
    return await db.send(_LOCK_SESSION_ROW, params, SessionRow)


async def owned(sent: Sent[SessionRow]) -> SessionRow:
    """The session a `send_lock` found: 404 when it is not the owner's (or deleted)."""
    session = await sent.row()
    if session is None:
        raise NotFound(SESSION_NOT_FOUND)
    return session


async def _owned(db: Db, query: str, *, owner: Identity, session_id: str) -> SessionRow:
    params = {"session_id": session_id, "tenant_id": owner.tenant_id, "user_id": owner.user_id}
    session = await db.row(query, params, SessionRow)
    if session is None:
        raise NotFound(SESSION_NOT_FOUND)
    return session


# Every post and stream runs these.
_SESSION = f"""
    SELECT {_SESSION_COLUMNS}
    FROM sessions
    WHERE id = %(session_id)s AND tenant_id = %(tenant_id)s AND user_id = %(user_id)s
        AND deleted_at IS NULL
"""
_LOCK_SESSION_ROW = f"{_SESSION} FOR UPDATE"


async def list_messages(
    db: Db, *, owner: Identity, session_id: str, after_seq: int, limit: int
) -> list[MessageView]:
    await get_session(db, owner=owner, session_id=session_id)
    params = {"session_id": session_id, "after_seq": after_seq, "limit": limit}
    rows = await db.rows(_MESSAGES, params, MessageRow)
    return [MessageView.from_row(row) for row in rows]


_MESSAGES = f"""
    SELECT {MESSAGE_COLUMNS} FROM messages
    WHERE session_id = %(session_id)s AND seq > %(after_seq)s AND replaced_by IS NULL
        AND NOT off_path
    ORDER BY seq
    LIMIT %(limit)s
"""


async def delete_session(db: Db, *, owner: Identity, session_id: str) -> str | None:
    """Hide the session from its owner for good; returns the turn still active in it, which
    the caller cancels once this is committed (its workflow then ends it as usual). One
    statement, which locks the row as it changes it."""
    params = {"session_id": session_id, "tenant_id": owner.tenant_id, "user_id": owner.user_id}
    params |= announce_params(SessionEventType.session_deleted)
    deleted = await db.row(_DELETE_SESSION, params, _Deleted)
    if deleted is None:
        raise NotFound(SESSION_NOT_FOUND)
    return deleted.active_turn_id


@dataclass(frozen=True)
class _Deleted:
    active_turn_id: str | None
    announced: Any


# The session's streams are told on its own log (store/live.py), and end.
_DELETE_SESSION = f"""
    WITH deleted AS (
        UPDATE sessions SET deleted_at = now(), {COUNTED}
        WHERE id = %(session_id)s AND tenant_id = %(tenant_id)s AND user_id = %(user_id)s
            AND deleted_at IS NULL
        RETURNING sessions.id, sessions.last_event_id, sessions.active_turn_id
    ), {announced("deleted")}
    SELECT active_turn_id, {LIVE_RUNG} AS announced FROM deleted
"""


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


async def get_turn(db: Db, *, owner: Identity, session_id: str, turn_id: str) -> TurnRow:
    """The owner's turn as it stands now."""
    params = {"turn_id": turn_id, "session_id": session_id}
    params |= {"tenant_id": owner.tenant_id, "user_id": owner.user_id}
    turn = await db.row(_TURN, params, TurnRow)
    if turn is None:
        raise NotFound(TURN_NOT_FOUND)
    return turn


_TURN = """
    SELECT t.id, t.session_id, t.state, t.user_seq, t.user_message_id, t.assistant_message_id,
        t.created_at, t.updated_at
    FROM turns AS t JOIN sessions AS s ON s.id = t.session_id
    WHERE t.id = %(turn_id)s AND t.session_id = %(session_id)s AND t.tenant_id = %(tenant_id)s
        AND t.user_id = %(user_id)s AND s.deleted_at IS NULL
"""


@dataclass(frozen=True)
class TenantedSession(SessionRow):
    """A session with its tenant's configuration as stored (`{}`: none, or no tenant row)."""

    tenant_config: dict[str, Any]


async def with_tenant(db: Db, *, session_id: str) -> TenantedSession | None:
    """The session and its tenant's configuration, in one round trip."""
    return await db.made(_WITH_TENANT, {"session_id": session_id}, _tenanted)


def _tenanted(*, tenant_config: dict[str, Any] | None, **session: Any) -> TenantedSession:
    return TenantedSession(**session, tenant_config=dict(tenant_config or {}))


_WITH_TENANT = """
    SELECT s.id, s.tenant_id, s.user_id, s.last_seq, s.active_turn_id, s.queued_turn_id,
        s.created_at, s.branch, t.config AS tenant_config
    FROM sessions AS s LEFT JOIN tenants AS t ON t.id = s.tenant_id
    WHERE s.id = %(session_id)s
"""
