"""Sessions, messages and turns: the repository functions behind the session API.

Ordering rule: the session row is locked (`SELECT … FOR UPDATE`) by every write that assigns
a seq or changes the active turn, so seqs are dense and there is at most one active turn.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import case, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from parley.consent import typed_decision
from parley.contracts import (
    TERMINAL_TURN_STATES,
    EventType,
    MessageStatus,
    ResolveActionSignal,
    TurnState,
)
from parley.errors import (
    AgentPaused,
    IdempotencyKeyReused,
    NotFound,
    RateLimited,
    StaleView,
    TurnInProgress,
    TurnNotRetryable,
)
from parley.ids import new_id
from parley.tenancy import TenantConfig
from store import actions
from store.events import append_event, append_events
from store.identity import Identity
from store.models import Action, ChatSession, Message, Tenant, ToolCall, Turn, TurnEvent

log = logging.getLogger(__name__)

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
        .where(
            Message.session_id == session_id,
            Message.seq > after_seq,
            Message.replaced_by.is_(None),
        )
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
    # True when `turn` is a new turn whose workflow must be started.
    new_turn: bool = False
    # Signals the API sends after commit: a waiting turn's action was resolved by this post.
    signals: tuple[tuple[str, ResolveActionSignal], ...] = ()


async def post_user_message(
    db: AsyncSession,
    *,
    owner: Identity,
    session_id: str,
    client_message_id: str,
    text: str,
    expected_last_seq: int | None,
) -> PostedMessage:
    """Store a user message and its turn in one transaction (the turn row is the outbox).

    If the session's turn rests awaiting a confirmation, a plain typed yes/no resolves the
    pending action (the message joins that turn); anything else supersedes the action and
    starts a new turn.
    """
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
        turn = await db.get(Turn, earlier.turn_id)
        assert turn is not None
        await db.commit()  # nothing written; ends the transaction without expiring objects
        return PostedMessage(turn=turn, message=earlier, created=False)

    await _admit(db, tenant_id=owner.tenant_id)
    if expected_last_seq is not None and expected_last_seq != session.last_seq:
        last_seq = session.last_seq
        await db.rollback()
        raise StaleView("the session has newer messages", last_seq=last_seq)

    signals: list[tuple[str, ResolveActionSignal]] = []
    if session.active_turn_id is not None:
        # Read, not locked: the session lock already orders every change of the active turn,
        # and activities lock turn then session (taking both here would invert that order).
        active = await db.get(Turn, session.active_turn_id)
        assert active is not None
        action = await actions.pending_action(db, session_id=session_id)
        if active.state != TurnState.awaiting_confirmation or (
            action is None or action.turn_id != active.id
        ):
            # Running, or its action was just answered and it is about to resume.
            active_id = active.id
            await db.rollback()
            raise TurnInProgress(
                "a turn is still running in this session", active_turn_id=active_id
            )
        decision = typed_decision(text)
        if action is not None and decision and action.expires_at > datetime.now(UTC):
            # The message answers the waiting turn; no new turn.
            await actions.resolve_action(
                db, action_id=action.id, session_id=session_id, owner=owner, decision=decision
            )
            message = _user_message(session, active.id, client_message_id, text)
            db.add(message)
            await db.commit()
            await db.refresh(message)
            signal = ResolveActionSignal(action.id, decision)
            return PostedMessage(active, message, True, signals=((active.id, signal),))
        if action is not None:
            await _supersede(db, action)
            signals.append((active.id, ResolveActionSignal(action.id, "superseded")))
        session.active_turn_id = None

    turn_id = new_id("trn")
    message = _user_message(session, turn_id, client_message_id, text)
    db.add(message)
    turn = await _open_turn(db, session, owner, message, turn_id=turn_id)
    await db.refresh(message)
    return PostedMessage(turn, message, True, new_turn=True, signals=tuple(signals))


async def _open_turn(
    db: AsyncSession,
    session: ChatSession,
    owner: Identity,
    message: Message,
    *,
    turn_id: str | None = None,
    retry_of: str | None = None,
) -> Turn:
    """Create the session's active turn for a user message and commit it: the row is the
    outbox the workflow start relies on, and its first event is `received`."""
    turn = Turn(
        id=turn_id or new_id("trn"),
        session_id=session.id,
        tenant_id=owner.tenant_id,
        user_id=owner.user_id,
        user_message_id=message.id,
        user_seq=message.seq,
        state=TurnState.received,
        retry_of=retry_of,
    )
    db.add(turn)
    session.active_turn_id = turn.id
    await db.flush()
    await append_event(db, turn_id=turn.id, type=EventType.state, data={"state": turn.state})
    await db.commit()
    await db.refresh(turn)
    return turn


async def _admit(db: AsyncSession, *, tenant_id: str) -> None:
    """The tenant's switches: paused fails closed, the daily cap answers 429."""
    tenant = await db.get(Tenant, tenant_id)
    if tenant is not None and tenant.paused:
        await db.rollback()
        raise AgentPaused("the assistant is paused for this tenant")
    if tenant is not None and await _over_daily_cap(db, tenant):
        await db.rollback()
        raise RateLimited(
            "the tenant's daily message cap is reached",
            retry_after_s=_seconds_to_midnight(),
            code="daily_cap_reached",
        )


