"""The worker process: wires activities to their dependencies and runs the turn workflow.

Also runs the outbox sweep, which starts turns whose workflow the API failed to start.
Stopping it (SIGINT/SIGTERM) drains gracefully; killing it outright loses nothing either:
Temporal hands the unfinished step to the next worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any, NoReturn

import httpx
import uvloop
from prometheus_client import start_http_server
from temporalio.client import Client
from temporalio.worker import Worker

from parley.activities import indexing
from parley.activities.budget_approvals import BudgetApprovalActivities
from parley.activities.context import ContextBuilder
from parley.activities.early_build import EarlyBuilds
from parley.activities.ending import EndingActivities
from parley.activities.erasure import ErasureActivities
from parley.activities.exports import ExportActivities
from parley.activities.failures import FailureInterceptor
from parley.activities.handoffs import HandoffActivities
from parley.activities.handover import Handover
from parley.activities.imports import ImportActivities
from parley.activities.knowledge import KnowledgeSource
from parley.activities.mcp import McpTools
from parley.activities.memory import MemoryActivities
from parley.activities.northwind import NorthwindClient
from parley.activities.opening import StepOpening
from parley.activities.retention import RetentionActivities
from parley.activities.screens import ScreenActivities
from parley.activities.sdk_metrics import sdk_runtime
from parley.activities.send import SendActivities
from parley.activities.skills import SkillTools
from parley.activities.specialist import SpecialistActivities
from parley.activities.specialist_agent import SpecialistAgentActivities
from parley.activities.tools import ToolActivities
from parley.activities.tracing import TracingInterceptor
from parley.activities.turn import TurnActivities
from parley.breaker import CircuitBreaker
from parley.config import Settings, get_settings
from parley.dispatch.connect import connect_temporal
from parley.dispatch.deployment import build_id, deployment_config, promote_configured
from parley.dispatch.outbox import run_outbox
from parley.dispatch.retention import ensure_purge_schedule
from parley.dispatch.runner import one_batch_per_task, workflow_runner
from parley.dispatch.telemetry import telemetry_for, tracing_on
from parley.gateway import ModelProvider, ProviderPool
from parley.gateway.embeddings import build_embedder as passage_embedder
from parley.gateway.minilm import build_embedder
from parley.logs import configure_logging, exit_unfinalized
from parley.screens import ModerationScreen, RulesScreen, Screen, ScreenChain
from parley.store.db import Database, create_socket_checked_engine, libpq_url
from parley.store.queue import OutboxBell
from parley.tls import httpx_verified
from parley.workflows.budget_approval import BudgetApprovalWorkflow
from parley.workflows.erasure import ErasureWorkflow
from parley.workflows.export import ExportWorkflow
from parley.workflows.handoff import HandoffWorkflow
from parley.workflows.imports import ImportWorkflow
from parley.workflows.renewal import RenewalWorkflow
from parley.workflows.retention import RetentionPurgeWorkflow
from parley.workflows.specialist import SpecialistWorkflow
from parley.workflows.summary import SummaryWorkflow
from parley.workflows.turn import TurnWorkflow


def build_screens(settings: Settings) -> tuple[Screen, Screen]:
    """The rules floor, then (if configured) the provider's moderation endpoint."""
    input_rules = RulesScreen("input", tuple(settings.screen_blocked_input_terms))
    output_rules = RulesScreen("output", tuple(settings.screen_blocked_output_terms))
    if settings.screen_provider == "rules":
        return input_rules, output_rules
    if settings.screen_provider == "openai":
        from openai import AsyncOpenAI

        moderation = ModerationScreen(AsyncOpenAI(max_retries=0, timeout=10.0))
        return ScreenChain([input_rules, moderation]), ScreenChain([output_rules, moderation])
    raise ValueError(f"unknown screen provider {settings.screen_provider!r}")


