"""Hand-offs to a person, as the record keeps them (the rules: parley/handoffs.py).

A case is a `handoffs` row: its status moves only through `_move` (the table of allowed
moves is `parley.handoffs.MOVES`), one open case per session at most (a partial unique
index), so while it is open it is the session's owner. Every change of status and every
message goes into the case's event log (store/handoff_events.py), which the customer's page
and the agent's follow, and is announced on the session's log (store/live.py: `handoff`,
`message`) for every tab of the customer's session stream. Internal notes live apart, in
`handoff_notes`: no statement here puts them in a log or among the messages.

Locks: every writer takes the session's row first, then the case's (store/posting.py holds
the session's when a customer's message joins the case), so a customer's message and an
agent's reply never wait on each other in opposite orders. Nothing here commits (see `store`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

from parley.errors import Forbidden, HandoffClaimed, HandoffClosed, HandoffOpen, NotFound
from parley.handoff_rules import OpenedBy
from parley.handoffs import (
    AGENT_ROLE,
    ENDED_STATUSES,
    MOVES,
    UNCLAIMED_TEXT,
    CaseFacts,
    HandoffMessageData,
    HandoffStatus,
    HandoffStatusData,
)
from parley.ids import new_id
from parley.live import SessionEventType
from parley.resolver import ACTIVE_ORDER
from parley.store.actions import ForeignRow
from parley.store.db import Db
from parley.store.handoff_events import append_event
from parley.store.identity import Identity
from parley.store.live import announce
from parley.store.messages import (
    MESSAGE_AT_SEQ,
    MESSAGE_COLUMNS,
    MessageRow,
    message_params,
    seq_taken,
)
from parley.wire import MessageView

NOT_FOUND = "no such hand-off"


@dataclass(frozen=True)
class HandoffRow:
    id: str
    session_id: str
    turn_id: str | None  # None: opened by the customer's words in a message with no turn
    tenant_id: str
    user_id: str
    reason: str
    status: str
    priority: int
    opened_by: str  # parley/handoff_rules.py `OpenedBy`
    summary: str | None
    summary_by: str | None
    agent_id: str | None
    agent_name: str | None
    created_at: datetime
    claimed_at: datetime | None
    unclaimed_at: datetime | None
    ended_at: datetime | None

    @property
    def open(self) -> bool:
        return self.status not in ENDED_STATUSES


@dataclass(frozen=True)
class NoteRow:
    id: str
    agent_name: str
    text: str
    created_at: datetime


_COLUMNS = (
    "id, session_id, turn_id, tenant_id, user_id, reason, status, priority, opened_by, "
    "summary, summary_by, agent_id, agent_name, created_at, claimed_at, unclaimed_at, ended_at"
)
_OPEN = "status IN ('waiting', 'claimed')"  # as the partial indexes spell it (migration 0027)
# Whether a case holds the session: a column of store/posting.py's first read of a post, so a
# post learns it without a round trip of its own.
HELD = f"EXISTS (SELECT 1 FROM handoffs WHERE session_id = %(session_id)s AND {_OPEN}) AS held"


def may_work_cases(who: Identity) -> None:
    """Only a tenant's support agents work its cases."""
    if AGENT_ROLE not in who.roles:
        raise Forbidden("this needs the agent role")


async def open_handoff(
    db: Db, *, handoff_id: str, session_id: str, turn_id: str, reason: str, priority: int = 0
) -> tuple[HandoffRow, bool]:
    """The case a `handoff_to_human` call asked for, once however often the call runs; a
    session with a case open already keeps that one. Returns the case and whether this call
    opened it (the caller starts its workflow either way: starting it is idempotent)."""
    params = {
        "id": handoff_id,
        "session_id": session_id,
        "turn_id": turn_id,
        "reason": reason,
        "priority": priority,
        "by": OpenedBy.tool.value,
    }
    opened = await db.row(OPEN_CASE, params, HandoffRow)
    if opened is not None:
        await announce_status(db, case=opened)
        return opened, True
    earlier = await db.row(_CASE, {"id": handoff_id}, HandoffRow)
    if earlier is not None:
        if (earlier.session_id, earlier.turn_id) != (session_id, turn_id):
            raise ForeignRow(f"hand-off {handoff_id} belongs to another turn")
        return earlier, False
    held = await open_case(db, session_id=session_id)
    assert held is not None, f"session {session_id} is missing"
    return held, False


