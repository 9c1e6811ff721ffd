"""What the API hands to Temporal after its transaction commits, shared by the routes: a user's
decision on a confirmation (to the turn waiting for it, or its specialist: dispatch/control.py),
the start of a renewed card's wait (dispatch/approvals.py), an answer to a specialist's
question (dispatch/specialists.py), the start of a turn
(dispatch/outbox.py) and the start of an erasure (dispatch/erasure.py). Each is stored
first, so one that fails here is not lost: the worker's sweeps deliver the decision and the
answer and start the turn and the erasure."""

from __future__ import annotations

import asyncio
import logging

from fastapi import BackgroundTasks

# The count of cases opened, by what opened them: the worker's counter (the model's call, a
# policy), counted here for the cases a customer's words open.
from parley.activities.metrics import HANDOFFS_OPENED
from parley.api.deps import Sessions, TemporalConnector
from parley.api.metrics import TURN_START_FAILURES
from parley.config import Settings
from parley.contracts import ResolveActionSignal, SteerInput, TurnInput
from parley.dispatch.approvals import start_renewal
from parley.dispatch.control import Delivery, deliver_and_record_decision, tell_steer
from parley.dispatch.erasure import start_erasure
from parley.dispatch.handoffs import start_case_run
from parley.dispatch.outbox import record_started, start_turn_workflow
from parley.dispatch.specialists import deliver_and_record
from parley.erasure import ErasureInput
from parley.store.actions import ActionRow
from parley.store.db import Database
from parley.store.handoffs import HandoffRow
from parley.store.interactions import AnswerRow
from parley.store.turns.reads import PostedTurn

log = logging.getLogger(__name__)

# How long a delivery waits for the Temporal client, and for an answer to be taken.
TIMEOUT_S = 5.0


async def deliver_decisions(
    temporal: TemporalConnector,
    sessions: Database,  # marking it delivered is one statement
    signals: tuple[tuple[str, ResolveActionSignal], ...],
    *,
    renewal: bool = False,
) -> None:
    """Deliver stored decisions to their waiting turns (or, for a `renewal`, to its own
    workflow), each retried for a few seconds until it is taken, and mark them delivered
    (dispatch/control.py); one this cannot deliver, the worker's outbox sweep will."""
    for turn_id, signal in signals:
        try:
            client = await asyncio.wait_for(temporal.get(), TIMEOUT_S)
            delivery = await deliver_and_record_decision(
                client,
                sessions,
                turn_id=turn_id,
                decision=signal,
                patience_s=TIMEOUT_S,
                renewal=renewal,
            )
        except Exception:
            log.warning("could not deliver a decision to turn %s now", turn_id, exc_info=True)
            continue
        if delivery in (Delivery.failed, Delivery.refused):
            log.warning(
                "decision on %s not delivered (%s); the outbox will",
                signal.action_id,
                delivery.value,
            )


async def deliver_answers(
    temporal: TemporalConnector,
    sessions: Database,  # marking it delivered is one statement
    answers: tuple[AnswerRow, ...],
) -> None:
    """Deliver committed answers to the specialists waiting for them and mark them delivered
    (dispatch/specialists.py); one this cannot deliver, the worker's outbox sweep will."""
    for row in answers:
        try:
            client = await asyncio.wait_for(temporal.get(), TIMEOUT_S)
            await asyncio.wait_for(deliver_and_record(client, sessions, row), TIMEOUT_S)
        except Exception:
            log.warning("could not deliver an answer to turn %s now", row.turn_id, exc_info=True)


async def deliver_steer(temporal: TemporalConnector, turn_id: str, steer: SteerInput) -> None:
    """Tell the running turn of a stored steer (dispatch/control.py). Best effort: the store's
    doorbell is what the turn takes it by, so a steer this cannot tell is still taken."""
    try:
        client = await asyncio.wait_for(temporal.get(), TIMEOUT_S)
        await tell_steer(client, turn_id=turn_id, steer=steer)
    except Exception:
        log.info("could not tell turn %s of its steer", turn_id, exc_info=True)


async def start_renewal_soon(
    temporal: TemporalConnector, sessions: Database, settings: Settings, action: ActionRow
) -> None:
    """Start the wait of a renewed card now if Temporal answers in time; otherwise the
    worker's sweep starts it (the renewal is committed)."""
    try:
        client = await asyncio.wait_for(temporal.get(), TIMEOUT_S)
        await asyncio.wait_for(
            start_renewal(client, sessions, action, task_queue=settings.task_queue), TIMEOUT_S
        )
    except Exception:
        log.warning("could not start renewal %s; the sweep will", action.id, exc_info=True)


async def start_erasure_soon(
    temporal: TemporalConnector, sessions: Sessions, settings: Settings, inp: ErasureInput
) -> None:
    """Start the erasure's workflow now if Temporal answers in time; otherwise the worker's
    sweep starts it (the row is committed)."""
    try:
        client = await asyncio.wait_for(temporal.get(), TIMEOUT_S)
        await asyncio.wait_for(
            start_erasure(client, sessions, inp, task_queue=settings.task_queue), TIMEOUT_S
        )
    except Exception:
        log.warning("could not start erasure %s; the sweep will", inp.erasure_id, exc_info=True)


async def start_turn(
    temporal: TemporalConnector,
    sessions: Database,  # marking it started is one statement
    settings: Settings,
    turn: PostedTurn,
    background: BackgroundTasks,
    turn_number: int | None = None,
) -> None:
    """Start the committed turn's workflow; its outbox row is marked started after the
    response has gone (`background`): the mark is a database round trip the client need not
    wait for, and nothing reads it sooner than the sweep's grace (dispatch/outbox.py)."""
    try:
        client = await asyncio.wait_for(temporal.get(), TIMEOUT_S)
        await asyncio.wait_for(
            start_turn_workflow(
                client,
                TurnInput(
                    turn_id=turn.id,
                    session_id=turn.session_id,
                    tenant_id=turn.tenant_id,
                    confirmation_timeout_s=settings.confirmation_timeout_s,
                    fallback=settings.has_fallback_model,
                ),
                task_queue=settings.task_queue,
                turn_number=turn_number,
                eager=settings.api_worker,  # this process's own worker takes the first task
            ),
            TIMEOUT_S,
        )
    except Exception:
        # The turn is committed; the worker's outbox sweep will start it.
        TURN_START_FAILURES.inc()
        log.warning("could not start turn %s now; the outbox will", turn.id, exc_info=True)
        return
    background.add_task(_record_started, sessions, turn.id)


async def start_case(
    temporal: TemporalConnector, sessions: Database, settings: Settings, case: HandoffRow
) -> None:
    """Start the workflow of a case the customer's words opened (store/posting.py), after its
    commit. Best effort: a case whose run does not start is still in the inbox, and an agent
    can claim, answer and end it, and the outbox sweep starts its run a few seconds later."""
    HANDOFFS_OPENED.labels(case.opened_by).inc()
    try:
        client = await asyncio.wait_for(temporal.get(), TIMEOUT_S)
        run = start_case_run(
            client,
            sessions,
            case,
            task_queue=settings.task_queue,
            default_timeout_s=settings.handoff_claim_timeout_s,
        )
        await asyncio.wait_for(run, TIMEOUT_S)
    except Exception:
        log.warning("could not start the run of hand-off %s", case.id, exc_info=True)


async def _record_started(sessions: Database, turn_id: str) -> None:
    try:
        await record_started(sessions, turn_id)
    except Exception:  # the sweep starts it again, which attaches to the running workflow
        log.warning("could not mark turn %s started", turn_id, exc_info=True)