def build_northwind(
    settings: Settings,
    http: httpx.AsyncClient,
    breaker_clock: Callable[[], float] = time.monotonic,
) -> NorthwindClient:
    """The demo backend's client, behind its circuit breaker."""
    return NorthwindClient(
        base_url=settings.northwind_url,
        http=http,
        breaker=CircuitBreaker(
            failure_threshold=settings.breaker_failure_threshold,
            cooldown_s=settings.breaker_cooldown_s,
            clock=breaker_clock,
        ),
        timeout_s=settings.tool_timeout_s,
    )


def build_activities(
    client: Client,
    settings: Settings,
    sessions: Database,
    northwind: NorthwindClient,
    *,
    providers: ProviderPool,
    screens: tuple[Screen, Screen],
    early: EarlyBuilds | None = None,
) -> list[Callable[..., Any]]:
    """Every activity of a turn, as methods of small classes holding their collaborators."""
    input_screen, output_screen = screens
    embedder = build_embedder(settings)  # recall by meaning; None: full-text only
    mcp = McpTools(sessions=sessions, allowed=settings.mcp_allowlist)  # the tenants' MCP servers
    # The skills catalog and the sandbox they run in (one per worker; each run its own folder).
    skills = SkillTools(sessions=sessions, northwind=northwind, settings=settings)
    # The user's message, read by a first step's build, for the input screen beside it.
    asked: Handover[str] = Handover()
    context = ContextBuilder(
        sessions=sessions,
        settings=settings,
        northwind=northwind,
        embedder=embedder,
        mcp=mcp,
        skills=skills,
        knowledge=KnowledgeSource(
            passages=settings.knowledge_passages, embedder=passage_embedder(settings)
        ),
        asked=asked,
    )
    turn = TurnActivities(
        sessions=sessions,
        providers=providers,
        settings=settings,
        context=context,
        output_screen=output_screen,
    )
    tools = ToolActivities(
        sessions=sessions, northwind=northwind, settings=settings, mcp=mcp, skills=skills
    )
    send = SendActivities(sessions=sessions, northwind=northwind, mcp=mcp)
    specialist = SpecialistActivities(
        sessions=sessions, northwind=northwind, settings=settings, output_screen=output_screen
    )
    agent = SpecialistAgentActivities(
        sessions=sessions, providers=providers, specialist=specialist, output_screen=output_screen
    )
    memory = MemoryActivities(
        sessions=sessions, providers=providers, settings=settings, embedder=embedder
    )
    memory.attach(client)  # it starts a session's summary workflow after a turn
    screening = ScreenActivities(
        sessions=sessions, input_screen=input_screen, output_screen=output_screen, asked=asked
    )
    ending = EndingActivities(turn=turn, screens=screening, memory=memory)
    importing = ImportActivities(sessions=sessions, memory=memory, embedder=embedder)
    steps = [_opening(turn, screening, context, early)]
    steps += _activity_list(turn, tools, send, screening, memory, (specialist, agent), ending)
    steps += _handoff_activities(client, settings, sessions, providers, (tools, ending))
    return [*steps, *_import_activities(importing), *_data_activities(client, settings, sessions)]


def _opening(
    turn: TurnActivities,
    screening: ScreenActivities,
    context: ContextBuilder,
    early: EarlyBuilds | None,
) -> Callable[..., Any]:
    """A model step's opening (turn build 14); `early`, where the outbox loop begins a turn's
    first build beside its start, builds with the turns' context build."""
    if early is not None:
        early.attach(context.build)
    return StepOpening(turn=turn, screens=screening, early=early).open_step


def _handoff_activities(
    client: Client,
    settings: Settings,
    db: Database,
    pool: ProviderPool,
    openers: tuple[ToolActivities, EndingActivities],
) -> list[Callable[..., Any]]:
    """A hand-off's steps; the tool step that opens a case, and a turn's ending that applies
    the tenant's policy, start its run (workflows/handoff.py). With them a budget approval's
    (workflows/budget_approval.py): both ask a person, both tell the tenant's webhook."""
    handoffs = HandoffActivities(sessions=db, providers=pool, settings=settings, client=client)
    tools, ending = openers
    tools.attach(handoffs)
    ending.attach(handoffs)
    budget = BudgetApprovalActivities(sessions=db, settings=settings)
    return [*handoffs.steps(), *budget.steps()]


