"""Talking to a running turn: the user's Stop, the user's answer to a confirmation, and a
steer.

Both are decisions stored first and delivered second, so the store stays the source of truth
and a delivery that fails costs time, never the decision:

- Stop: recorded on the turn row under its lock (a finished turn refuses: `TurnFinished`),
  then the workflow is cancelled. Every step refuses to start once the Stop is recorded, and
  every ending after it is `cancelled`, so a Stop that was accepted is never lost.
- Confirm / decline: the action's row is updated by the route, then the decision is sent as
  a Workflow Update, retried for a few seconds until the turn accepts it (its validator takes
  only the decision it is waiting for) or its specialist does, and the row is marked
  delivered (`decision_delivered_at`). The actions table is the decisions' outbox, as the
  turns table is the starts': a decision the API could not deliver (Temporal away, the API
  died after its commit) is delivered by the sweep in every worker (`sweep_decisions`,
  beside the start sweep in dispatch/outbox.py) once Temporal answers, so the turn goes on
  at once rather than when its wait runs out. Delivery is idempotent: the turn keeps the
  first decision it took. A decision that finds neither the turn nor its specialist waiting
  is read from the store when the turn's wait ends, and `send_email` reads the stored
  status, not the Update.
- Steer: the message and the session's doorbell are stored by the post (store/steering.py),
  which is how the turn's running step hears it; the Update (`tell_steer`) records it in the
  turn's history for operators. A turn that has ended refuses it, and nothing is lost.

A card renewed after it expired (workflows/renewal.py) is waited on by its renewal's own
workflow, not by its turn, which has ended: its decision goes there (`renewal=True`).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from enum import Enum

from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from parley.contracts import (
    RESOLVE_ACTION_UPDATE,
    STEER_UPDATE,
    ResolveActionSignal,
    SteerInput,
    TurnState,
)
from parley.dispatch.specialists import offer_decision
from parley.ids import renewal_workflow_id, workflow_id_for_turn
from parley.statuses import ActionStatus, Decision
from parley.store import actions, outbox, turns
from parley.store.db import Database, connect

log = logging.getLogger(__name__)

# How long a decision's delivery is retried before it is left to the turn's own wait.
DELIVERY_PATIENCE_S = 5.0
FIRST_RETRY_S = 0.05
MAX_RETRY_S = 0.4
# The sweep's patience per decision: long enough for a worker that has just reconnected to
# take it (a shorter wait sends it again on the next sweep: taken once, but recorded twice in
# the turn's history), short enough that a turn refusing it holds the others up little.
SWEEP_PATIENCE_S = 3.0


async def cancel_turn_workflow(client: Client, sessions: Database, *, turn_id: str) -> None:
    """Record the Stop, then cancel the turn's workflow. Raises `TurnFinished` (nothing
    recorded) when the turn has already ended: its ending stands.

    A turn whose workflow never started, or closed without ending the turn, is ended here,
    in the same transaction that marks it started, so the outbox never starts it later.
    """
    async with sessions() as db:
        await turns.request_cancel(db, turn_id=turn_id)
        await db.commit()
    handle = client.get_workflow_handle(workflow_id_for_turn(turn_id))
    try:
        await handle.cancel()
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            # The Stop is recorded: the turn's next step refuses to run and ends it.
            log.warning("could not cancel the workflow of turn %s", turn_id, exc_info=True)
            return
        async with sessions() as db:
            await outbox.end_unstarted_turn(db, turn_id=turn_id, state=TurnState.cancelled)
            await db.commit()


# How long a steer's Update waits: a turn streaming in one workflow task takes it at its
# next task, a few seconds on.
STEER_PATIENCE_S = 10.0


async def tell_steer(
    client: Client, *, turn_id: str, steer: SteerInput, patience_s: float = STEER_PATIENCE_S
) -> bool:
    """Deliver a stored steer to its turn as an Update; True once the turn took it, False
    when it refused (it has ended) or did not answer in time."""
    handle = client.get_workflow_handle(workflow_id_for_turn(turn_id))
    try:
        await asyncio.wait_for(handle.execute_update(STEER_UPDATE, steer), patience_s)
    except (WorkflowUpdateFailedError, RPCError, TimeoutError):
        log.info("turn %s did not take its steer", turn_id, exc_info=True)
        return False
    return True


class Delivery(Enum):
    """How one delivery of a decision went."""

    taken = "taken"  # by the turn, or by its specialist
    closed = "closed"  # the turn's workflow has closed: nobody is left to take it
    refused = "refused"  # neither the turn nor its specialist waits for it
    failed = "failed"  # Temporal did not answer in time


async def deliver_decision(
    client: Client,
    *,
    turn_id: str,
    decision: ResolveActionSignal,
    patience_s: float = DELIVERY_PATIENCE_S,
) -> bool:
    """Deliver a stored decision to the waiting turn, retrying until it is accepted; True
    once it is. False when the turn has closed or never accepted it within `patience_s`
    (the turn then reads the stored decision when its wait ends)."""
    delivery = await _deliver(client, turn_id=turn_id, decision=decision, patience_s=patience_s)
    return delivery is Delivery.taken


async def _deliver(
    client: Client,
    *,
    turn_id: str,
    decision: ResolveActionSignal,
    patience_s: float,
    renewal: bool = False,
) -> Delivery:
    waiting = (
        renewal_workflow_id(action_id=decision.action_id)
        if renewal
        else workflow_id_for_turn(turn_id)
    )
    handle = client.get_workflow_handle(waiting)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience_s
    delay = FIRST_RETRY_S
    outcome = Delivery.failed
    while True:
        try:
            # Bounded: with Temporal away, or no worker to take it, an Update waits.
            left = max(deadline - loop.time(), FIRST_RETRY_S)
            await asyncio.wait_for(handle.execute_update(RESOLVE_ACTION_UPDATE, decision), left)
            return Delivery.taken
        except WorkflowUpdateFailedError:
            # The turn is not (yet) waiting for this action: its specialist may be.
            if not renewal and await offer_decision(client, turn_id=turn_id, decision=decision):
                return Delivery.taken  # its specialist was waiting for it (dispatch/specialists.py)
            outcome = Delivery.refused
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return Delivery.closed
            log.info("delivery to turn %s failed; retrying", turn_id, exc_info=True)
            outcome = Delivery.failed
        except Exception:
            log.info("delivery to turn %s failed; retrying", turn_id, exc_info=True)
            outcome = Delivery.failed
        if loop.time() + delay > deadline:
            return outcome
        await asyncio.sleep(delay)
        delay = min(delay * 2, MAX_RETRY_S)


async def deliver_and_record_decision(
    client: Client,
    sessions: Database,  # marking it delivered is one statement
    *,
    turn_id: str,
    decision: ResolveActionSignal,
    patience_s: float = DELIVERY_PATIENCE_S,
    renewal: bool = False,
) -> Delivery:
    """Deliver a stored decision, then mark it delivered once nothing is left to deliver
    (taken, or the turn has closed). One refused or not delivered stays for the sweep.
    `renewal`: the card is a renewal, waited on by its own workflow."""
    delivery = await _deliver(
        client, turn_id=turn_id, decision=decision, patience_s=patience_s, renewal=renewal
    )
    if delivery in (Delivery.taken, Delivery.closed):
        async with connect(sessions) as conn:
            await actions.mark_decision_delivered(conn, action_id=decision.action_id)
    return delivery


def stored_decision(action: actions.DecidedAction) -> ResolveActionSignal:
    """The decision as the API delivered it when it was made: a card the user moved on
    from is `superseded` (store/posting.py)."""
    if action.status == ActionStatus.confirmed:
        return ResolveActionSignal(action.id, Decision.confirmed)
    if action.status == ActionStatus.superseded:
        return ResolveActionSignal(action.id, Decision.superseded)
    return ResolveActionSignal(action.id, Decision.declined)


async def sweep_decisions(
    client: Client,
    sessions: Database,
    *,
    grace: timedelta,
    patience_s: float = SWEEP_PATIENCE_S,
) -> int:
    """Deliver every decision the API did not mark delivered within `grace` (Temporal was
    away, the API died after its commit); return how many were delivered. A decision whose
    turn has ended is marked without a delivery; the round stops at the first that Temporal
    does not answer for (the next sweep tries again)."""
    async with connect(sessions) as db:
        pending = await actions.undelivered_decisions(db, older_than=grace)
    delivered = 0
    for action in pending:
        if action.turn_ended:
            async with connect(sessions) as conn:
                await actions.mark_decision_delivered(conn, action_id=action.id)
            continue
        log.warning("delivering the decision on %s that the API did not", action.id)
        delivery = await deliver_and_record_decision(
            client,
            sessions,
            turn_id=action.turn_id,
            decision=stored_decision(action),
            patience_s=patience_s,
            renewal=action.renewed,
        )
        if delivery is Delivery.failed:
            break
        delivered += delivery is Delivery.taken
    return delivered