async def _over_daily_cap(db: AsyncSession, tenant: Tenant) -> bool:
    """The cap fails open: if counting fails, the message goes through (and is logged)."""
    cap = TenantConfig.model_validate(tenant.config or {}).daily_cap
    if cap is None:
        return False
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    try:
        async with db.begin_nested():
            today = await db.scalar(
                select(func.count())
                .select_from(Message)
                .join(ChatSession, ChatSession.id == Message.session_id)
                .where(
                    ChatSession.tenant_id == tenant.id,
                    Message.role == "user",
                    Message.created_at >= midnight,
                )
            )
    except Exception:
        log.warning("could not count today's messages for %s; letting it through", tenant.id)
        return False
    return int(today or 0) >= int(cap)


def _seconds_to_midnight() -> int:
    now = datetime.now(UTC)
    midnight = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return max(1, int((midnight - now).total_seconds()))


def _user_message(session: ChatSession, turn_id: str, client_message_id: str, text: str) -> Message:
    session.last_seq += 1
    return Message(
        id=new_id("msg"),
        session_id=session.id,
        seq=session.last_seq,
        role="user",
        turn_id=turn_id,
        status=MessageStatus.complete,
        text=text,
        client_message_id=client_message_id,
    )


async def _supersede(db: AsyncSession, action: Action) -> None:
    updated = await actions.set_action_status(
        db, action_id=action.id, status="declined", only_from=("pending",)
    )
    if updated is not None:
        updated.decline_reason = "superseded"
        updated.resolved_at = datetime.now(UTC)
        await db.flush()
        await append_event(
            db,
            turn_id=updated.turn_id,
            type=EventType.confirmation_resolved,
            data={"action": actions.action_view(updated)},
        )


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
        .values(workflow_started_at=datetime.now(UTC))
    )
    await db.commit()


async def unstarted_turns(
    db: AsyncSession, *, older_than: timedelta, limit: int = 50
) -> list[Turn]:
    """Turns committed by the API whose workflow start was never confirmed."""
    cutoff = datetime.now(UTC) - older_than
    rows = await db.scalars(
        select(Turn)
        .where(Turn.workflow_started_at.is_(None), Turn.created_at < cutoff)
        .order_by(Turn.created_at)
        .limit(limit)
    )
    return list(rows)


# --- turn progress (called by activities) ------------------------------------------------


def message_id_for_call(model_call_id: str) -> str:
    """The assistant message a model call produces; known before its first token streams."""
    return "msg_" + model_call_id.removeprefix("mc_")


def tool_call_row_id(model_call_id: str, provider_call_id: str) -> str:
    return f"{model_call_id}:{provider_call_id}"[:80]


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