# Composed by store/handoff_openers.py, which opens the cases code decides on.
OPEN_CASE = f"""
    INSERT INTO handoffs
        (id, session_id, turn_id, tenant_id, user_id, reason, status, priority, opened_by)
    SELECT %(id)s, s.id, %(turn_id)s, s.tenant_id, s.user_id, %(reason)s, 'waiting',
        %(priority)s, %(by)s
    FROM sessions AS s WHERE s.id = %(session_id)s
    ON CONFLICT DO NOTHING
    RETURNING {_COLUMNS}
"""
_CASE = f"SELECT {_COLUMNS} FROM handoffs WHERE id = %(id)s"


async def open_case(db: Db, *, session_id: str) -> HandoffRow | None:
    """The session's open case, if a person's team holds the session."""
    return await db.row(OPEN_CASE_OF_SESSION, {"session_id": session_id}, HandoffRow)


OPEN_CASE_OF_SESSION = (
    f"SELECT {_COLUMNS} FROM handoffs WHERE session_id = %(session_id)s AND {_OPEN}"
)


async def refuse_while_held(db: Db, *, session_id: str) -> None:
    """A person of the support team holds the session: what would have the assistant answer
    instead (an edit, a regenerate, a retry, another version shown) waits for the hand-back."""
    case = await open_case(db, session_id=session_id)
    if case is not None:
        raise HandoffOpen(
            "a person from the support team holds this conversation", handoff_id=case.id
        )


async def latest_case(db: Db, *, session_id: str) -> HandoffRow | None:
    """The session's most recent case, open or not (the customer's page reads it)."""
    return await db.row(_LATEST, {"session_id": session_id}, HandoffRow)


_LATEST = f"""
    SELECT {_COLUMNS} FROM handoffs WHERE session_id = %(session_id)s
    ORDER BY created_at DESC, id DESC LIMIT 1
"""


async def get_case(db: Db, *, handoff_id: str) -> HandoffRow | None:
    """A case by id, for the workflow's steps (no caller to check)."""
    return await db.row(_CASE, {"id": handoff_id}, HandoffRow)


async def case_for_agent(db: Db, *, agent: Identity, handoff_id: str) -> HandoffRow:
    """The case, when it is one of the agent's tenant's: any other is 404."""
    may_work_cases(agent)
    found = await db.row(_TENANT_CASE, {"id": handoff_id, "tenant": agent.tenant_id}, HandoffRow)
    if found is None:
        raise NotFound(NOT_FOUND)
    return found


_TENANT_CASE = f"SELECT {_COLUMNS} FROM handoffs WHERE id = %(id)s AND tenant_id = %(tenant)s"


async def unstarted_cases(db: Db, *, older_than: timedelta) -> list[HandoffRow]:
    """Open cases older than `older_than` whose run wrote no summary (its first step): a
    lost start, or a slow run (the outbox sweep starts both; a start attaches to a run)."""
    return await db.rows(_UNSTARTED, {"before": datetime.now(UTC) - older_than}, HandoffRow)


_UNSTARTED = f"""SELECT {_COLUMNS} FROM handoffs
    WHERE {_OPEN} AND summary IS NULL AND created_at < %(before)s ORDER BY created_at LIMIT 100"""


async def inbox(db: Db, *, agent: Identity, limit: int = 100) -> list[HandoffRow]:
    """The tenant's open cases: the highest priority first, then the oldest."""
    may_work_cases(agent)
    params = {"tenant": agent.tenant_id, "limit": limit}
    return await db.rows(_INBOX, params, HandoffRow)


