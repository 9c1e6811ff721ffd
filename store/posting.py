"""Posting a user message: admission, the turn it opens (the start outbox), and retries.

Ordering rule: the session row is locked (`SELECT … FOR UPDATE`) by every write that assigns
a seq or changes the active turn, so seqs are dense and there is at most one active turn.
Nothing here commits (see `store`): the API commits the message and its turn before it starts
the workflow, because the turn row is the outbox that start relies on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Select, Table, Text, bindparam, func, insert, select, true, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import make_transient_to_detached
from sqlalchemy.orm.attributes import set_committed_value

from parley.config import Limits
from parley.consent import typed_decision
from parley.contracts import MessageStatus, ResolveActionSignal, TurnState
from parley.errors import (
    FeatureNotEnabled,
    IdempotencyKeyReused,
    StaleView,
    TurnInProgress,
    TurnNotRetryable,
)
from parley.features import ASSISTANT
from parley.ids import new_id
from parley.statuses import ActionStatus, Decision, DeclineReason
from store import actions, interactions
from store import files as files_store
from store import limits as limits_store
from store.events import NOTIFY_CHANNEL, append_events, opening_event, state_event
from store.identity import Identity
from store.models import Action, ChatSession, Message, SpecialistAnswer, Turn, TurnEvent
from store.models.core import count_tokens
from store.sessions import get_session, get_turn

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PostedMessage:
    turn: Turn
    message: Message
    created: bool  # False when this was a duplicate POST of an earlier message
    # True when `turn` is a new turn whose workflow must be started.
    new_turn: bool = False
    # Signals the API sends after commit: a waiting turn's action was resolved by this post.
    signals: tuple[tuple[str, ResolveActionSignal], ...] = ()
    # Answers (their outbox rows) the API delivers after commit to a specialist waiting in
    # `awaiting_input`; the worker's sweep delivers any it does not.
    answers: tuple[SpecialistAnswer, ...] = ()
    # A new turn's place in its session (the workflow's summary), read under the session lock.
    turn_number: int | None = None


async def post_user_message(
    db: AsyncSession,
    *,
    owner: Identity,
    session_id: str,
    client_message_id: str,
    text: str,
    expected_last_seq: int | None,
    limits: Limits | None = None,
    file_ids: Sequence[str] = (),
    interaction_value: str | None = None,
) -> PostedMessage:
    """Store a user message and its turn in the caller's transaction; `file_ids` (the user's
    uploads to this session, else 404) are kept on the message for its prompt. A turn resting
    on a specialist's question takes the message as the answer; on a confirmation, a plain
    typed yes/no resolves the pending action (the message joins that turn), anything else
    supersedes it and starts a new turn.
    """
    session = await get_session(db, owner=owner, session_id=session_id, for_update=True)
    earlier, turns_before = await _earlier_post(db, owner, session_id, client_message_id, text)
    if earlier is not None:
        return earlier

    _may_use_assistant(owner)
    # What the request itself gets wrong is refused before the limits count it: a post that
    # fails validation costs nothing, and is told what is wrong even at a limit.
    if expected_last_seq is not None and expected_last_seq != session.last_seq:
        raise StaleView("the session has newer messages", last_seq=session.last_seq)
    attached = await files_store.check_owned(
        db, owner=owner, session_id=session_id, file_ids=file_ids
    )
    await _admit(db, owner=owner, limits=limits, locked=True)

    if answered := await _answering(db, session, client_message_id, text, interaction_value):
        return answered
    signals: list[tuple[str, ResolveActionSignal]] = []
    if session.active_turn_id is not None:
        active, action = await _waiting_turn(db, session)
        decision = typed_decision(text)
        if decision and action.expires_at > datetime.now(UTC):
            # The message answers the waiting turn; no new turn.
            await actions.resolve_action(
                db, action_id=action.id, session_id=session_id, owner=owner, decision=decision
            )
            message = _user_message(session, active.id, client_message_id, text)
            message.file_ids = attached or None
            db.add(message)
            await db.flush()
            await db.refresh(message)
            signal = ResolveActionSignal(action.id, decision)
            return PostedMessage(active, message, True, signals=((active.id, signal),))
        await _supersede(db, action)
        signals.append((active.id, ResolveActionSignal(action.id, Decision.superseded)))

    message, turn = await _insert_message_and_turn(
        db, session=session, owner=owner, message=(client_message_id, text, attached)
    )
    return PostedMessage(
        turn, message, True, new_turn=True, signals=tuple(signals), turn_number=turns_before + 1
    )


async def _earlier_post(
    db: AsyncSession, owner: Identity, session_id: str, client_message_id: str, text: str
) -> tuple[PostedMessage | None, int]:
    """The same message posted before (answered with its original turn), if it was, and how
    many turns the session has: one read, taken after the session's lock. The same statement
    takes the user's admission lock (`limits.turns_lock`, always after the session's, as
    before), which `_admit` would otherwise take in a round trip of its own; a repeated post
    holds it briefly for nothing."""
    params = {
        "session_id": session_id,
        "client_message_id": client_message_id,
        "lock_key": limits_store.turns_lock(owner),
    }
    _, found, turns_before = (await db.execute(_EARLIER_AND_TURNS, params)).one()
    if found is None:
        return None, int(turns_before)
    earlier = await db.get(Message, found)
    assert earlier is not None
    if earlier.text != text:
        raise IdempotencyKeyReused("this client_message_id was already used with a different text")
    turn = await db.get(Turn, earlier.turn_id)
    assert turn is not None
    return PostedMessage(turn=turn, message=earlier, created=False), int(turns_before)


# Built once: every post runs it (see store/identity.py `_IDENTITY`).
_EARLIER_AND_TURNS = select(
    func.pg_advisory_xact_lock(func.hashtext(bindparam("lock_key", type_=Text))),
    select(Message.id)
    .where(
        Message.session_id == bindparam("session_id"),
        Message.client_message_id == bindparam("client_message_id"),
    )
    .scalar_subquery(),
    select(func.count()).where(Turn.session_id == bindparam("session_id")).scalar_subquery(),
)


async def _answering(
    db: AsyncSession, session: ChatSession, client_message_id: str, text: str, value: str | None
) -> PostedMessage | None:
    """A specialist waits for the user: the message joins its turn as the answer, an outbox
    row delivered after commit (store/interactions.py). None when no specialist waits."""
    answered = await interactions.answer_for_waiting_turn(
        db, session=session, text=text, value=value
    )
    if answered is None:
        return None
    waiting, answer = answered
    message = _user_message(session, waiting.id, client_message_id, text)
    db.add(message)
    await db.flush()
    await db.refresh(message)
    row = await interactions.record_answer(db, turn_id=waiting.id, answer=answer)
    return PostedMessage(waiting, message, True, answers=(row,))


async def _waiting_turn(db: AsyncSession, session: ChatSession) -> tuple[Turn, Action]:
    """The session's active turn and its pending action, if the turn rests awaiting that
    confirmation; otherwise the turn is running and a new message must wait."""
    # Read, not locked: the session lock already orders every change of the active turn,
    # and activities lock turn then session (taking both here would invert that order).
    assert session.active_turn_id is not None
    active = await db.get(Turn, session.active_turn_id)
    assert active is not None
    action = await actions.pending_action(db, session_id=session.id)
    if active.state != TurnState.awaiting_confirmation or (
        action is None or action.turn_id != active.id
    ):
        # Running, or its action was just answered and it is about to resume.
        raise TurnInProgress("a turn is still running in this session", active_turn_id=active.id)
    return active, action


async def open_turn(
    db: AsyncSession,
    *,
    session: ChatSession,
    owner: Identity,
    message: Message,
    turn_id: str | None = None,
    retry_of: str | None = None,
) -> Turn:
    """Create the session's active turn for a user message: the row is the outbox the
    workflow start relies on, and its first event is `received`. A turn is born here in
    `received`; every later state goes through `store.turns.move_turn`."""
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
    await db.flush()  # the rows' server defaults come back with their INSERTs (eager defaults)
    ids = await append_events(db, turn_id=turn.id, events=[state_event(TurnState.received)])
    # The append moved the counter in SQL (and `updated_at` to the same transaction time).
    set_committed_value(turn, "last_event_id", ids[-1])
    return turn


async def _insert_message_and_turn(
    db: AsyncSession,
    *,
    session: ChatSession,
    owner: Identity,
    message: tuple[str, str, Sequence[str]],  # client_message_id, text, attached file ids
) -> tuple[Message, Turn]:
    """The user message, its new turn (born in `received`, the start outbox) and the session's
    next seq and active turn, written in one statement; the rows join the ORM session as
    loaded, as if a flush had written them. The turn's first event follows, as in `open_turn`.
    """
    client_message_id, text, attached = message
    turn_id, seq = new_id("trn"), session.last_seq + 1
    row = Message(
        id=new_id("msg"),
        session_id=session.id,
        seq=seq,
        role="user",
        turn_id=turn_id,
        status=MessageStatus.complete,
        text=text,
        client_message_id=client_message_id,
        file_ids=list(attached) or None,
        **dict.fromkeys(("tool_calls", "tool_call_id", "replaced_by")),
    )
    count_tokens(row)
    turn = Turn(
        id=turn_id,
        session_id=session.id,
        tenant_id=owner.tenant_id,
        user_id=owner.user_id,
        user_message_id=row.id,
        user_seq=seq,
        state=TurnState.received,
        last_event_id=1,  # its `received` event is written with it
        viewers=0,
        **dict.fromkeys(_TURN_UNSET),
    )
    stamps = (await db.execute(_WRITE, _write_params(row, turn))).one()
    set_committed_value(row, "created_at", stamps.message_created_at)
    set_committed_value(turn, "created_at", stamps.turn_created_at)
    set_committed_value(turn, "updated_at", stamps.turn_updated_at)
    for loaded in (row, turn):
        make_transient_to_detached(loaded)
        db.add(loaded)
    set_committed_value(session, "last_seq", seq)  # written above, not a pending change
    set_committed_value(session, "active_turn_id", turn_id)
    return row, turn


def _write_statement() -> Select[Any]:
    """Insert the message, the turn and its first event (`received`, rung on the doorbell as
    `append_events` would) and move the session on, returning the rows' stamps. Built once,
    with a parameter per written column (`m_<column>`, `t_<column>`): a statement built per
    post is compiled, or looked up by a cache key computed afresh, per post."""
    messages, turns, sessions, events = (
        cast(Table, m.__table__) for m in (Message, Turn, ChatSession, TurnEvent)
    )
    new_message = (
        insert(messages)
        .values({c: bindparam(f"m_{c}", type_=messages.c[c].type) for c in _MESSAGE_WRITTEN})
        .returning(messages.c.created_at)
        .cte("new_message")
    )
    new_turn = (
        insert(turns)
        .values({c: bindparam(f"t_{c}", type_=turns.c[c].type) for c in _TURN_WRITTEN})
        .returning(turns.c.created_at, turns.c.updated_at)
        .cte("new_turn")
    )
    first_event = (
        insert(events)
        .values(
            turn_id=bindparam("t_id"),
            id=1,
            type=bindparam("e_type", type_=events.c.type.type),
            data=bindparam("e_data", type_=events.c.data.type),
        )
        .returning(events.c.id)
        .cte("first_event")
    )
    moved = (
        update(sessions)
        .where(sessions.c.id == bindparam("s_id", type_=sessions.c.id.type))
        .values(
            last_seq=bindparam("s_last_seq", type_=sessions.c.last_seq.type),
            active_turn_id=bindparam("s_active_turn_id", type_=sessions.c.active_turn_id.type),
        )
        .returning(sessions.c.id)
        .cte("moved_session")
    )
    return select(
        new_message.c.created_at.label("message_created_at"),
        new_turn.c.created_at.label("turn_created_at"),
        new_turn.c.updated_at.label("turn_updated_at"),
        moved.c.id.label("session_id"),
        func.pg_notify(NOTIFY_CHANNEL, bindparam("e_notify", type_=Text)).label("rung"),
    ).select_from(  # one row each
        new_message.join(new_turn, true()).join(first_event, true()).join(moved, true())
    )


def _write_params(message: Message, turn: Turn) -> dict[str, Any]:
    params = {f"m_{c}": getattr(message, c) for c in _MESSAGE_WRITTEN}
    params |= {f"t_{c}": getattr(turn, c) for c in _TURN_WRITTEN}
    type_, data = state_event(TurnState.received)
    wire, notify = opening_event(turn.id, type_, data)
    params |= {"e_type": type_.value, "e_data": wire, "e_notify": notify}
    return params | {
        "s_id": turn.session_id,
        "s_last_seq": message.seq,
        "s_active_turn_id": turn.id,
    }


_MESSAGE_WRITTEN = (
    "id", "session_id", "seq", "role", "turn_id", "status", "text", "client_message_id",
    "file_ids", "token_count", "token_counter",
)  # fmt: skip
_TURN_UNSET = (
    "assistant_message_id", "workflow_started_at", "cancel_requested_at", "error",
    "resolution", "retry_of", "detached_at",
)  # fmt: skip
_TURN_WRITTEN = (
    "id", "session_id", "tenant_id", "user_id", "user_message_id", "user_seq", "state",
    "last_event_id", "viewers",
)  # fmt: skip
_STAMPS = ("created_at", "updated_at")
_WRITE = _write_statement()


def _may_use_assistant(owner: Identity) -> None:
    """The user's own access, first of all: it is on the identity already, no query."""
    if ASSISTANT not in owner.features:
        raise FeatureNotEnabled("the assistant is not enabled for this user", feature=ASSISTANT)