async def _append_message(
    db: AsyncSession,
    *,
    turn: Turn,
    message_id: str,
    role: str,
    text: str,
    tool_calls: list[dict[str, Any]] | None = None,
    tool_call_id: str | None = None,
) -> Message:
    """Give a message the session's next seq, unless it is already stored (retries)."""
    existing = await db.get(Message, message_id)
    if existing is not None:
        return existing
    session = await db.get(ChatSession, turn.session_id, with_for_update=True)
    assert session is not None
    session.last_seq += 1
    message = Message(
        id=message_id,
        session_id=session.id,
        seq=session.last_seq,
        role=role,
        turn_id=turn.id,
        status=MessageStatus.complete,
        text=text,
        tool_calls=tool_calls,
        tool_call_id=tool_call_id,
    )
    db.add(message)
    await db.flush()
    await db.refresh(message)
    return message


async def store_tool_requests(
    db: AsyncSession,
    *,
    turn_id: str,
    model_call_id: str,
    text: str,
    tool_calls: list[dict[str, Any]],
    hashes: list[str],
) -> None:
    """Store the model's tool-calling message and one `tool_calls` row per call."""
    turn = await db.get(Turn, turn_id, with_for_update=True)
    assert turn is not None
    await _append_message(
        db,
        turn=turn,
        message_id=message_id_for_call(model_call_id),
        role="assistant",
        text=text,
        tool_calls=tool_calls,
    )
    for call, digest in zip(tool_calls, hashes, strict=True):
        row_id = tool_call_row_id(model_call_id, call["id"])
        if await db.get(ToolCall, row_id) is None:
            db.add(
                ToolCall(
                    id=row_id,
                    turn_id=turn_id,
                    model_call_id=model_call_id,
                    provider_call_id=call["id"],
                    name=call["name"],
                    arguments=call["arguments"],
                    args_hash=digest,
                    status="pending",
                )
            )
    await db.commit()


async def store_tool_result(
    db: AsyncSession, *, call: ToolCall, status: str, result: dict[str, Any]
) -> None:
    """Record a tool call's outcome and append it to the transcript as a `tool` message."""
    turn = await db.get(Turn, call.turn_id, with_for_update=True)
    assert turn is not None
    call.status = status
    call.result = result
    call.completed_at = datetime.now(UTC)
    digest = hashlib.sha256(call.id.encode()).hexdigest()[:20]
    await _append_message(
        db,
        turn=turn,
        message_id=f"msg_t{digest}",
        role="tool",
        text=json.dumps({"name": call.name, "result": result}, sort_keys=True),
        tool_call_id=call.provider_call_id,
    )


async def rest_awaiting_confirmation(
    db: AsyncSession, *, turn_id: str, model_call_id: str, text: str, action: Action
) -> None:
    """Store the model's proposal text, then show the confirmation card and wait."""
    turn = await db.get(Turn, turn_id, with_for_update=True)
    assert turn is not None
    if turn.state == TurnState.awaiting_confirmation:
        await db.commit()
        return
    message = await _append_message(
        db, turn=turn, message_id=message_id_for_call(model_call_id), role="assistant", text=text
    )
    turn.state = TurnState.awaiting_confirmation
    turn.assistant_message_id = message.id
    await append_events(
        db,
        turn_id=turn_id,
        events=[
            (EventType.state, {"state": TurnState.awaiting_confirmation}),
            (EventType.confirmation_required, {"action": actions.action_view(action)}),
        ],
    )
    await db.commit()


