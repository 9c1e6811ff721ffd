"""Talking to a running turn: the user's Stop and the user's answer to a confirmation.

Both are decisions stored first and delivered second, so the store stays the source of truth
and a delivery that fails costs time, never the decision:

- Stop: recorded on the turn row under its lock (a finished turn refuses: `TurnFinished`),
  then the workflow is cancelled. Every step refuses to start once the Stop is recorded, and
  every ending after it is `cancelled`, so a Stop that was accepted is never lost.
- Confirm / decline: the action's row is updated by the route, then the decision is sent as
  a Workflow Update, retried for a few seconds until the turn accepts it (its validator takes
  only the decision it is waiting for) or its specialist does. That is the one route: a
  decision that finds neither is read from the store when the turn's wait ends, and
  `send_email` reads the stored status, not the Update.
"""

from __future__ import annotations

import asyncio
import logging

from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from parley.contracts import RESOLVE_ACTION_UPDATE, ResolveActionSignal, TurnState
from parley.dispatch.specialists import offer_decision
from parley.ids import workflow_id_for_turn
from parley.store import outbox, turns
from parley.store.db import Database

log = logging.getLogger(__name__)

# How long a decision's delivery is retried before it is left to the turn's own wait.
DELIVERY_PATIENCE_S = 5.0
FIRST_RETRY_S = 0.05
MAX_RETRY_S = 0.4


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
    handle = client.get_workflow_handle(workflow_id_for_turn(turn_id))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience_s
    delay = FIRST_RETRY_S
    while True:
        try:
            await handle.execute_update(RESOLVE_ACTION_UPDATE, decision)
            return True
        except WorkflowUpdateFailedError:
            # The turn is not (yet) waiting for this action: its specialist may be.
            if await offer_decision(client, turn_id=turn_id, decision=decision):
                return True  # the turn's specialist was waiting for it (dispatch/specialists.py)
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return False  # the turn has closed
            log.info("delivery to turn %s failed; retrying", turn_id, exc_info=True)
        except Exception:
            log.info("delivery to turn %s failed; retrying", turn_id, exc_info=True)
        if loop.time() + delay > deadline:
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 2, MAX_RETRY_S)
