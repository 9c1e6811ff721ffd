"""Posting a user message, as a pipeline that reads top to bottom (`post_user_message`):

1. **Lock** the session row (every write that assigns a seq or changes the active turn does,
   so seqs are dense and there is at most one active turn), sent together with the reads
   the lock orders: one round trip.
2. **Idempotency**: the same `client_message_id` again is answered with its original turn.
3. **Admission**: first what the request itself gets wrong (a stale view, a file that is not
   the user's), which costs nothing; then the user's access and the limits, which count it
   (the windowed counts ride with the kind's write: a new turn's in the same round trip).
4. **Classification**: what the message is, from the session's state, without writing:
   a message to the person of an open hand-off, or one asking for a person, which opens a
   case (store/handoffs.py, handoff_openers.py: no turn, no model asked), a new turn, an
   answer to a waiting specialist, a typed yes/no on a pending card, a steer
   (store/steering.py) or the session's next turn, queued behind the running one.
5. **The write** that kind of message makes, each a function of its own.

Nothing here commits (see `store`): the API commits the message and its turn in this one
transaction, whose ring a worker hears at the commit and starts the turn by, because the turn
row is the outbox that start relies on. Callers get typed rows (`PostedMessage`), never ORM
objects to change.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from parley.config import Limits
from parley.consent import typed_decision
from parley.contracts import InteractionAnswer, ResolveActionSignal, TurnState
from parley.errors import (
    FeatureNotEnabled,
    IdempotencyKeyReused,
    StaleView,
    TurnInProgress,
)
from parley.features import ASSISTANT
from parley.handoff_rules import HandoffRules, asks_for_person
from parley.ids import new_id
from parley.live import SessionEventType
from parley.statuses import Decision
from parley.store import actions, handoff_openers, handoffs, interactions, locks, queue, steering
from parley.store import files as files_store
from parley.store import limits as limits_store
from parley.store import sessions as store_sessions
from parley.store.db import Db, Sent
from parley.store.events import OUTBOX_CHANNEL, OutboxRing, ring
from parley.store.identity import Identity
from parley.store.live import COUNTED, announce_params, joined_row, joining
from parley.store.messages import (
    MESSAGE,
    MessageRow,
    message_params,
    seq_taken,
)
from parley.store.sessions import SessionRow
from parley.store.turns import birth
from parley.store.turns.reads import PostedTurn, TurnFacts, turn_facts
from parley.tenancy import TenantConfig
from parley.wire import MessageView

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PostedMessage:
    turn: PostedTurn | None  # None: the message went to the person of a hand-off
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
    # The message joined the running turn as a steer: the API tells its workflow after commit.
    steered: bool = False
    handoff_id: str | None = None  # the open hand-off the message went to
    # The case this message opened (it asked for a person): the API starts its workflow.
    opened: handoffs.HandoffRow | None = None


@dataclass(frozen=True)
class Post:
    """What the request asks, once admitted: the message and the session it goes to."""

    session: SessionRow  # locked by this transaction
    owner: Identity
    client_message_id: str
    text: str
    attached: list[str]  # file ids, checked as the user's uploads to this session
    interaction_value: str | None
    steer: bool = False  # `"mode": "steer"`: joins the running turn rather than queued


# What a message is (`_classify`): exactly one of these.
@dataclass(frozen=True)
class NewTurn:
    """A message that opens a turn; a card it leaves unanswered is superseded."""

    superseded: actions.ActionRow | None = None


@dataclass(frozen=True)
class AnswerToSpecialist:
    turn: TurnFacts  # resting in `awaiting_input`
    answer: InteractionAnswer


@dataclass(frozen=True)
class DecisionOnCard:
    turn: TurnFacts  # resting in `awaiting_confirmation`
    action: actions.ActionRow
    decision: Decision


@dataclass(frozen=True)
class NextTurn:
    """Posted while the session's turn runs: queued as the session's next turn."""


@dataclass(frozen=True)
class SteerTurn:
    """Posted with `"mode": "steer"` while the session's turn runs: joins it (steering.py)."""

    turn: TurnFacts


@dataclass(frozen=True)
class ToPerson:
    """Posted while a hand-off is open: the message goes to the support team's person."""

    case: handoffs.HandoffRow


@dataclass(frozen=True)
class AsksForPerson:
    """Asks for a person while no turn runs: a case opens with it, no turn (handoff_rules)."""

    rules: HandoffRules


Kind = (
    ToPerson | AsksForPerson | NewTurn | AnswerToSpecialist | DecisionOnCard | NextTurn | SteerTurn
)