async def _admit(
    db: AsyncSession, *, owner: Identity, limits: Limits | None, locked: bool = False
) -> None:
    """Before anything that leads to model work, once the request is known to be valid: the
    tenant's switch (paused fails closed), then the limits (`store.limits`), cheapest first.
    `locked`: the transaction holds the user's admission lock already."""
    await limits_store.admit_turn(db, owner=owner, limits=limits or Limits(), locked=locked)


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
        db,
        action_id=action.id,
        status=ActionStatus.declined,
        only_from=(ActionStatus.pending,),
    )
    if updated is not None:
        updated.decline_reason = DeclineReason.superseded
        updated.resolved_at = datetime.now(UTC)
        await db.flush()
        await actions.announce_resolution(db, action=updated)


async def retry_turn(
    db: AsyncSession,
    *,
    owner: Identity,
    session_id: str,
    turn_id: str,
    limits: Limits | None = None,
) -> Turn:
    """Open a new turn for the same user message; its answer will replace the failed one.
    The old turn stays as it ended: a finished turn never moves again."""
    session = await get_session(db, owner=owner, session_id=session_id, for_update=True)
    old = await get_turn(db, owner=owner, session_id=session_id, turn_id=turn_id)
    _may_use_assistant(owner)
    answer = await db.get(Message, old.assistant_message_id) if old.assistant_message_id else None
    retryable = old.state in (TurnState.failed, TurnState.cancelled) and (
        answer is None or answer.status in (MessageStatus.incomplete, MessageStatus.cancelled)
    )
    # One retry per turn: a retry that failed in turn is retried itself, never the original.
    retried = await db.scalar(select(Turn.id).where(Turn.retry_of == old.id).limit(1))
    if not retryable or retried is not None:
        raise TurnNotRetryable("only a failed or cancelled answer can be retried", state=old.state)
    if session.active_turn_id is not None:
        raise TurnInProgress(
            "a turn is still running in this session", active_turn_id=session.active_turn_id
        )
    await _admit(db, owner=owner, limits=limits)  # only a retry that can run is counted
    asked = await db.get(Message, old.user_message_id)
    if asked is None:  # the user forgot it (store/forget.py): nothing to answer again
        raise TurnNotRetryable("the message this turn answered was forgotten", state=old.state)
    return await open_turn(db, session=session, owner=owner, message=asked, retry_of=old.id)
