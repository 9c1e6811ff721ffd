"""The pieces of a Parley stack a test builds for itself: an ASGI app served on a free port,
the API in this event loop, a worker on a task queue of its own, the environment of a Parley
subprocess, and the limits the shared stack lifts. The session's shared stack
(tests/conftest.py) is built from these same pieces."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from temporalio.client import Client

from parley.activities.early_build import EarlyBuilds
from parley.api.main import create_app
from parley.config import Settings
from parley.dispatch.deployment import promote_configured
from parley.dispatch.outbox import Starts, start_forever, sweep_forever
from parley.gateway.base import ModelProvider
from parley.screens import Screen
from parley.store.db import Database, libpq_url
from parley.store.queue import OutboxBell
from parley.tls import httpx_verified
from parley.worker import build_worker, drain, early_builds
from tests.support.client import ParleyClient

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def serve(app: Any) -> AsyncIterator[str]:
    """Run an ASGI app under uvicorn on a free loopback port, in this event loop."""
    port = free_port()
    # The server keeps an idle connection longer than a test's httpx client does (5 s), so the
    # client never reuses one the server is closing at that moment ("Server disconnected
    # without sending a response", after a test's client sat idle about 5 s).
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", timeout_keep_alive=75
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@asynccontextmanager
async def api_in_process(settings: Settings, token: str) -> AsyncIterator[tuple[Any, ParleyClient]]:
    """The API app served in this event loop (so a test can reach the app object too), and
    a client of it with `token`. Yielded once the app listens for the log's rings: a stream
    opened before that reads the log again when the listener comes up (api/streaming.py), a
    round trip that depends on how loaded the machine is, not on the code."""
    app = create_app(settings)
    async with serve(app) as url:
        async with asyncio.timeout(60):
            await app.state.hub.listening.wait()
        client = ParleyClient(url, token)
        try:
            yield app, client
        finally:
            await client.aclose()


# Priya drives most of the suite's turns from one token, faster than any person: the shared
# stack lifts the per-user limits (as the bench does). tests/system/test_limits.py runs the default
# machinery with its own, low limits.
SHARED_STACK_LIMITS: dict[str, Any] = {
    "max_active_turns_per_user": 50,
    "user_requests_per_minute": 10_000,
    "tenant_requests_per_minute": 100_000,
    "max_sessions_per_user_per_day": 100_000,
    "user_daily_messages": 0,
}
# The same, for tests that post through the store directly as the API would.
LIFTED_LIMITS = Settings(database_url="postgresql://unused", **SHARED_STACK_LIMITS).limits


def own_queue(settings: Settings, prefix: str, **update: Any) -> Settings:
    """The session's settings on a task queue of its own, so only the worker a test module
    starts (with its own model, screens or crash behaviour) serves its turns."""
    return settings.model_copy(update={"task_queue": f"{prefix}-{uuid.uuid4().hex[:8]}", **update})


class SteppedClock:
    """`time.monotonic`, plus however far a test moved it forward: a breaker's cooldown
    passes when the test says so instead of after a sleep."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@asynccontextmanager
async def running_worker(
    client: Client,
    settings: Settings,
    sessions: Database,
    provider: ModelProvider,
    screens: tuple[Screen, Screen] | None = None,
    fallback: ModelProvider | None = None,
    breaker_clock: SteppedClock | None = None,
) -> AsyncIterator[None]:
    early = early_builds(settings)  # as `parley worker`: its outbox loop begins first builds
    async with httpx.AsyncClient(verify=httpx_verified()) as http:
        worker = build_worker(
            client,
            settings,
            sessions,
            http,
            provider=provider,
            fallback=fallback,
            screens=screens,
            breaker_clock=breaker_clock or time.monotonic,
            early=early,
        )
        try:
            async with worker:
                # Versioned by default, as `parley worker` is: its version becomes current.
                await promote_configured(client, settings)
                async with starting_posted_turns(client, settings, sessions, early):
                    yield
        finally:
            # As `parley worker` stops: nothing embeds after the stack, and the trace
            # ledger's last spans are written (a test counting rows then finds them all).
            await drain(worker)


