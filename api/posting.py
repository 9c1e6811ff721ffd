"""What a user sends, shared by the routes that take it: a message (its turn started, or
queued, steered, or handed to a person) and an answer to a card. `POST .../messages` and
`POST .../actions/{id}/confirm|decline` answer with these; the AI SDK chat
(api/routes/ai_sdk.py) takes the same paths and streams the turn they lead to."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import BackgroundTasks

from parley.api.delivery import deliver_answers, deliver_decisions, deliver_steer, start_case
from parley.api.delivery import start_turn as _start
from parley.api.deps import TemporalConnector
from parley.api.faults import kill_at
from parley.api.metrics import MESSAGES_POSTED
from parley.api.schemas import ActionOut, PostMessageIn, TurnStarted
from parley.config import Settings
from parley.contracts import ResolveActionSignal, SteerInput
from parley.dispatch.telemetry import name_post, post_trace
from parley.errors import ActionExpired, ActionResolved, AgentPaused, InvalidRequest
from parley.statuses import Decision
from parley.store import actions, tenants
from parley.store import posting as store_posting
from parley.store import sessions as store_sessions
from parley.store.db import Database, Db
from parley.store.events import OutboxRing
from parley.store.identity import Identity
from parley.wire import ActionView


@dataclass(frozen=True)
class Posted:
    started: TurnStarted
    created: bool  # False: the same `client_message_id` again, answered with its turn


async def post(
    session_id: str,
    body: PostMessageIn,
    db: Db,
    one_statement: Database,
    user: Identity,
    temporal: TemporalConnector,
    settings: Settings,
    background: BackgroundTasks,
) -> Posted:
    """Store the user's message and start (or queue, or steer with) its turn; commits."""
    if len(body.text) > settings.max_message_chars:
        raise InvalidRequest(f"text: at most {settings.max_message_chars} characters", field="text")
    trace = post_trace(settings)  # the turn's trace, joined by the worker that starts it
    posted = await store_posting.post_user_message(
        db,
        owner=user,
        session_id=session_id,
        client_message_id=body.client_message_id,
        text=body.text,
        expected_last_seq=body.expected_last_seq,
        limits=settings.limits,
        file_ids=body.file_ids,
        interaction_value=body.interaction_value,
        steer=body.mode == "steer",
        # A new turn rings the workers' outbox from its write; one of them starts it at once
        # (dispatch/outbox.py). An API that runs a worker of its own starts it itself.
        start_on=None if settings.api_worker else _ring(settings, trace),
    )
    turn = posted.turn
    await db.commit()  # the message and its turn (the start outbox) before any start
    MESSAGES_POSTED.labels("new" if posted.created else "duplicate").inc()
    if turn is None:  # a person of the support team holds the session: no turn, no model
        if posted.opened is not None:  # the customer asked for one: the case's run starts
            await start_case(temporal, one_statement, settings, posted.opened)
        held = TurnStarted(
            turn_id=None,
            state=None,
            message=posted.message,
            events_url=None,
            handoff_id=posted.handoff_id,
        )
        return Posted(held, posted.created)
    if posted.answers:
        kill_at(settings, "answer_committed")  # a test's crash between commit and delivery
    await deliver_decisions(temporal, one_statement, posted.signals)
    await deliver_answers(temporal, one_statement, posted.answers)
    if posted.steered:
        # After the response: the running step hears the store's doorbell, not this Update,
        # which a turn streaming in one workflow task takes only at its next task.
        steer = SteerInput(posted.message.id, posted.message.seq)
        background.add_task(deliver_steer, temporal, turn.id, steer)
    name_post(settings, turn_id=turn.id, session_id=turn.session_id, tenant_id=turn.tenant_id)
    if posted.start and settings.api_worker:
        # Its place in the session (the workflow's summary); a duplicate's start looks it up.
        await _start(temporal, one_statement, settings, turn, background, posted.turn_number)
    started = TurnStarted.build(
        session_id=session_id, turn_id=turn.id, state=turn.state, message=posted.message
    )
    return Posted(started.model_copy(update={"steered": posted.steered}), posted.created)


def _ring(settings: Settings, trace: str) -> OutboxRing:
    """The ring of a new turn (its id filled in by its write), with what the API starts a
    turn with: its task queue, the card's window, whether a fallback model is configured."""
    return OutboxRing(
        "",
        settings.task_queue,
        settings.confirmation_timeout_s,
        settings.has_fallback_model,
        trace,
    )


async def answer_card(
    session_id: str,
    action_id: str,
    decision: Decision,
    db: Db,
    user: Identity,
    temporal: TemporalConnector,
    one_statement: Database,
) -> ActionOut:
    """The user's answer to a card, bound to the action, its session and its user; recorded,
    committed, then delivered to the turn waiting for it."""
    await store_sessions.get_session(db, owner=user, session_id=session_id)
    if await tenants.is_paused(db, tenant_id=user.tenant_id):
        # Fails closed: nothing is decided, the action stays pending for after the resume.
        raise AgentPaused("the assistant is paused for this tenant")
    try:
        action = await actions.resolve_action(
            db, action_id=action_id, session_id=session_id, owner=user, decision=decision
        )
    except ActionExpired:
        await db.commit()  # the action is stored expired, whatever the answer
        raise
    except ActionResolved:
        # The same answer again: its first delivery may have been lost, so deliver it again
        # (the turn takes a decision once) before answering 409.
        answered = await actions.get_action(db, action_id=action_id)
        if answered is not None and answered.status == decision:
            again = ((answered.turn_id, ResolveActionSignal(action_id, decision)),)
            await db.rollback()
            renewal = answered.renewed_from is not None
            await deliver_decisions(temporal, one_statement, again, renewal=renewal)
        raise
    await db.commit()
    decided = ((action.turn_id, ResolveActionSignal(action.id, decision)),)
    renewal = action.renewed_from is not None
    await deliver_decisions(temporal, one_statement, decided, renewal=renewal)
    return ActionOut(action=ActionView.from_row(action))
