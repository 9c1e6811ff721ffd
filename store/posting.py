"""Posting a user message, as a pipeline that reads top to bottom (`post_user_message`):

1. **Lock** the session row (every write that assigns a seq or changes the active turn does,
   so seqs are dense and there is at most one active turn).
2. **Idempotency**: the same `client_message_id` again is answered with its original turn.
3. **Admission**: first what the request itself gets wrong (a stale view, a file that is not
   the user's), which costs nothing; then the user's access and the limits, which count it.
4. **Classification**: what the message is, from the session's state, without writing:
   a new turn, an answer to a waiting specialist, a typed yes/no on a pending card, or the
   session's next turn, queued behind the running one (store/queue.py).
5. **The write** that kind of message makes, each a function of its own.

Nothing here commits (see `store`): the API commits the message and its turn in this one
transaction before it starts the workflow, because the turn row is the outbox that start
relies on. Callers get typed rows (`PostedMessage`), never ORM objects to change.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from parley.config import Limits
from parley.consent import typed_decision
from parley.contracts import InteractionAnswer, MessageStatus, ResolveActionSignal, TurnState
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
from parley.store import actions, interactions, queue
from parley.store import files as files_store
from parley.store import limits as limits_store
from parley.store.db import session_conn
from parley.store.events import append_events, state_event
from parley.store.identity import Identity
from parley.store.messages import take_seq
from parley.store.models import (
    ChatSession,
    Message,
    QueuedMessage,
    Turn,
)
from parley.store.sessions import SessionRow, get_turn, lock_session, lock_session_row
from parley.store.turns import birth
from parley.wire import MessageView

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PostedTurn:
    """The turn a post opened, joined or queued, as the API needs it."""

    id: str
    session_id: str
    tenant_id: str
    user_id: str
    state: TurnState


@dataclass(frozen=True)
class PostedMessage:
    turn: PostedTurn
    message: MessageView
    created: bool  # False when this was a duplicate POST of an earlier message
    # The API starts this turn's workflow after commit: a new turn, or a repeat of a post
    # whose turn was never started (its API died after the commit).
    start: bool = False
    # Signals the API sends after commit: a waiting turn's action was resolved by this post.
    signals: tuple[tuple[str, ResolveActionSignal], ...] = ()
    # Answers (their outbox rows) the API delivers after commit to a specialist waiting in
    # `awaiting_input`; the worker's sweep delivers any it does not.
    answers: tuple[interactions.AnswerRow, ...] = ()
    # A new turn's place in its session (the workflow's summary), read under the session lock.
    turn_number: int | None = None


@dataclass(frozen=True)
class Post:
    """What the request asks, once admitted: the message and the session it goes to."""

    session: SessionRow  # locked by this transaction (`_locked` for its ORM row)
    owner: Identity
    client_message_id: str
    text: str
    attached: list[str]  # file ids, checked as the user's uploads to this session
    interaction_value: str | None


# What a message is (`_classify`): exactly one of these.
@dataclass(frozen=True)
class NewTurn:
    """A message that opens a turn; a card it leaves unanswered is superseded."""

    superseded: actions.ActionRow | None = None


@dataclass(frozen=True)
class AnswerToSpecialist:
    turn: Turn  # resting in `awaiting_input`
    answer: InteractionAnswer


@dataclass(frozen=True)
class DecisionOnCard:
    turn: Turn  # resting in `awaiting_confirmation`
    action: actions.ActionRow
    decision: Decision


@dataclass(frozen=True)
class NextTurn:
    """Posted while the session's turn runs: queued as the session's next turn."""


Kind = NewTurn | AnswerToSpecialist | DecisionOnCard | NextTurn


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
    """Store a user message and what it starts or answers, in the caller's transaction."""
    session = await lock_session_row(db, owner=owner, session_id=session_id)
    earlier, turns_before = await _earlier_post(db, owner, session_id, client_message_id, text)
    if earlier is not None:
        return earlier
    attached = await _validate(db, owner, session, expected_last_seq, file_ids)
    await _admit(db, owner=owner, limits=limits, locked=True)
    post = Post(session, owner, client_message_id, text, attached, interaction_value)
    match await _classify(db, post):
        case AnswerToSpecialist() as kind:
            return await _answer_specialist(db, post, kind)
        case DecisionOnCard() as kind:
            return await _decide_card(db, post, kind)
        case NextTurn():
            return await _queue_next_turn(db, post)
        case NewTurn() as kind:
            return await _open_new_turn(db, post, kind, number=turns_before + 1)


