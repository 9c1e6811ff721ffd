"""Starting, signalling and cancelling turn workflows; the turns table is the start outbox.

The API commits the user message and its turn, and the statement that writes the turn rings
`OUTBOX_CHANNEL` (heard at the commit); the API calls no Temporal. A worker of the turn's task
queue that hears the ring claims the start (`start_rung`: one of the many that hear it) and
starts the workflow eagerly on its own client, so the first workflow task runs in it with no
trip through matching, then marks the row started; beside the start, it begins the turn's
first context build (activities/early_build.py), which its first step takes from memory. If
nobody hears the ring, or the claimer dies before its start, the turn row still says
`workflow_started_at IS NULL`; the sweep starts such turns a few seconds later. Every worker
ticks, and one sweeps at a time (an advisory lock, store/locks.py): a tick that finds
another worker sweeping skips. Starting is idempotent: the workflow id comes from the turn,
a running workflow is attached to (`USE_EXISTING`), and a finished one is never started
again (`REJECT_DUPLICATE`).

The sweep starts only turns still in `received` (or `building_context`, an early build's); a
paused tenant's turn is ended instead (`agent_paused`, retryable), in the transaction that
marks it started. A second sweep ends turns whose workflow closed while the row says they
have not ended (an execution timeout, a bug in workflow code), so no session stays locked
behind them. The same loop delivers the users' decisions on confirmations the API stored but
did not deliver (dispatch/control.py) and the specialists' answers it committed but did not
signal (dispatch/specialists.py), starts erasures, renewed cards' waits and budget approvals
whose start was lost (dispatch/erasure.py, dispatch/approvals.py, dispatch/budgets.py),
delivers budget notices to the tenants' webhooks, and shows `confirmation_expiring` on cards
that lapse soon. While Temporal is away a sweep fails and the next one tries again:
everything it delivers or starts is in the store.

A turn queued behind a running one (store/queue.py) becomes an ordinary unstarted turn when
that one ends, whichever way; the transaction that ends it rings `OUTBOX_CHANNEL`, and the
loop, listening between sweeps, starts the queued turn at once. The sweep covers a ring
nobody heard (no worker listening, a crash between the end and the start).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from parley.activities.webhooks import WebhookSender
from parley.config import DEFAULT_CLAIM_TIMEOUT_S, Settings
from parley.contracts import (
    DEFAULT_CONFIRMATION_TIMEOUT_S,
    SA_SESSION_ID,
    SA_TENANT_ID,
    SA_TURN_STATE,
    TURN_WORKFLOW,
    TurnInput,
    TurnState,
)
from parley.dispatch.approvals import DEFAULT_WARNING_LEAD_S, sweep_renewals, warn_expiring
from parley.dispatch.budgets import deliver_notices, sweep_approvals
from parley.dispatch.control import sweep_decisions
from parley.dispatch.erasure import sweep_erasures
from parley.dispatch.handoffs import sweep_cases
from parley.dispatch.specialists import sweep_answers
from parley.dispatch.telemetry import joined_trace
from parley.gateway.resolver import system_resolver
from parley.ids import workflow_id_for_turn
from parley.statuses import TurnErrorCode
from parley.store import locks, outbox, queue, tenants
from parley.store.db import Database, connect
from parley.store.events import OutboxRing
from parley.wire import ErrorData

# A turn's workflow runs at most this much longer than its confirmation wait; past that
# Temporal closes it and the abandoned-turn sweep ends the row.
EXECUTION_MARGIN = timedelta(minutes=30)
# How long a worker may hold one of the turn's workflow tasks: a dead worker's turn resumes
# on another after this. The SDK extends a task while a local step (the model call) runs
# past most of it, so a long answer is never cut off.
WORKFLOW_TASK_TIMEOUT = timedelta(seconds=5)
# A started turn that has written nothing for this long is looked up in Temporal.
QUIET_FOR = timedelta(minutes=2)

log = logging.getLogger(__name__)


async def start_turn_workflow(
    client: Client,
    inp: TurnInput,
    *,
    task_queue: str,
    turn_number: int | None = None,
    eager: bool = False,
) -> None:
    """Start the turn's workflow; `eager` asks the server to hand its first task to a worker
    running on this same client (`Settings.api_worker`)."""
    # The UI's one line for the turn: ids and its place in the session, no personal data.
    place = f"Turn {turn_number}" if turn_number else "Turn"
    try:
        await client.start_workflow(
            TURN_WORKFLOW,
            inp,
            id=workflow_id_for_turn(inp.turn_id),
            task_queue=task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            execution_timeout=timedelta(seconds=inp.confirmation_timeout_s) + EXECUTION_MARGIN,
            task_timeout=WORKFLOW_TASK_TIMEOUT,
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(SA_SESSION_ID, inp.session_id),
                    SearchAttributePair(SA_TENANT_ID, inp.tenant_id),
                    SearchAttributePair(SA_TURN_STATE, TurnState.received.value),
                ]
            ),
            static_summary=f"{place} of session {inp.session_id} ({inp.turn_id})",
            request_eager_start=eager,
        )
    except WorkflowAlreadyStartedError:
        pass  # it ran already; starting twice must never run a turn twice


async def start_and_record(
    client: Client,
    sessions: Database,
    inp: TurnInput,
    *,
    task_queue: str,
    turn_number: int | None = None,
    eager: bool = False,
) -> None:
    """Start the turn's workflow (idempotently, eagerly if asked), then mark the outbox row
    started. A caller that has the turn's `turn_number` at hand (read in the transaction that
    made the turn) saves a read."""
    number = turn_number
    if number is None:
        async with sessions() as db:
            number = await outbox.turn_number(db, turn_id=inp.turn_id)
    await start_turn_workflow(client, inp, task_queue=task_queue, turn_number=number, eager=eager)
    await record_started(sessions, inp.turn_id)


async def record_started(sessions: Database, turn_id: str) -> None:
    """Mark the outbox row of a turn whose workflow has started: the sweep leaves it alone.
    Only ever after the start; a mark that is lost costs at most a second start, which
    attaches to the running workflow (or is refused for a finished one)."""
    async with connect(sessions) as conn:  # one statement, autocommit
        await outbox.mark_workflow_started(conn, turn_id=turn_id)


@dataclass(frozen=True)
class Starts:
    """What every start of an unstarted turn (or case) shares: where it starts and the
    options the worker was configured with."""

    client: Client
    sessions: Database
    task_queue: str
    confirmation_timeout_s: float = DEFAULT_CONFIRMATION_TIMEOUT_S
    fallback: bool = False
    handoff_claim_timeout_s: float = DEFAULT_CLAIM_TIMEOUT_S
    # Delivers budget notices to the tenants' webhooks (None: they wait in their table).
    notices: WebhookSender | None = None
    tracing: bool = False  # a posted turn's start joins its POST's trace
    kill_at: str = ""  # a crash test's point (`PARLEY_FAULT_KILL_AT`, dev only)
    # Begins a claimed turn's first context build beside its start (activities/early_build.py);
    # None: its first step builds.
    begin_build: Callable[[str], asyncio.Task[Any] | None] | None = None


async def sweep_once(
    client: Client,
    sessions: Database,
    *,
    task_queue: str,
    grace: timedelta,
    confirmation_timeout_s: float = DEFAULT_CONFIRMATION_TIMEOUT_S,
    fallback: bool = False,
) -> int:
    """Start every turn whose start was not confirmed within `grace`; return how many."""
    starts = Starts(client, sessions, task_queue, confirmation_timeout_s, fallback)
    return await _sweep(starts, grace)


async def _sweep(starts: Starts, grace: timedelta) -> int:
    async with connect(starts.sessions) as db:
        pending = await outbox.unstarted_turns(db, older_than=grace)
    for turn in pending:
        log.warning("starting turn %s that no ring started", turn.id)
        await _start_unstarted(starts, turn)
    return len(pending)


async def start_promoted(starts: Starts, turn_id: str) -> bool:
    """Start a queued turn the moment its session's running turn ended (the outbox's bell,
    store/queue.py); False when it is no longer waiting to start (started, or dropped)."""
    async with connect(starts.sessions) as db:
        turn = await queue.startable_turn(db, turn_id=turn_id)
    if turn is None:
        return False
    await _start_unstarted(starts, turn)
    return True


async def start_rung(starts: Starts, payload: str, *, promoted: bool = True) -> bool:
    """Start the turn the outbox's doorbell rang for (store/events.py `OutboxRing`): a new
    turn's post, or a queued turn's promotion, names its task queue, and a worker of that
    queue claims it (store/outbox.py `claim_start`: one worker of the many that hear it) and
    starts it eagerly on its own client, so its first workflow task runs here without a trip
    through matching; the claim is held until the start is marked. The turn's first build
    begins beside the start (`begin_build`). A promoted turn's ring that names no queue (an
    older release's) is started as `start_promoted` does, when `promoted`. False when this
    worker starts nothing. A worker that dies with the claim lets it go with its connection:
    the sweep starts the turn a few seconds later."""
    rung = OutboxRing.heard(payload)
    if rung.task_queue is None:
        return promoted and await start_promoted(starts, rung.turn_id)
    if rung.task_queue != starts.task_queue:
        return False  # another deployment's turn (tests share a database)
    async with starts.sessions() as db:
        claimed = await outbox.claim_start(db, turn_id=rung.turn_id)
        if claimed is None:
            return False
        _die_at(starts, "turn_claimed")
        if claimed.paused:
            await db.rollback()  # the claim goes: the ending is written apart
            turn = queue.Startable(claimed.id, claimed.session_id, claimed.tenant_id)
            return await _end_if_paused(starts.sessions, turn.id, turn.tenant_id)
        # A posted turn starts with its API's settings; a promoted one with this worker's.
        given = starts if rung.promoted else rung
        inp = TurnInput(
            turn_id=claimed.id,
            session_id=claimed.session_id,
            tenant_id=claimed.tenant_id,
            confirmation_timeout_s=given.confirmation_timeout_s,
            fallback=given.fallback,
        )
        with joined_trace(rung.trace if starts.tracing else ""):
            await _begin_build(starts, claimed.id)  # its first task runs here, eagerly
            await start_turn_workflow(
                starts.client,
                inp,
                task_queue=starts.task_queue,
                turn_number=claimed.number,
                eager=True,
            )
        _die_at(starts, "turn_started")
        await outbox.mark_workflow_started(db, turn_id=claimed.id)
        await db.commit()
    return True


async def _begin_build(starts: Starts, turn_id: str) -> None:
    """Begin the turn's first build beside its start (activities/early_build.py). A crash
    test's `context_built` lets the build move the turn and store its request, then dies
    before the start is asked for."""
    if starts.begin_build is None:
        return
    begun = starts.begin_build(turn_id)
    if begun is not None and starts.kill_at == "context_built":
        await asyncio.wait([begun])
        _die_at(starts, "context_built")


def _die_at(starts: Starts, point: str) -> None:
    """A crash test's SIGKILL at `point` (dispatch only: `PARLEY_FAULT_KILL_AT`)."""
    if starts.kill_at == point:
        log.warning("fault injection: killed at %s", point)
        os.kill(os.getpid(), signal.SIGKILL)


