"""Sessions, messages and turns: the repository functions behind the session API.

Ordering rule: the session row is locked (`SELECT … FOR UPDATE`) by every write that assigns
a seq or changes the active turn, so seqs are dense and there is at most one active turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from parley.contracts import TERMINAL_TURN_STATES, EventType, MessageStatus, TurnState
from parley.errors import (
    AgentPaused,
    IdempotencyKeyReused,
    NotFound,
    StaleView,
    TurnInProgress,
)
from parley.ids import assistant_message_id, new_id
from store.events import append_event, append_events
from store.identity import Identity
from store.models import ChatSession, Message, Tenant, Turn

SESSION_NOT_FOUND = "session not found"
TURN_NOT_FOUND = "turn not found"


def message_payload(m: Message) -> dict[str, Any]:
    """The contract's `Message` shape (api.md), used by the API and by `done` events."""
    payload: dict[str, Any] = {
        "id": m.id,
        "seq": m.seq,
        "role": m.role,
        "turn_id": m.turn_id,
        "status": m.status,
        "text": m.text,
        "created_at": m.created_at.isoformat(),
    }
    if m.tool_calls is not None:
        payload["tool_calls"] = m.tool_calls
    if m.tool_call_id is not None:
        payload["tool_call_id"] = m.tool_call_id
    return payload


# --- sessions -----------------------------------------------------------------------------


async def create_session(db: AsyncSession, *, owner: Identity) -> ChatSession:
    session = ChatSession(id=new_id("ses"), tenant_id=owner.tenant_id, user_id=owner.user_id)
    db.add(session)
    await db.commit()
    await db.refresh(session)
    return session


async def list_sessions(
    db: AsyncSession, *, owner: Identity, limit: int = 100
) -> list[ChatSession]:
    rows = await db.scalars(
        select(ChatSession)
        .where(ChatSession.tenant_id == owner.tenant_id, ChatSession.user_id == owner.user_id)
        .order_by(ChatSession.created_at.desc())
        .limit(limit)
    )
    return list(rows)


async def get_session(
    db: AsyncSession, *, owner: Identity, session_id: str, for_update: bool = False
) -> ChatSession:
    query = select(ChatSession).where(
        ChatSession.id == session_id,
        ChatSession.tenant_id == owner.tenant_id,
        ChatSession.user_id == owner.user_id,
    )
    if for_update:
        query = query.with_for_update()
    session = await db.scalar(query)
    if session is None:
        raise NotFound(SESSION_NOT_FOUND)
    return session


async def list_messages(
    db: AsyncSession, *, owner: Identity, session_id: str, after_seq: int, limit: int
) -> list[Message]:
    await get_session(db, owner=owner, session_id=session_id)
    rows = await db.scalars(
        select(Message)
        .where(Message.session_id == session_id, Message.seq > after_seq)
        .order_by(Message.seq)
        .limit(limit)
    )
    return list(rows)


# --- turns --------------------------------------------------------------------------------


@dataclass(frozen=True)
class PostedMessage:
    turn: Turn
    message: Message
    created: bool  # False when this was a duplicate POST of an earlier message


async def post_user_message(
    db: AsyncSession,
    *,
    owner: Identity,
    session_id: str,
    client_message_id: str,
    text: str,
    expected_last_seq: int | None,
) -> PostedMessage:
    """Store a user message and its turn in one transaction (the turn row is the outbox)."""
    session = await get_session(db, owner=owner, session_id=session_id, for_update=True)

    earlier = await db.scalar(
        select(Message).where(
            Message.session_id == session_id, Message.client_message_id == client_message_id
        )
    )
    if earlier is not None:
        if earlier.text != text:
            await db.rollback()
            raise IdempotencyKeyReused(
                "this client_message_id was already used with a different text"
            )
        turn = await db.scalar(select(Turn).where(Turn.user_message_id == earlier.id))
        assert turn is not None
        await db.commit()  # nothing written; ends the transaction without expiring objects
        return PostedMessage(turn=turn, message=earlier, created=False)

    tenant = await db.get(Tenant, owner.tenant_id)
    if tenant is not None and tenant.paused:
        await db.rollback()
        raise AgentPaused("the assistant is paused for this tenant")
    if expected_last_seq is not None and expected_last_seq != session.last_seq:
        last_seq = session.last_seq
        await db.rollback()
        raise StaleView("the session has newer messages", last_seq=last_seq)
    if session.active_turn_id is not None:
        active = session.active_turn_id
        await db.rollback()
        raise TurnInProgress("a turn is still running in this session", active_turn_id=active)

    seq = session.last_seq + 1
    turn_id = new_id("trn")
    message = Message(
        id=new_id("msg"),
        session_id=session_id,
        seq=seq,
        role="user",
        turn_id=turn_id,
        status=MessageStatus.complete,
        text=text,
        client_message_id=client_message_id,
    )
    turn = Turn(
        id=turn_id,
        session_id=session_id,
        tenant_id=owner.tenant_id,
        user_id=owner.user_id,
        user_message_id=message.id,
        user_seq=seq,
        state=TurnState.received,
    )
    db.add_all([message, turn])
    session.last_seq = seq
    session.active_turn_id = turn_id
    await db.flush()
    await append_event(db, turn_id=turn_id, type=EventType.state, data={"state": turn.state})
    await db.commit()
    await db.refresh(message)
    await db.refresh(turn)
    return PostedMessage(turn=turn, message=message, created=True)