async def _validate(
    db: AsyncSession,
    owner: Identity,
    session: SessionRow,
    expected_last_seq: int | None,
    file_ids: Sequence[str],
) -> list[str]:
    """What the request itself gets wrong, refused before the limits count it: a post that
    fails validation costs nothing, and is told what is wrong even at a limit. Returns the
    attached file ids."""
    _may_use_assistant(owner)
    if expected_last_seq is not None and expected_last_seq != session.last_seq:
        raise StaleView("the session has newer messages", last_seq=session.last_seq)
    return await files_store.check_owned(db, owner=owner, session_id=session.id, file_ids=file_ids)


async def _classify(db: AsyncSession, post: Post) -> Kind:
    """What the message is, from the session's state; reads only. A message that would open a
    turn while one is queued is refused (`TurnInProgress`): at most one waits per session,
    and it goes first."""
    session = post.session
    if session.active_turn_id is None:
        return NewTurn()
    answered = await interactions.answer_for_waiting_turn(
        db, active_turn_id=session.active_turn_id, text=post.text, value=post.interaction_value
    )
    if answered is not None:
        return AnswerToSpecialist(*answered)
    # Read, not locked: the session lock already orders every change of the active turn,
    # and activities lock turn then session (taking both here would invert that order).
    active = await db.get(Turn, session.active_turn_id)
    assert active is not None
    action = await actions.pending_action(db, session_id=session.id)
    if active.state == TurnState.awaiting_confirmation and (
        action is not None and action.turn_id == active.id
    ):
        decision = typed_decision(post.text)
        if decision and action.expires_at > datetime.now(UTC):
            return DecisionOnCard(active, action, decision)
        if session.queued_turn_id is None:
            return NewTurn(superseded=action)  # the user moved on: the card is declined
    # Running (or its card was just answered and it is about to resume), or resting with a
    # message already queued behind it, which must run first.
    if session.queued_turn_id is not None:
        raise TurnInProgress(
            "a turn is still running in this session and another message waits",
            active_turn_id=active.id,
        )
    return NextTurn()


async def _answer_specialist(
    db: AsyncSession, post: Post, kind: AnswerToSpecialist
) -> PostedMessage:
    """The message joins the waiting turn as the specialist's answer: an outbox row delivered
    after commit (store/interactions.py)."""
    message = await _join_turn(db, post, kind.turn.id)
    row = await interactions.record_answer(db, turn_id=kind.turn.id, answer=kind.answer)
    return PostedMessage(_posted_turn(kind.turn), message, True, answers=(row,))


async def _decide_card(db: AsyncSession, post: Post, kind: DecisionOnCard) -> PostedMessage:
    """A plain typed yes/no resolves the pending card; the message joins its turn, which the
    API signals after commit. No new turn."""
    await actions.resolve_action(
        db,
        action_id=kind.action.id,
        session_id=post.session.id,
        owner=post.owner,
        decision=kind.decision,
    )
    message = await _join_turn(db, post, kind.turn.id, attached=post.attached)
    signal = ResolveActionSignal(kind.action.id, kind.decision)
    return PostedMessage(_posted_turn(kind.turn), message, True, signals=((kind.turn.id, signal),))


async def _queue_next_turn(db: AsyncSession, post: Post) -> PostedMessage:
    """The session's next turn, `queued`: started when the running one ends."""
    queued = await queue.queue_message(
        db,
        session=await _locked(db, post),
        owner=post.owner,
        client_message_id=post.client_message_id,
        text=post.text,
        file_ids=post.attached,
    )
    return PostedMessage(_posted_turn(queued.turn), queued.message, True)


async def _open_new_turn(
    db: AsyncSession, post: Post, kind: NewTurn, *, number: int
) -> PostedMessage:
    """The message and its new turn (born in `received`, the start outbox); a card the user
    moved on from is declined first, and its turn told so after commit."""
    signals: tuple[tuple[str, ResolveActionSignal], ...] = ()
    if kind.superseded is not None:
        await _supersede(db, kind.superseded)
        signals = (
            (kind.superseded.turn_id, ResolveActionSignal(kind.superseded.id, Decision.superseded)),
        )
    owner = post.owner
    message, turn_id = await birth.insert_message_and_turn(
        db,
        session_id=post.session.id,
        last_seq=post.session.last_seq,
        owner=owner,
        client_message_id=post.client_message_id,
        text=post.text,
        attached=post.attached,
    )
    turn = PostedTurn(turn_id, post.session.id, owner.tenant_id, owner.user_id, TurnState.received)
    return PostedMessage(turn, message, True, start=True, signals=signals, turn_number=number)