async def _start_unstarted(starts: Starts, turn: queue.Startable) -> None:
    if await _end_if_paused(starts.sessions, turn.id, turn.tenant_id):
        return
    inp = TurnInput(
        turn_id=turn.id,
        session_id=turn.session_id,
        tenant_id=turn.tenant_id,
        confirmation_timeout_s=starts.confirmation_timeout_s,
        fallback=starts.fallback,
    )
    await start_and_record(starts.client, starts.sessions, inp, task_queue=starts.task_queue)


async def _end_if_paused(sessions: Database, turn_id: str, tenant_id: str) -> bool:
    """A paused tenant's turn is not started: it ends with `agent_paused` (retryable)."""
    async with sessions() as db:
        if not await tenants.is_paused(db, tenant_id=tenant_id):
            return False
        paused = ErrorData(
            code=TurnErrorCode.agent_paused,
            message="the assistant is paused for this tenant",
            retryable=True,
        )
        await outbox.end_unstarted_turn(db, turn_id=turn_id, state=TurnState.failed, error=paused)
        await db.commit()
    return True


async def end_abandoned_turns(
    client: Client, sessions: Database, *, quiet_for: timedelta = QUIET_FOR
) -> int:
    """End every open turn whose workflow has closed (or never existed); return how many."""
    async with connect(sessions) as db:
        quiet = await outbox.quiet_open_turns(db, quiet_for=quiet_for)
    ended = 0
    for turn in quiet:
        handle = client.get_workflow_handle(workflow_id_for_turn(turn.id))
        try:
            status = (await handle.describe()).status
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
            status = None
        if status == WorkflowExecutionStatus.RUNNING:
            continue
        log.warning("turn %s is open but its workflow is %s; ending it", turn.id, status)
        abandoned = ErrorData(
            code=TurnErrorCode.turn_abandoned,
            message="the assistant could not finish this answer",
            retryable=True,
        )
        async with sessions() as db:
            await outbox.end_unstarted_turn(
                db, turn_id=turn.id, state=TurnState.failed, error=abandoned
            )
            await db.commit()
        ended += 1
    return ended