def _import_activities(importing: ImportActivities) -> list[Callable[..., Any]]:
    """An imported conversation's indexing, and the summary pass it asks for after (its
    activities share the turns' embedder and summary start)."""
    return [importing.index_import, importing.finish_import]


def _data_activities(
    client: Client, settings: Settings, sessions: Database
) -> list[Callable[..., Any]]:
    """A user's data leaving (export), expiring (retention purge) and erased (erasures cancel
    turns and delete workflow executions, so they need the client too)."""
    export = ExportActivities(sessions=sessions)
    purge = RetentionActivities(sessions=sessions, settings=settings)
    erasing = ErasureActivities(sessions=sessions, settings=settings, client=client)
    return [
        export.write_export,
        export.fail_export,
        purge.plan_purge,
        purge.purge_batch,
        erasing.begin_erasure,
        erasing.stop_turns,
        erasing.forget_workflows,
        erasing.erase_table,
        erasing.remaining_rows,
        erasing.finish_erasure,
    ]


def _activity_list(
    turn: TurnActivities,
    tools: ToolActivities,
    send: SendActivities,
    screening: ScreenActivities,
    memory: MemoryActivities,
    specialists: tuple[SpecialistActivities, SpecialistAgentActivities],
    ending: EndingActivities,
) -> list[Callable[..., Any]]:
    # The Returns specialist: fixed steps with the demo model, its own agent loop with a
    # real one (parley/returns_agent.py).
    specialist, agent = specialists
    return [
        ending.finish_turn,
        turn.build_context,
        turn.call_model,
        turn.request_confirmation,
        turn.fail_turn,
        turn.cancel_turn,
        tools.execute_tool,
        send.send_email,
        send.expire_action,
        screening.screen_input,
        memory.start_summary,
        memory.summarize,
        specialist.begin,
        specialist.ask,
        specialist.check_window,
        specialist.propose_return,
        specialist.end,
        agent.step,
        agent.run_tool,
        agent.ask,
        agent.answer,
        agent.propose,
    ]


# Every workflow a Parley worker runs (tests/replay replays the committed histories of each).
WORKFLOWS = (
    TurnWorkflow,
    SummaryWorkflow,
    SpecialistWorkflow,
    ExportWorkflow,
    RetentionPurgeWorkflow,
    ErasureWorkflow,
    ImportWorkflow,
    HandoffWorkflow,
    RenewalWorkflow,
    BudgetApprovalWorkflow,
)


