"""Starting, signalling and cancelling turn workflows; the turns table is the start outbox.

The API commits the user message and its turn first, then starts the workflow. If the API
dies in between, the turn row still says `workflow_started_at IS NULL`; the sweep that runs
in every worker starts such turns a few seconds later. Starting is idempotent: the workflow
id comes from the turn, a running workflow is attached to (`USE_EXISTING`), and a finished
one is never started again (`REJECT_DUPLICATE`).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from parley.contracts import (
    DEFAULT_CONFIRMATION_TIMEOUT_S,
    RESOLVE_ACTION_SIGNAL,
    SA_SESSION_ID,
    SA_TENANT_ID,
    SA_TURN_STATE,
    TURN_WORKFLOW,
    ResolveActionSignal,
    TurnInput,
    TurnState,
)
from parley.ids import workflow_id_for_turn
from store import outbox, turns

log = logging.getLogger(__name__)


async def start_turn_workflow(
    client: Client,
    *,
    task_queue: str,
    turn_id: str,
    session_id: str,
    tenant_id: str,
    confirmation_timeout_s: float = DEFAULT_CONFIRMATION_TIMEOUT_S,
    fallback: bool = False,
) -> None:
    try:
        await client.start_workflow(
            TURN_WORKFLOW,
            TurnInput(
                turn_id=turn_id,
                session_id=session_id,
                tenant_id=tenant_id,
                confirmation_timeout_s=confirmation_timeout_s,
                fallback=fallback,
            ),
            id=workflow_id_for_turn(turn_id),
            task_queue=task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(SA_SESSION_ID, session_id),
                    SearchAttributePair(SA_TENANT_ID, tenant_id),
                    SearchAttributePair(SA_TURN_STATE, TurnState.received.value),
                ]
            ),
            static_summary=f"Turn {turn_id} of session {session_id}",
        )
    except WorkflowAlreadyStartedError:
        pass  # it ran already; starting twice must never run a turn twice


async def start_and_record(
    client: Client,
    sessions: async_sessionmaker[AsyncSession],
    *,
    task_queue: str,
    turn_id: str,
    session_id: str,
    tenant_id: str,
    confirmation_timeout_s: float = DEFAULT_CONFIRMATION_TIMEOUT_S,
    fallback: bool = False,
) -> None:
    await start_turn_workflow(
        client,
        task_queue=task_queue,
        turn_id=turn_id,
        session_id=session_id,
        tenant_id=tenant_id,
        confirmation_timeout_s=confirmation_timeout_s,
        fallback=fallback,
    )
    async with sessions() as db:
        await outbox.mark_workflow_started(db, turn_id=turn_id)
        await db.commit()


async def sweep_once(
    client: Client,
    sessions: async_sessionmaker[AsyncSession],
    *,
    task_queue: str,
    grace: timedelta,
    confirmation_timeout_s: float = DEFAULT_CONFIRMATION_TIMEOUT_S,
    fallback: bool = False,
) -> int:
    """Start every turn whose start was not confirmed within `grace`; return how many."""
    async with sessions() as db:
        pending = await outbox.unstarted_turns(db, older_than=grace)
    for turn in pending:
        log.warning("starting turn %s that the API did not start", turn.id)
        await start_and_record(
            client,
            sessions,
            task_queue=task_queue,
            turn_id=turn.id,
            session_id=turn.session_id,
            tenant_id=turn.tenant_id,
            confirmation_timeout_s=confirmation_timeout_s,
            fallback=fallback,
        )
    return len(pending)


async def sweep_forever(
    client: Client,
    sessions: async_sessionmaker[AsyncSession],
    *,
    task_queue: str,
    grace: timedelta,
    every: timedelta,
    confirmation_timeout_s: float = DEFAULT_CONFIRMATION_TIMEOUT_S,
    fallback: bool = False,
) -> None:
    while True:
        try:
            await sweep_once(
                client,
                sessions,
                task_queue=task_queue,
                grace=grace,
                confirmation_timeout_s=confirmation_timeout_s,
                fallback=fallback,
            )
        except Exception:  # a failed sweep is retried on the next tick
            log.exception("outbox sweep failed")
        await asyncio.sleep(every.total_seconds())


async def signal_turn(client: Client, *, turn_id: str, signal: ResolveActionSignal) -> None:
    """Tell a waiting turn what the user decided. The decision is already stored, so a lost
    signal only delays the turn: when its wait times out it reads the stored answer."""
    handle = client.get_workflow_handle(workflow_id_for_turn(turn_id))
    await handle.signal(RESOLVE_ACTION_SIGNAL, signal)


async def cancel_turn_workflow(
    client: Client, sessions: async_sessionmaker[AsyncSession], *, turn_id: str
) -> None:
    """Ask the turn's workflow to cancel; it stops the model stream and stores what streamed.

    A turn whose workflow never started (the outbox had not got to it) is ended here, and
    marked started so the outbox leaves it alone.
    """
    handle = client.get_workflow_handle(workflow_id_for_turn(turn_id))
    try:
        await handle.cancel()
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        async with sessions() as db:
            await turns.end_unfinished_turn(db, turn_id=turn_id, state=TurnState.cancelled)
            await db.commit()
        async with sessions() as db:
            await outbox.mark_workflow_started(db, turn_id=turn_id)
            await db.commit()