async def sweep_tick(
    starts: Starts, *, grace: timedelta, warning_lead_s: float = DEFAULT_WARNING_LEAD_S
) -> bool:
    """One sweep of everything the outbox keeps, by one worker at a time: False, doing
    nothing, when another worker's sweep is running (its tick covers this one). Its reads
    run in autocommit: a unit of work that only reads ends in a `ROLLBACK`, and psycopg's
    rollback drops the pooled connection's prepared statements, which every tick would
    do to a few of the worker's connections."""
    client, sessions, task_queue = starts.client, starts.sessions, starts.task_queue
    async with locks.if_free(sessions, locks.OUTBOX_SWEEP) as mine:
        if not mine:
            return False
        # First what needs only the store: a warning is due on the clock.
        await warn_expiring(sessions, default_lead_s=warning_lead_s)
        await _sweep(starts, grace)
        # A renewal's wait is started before its answer is delivered to it.
        await sweep_renewals(client, sessions, task_queue=task_queue, grace=grace)
        await sweep_decisions(client, sessions, grace=grace)
        await sweep_answers(client, sessions, grace=grace)
        await sweep_erasures(client, sessions, task_queue=task_queue, grace=grace)
        await sweep_cases(
            client,
            sessions,
            task_queue=task_queue,
            grace=grace,
            default_timeout_s=starts.handoff_claim_timeout_s,
        )
        await sweep_approvals(client, sessions, task_queue=task_queue, grace=grace)
        await end_abandoned_turns(client, sessions)
        if starts.notices is not None:
            await deliver_notices(sessions, starts.notices)
    return True