async def complete_turn(
    db: AsyncSession,
    *,
    turn_id: str,
    model_call_id: str,
    text: str,
    outcome: str = "completed",
    retracted: bool = False,
) -> Message | None:
    """Store the final assistant message, end the stream with `done`, release the session.

    `outcome` "expired" ends in state expired; "superseded" stores nothing new (the user
    moved on) and closes the stream with the turn's last message. Idempotent under retries.
    """
    turn = await db.get(Turn, turn_id, with_for_update=True)
    if turn is None:
        raise LookupError(turn_id)
    if turn.state in (TurnState.cancelled, TurnState.failed):
        # Ended by a cancel that raced the answer; the answer must not reappear.
        existing = await db.get(Message, turn.assistant_message_id or "")
        await db.commit()
        return existing
    if outcome == "superseded":
        assert turn.assistant_message_id is not None
        message = await db.get(Message, turn.assistant_message_id)
    else:
        message = await _append_message(
            db,
            turn=turn,
            message_id=message_id_for_call(model_call_id),
            role="assistant",
            text=text,
        )
        if retracted:
            # Only the safe text is kept; the withdrawn answer is not stored anywhere visible.
            message.text, message.status = text, MessageStatus.retracted
            await db.flush()
    assert message is not None
    if turn.state in TERMINAL_TURN_STATES:
        await db.commit()
        return message
    session = await db.get(ChatSession, turn.session_id, with_for_update=True)
    assert session is not None
    if session.active_turn_id == turn_id:
        session.active_turn_id = None
    final_state = TurnState.expired if outcome == "expired" else TurnState.completed
    turn.state = final_state
    turn.assistant_message_id = message.id
    await replace_retried_answer(db, turn=turn, message_id=message.id)
    # A proposal the turn never got to ask about (it hit its bounds) must not stay pending.
    await db.execute(
        update(Action)
        .where(Action.turn_id == turn_id, Action.status == "pending")
        .values(status="declined", decline_reason="turn_ended", resolved_at=datetime.now(UTC))
    )
    events: list[tuple[str, dict[str, Any]]] = []
    if retracted:
        events.append(
            (EventType.retracted, {"message_id": message.id, "replacement_text": message.text})
        )
    events += [
        (EventType.state, {"state": final_state}),
        (EventType.done, {"message": message_payload(message)}),
    ]
    await append_events(db, turn_id=turn_id, events=events)
    await db.commit()
    return message


async def streamed_so_far(db: AsyncSession, *, turn_id: str) -> tuple[str | None, str]:
    """The message the user last saw streaming in this turn and its text, exactly as a client
    applying deltas and resets in order shows it. The event log is the record of that."""
    rows = await db.execute(
        select(TurnEvent.type, TurnEvent.data)
        .where(TurnEvent.turn_id == turn_id, TurnEvent.type.in_(["delta", "reset"]))
        .order_by(TurnEvent.id)
    )
    message_id: str | None = None
    text = ""
    for type_, data in rows:
        if type_ == EventType.delta:
            if data["message_id"] != message_id:
                message_id, text = data["message_id"], ""
            text += data["text"]
        elif data["message_id"] == message_id:
            text = ""
    return message_id, text


async def end_unfinished_turn(
    db: AsyncSession,
    *,
    turn_id: str,
    state: TurnState,
    error: dict[str, Any] | None = None,
) -> Message | None:
    """End a turn that did not finish: `cancelled` (by the user or abandoned) or `failed`.

    What had streamed is kept, marked `cancelled` or `incomplete`, so a retry can replace it.
    A cancelled turn always ends with a message (the `cancelled` event carries one); a failed
    turn that showed nothing ends with the `error` event alone. Idempotent.
    """
    turn = await db.get(Turn, turn_id, with_for_update=True)
    if turn is None:
        raise LookupError(turn_id)
    if turn.state in TERMINAL_TURN_STATES:
        await db.commit()
        return None
    # Tool calls the turn never got to answer get a result now: a transcript with a call and
    # no result is refused by real providers, and would break every later turn.
    open_calls = await db.scalars(
        select(ToolCall)
        .where(ToolCall.turn_id == turn_id, ToolCall.status == "pending")
        .order_by(ToolCall.created_at)
    )
    for open_call in list(open_calls):
        await store_tool_result(
            db,
            call=open_call,
            status="error",
            result={
                "error": {
                    "code": state.value,
                    "message": f"the turn was {state.value} before this ran",
                    "retryable": True,
                }
            },
        )
    message_id, text = await streamed_so_far(db, turn_id=turn_id)
    status = MessageStatus.cancelled if state == TurnState.cancelled else MessageStatus.incomplete
    message: Message | None = None
    if text or state == TurnState.cancelled:
        candidate = message_id or f"msg_{turn_id.removeprefix('trn_')}x"
        if await db.get(Message, candidate) is not None:
            candidate += "x"  # that id already holds a stored step (a tool-calling message)
        message = await _append_message(
            db, turn=turn, message_id=candidate, role="assistant", text=text
        )
        message.status = status
        turn.assistant_message_id = message.id
    pending = await db.scalar(
        select(Action).where(Action.turn_id == turn_id, Action.status == "pending")
    )
    if pending is not None:
        pending.status, pending.decline_reason = "declined", state.value
        pending.resolved_at = datetime.now(UTC)
    session = await db.get(ChatSession, turn.session_id, with_for_update=True)
    assert session is not None
    if session.active_turn_id == turn_id:
        session.active_turn_id = None
    turn.state = state
    turn.error = error
    await db.flush()
    events: list[tuple[str, dict[str, Any]]] = [(EventType.state, {"state": state})]
    if state == TurnState.cancelled:
        assert message is not None
        events.append((EventType.cancelled, {"message": message_payload(message)}))
    else:
        events.append((EventType.error, dict(error or {})))
    await append_events(db, turn_id=turn_id, events=events)
    await db.commit()
    return message