async def get_turn(db: AsyncSession, *, owner: Identity, session_id: str, turn_id: str) -> Turn:
    turn = await db.scalar(
        select(Turn).where(
            Turn.id == turn_id,
            Turn.session_id == session_id,
            Turn.tenant_id == owner.tenant_id,
            Turn.user_id == owner.user_id,
        )
    )
    if turn is None:
        raise NotFound(TURN_NOT_FOUND)
    return turn


async def mark_workflow_started(db: AsyncSession, *, turn_id: str) -> None:
    await db.execute(
        update(Turn)
        .where(Turn.id == turn_id, Turn.workflow_started_at.is_(None))
        .values(workflow_started_at=datetime.now().astimezone())
    )
    await db.commit()


async def unstarted_turns(
    db: AsyncSession, *, older_than: timedelta, limit: int = 50
) -> list[Turn]:
    """Turns committed by the API whose workflow start was never confirmed."""
    cutoff = datetime.now().astimezone() - older_than
    rows = await db.scalars(
        select(Turn)
        .where(Turn.workflow_started_at.is_(None), Turn.created_at < cutoff)
        .order_by(Turn.created_at)
        .limit(limit)
    )
    return list(rows)


# --- turn progress (called by activities) ------------------------------------------------


async def set_turn_state(db: AsyncSession, *, turn_id: str, state: TurnState) -> None:
    """Persist a state change and announce it on the stream; a repeat is a no-op."""
    turn = await db.get(Turn, turn_id, with_for_update=True)
    if turn is None:
        raise LookupError(turn_id)
    if turn.state == state or turn.state in TERMINAL_TURN_STATES:
        await db.commit()  # nothing changed; releases the row lock without expiring objects
        return
    turn.state = state
    await append_event(db, turn_id=turn_id, type=EventType.state, data={"state": state})
    await db.commit()


async def complete_turn(db: AsyncSession, *, turn_id: str, text: str) -> Message:
    """Store the assistant message, end the stream with `done`, release the session.

    Idempotent: a retried call after a crash finds the message already stored and returns it.
    """
    turn = await db.get(Turn, turn_id, with_for_update=True)
    if turn is None:
        raise LookupError(turn_id)
    message_id = assistant_message_id(turn_id)
    existing = await db.get(Message, message_id)
    if existing is not None:
        await db.commit()  # nothing changed; releases the row lock without expiring objects
        return existing
    session = await db.get(ChatSession, turn.session_id, with_for_update=True)
    assert session is not None
    seq = session.last_seq + 1
    message = Message(
        id=message_id,
        session_id=session.id,
        seq=seq,
        role="assistant",
        turn_id=turn_id,
        status=MessageStatus.complete,
        text=text,
    )
    db.add(message)
    session.last_seq = seq
    if session.active_turn_id == turn_id:
        session.active_turn_id = None
    turn.state = TurnState.completed
    turn.assistant_message_id = message_id
    await db.flush()
    await db.refresh(message)
    await append_events(
        db,
        turn_id=turn_id,
        events=[
            (EventType.state, {"state": TurnState.completed}),
            (EventType.done, {"message": message_payload(message)}),
        ],
    )
    await db.commit()
    return message


async def fail_turn(
    db: AsyncSession, *, turn_id: str, code: str, message: str, retryable: bool
) -> None:
    """Mark the turn failed, end its stream with `error`, release the session."""
    turn = await db.get(Turn, turn_id, with_for_update=True)
    if turn is None:
        raise LookupError(turn_id)
    if turn.state in TERMINAL_TURN_STATES:
        await db.commit()  # nothing changed; releases the row lock without expiring objects
        return
    session = await db.get(ChatSession, turn.session_id, with_for_update=True)
    assert session is not None
    if session.active_turn_id == turn_id:
        session.active_turn_id = None
    turn.state = TurnState.failed
    turn.error = {"code": code, "message": message, "retryable": retryable}
    await append_events(
        db,
        turn_id=turn_id,
        events=[
            (EventType.state, {"state": TurnState.failed}),
            (EventType.error, {"code": code, "message": message, "retryable": retryable}),
        ],
    )
    await db.commit()