@asynccontextmanager
async def starting_posted_turns(
    client: Client, settings: Settings, sessions: Database, early: EarlyBuilds | None = None
) -> AsyncIterator[None]:
    """What `parley worker`'s outbox loop does for a posted turn of its queue: claim it when
    its post rings and start it eagerly (dispatch/outbox.py `start_forever`), listening
    before the block begins."""
    assert settings.database_url is not None
    bell = OutboxBell(libpq_url(settings.database_url))
    await bell.listen()
    starts = Starts(
        client,
        sessions,
        settings.task_queue,
        settings.confirmation_timeout_s,
        settings.has_fallback_model,
        tracing=bool(settings.otlp_endpoint),
        begin_build=early.begin if early is not None else None,
    )
    loop = asyncio.create_task(start_forever(starts, bell))
    try:
        yield
    finally:
        loop.cancel()
        with suppress(asyncio.CancelledError):
            await loop
        await bell.close()


@asynccontextmanager
async def running_outbox(
    client: Client,
    settings: Settings,
    sessions: Database,
    *,
    grace: timedelta = timedelta(hours=1),
    every: timedelta = timedelta(hours=1),
) -> AsyncIterator[None]:
    """The outbox loop `parley worker` runs (dispatch/outbox.py), beside an in-process
    worker: its bell starts a queued turn the moment its session's turn ends. By default its
    periodic sweep waits an hour, so it leaves the other tests' unstarted turns alone; a
    module on a Temporal server of its own sweeps as `parley worker` does."""
    assert settings.database_url is not None
    bell = OutboxBell(libpq_url(settings.database_url))
    loop = asyncio.create_task(
        sweep_forever(
            client,
            sessions,
            task_queue=settings.task_queue,
            grace=grace,
            every=every,
            confirmation_timeout_s=settings.confirmation_timeout_s,
            bell=bell,
            handoff_claim_timeout_s=settings.handoff_claim_timeout_s,
        )
    )
    try:
        yield
    finally:
        loop.cancel()
        with suppress(asyncio.CancelledError):
            await loop
        await bell.close()


@asynccontextmanager
async def serve_api(settings: Settings) -> AsyncIterator[str]:
    """Run the real API app under uvicorn on a free loopback port, in this event loop."""
    async with serve(create_app(settings)) as url:
        yield url


def service_env(settings: Settings, **extra: str) -> dict[str, str]:
    """Environment for a Parley subprocess (worker or API) pointed at the test services."""
    assert settings.database_url is not None
    return {
        **os.environ,
        "DATABASE_URL": settings.database_url,
        "TEMPORAL_ADDRESS": settings.temporal_address,
        "PARLEY_TASK_QUEUE": settings.task_queue,
        "PARLEY_DEMO_TOKEN_DELAY_MS": str(settings.demo_token_delay_ms),
        "PARLEY_NORTHWIND_URL": settings.northwind_url,
        "PARLEY_TOOL_TIMEOUT_S": str(settings.tool_timeout_s),
        "PARLEY_WORKER_METRICS_PORT": "0",
        "PARLEY_WORKER_DEPLOYMENT": settings.worker_deployment,
        "PARLEY_WORKER_BUILD_ID": settings.worker_build_id,
        "PARLEY_MAX_ACTIVE_TURNS_PER_USER": str(settings.max_active_turns_per_user),
        "PARLEY_USER_REQUESTS_PER_MINUTE": str(settings.user_requests_per_minute),
        "PARLEY_TENANT_REQUESTS_PER_MINUTE": str(settings.tenant_requests_per_minute),
        "PARLEY_MAX_SESSIONS_PER_USER_PER_DAY": str(settings.max_sessions_per_user_per_day),
        "PARLEY_USER_DAILY_MESSAGES": str(settings.user_daily_messages),
        "PARLEY_EVAL_CAPTURE_DIR": str(settings.eval_capture_dir),
        "PARLEY_EMBEDDINGS": settings.embeddings,
        **extra,
    }


async def run_cli(
    settings: Settings | None,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 90.0,
) -> subprocess.CompletedProcess[bytes]:
    """`parley ARGS` in a process of its own, pointed at the test services (or given its
    own `env`); awaited, so a worker running in the caller's event loop can serve what the
    command starts."""
    if env is None:
        assert settings is not None
        env = service_env(settings)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "parley.launch.cli",
        *args,
        env=env,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    assert process.returncode is not None
    return subprocess.CompletedProcess(list(args), process.returncode, out, err)


async def parley_cli(settings: Settings, *args: str) -> str:
    """What `parley ARGS` printed, once it succeeded."""
    done = await run_cli(settings, *args)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


def spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, *args], env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=None
    )