_INBOX = f"""
    SELECT {_COLUMNS} FROM handoffs WHERE tenant_id = %(tenant)s AND {_OPEN}
    ORDER BY priority DESC, created_at, id LIMIT %(limit)s
"""


async def claim(db: Db, *, agent: Identity, handoff_id: str) -> HandoffRow:
    """The agent takes the case: one owner at a time, so a second claim (or a claim of a case
    another holds) is `HandoffClaimed`, of an ended one `HandoffClosed`."""
    case = await _lock(db, agent, handoff_id)
    params = {"id": case.id, "agent_id": agent.user_id, "tenant": agent.tenant_id}
    return await _move(db, case, HandoffStatus.claimed, _CLAIM, params)


_CLAIM = f"""
    UPDATE handoffs SET status = 'claimed', claimed_at = now(),
        agent_id = CAST(%(agent_id)s AS varchar),
        agent_name = (SELECT display_name FROM users
                      WHERE tenant_id = %(tenant)s AND id = CAST(%(agent_id)s AS varchar))
    WHERE id = %(id)s AND status = 'waiting'
    RETURNING {_COLUMNS}
"""


async def end(db: Db, *, agent: Identity, handoff_id: str, status: HandoffStatus) -> HandoffRow:
    """The holder resolves the case or hands the conversation back to the assistant."""
    case = await _held_by(db, agent, handoff_id)
    return await _move(db, case, status, _END, {"id": case.id, "status": status.value})


_END = f"""
    UPDATE handoffs SET status = %(status)s, ended_at = now()
    WHERE id = %(id)s AND status = 'claimed'
    RETURNING {_COLUMNS}
"""


async def _move(
    db: Db, case: HandoffRow, to: HandoffStatus, statement: str, params: dict[str, Any]
) -> HandoffRow:
    """Every change of a case's status, checked against the table of moves, announced in its
    log in the same transaction."""
    if to not in MOVES[HandoffStatus(case.status)]:
        _refuse(case)
    moved = await db.row(statement, params, HandoffRow)
    if moved is None:  # the row is locked by this transaction: only the check above can fail
        _refuse(case)
    await announce_status(db, case=moved)
    return moved


def _refuse(case: HandoffRow) -> NoReturn:
    if case.status in ENDED_STATUSES:
        raise HandoffClosed(f"this hand-off is {case.status}", status=case.status)
    raise HandoffClaimed("another agent holds this hand-off", status=case.status)


async def reply(db: Db, *, agent: Identity, handoff_id: str, text: str) -> MessageView:
    """The holder's reply: a message of the conversation under the agent's name, streamed to
    the customer."""
    case = await _held_by(db, agent, handoff_id)
    return await add_message(
        db, case=case, role="assistant", text=text, author_name=case.agent_name or "Support"
    )


async def from_customer(db: Db, *, case: HandoffRow, text: str, key: str) -> MessageView:
    """The customer's message (its `client_message_id`: `key`) for the person holding the
    session; the caller (store/posting.py) holds the session's row."""
    return await add_message(db, case=case, role="user", text=text, client_message_id=key)


async def add_message(
    db: Db,
    *,
    case: HandoffRow,
    role: str,
    text: str,
    author_name: str | None = None,
    client_message_id: str | None = None,
) -> MessageView:
    """A message of a conversation the case holds (no turn: the model is not asked), with the
    session's next seq, and its `message` event. The caller holds the session's row."""
    params = {
        "session_id": case.session_id,
        **message_params(
            message_id=new_id("msg"),
            turn_id=None,
            role=role,
            text=text,
            client_message_id=client_message_id,
            author_name=author_name,
        ),
    }
    stored = await db.row(_ADD_MESSAGE, params, MessageRow)
    assert stored is not None
    view = MessageView.from_row(stored)
    await append_event(db, handoff_id=case.id, data=HandoffMessageData(message=view))
    await announce(
        db, session_id=case.session_id, type=SessionEventType.message, message_id=view.id
    )
    return view