async def post_user_message(
    db: Db,
    *,
    owner: Identity,
    session_id: str,
    client_message_id: str,
    text: str,
    expected_last_seq: int | None,
    limits: Limits | None = None,
    file_ids: Sequence[str] = (),
    interaction_value: str | None = None,
    steer: bool = False,
    start_on: OutboxRing | None = None,
) -> PostedMessage:
    """Store a user message and what it starts or answers, in the caller's transaction.
    A new turn's post is three round trips: the session's lock with the reads it orders, then
    the counts with the write (store/limits.py `take_all_then`), then the caller's commit.
    `start_on`: the outbox's ring for a turn to start (its turn id filled in here), heard by
    the workers at commit (dispatch/outbox.py); None: the caller starts it (`start`). Its
    task queue is also recorded with a queued message, for the ring of its promotion."""
    limits = limits or Limits()
    async with db.together():  # the lock first: the reads behind it run once it is held
        locking = await store_sessions.send_lock(db, owner=owner, session_id=session_id)
        earlier_read = await _send_earlier(db, owner, session_id, client_message_id)
        running = await limits_store.send_running(db, owner=owner, limits=limits)
    session = await store_sessions.owned(locking)
    earlier, before, held = await _earlier_post(
        db, owner, session_id, client_message_id, text, earlier_read
    )
    if earlier is not None:
        if earlier.start and earlier.turn is not None and start_on is not None:
            # Committed by a post whose ring nobody acted on: rung again.
            again = replace(start_on, turn_id=earlier.turn.id)
            await ring(db, channel=OUTBOX_CHANNEL, payload=again.payload())
        return earlier
    attached = await _validate(db, owner, session, expected_last_seq, file_ids)
    # The tenant's switch and the running turns; the windowed counts come with the write.
    admitted = await limits_store.admission(running, owner, limits)
    post = Post(session, owner, client_message_id, text, attached, interaction_value, steer)
    kind = await _classify(db, post, held, admitted.config.handoffs())
    if isinstance(kind, NewTurn):
        return await _open_new_turn(
            db, post, kind, number=before + 1, takes=admitted.takes, start_on=start_on
        )
    await limits_store.take_all(db, admitted.takes)
    match kind:
        case ToPerson(case=case):  # for the case's person: no turn, and no model is asked
            message = await handoffs.from_customer(db, case=case, text=text, key=client_message_id)
            return PostedMessage(None, message, True, handoff_id=case.id)
        case AsksForPerson(rules=rules):  # the customer's words open a case: no model asked
            return await _open_case(db, post, rules)
        case AnswerToSpecialist():
            return await _answer_specialist(db, post, kind)
        case DecisionOnCard():
            return await _decide_card(db, post, kind)
        case NextTurn():
            return await _queue_next_turn(db, post, start_on)
        case SteerTurn():
            return await _steer_turn(db, post, kind)


