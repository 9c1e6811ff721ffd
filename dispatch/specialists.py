"""Talking to a turn's specialist (workflows/specialist.py): the user's answer to its
question, and a confirm or decline of its proposal that the turn itself does not await.

An answer is a signal: Temporal keeps it in the specialist's history even while no worker
runs, and the specialist takes only the answer bound to the question it is waiting on.
"""

from __future__ import annotations

import logging

from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError

from parley.contracts import (
    ANSWER_INTERACTION_SIGNAL,
    RESOLVE_ACTION_UPDATE,
    InteractionAnswer,
    ResolveActionSignal,
)
from parley.ids import specialist_workflow_id

log = logging.getLogger(__name__)


async def deliver_answer(client: Client, *, turn_id: str, answer: InteractionAnswer) -> None:
    """The user's answer to the question the turn's specialist asked."""
    handle = client.get_workflow_handle(specialist_workflow_id(turn_id=turn_id))
    await handle.signal(ANSWER_INTERACTION_SIGNAL, answer)


async def offer_decision(client: Client, *, turn_id: str, decision: ResolveActionSignal) -> bool:
    """The decision to the turn's specialist; True once it took it. False when the turn has
    no specialist or it is not (yet) waiting for this action."""
    handle = client.get_workflow_handle(specialist_workflow_id(turn_id=turn_id))
    try:
        await handle.execute_update(RESOLVE_ACTION_UPDATE, decision)
    except (WorkflowUpdateFailedError, RPCError):
        return False
    return True