def build_worker(
    client: Client,
    settings: Settings,
    sessions: Database,
    http: httpx.AsyncClient,
    *,
    provider: ModelProvider | None = None,
    fallback: ModelProvider | None = None,
    screens: tuple[Screen, Screen] | None = None,
    task_queue: str | None = None,
    breaker_clock: Callable[[], float] = time.monotonic,
    early: EarlyBuilds | None = None,
) -> Worker:
    """Wire the activities to their collaborators; tests pass their own provider, screens,
    queue, the clock the breaker's cooldown is measured on, `early` (`early_builds`). A client
    connected with the tracing interceptor (`PARLEY_OTLP_ENDPOINT`) lends it to the worker: a
    span around each provider call, the trace id in each ledger row."""
    tracing = tracing_on(client, settings)
    activities = build_activities(
        client,
        settings,
        sessions,
        build_northwind(settings, http, breaker_clock),
        providers=ProviderPool(
            settings,
            primary=provider,
            fallback=fallback,
            wrap=tracing.traced if tracing is not None else None,
        ),
        screens=screens or build_screens(settings),
        early=early,
    )
    runner = workflow_runner(client.data_converter, sandboxed=settings.workflow_sandbox)
    ledger = TracingInterceptor(sessions, trace_id=tracing.trace_id if tracing else lambda: None)
    return one_batch_per_task(
        Worker(
            client,
            task_queue=task_queue or settings.task_queue,
            workflows=list(WORKFLOWS),
            activities=activities,
            workflow_runner=runner,  # no sandbox unless PARLEY_WORKFLOW_SANDBOX=on
            # Every activity attempt leaves a span in the trace ledger, and its failures reach the
            # workflow under names it relies on (activities/failures.py); OpenTelemetry's first.
            interceptors=[ledger, FailureInterceptor.polling(sessions, settings)],
            # SIGTERM: poll no more, let running steps (a whole streamed answer) finish.
            graceful_shutdown_timeout=timedelta(seconds=settings.worker_shutdown_grace_s),
            # No more steps at once than the pool has connections for (`worker_pool`).
            max_concurrent_activities=settings.worker_max_activities,
            # Heartbeats reach the server (and cancellations reach activities) within a second,
            # so a cancelled turn stops its model stream that fast.
            max_heartbeat_throttle_interval=timedelta(seconds=1),
            # A worker that died holding a turn's cached workflow task: hand the task to another
            # worker after 3 s rather than the SDK's default 10 s.
            sticky_queue_schedule_to_start_timeout=timedelta(seconds=3),
            default_heartbeat_throttle_interval=timedelta(seconds=1),
            # A version of PARLEY_WORKER_DEPLOYMENT (turns pinned); unversioned if it is "".
            deployment_config=deployment_config(settings),
        )
    )


# Connections beyond one per running activity: the outbox sweep, the trace ledger's span
# writes and the log context's turn lookups (both between steps, briefly).
POOL_RESERVE = 4


def worker_pool(settings: Settings) -> dict[str, int]:
    """The worker engine's pool: a connection for every activity slot, so steps never queue
    behind the pool (Temporal queues the rest, where another worker can take them), and those
    of the first builds begun early (activities/early_build.py `AT_ONCE`). A step
    holds one only for its statements: a streaming step's frames go through the worker's
    writer (activities/frame_writer.py), so the pool is what a worker may use at once, not
    what its open streams hold."""
    early = EarlyBuilds.AT_ONCE * EarlyBuilds.CONNECTIONS_EACH if settings.early_build else 0
    return {
        "pool_size": settings.worker_max_activities + POOL_RESERVE + early,
        "max_overflow": POOL_RESERVE,
    }


@contextlib.asynccontextmanager
async def embedded_worker(client: Client, settings: Settings) -> AsyncIterator[Worker]:
    """A worker inside another process, on that process's client: the API's, with
    `api_worker`, so the turns it starts eagerly run here. Its own pool (as `run_worker`'s),
    its version promoted like any worker's; leaving it drains its running steps. The outbox
    sweep and the metrics port stay with the dedicated workers."""
    assert settings.database_url is not None
    pool = worker_pool(settings)
    engine = create_socket_checked_engine(
        settings.database_url, pool_size=pool["pool_size"], max_overflow=pool["max_overflow"]
    )
    http = httpx.AsyncClient(verify=httpx_verified())
    try:
        worker = build_worker(client, settings, Database(engine), http)
        async with worker:
            await promote_configured(client, settings)
            yield worker
        await drain(worker)
    finally:
        await http.aclose()
        await engine.dispose()


async def drain(worker: Worker) -> None:
    """Before the pool closes: the trace ledger's last spans (the final steps') written, and
    the embedding of messages asked for stopped (activities/indexing.py: the next turn asks
    again)."""
    await indexing.stop()
    for interceptor in worker.config()["interceptors"]:
        if isinstance(interceptor, TracingInterceptor):
            await interceptor.ledger.drain()