async def fail_turn(
    db: AsyncSession, *, turn_id: str, code: str, message: str, retryable: bool
) -> None:
    """Mark the turn failed, keep what streamed as `incomplete`, end with `error`."""
    await end_unfinished_turn(
        db,
        turn_id=turn_id,
        state=TurnState.failed,
        error={"code": code, "message": message, "retryable": retryable},
    )


async def retry_turn(db: AsyncSession, *, owner: Identity, session_id: str, turn_id: str) -> Turn:
    """Start a new turn for the same user message; its answer will replace the failed one."""
    session = await get_session(db, owner=owner, session_id=session_id, for_update=True)
    old = await get_turn(db, owner=owner, session_id=session_id, turn_id=turn_id)
    await _admit(db, tenant_id=owner.tenant_id)
    answer = await db.get(Message, old.assistant_message_id) if old.assistant_message_id else None
    retryable = old.state in (TurnState.failed, TurnState.cancelled) and (
        answer is None or answer.status in (MessageStatus.incomplete, MessageStatus.cancelled)
    )
    # One retry per turn: a retry that failed in turn is retried itself, never the original.
    retried = await db.scalar(select(Turn.id).where(Turn.retry_of == old.id).limit(1))
    if not retryable or retried is not None:
        state = old.state
        await db.rollback()
        raise TurnNotRetryable("only a failed or cancelled answer can be retried", state=state)
    if session.active_turn_id is not None:
        active = session.active_turn_id
        await db.rollback()
        raise TurnInProgress("a turn is still running in this session", active_turn_id=active)
    asked = await db.get(Message, old.user_message_id)
    assert asked is not None
    return await _open_turn(db, session, owner, asked, retry_of=old.id)


async def replace_retried_answer(db: AsyncSession, *, turn: Turn, message_id: str) -> None:
    """Within complete_turn: the retried turn's unfinished answer gives way to the new one."""
    if turn.retry_of is None:
        return
    old = await db.get(Turn, turn.retry_of)
    if old is not None and old.assistant_message_id is not None:
        previous = await db.get(Message, old.assistant_message_id)
        if previous is not None and previous.replaced_by is None:
            previous.replaced_by = message_id


# --- who is watching (for cancelling abandoned turns) ---------------------------------------


async def attach_viewer(db: AsyncSession, *, turn_id: str) -> None:
    await db.execute(
        update(Turn).where(Turn.id == turn_id).values(viewers=Turn.viewers + 1, detached_at=None)
    )
    await db.commit()


async def detach_viewer(db: AsyncSession, *, turn_id: str) -> None:
    await db.execute(
        update(Turn)
        .where(Turn.id == turn_id)
        .values(
            viewers=func.greatest(Turn.viewers - 1, 0),
            detached_at=case((Turn.viewers <= 1, func.now()), else_=None),
        )
    )
    await db.commit()


async def abandoned(db: AsyncSession, *, turn_id: str, grace: timedelta) -> bool:
    """Nobody has watched this running turn for `grace`. A turn resting for a confirmation is
    not running, so it is never abandoned."""
    turn = await db.get(Turn, turn_id, populate_existing=True)
    await db.commit()
    if turn is None or turn.viewers > 0 or turn.detached_at is None:
        return False
    if turn.state in TERMINAL_TURN_STATES or turn.state == TurnState.awaiting_confirmation:
        return False
    return turn.detached_at <= datetime.now(UTC) - grace + timedelta(milliseconds=50)