async def announce_status(db: Db, *, case: HandoffRow) -> None:
    """The case's status, on its own log and on the session's (every tab of the customer's
    hears a person join or leave)."""
    data = status_data(case)
    await append_event(db, handoff_id=case.id, data=data)
    await announce(db, session_id=case.session_id, type=SessionEventType.handoff, data=data)


_ADD_MESSAGE = f"""
    WITH {seq_taken(session="%(session_id)s", message="%(message_id)s")}
    {MESSAGE_AT_SEQ}
    RETURNING {MESSAGE_COLUMNS}
"""


async def add_note(db: Db, *, agent: Identity, handoff_id: str, text: str) -> NoteRow:
    """An internal note on a case of the agent's tenant: for agents only, never in the
    conversation or its stream."""
    case = await case_for_agent(db, agent=agent, handoff_id=handoff_id)
    params = {
        "id": new_id("hnote"),
        "handoff_id": case.id,
        "agent_id": agent.user_id,
        "tenant": agent.tenant_id,
        "text": text,
    }
    note = await db.row(_ADD_NOTE, params, NoteRow)
    assert note is not None
    return note


_ADD_NOTE = """
    INSERT INTO handoff_notes (id, handoff_id, agent_id, agent_name, text)
    SELECT %(id)s, %(handoff_id)s, agent.id, coalesce(u.display_name, agent.id), %(text)s
    FROM (SELECT CAST(%(agent_id)s AS varchar) AS id) AS agent
    LEFT JOIN users AS u ON u.tenant_id = %(tenant)s AND u.id = agent.id
    RETURNING id, agent_name, text, created_at
"""


async def notes(db: Db, *, handoff_id: str) -> list[NoteRow]:
    return await db.rows(_NOTES, {"handoff_id": handoff_id}, NoteRow)


_NOTES = """
    SELECT id, agent_name, text, created_at FROM handoff_notes
    WHERE handoff_id = %(handoff_id)s ORDER BY created_at, id
"""


async def conversation(db: Db, *, session_id: str, limit: int = 200) -> list[MessageView]:
    """The conversation's last messages, as the customer sees them, for the agent."""
    rows = await db.rows(_CONVERSATION, {"session_id": session_id, "limit": limit}, MessageRow)
    return [MessageView.from_row(row) for row in reversed(rows)]


_CONVERSATION = f"""
    SELECT {MESSAGE_COLUMNS} FROM messages
    WHERE session_id = %(session_id)s AND replaced_by IS NULL AND NOT off_path
    ORDER BY seq DESC LIMIT %(limit)s
"""


async def _lock(db: Db, agent: Identity, handoff_id: str) -> HandoffRow:
    """The session's row, then the case's, locked in that order (see the module's note); the
    case as it is under them. Another tenant's case is 404."""
    may_work_cases(agent)
    params = {"id": handoff_id, "tenant": agent.tenant_id}
    if await db.value(_LOCK_SESSION, params) is None:
        raise NotFound(NOT_FOUND)
    found = await db.row(_LOCK_CASE, params, HandoffRow)
    assert found is not None
    return found


_LOCK_SESSION = """
    SELECT s.id FROM sessions AS s JOIN handoffs AS h ON h.session_id = s.id
    WHERE h.id = %(id)s AND h.tenant_id = %(tenant)s
    FOR UPDATE OF s
"""
_LOCK_CASE = f"SELECT {_COLUMNS} FROM handoffs WHERE id = %(id)s FOR UPDATE"


async def _held_by(db: Db, agent: Identity, handoff_id: str) -> HandoffRow:
    """The case locked, when the agent holds it."""
    case = await _lock(db, agent, handoff_id)
    if case.status in ENDED_STATUSES:
        raise HandoffClosed(f"this hand-off is {case.status}", status=case.status)
    if case.status != HandoffStatus.claimed or case.agent_id != agent.user_id:
        raise HandoffClaimed("claim this hand-off first; only its holder may", status=case.status)
    return case


async def save_summary(db: Db, *, handoff_id: str, summary: str, by: str) -> None:
    await db.run(_SAVE_SUMMARY, {"id": handoff_id, "summary": summary, "by": by})