def freeze_startup_objects() -> None:
    """Everything the worker holds from its start (modules, schemas, the workflow sandbox's
    tables) moved out of the garbage collector's reach: a full collection then scans only what
    turns made since. Unfrozen, one took 0.4 s under plain-turn load, every turn in flight
    stalled behind it (bench/open_loop.py's tail)."""
    gc.collect()
    gc.freeze()


async def _schedule_purge(client: Client, settings: Settings) -> None:
    """The daily retention purge's schedule (dispatch/retention.py), created or updated; a
    failure is logged, not fatal: the next worker to start tries again."""
    try:
        await ensure_purge_schedule(client, settings)
    except Exception:
        logging.getLogger(__name__).warning("could not set the purge schedule", exc_info=True)


def early_builds(settings: Settings) -> EarlyBuilds | None:
    """Where the outbox loop begins a claimed turn's first build (`Settings.early_build`)."""
    return EarlyBuilds() if settings.early_build else None


async def run_worker(settings: Settings) -> None:
    if settings.database_url is None:
        raise SystemExit("DATABASE_URL is not set (use `parley dev` for the embedded database)")
    # Checked by its socket, not by a `SELECT 1` per checkout (store/db.py): a step takes a
    # session or two, a turn about twenty. A connection the network lost without a word fails
    # its step's statement instead, and the step is retried (activities/failures.py).
    pool = worker_pool(settings)
    engine = create_socket_checked_engine(
        settings.database_url, pool_size=pool["pool_size"], max_overflow=pool["max_overflow"]
    )
    sessions = Database(engine)
    # The SDK's own metrics join the app's on the metrics port; its core logs join ours.
    runtime, sdk_metrics = sdk_runtime(metrics=bool(settings.worker_metrics_port))
    telemetry = telemetry_for(settings, "parley-worker")  # None unless PARLEY_OTLP_ENDPOINT
    client = await connect_temporal(
        settings,
        runtime=runtime,
        interceptors=[telemetry.interceptor] if telemetry is not None else [],
    )
    http = httpx.AsyncClient(verify=httpx_verified())
    early = early_builds(settings)
    worker = build_worker(client, settings, sessions, http, early=early)
    freeze_startup_objects()
    draining = asyncio.create_task(sdk_metrics.drain_forever()) if sdk_metrics else None
    if settings.worker_metrics_port:
        start_http_server(settings.worker_metrics_port, addr=settings.api_host)
    # Posted and queued turns start on it; a LISTEN needs a session (PgBouncer: docs/operations.md).
    bell = OutboxBell(libpq_url(settings.listen_database_url or settings.database_url))
    begin = early.begin if early is not None else None
    sweep = asyncio.create_task(run_outbox(client, sessions, settings, bell, begin_build=begin))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with worker:
        logging.getLogger(__name__).info("worker polling task queue %s", settings.task_queue)
        if not await promote_configured(client, settings):  # new turns start on this build
            logging.getLogger(__name__).warning(
                "build %s was replaced by a newer current version: serving its own turns only",
                build_id(settings),
            )
        await _schedule_purge(client, settings)
        await stop.wait()
    sweep.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sweep
    await bell.close()
    await drain(worker)
    if draining is not None:
        draining.cancel()
    if telemetry is not None:
        await asyncio.to_thread(telemetry.shutdown)  # the last steps' spans go out first
    await http.aclose()
    await engine.dispose()


def serve(settings: Settings) -> NoReturn:
    """Run the worker until SIGTERM or SIGINT and its drain, then leave without finalizing
    the interpreter (`exit_unfinalized`; a rolling restart saw a worker that had drained
    cleanly exit with -6). Everything the worker owns is closed by then."""
    # uvloop, as the API runs under uvicorn: the worker's loop turns over for every statement,
    # heartbeat and task, and the default loop's Python bookkeeping showed in its CPU profile.
    uvloop.run(run_worker(settings))
    exit_unfinalized(0)


def main() -> None:
    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    serve(settings)


if __name__ == "__main__":
    main()
