"""Talking to a turn's specialist (workflows/specialist.py): the user's answer to its
question, and a confirm or decline of its proposal that the turn itself does not await.

An answer is a signal: Temporal keeps it in the specialist's history even while no worker
runs, and the specialist takes only the answer bound to the question it is waiting on.
The `specialist_answers` table is the answers' outbox, as the turns table is the starts':
the API commits the answer with the user's message, signals at once and marks the row
delivered; an API that dies in between leaves the row undelivered, and the sweep in every
worker (`sweep_answers`, beside the start sweep in dispatch/outbox.py) signals it a few
seconds later. Delivery is idempotent: the specialist takes the first answer to each
question (its interaction id) and ignores a repeat, so a row signalled twice (an API that
died after the signal but before marking it) is taken once.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from parley.contracts import (
    ANSWER_INTERACTION_SIGNAL,
    RESOLVE_ACTION_UPDATE,
    InteractionAnswer,
    ResolveActionSignal,
)
from parley.ids import specialist_workflow_id
from parley.store import interactions
from parley.store.db import Database, connect

log = logging.getLogger(__name__)


async def deliver_answer(client: Client, *, turn_id: str, answer: InteractionAnswer) -> None:
    """The user's answer to the question the turn's specialist asked."""
    handle = client.get_workflow_handle(specialist_workflow_id(turn_id=turn_id))
    await handle.signal(ANSWER_INTERACTION_SIGNAL, answer)


async def deliver_and_record(
    client: Client, sessions: Database, row: interactions.AnswerRow
) -> None:
    """Signal the stored answer, then mark its outbox row delivered. A specialist that has
    ended (its wait ran out, its turn was stopped) has nobody to take it: marked too."""
    answer = InteractionAnswer(row.interaction_id, row.value)
    try:
        await deliver_answer(client, turn_id=row.turn_id, answer=answer)
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        log.warning("the specialist of turn %s has ended; answer %s dropped", row.turn_id, row.id)
    async with sessions() as db:
        await interactions.mark_answer_delivered(db, answer_id=row.id)
        await db.commit()


async def sweep_answers(client: Client, sessions: Database, *, grace: timedelta) -> int:
    """Deliver every answer the API did not mark delivered within `grace`; return how many."""
    async with connect(sessions) as db:
        pending = await interactions.undelivered_answers(db, older_than=grace)
    for row in pending:
        log.warning("delivering answer %s to turn %s that the API did not", row.id, row.turn_id)
        await deliver_and_record(client, sessions, row)
    return len(pending)


async def offer_decision(client: Client, *, turn_id: str, decision: ResolveActionSignal) -> bool:
    """The decision to the turn's specialist; True once it took it. False when the turn has
    no specialist or it is not (yet) waiting for this action."""
    handle = client.get_workflow_handle(specialist_workflow_id(turn_id=turn_id))
    try:
        await handle.execute_update(RESOLVE_ACTION_UPDATE, decision)
    except (WorkflowUpdateFailedError, RPCError):
        return False
    return True