_SAVE_SUMMARY = "UPDATE handoffs SET summary = %(summary)s, summary_by = %(by)s WHERE id = %(id)s"


async def tell_unclaimed(db: Db, *, handoff_id: str) -> bool:
    """Nobody claimed the case in time: the customer is told so and offered an email
    follow-up, once, and only while it still waits. Whether they were told now."""
    session_id = await db.value(_SESSION_OF, {"id": handoff_id})
    if session_id is None:
        return False
    await db.value(LOCK_SESSION_BY_ID, {"session_id": session_id})
    case = await db.row(_UNCLAIMED, {"id": handoff_id}, HandoffRow)
    if case is None:  # claimed or ended meanwhile, or told already
        return False
    await announce_status(db, case=case)
    await add_message(db, case=case, role="assistant", text=UNCLAIMED_TEXT)
    return True


async def tell_away(db: Db, *, handoff_id: str, text: str) -> bool:
    """The case opened outside the team's hours: the customer is told (`text`: when a person
    is back), once, and only while it still waits. Whether they were told now."""
    session_id = await db.value(_SESSION_OF, {"id": handoff_id})
    if session_id is None:
        return False
    await db.value(LOCK_SESSION_BY_ID, {"session_id": session_id})
    case = await db.row(_AWAY, {"id": handoff_id}, HandoffRow)
    if case is None:  # claimed or ended meanwhile, or told already
        return False
    await add_message(db, case=case, role="assistant", text=text)
    return True


_AWAY = f"""
    UPDATE handoffs SET away_told_at = now()
    WHERE id = %(id)s AND status = 'waiting' AND away_told_at IS NULL
    RETURNING {_COLUMNS}
"""
_SESSION_OF = "SELECT session_id FROM handoffs WHERE id = %(id)s"
LOCK_SESSION_BY_ID = "SELECT id FROM sessions WHERE id = %(session_id)s FOR UPDATE"
_UNCLAIMED = f"""
    UPDATE handoffs SET unclaimed_at = now()
    WHERE id = %(id)s AND status = 'waiting' AND unclaimed_at IS NULL
    RETURNING {_COLUMNS}
"""


async def case_facts(db: Db, *, case: HandoffRow) -> CaseFacts:
    """What the record says about the case, for its summary."""
    params = {"session_id": case.session_id, "slot": ACTIVE_ORDER}
    facts = await db.row(_FACTS, params, _Facts)
    assert facts is not None  # a select list without FROM: always one row
    transcript = [{"role": role, "text": text} for role, text in facts.transcript or []]
    order = facts.order_id
    return CaseFacts(
        reason=case.reason,
        order_id=None if order is None else str(order),
        transcript=transcript,
        tools=list(facts.tools or []),
    )


@dataclass(frozen=True)
class _Facts:
    order_id: Any
    transcript: list[list[str]] | None
    tools: list[str] | None


_FACTS = """
    SELECT
        (SELECT value FROM slots WHERE session_id = %(session_id)s AND name = %(slot)s)
            AS order_id,
        (SELECT json_agg(json_build_array(role, text) ORDER BY seq) FROM (
            SELECT seq, role, text FROM messages
            WHERE session_id = %(session_id)s AND role IN ('user', 'assistant')
                AND tool_calls IS NULL AND replaced_by IS NULL AND status <> 'retracted'
                AND NOT off_path
            ORDER BY seq DESC LIMIT 30) AS recent) AS transcript,
        (SELECT json_agg(tc.name ORDER BY tc.created_at, tc.id)
            FROM tool_calls AS tc JOIN turns AS t ON t.id = tc.turn_id
            WHERE t.session_id = %(session_id)s AND tc.name <> 'handoff_to_human') AS tools
"""


def status_data(case: HandoffRow) -> HandoffStatusData:
    return HandoffStatusData(
        handoff_id=case.id,
        status=case.status,
        agent_name=case.agent_name,
        unclaimed=case.unclaimed_at is not None,
    )