async def _earlier_post(
    db: AsyncSession, owner: Identity, session_id: str, client_message_id: str, text: str
) -> tuple[PostedMessage | None, int]:
    """The same message posted before (answered with its original turn), if it was, and how
    many turns the session has: one read, taken after the session's lock. The same statement
    takes the user's admission lock (`limits.turns_lock`, always after the session's, as
    before), which `_admit` would otherwise take in a round trip of its own; a repeated post
    holds it briefly for nothing. A message still queued is found among the queued ones."""
    params = {
        "session_id": session_id,
        "client_message_id": client_message_id,
        "lock_key": limits_store.turns_lock(owner),
    }
    conn = await session_conn(db)
    read = await conn.made(_EARLIER_AND_TURNS, params, _earlier)
    assert read is not None  # a select list without FROM: always one row
    found, waiting, turns_before = read
    if found is None and waiting is None:
        return None, int(turns_before)
    if found is not None:
        earlier = await db.get(Message, found)
        assert earlier is not None
        said, view = earlier.text, MessageView.from_row(earlier)
        turn = await db.get(Turn, earlier.turn_id)
    else:
        row = await db.get(QueuedMessage, waiting)
        assert row is not None
        said, view = row.text, queue.queued_view(row)
        turn = await db.get(Turn, row.turn_id)
    if said != text:
        raise IdempotencyKeyReused("this client_message_id was already used with a different text")
    assert turn is not None
    # A turn its API committed but never started is started now; a queued one waits.
    start = turn.workflow_started_at is None and turn.state == TurnState.received
    posted = PostedMessage(_posted_turn(turn), view, created=False, start=start)
    return posted, int(turns_before)


def _earlier(
    *, locked: Any, found: str | None, waiting: str | None, turns_before: int
) -> tuple[str | None, str | None, int]:
    return found, waiting, turns_before


# Plain SQL on the session's own connection (see store/identity.py `_IDENTITY`): every post
# runs it. The lock is the first column, so it is held before the reads beside it.
_EARLIER_AND_TURNS = """
    SELECT pg_advisory_xact_lock(hashtext(%(lock_key)s)) AS locked,
        (SELECT id FROM messages
            WHERE session_id = %(session_id)s AND client_message_id = %(client_message_id)s
        ) AS found,
        (SELECT turn_id FROM queued_messages
            WHERE session_id = %(session_id)s AND client_message_id = %(client_message_id)s
        ) AS waiting,
        (SELECT count(*) FROM turns WHERE session_id = %(session_id)s) AS turns_before
"""


async def _join_turn(
    db: AsyncSession, post: Post, turn_id: str, *, attached: Sequence[str] = ()
) -> MessageView:
    """The user's message, with the session's next seq, as part of a turn already open."""
    session = await _locked(db, post)
    message = Message(
        id=new_id("msg"),
        session_id=session.id,
        seq=take_seq(session),
        role="user",
        turn_id=turn_id,
        status=MessageStatus.complete,
        text=post.text,
        client_message_id=post.client_message_id,
        file_ids=list(attached) or None,
    )
    db.add(message)
    await db.flush()
    await db.refresh(message)
    return MessageView.from_row(message)


async def _locked(db: AsyncSession, post: Post) -> ChatSession:
    """The post's session as the ORM row, for the writers that move its counters through it
    (the row is locked by this transaction already: `lock_session_row`)."""
    session = await db.get(ChatSession, post.session.id)
    assert session is not None
    return session


def _posted_turn(turn: Turn) -> PostedTurn:
    return PostedTurn(turn.id, turn.session_id, turn.tenant_id, turn.user_id, TurnState(turn.state))


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
    # The append moves the counter in SQL; the turn object's copy is stale, and unchanged.
    await append_events(db, turn_id=turn.id, events=[state_event(TurnState.received)])
    return turn


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


async def _supersede(db: AsyncSession, action: actions.ActionRow) -> None:
    updated = await actions.set_action_status(
        db,
        action_id=action.id,
        status=ActionStatus.declined,
        only_from=(ActionStatus.pending,),
        decline_reason=DeclineReason.superseded,
    )
    if updated is not None:
        await actions.announce_resolution(db, action=updated)


async def retry_turn(
    db: AsyncSession,
    *,
    owner: Identity,
    session_id: str,
    turn_id: str,
    limits: Limits | None = None,
) -> PostedMessage:
    """Open a new turn for the same user message; its answer will replace the failed one.
    The old turn stays as it ended: a finished turn never moves again. The API starts the
    new turn after commit."""
    session = await lock_session(db, owner=owner, session_id=session_id)
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
    if asked is None:  # the user forgot it (store/lifecycle/forget.py): nothing to answer again
        raise TurnNotRetryable("the message this turn answered was forgotten", state=old.state)
    turn = await open_turn(db, session=session, owner=owner, message=asked, retry_of=old.id)
    return PostedMessage(_posted_turn(turn), MessageView.from_row(asked), True, start=True)