async def sweep_forever(
    client: Client,
    sessions: Database,
    *,
    task_queue: str,
    grace: timedelta,
    every: timedelta,
    confirmation_timeout_s: float = DEFAULT_CONFIRMATION_TIMEOUT_S,
    fallback: bool = False,
    bell: queue.OutboxBell | None = None,
    warning_lead_s: float = DEFAULT_WARNING_LEAD_S,
    handoff_claim_timeout_s: float = DEFAULT_CLAIM_TIMEOUT_S,
    notices: WebhookSender | None = None,
    tracing: bool = False,
    kill_at: str = "",
    begin_build: Callable[[str], asyncio.Task[Any] | None] | None = None,
) -> None:
    """Sweep every `every`; between sweeps, start each queued turn the moment `bell` rings
    for it (a ring this misses, the next sweep covers). `warning_lead_s`: the deployment's
    lead time of `confirmation_expiring` (a tenant's setting overrides it)."""
    starts = Starts(
        client,
        sessions,
        task_queue,
        confirmation_timeout_s,
        fallback,
        handoff_claim_timeout_s,
        notices,
        tracing,
        kill_at,
        begin_build,
    )
    loop = asyncio.get_running_loop()
    starting: set[asyncio.Task[bool]] = set()  # each ring's start runs beside the others
    if bell is not None:
        await bell.listen()
    due = loop.time()
    while True:
        if loop.time() >= due:
            due = loop.time() + every.total_seconds()
            try:
                await sweep_tick(starts, grace=grace, warning_lead_s=warning_lead_s)
            except Exception:  # a failed sweep is retried on the next tick
                log.exception("outbox sweep failed")
        wait = max(due - loop.time(), 0.0)
        if bell is None:
            await asyncio.sleep(wait)
            continue
        for payload in await bell.rung(wait):
            task = asyncio.create_task(_start_now(starts, payload))
            starting.add(task)
            task.add_done_callback(starting.discard)


async def run_outbox(
    client: Client,
    sessions: Database,
    settings: Settings,
    bell: queue.OutboxBell,
    *,
    begin_build: Callable[[str], asyncio.Task[Any] | None] | None = None,
) -> None:
    """A worker's outbox loop as its settings say (`sweep_forever`): unstarted turns,
    undelivered answers, lost erasures, abandoned turns, and a posted or promoted turn the
    moment the bell rings, its first build begun beside its start (`begin_build`)."""
    await sweep_forever(
        client,
        sessions,
        task_queue=settings.task_queue,
        grace=timedelta(seconds=settings.outbox_grace_s),
        every=timedelta(seconds=settings.outbox_poll_s),
        confirmation_timeout_s=settings.confirmation_timeout_s,
        fallback=settings.has_fallback_model,
        bell=bell,
        warning_lead_s=settings.confirmation_warning_s,
        handoff_claim_timeout_s=settings.handoff_claim_timeout_s,
        notices=WebhookSender(
            sessions=sessions, allowlist=settings.mcp_allowlist, resolve=system_resolver
        ),
        tracing=bool(settings.otlp_endpoint),
        kill_at=settings.fault_kill_at,
        begin_build=begin_build,
    )


async def start_forever(starts: Starts, bell: queue.OutboxBell) -> None:
    """Start each posted or promoted turn of this worker's queue the moment its ring is
    heard, and nothing else: no sweep, no promoted turn whose ring names no queue (a worker
    beside which no outbox loop runs: tests' in-process workers, on a database other
    deployments share)."""
    starting: set[asyncio.Task[bool]] = set()
    await bell.listen()
    while True:
        for payload in await bell.rung(60.0):
            task = asyncio.create_task(_start_now(starts, payload, promoted=False))
            starting.add(task)
            task.add_done_callback(starting.discard)


async def _start_now(starts: Starts, payload: str, *, promoted: bool = True) -> bool:
    try:
        return await start_rung(starts, payload, promoted=promoted)
    except Exception:  # the sweep starts it
        log.warning("could not start the turn rung as %r now", payload, exc_info=True)
        return False