async def _validate(
    db: Db,
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


async def _classify(db: Db, post: Post, held: bool, rules: HandoffRules) -> Kind:
    """What the message is, from the session's state (`held`: a hand-off is open) and the
    tenant's hand-off rules; reads only. A message that would open a turn while one is queued
    is refused (`TurnInProgress`): at most one waits per session, and it goes first."""
    session = post.session
    case = await handoffs.open_case(db, session_id=session.id) if held else None
    if case is not None:  # read under the session's lock: it cannot end meanwhile
        return ToPerson(case)
    if session.active_turn_id is None:
        if not post.attached and asks_for_person(post.text, rules.phrases()):
            return AsksForPerson(rules)
        return NewTurn()
    # Read, not locked: the session lock already orders every change of the active turn,
    # and activities lock turn then session (taking both here would invert that order).
    active = await turn_facts(db, turn_id=session.active_turn_id)
    assert active is not None
    answer = await interactions.answer_for_waiting_turn(
        db, active=active, text=post.text, value=post.interaction_value
    )
    if answer is not None:
        return AnswerToSpecialist(active, answer)
    action = await actions.pending_action(db, session_id=session.id)
    resting = active.state == TurnState.awaiting_confirmation
    card = action if resting and action is not None and action.turn_id == active.id else None
    if card is not None and (decision := typed_decision(post.text)):
        if card.expires_at > datetime.now(UTC):
            return DecisionOnCard(active, card, decision)
    if post.steer and not post.attached and (card or active.state in steering.STEERABLE):
        return SteerTurn(active)  # a card waiting stays: the turn answers, then waits on
    if card is not None and session.queued_turn_id is None:
        return NewTurn(superseded=card)  # the user moved on: the card is superseded
    # Running (or its card was just answered and it is about to resume), or resting with a
    # message already queued behind it, which must run first.
    if session.queued_turn_id is not None:
        raise TurnInProgress(
            "a turn is still running in this session and another message waits",
            active_turn_id=active.id,
        )
    return NextTurn()


async def _open_case(db: Db, post: Post, rules: HandoffRules) -> PostedMessage:
    """The customer asked for a person: the case opens with their message and the notice a
    model-opened case gives; the API starts its workflow after commit (`opened`)."""
    key, text = post.client_message_id, post.text
    opened = await handoff_openers.open_asked(
        db, session_id=post.session.id, text=text, client_message_id=key, rules=rules
    )
    assert opened is not None and opened.asked is not None  # locked, and no case held it
    return PostedMessage(None, opened.asked, True, handoff_id=opened.case.id, opened=opened.case)


async def _answer_specialist(db: Db, post: Post, kind: AnswerToSpecialist) -> PostedMessage:
    """The message joins the waiting turn as the specialist's answer: an outbox row delivered
    after commit (store/interactions.py)."""
    message = await _join_turn(db, post, kind.turn.id)
    row = await interactions.record_answer(db, turn_id=kind.turn.id, answer=kind.answer)
    return PostedMessage(_posted_turn(kind.turn), message, True, answers=(row,))


async def _decide_card(db: Db, post: Post, kind: DecisionOnCard) -> PostedMessage:
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


async def _steer_turn(db: Db, post: Post, kind: SteerTurn) -> PostedMessage:
    """The message joins the running turn and rings the steer's doorbell; no new turn."""
    joined = (post.session.id, kind.turn.id, post.client_message_id, post.text)
    message = MessageView.from_row(await steering.join_as_steer(db, *joined))
    return PostedMessage(_posted_turn(kind.turn), message, True, steered=True)


async def _queue_next_turn(db: Db, post: Post, start_on: OutboxRing | None) -> PostedMessage:
    """The session's next turn, `queued`: started when the running one ends."""
    queued = await queue.queue_message(
        db,
        session=post.session,
        owner=post.owner,
        client_message_id=post.client_message_id,
        text=post.text,
        file_ids=post.attached,
        posted_on=start_on,
    )
    return PostedMessage(_posted_turn(queued.turn), queued.message, True)


async def _open_new_turn(
    db: Db,
    post: Post,
    kind: NewTurn,
    *,
    number: int,
    takes: Sequence[limits_store.Take],
    start_on: OutboxRing | None,
) -> PostedMessage:
    """The message and its new turn (born in `received`, the start outbox), written in the
    round trip that counts the post; a card the user moved on from is superseded first, and
    its turn told so after commit."""
    signals: tuple[tuple[str, ResolveActionSignal], ...] = ()
    if kind.superseded is not None:
        await actions.supersede(db, action=kind.superseded)
        signals = (
            (kind.superseded.turn_id, ResolveActionSignal(kind.superseded.id, Decision.superseded)),
        )
    owner = post.owner

    async def write() -> birth.Born:
        return await birth.send_message_and_turn(
            db,
            session_id=post.session.id,
            last_seq=post.session.last_seq,
            owner=owner,
            client_message_id=post.client_message_id,
            text=post.text,
            attached=post.attached,
            start_on=start_on,
        )

    born = await limits_store.take_all_then(db, takes, write)
    message, turn_id = await born.made()
    turn = PostedTurn(turn_id, post.session.id, owner.tenant_id, owner.user_id, TurnState.received)
    return PostedMessage(turn, message, True, start=True, signals=signals, turn_number=number)


async def _send_earlier(
    db: Db, owner: Identity, session_id: str, client_message_id: str
) -> Sent[tuple[str | None, str | None, int, bool]]:
    """Send (or queue behind the session's lock, `Db.together`) the read `_earlier_post`
    decides on."""
    params = {
        "session_id": session_id,
        "client_message_id": client_message_id,
        "lock_key": locks.user_turns(owner),
    }
    return await db.send_made(_EARLIER_AND_TURNS, params, _earlier)


async def _earlier_post(
    db: Db,
    owner: Identity,
    session_id: str,
    client_message_id: str,
    text: str,
    sent: Sent[tuple[str | None, str | None, int, bool]] | None = None,
) -> tuple[PostedMessage | None, int, bool]:
    """The same message posted before (answered with its original turn), if it was, and how
    many turns the session has: one read, taken after the session's lock. The same statement
    takes the user's admission lock (`locks.user_turns`, always after the session's, as
    before), which `_admit` would otherwise take in a round trip of its own; a repeated post
    holds it briefly for nothing. A message still queued is found among the queued ones. The
    same read says whether a hand-off holds the session (store/handoffs.py). `sent`: the read
    as the caller sent it already (`_send_earlier`); None: sent here."""
    if sent is None:
        sent = await _send_earlier(db, owner, session_id, client_message_id)
    read = await sent.row()
    assert read is not None  # a select list without FROM: always one row
    found, waiting, turns_before, held = read
    if found is None and waiting is None:
        return None, int(turns_before), held
    turn_id: str | None
    if found is not None:
        earlier = await db.row(MESSAGE, {"id": found}, MessageRow)
        assert earlier is not None
        view, turn_id = MessageView.from_row(earlier), earlier.turn_id
    else:
        waiting_view = await queue.queued_message(db, queued_turn_id=waiting)
        assert waiting_view is not None and waiting is not None
        view, turn_id = waiting_view, waiting
    if view.text != text:
        raise IdempotencyKeyReused("this client_message_id was already used with a different text")
    if turn_id is None:  # it went to the person of a hand-off
        return PostedMessage(None, view, created=False), int(turns_before), held
    turn = await db.row(_EARLIER_TURN, {"id": turn_id}, _EarlierTurn)
    assert turn is not None
    # A turn its API committed but never started is started now; a queued one waits.
    start = turn.workflow_started_at is None and turn.state == TurnState.received
    posted = PostedMessage(_posted_turn(turn), view, created=False, start=start)
    return posted, int(turns_before), held


@dataclass(frozen=True)
class _EarlierTurn:
    id: str
    session_id: str
    tenant_id: str
    user_id: str
    state: str
    workflow_started_at: datetime | None


_EARLIER_TURN = """
    SELECT id, session_id, tenant_id, user_id, state, workflow_started_at FROM turns
    WHERE id = %(id)s
"""


def _earlier(
    *, locked: Any, found: str | None, waiting: str | None, turns_before: int, held: bool
) -> tuple[str | None, str | None, int, bool]:
    return found, waiting, turns_before, held


# Plain SQL on the session's own connection (see store/identity.py `_IDENTITY`): every post
# runs it. The lock is the first column, so it is held before the reads beside it.
_EARLIER_AND_TURNS = f"""
    SELECT {locks.TAKE} AS locked,
        (SELECT id FROM messages
            WHERE session_id = %(session_id)s AND client_message_id = %(client_message_id)s
        ) AS found,
        (SELECT turn_id FROM queued_messages
            WHERE session_id = %(session_id)s AND client_message_id = %(client_message_id)s
        ) AS waiting,
        (SELECT count(*) FROM turns WHERE session_id = %(session_id)s) AS turns_before,
        {handoffs.HELD}
"""


async def _join_turn(
    db: Db, post: Post, turn_id: str, *, attached: Sequence[str] = ()
) -> MessageView:
    """The user's message, with the session's next seq, as part of a turn already open: one
    statement (the session's row is locked by this transaction already)."""
    params = {
        "session_id": post.session.id,
        **message_params(
            message_id=new_id("msg"),
            turn_id=turn_id,
            role="user",
            text=post.text,
            client_message_id=post.client_message_id,
            file_ids=list(attached) or None,
        ),
    }
    params |= announce_params(SessionEventType.message, message_id=params["message_id"])
    message = await db.made(_JOIN_TURN, params, joined_row)
    assert message is not None
    return MessageView.from_row(message)


_JOIN_TURN = joining(seq_taken(session="%(session_id)s", message="%(message_id)s", sets=COUNTED))


def _posted_turn(turn: TurnFacts | _EarlierTurn | PostedTurn) -> PostedTurn:
    return PostedTurn(turn.id, turn.session_id, turn.tenant_id, turn.user_id, TurnState(turn.state))


def _may_use_assistant(owner: Identity) -> None:
    """The user's own access, first of all: it is on the identity already, no query."""
    if ASSISTANT not in owner.features:
        raise FeatureNotEnabled("the assistant is not enabled for this user", feature=ASSISTANT)


async def _admit(
    db: Db, *, owner: Identity, limits: Limits | None, locked: bool = False
) -> TenantConfig:
    """Before anything that leads to model work, once the request is known to be valid: the
    tenant's switch (paused fails closed), then the limits (`store.limits`), cheapest first.
    `locked`: the transaction holds the user's admission lock already. The tenant's config."""
    return await limits_store.admit_turn(db, owner=owner, limits=limits or Limits(), locked=locked)
