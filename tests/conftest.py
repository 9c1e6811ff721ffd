"""Session-wide real services: one embedded PostgreSQL, one Temporal dev server, one worker,
one API server. Tests that need their own worker or API (crash tests) build them from the
same pieces on a fresh task queue."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import uvicorn
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from api.main import create_app
from demo_backend.app import create_app as create_backend
from dispatch.deployment import build_id, promote_configured
from gateway.base import ModelProvider
from gateway.demo import DemoModel
from launch.dev import EAGER_ACTIVITIES, EAGER_WORKFLOW_START, temporal_cli
from launch.knowledge import load_library, read_library
from parley.config import Settings
from parley.contracts import SEARCH_ATTRIBUTES
from parley.screens import Screen
from store.db import create_socket_checked_engine, session_factory
from store.embedded import EmbeddedPostgres
from store.identity import create_token, seed_demo
from store.migrate import upgrade
from tests.client import ParleyClient
from worker import build_worker

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("PARLEY_TEST_DATABASE_URL")
    if external:
        upgrade(external)
        yield external
        return
    pg = EmbeddedPostgres(tmp_path_factory.mktemp("pg") / "data")
    url = pg.start()
    upgrade(url)
    yield url
    pg.stop()


@pytest_asyncio.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(),
        search_attributes=SEARCH_ATTRIBUTES,
        dev_server_log_level="error",
        dev_server_extra_args=[*EAGER_ACTIVITIES, *EAGER_WORKFLOW_START],
    )
    yield env
    await env.shutdown()


@pytest.fixture(scope="session")
def temporal_address(temporal_env: WorkflowEnvironment) -> str:
    return str(temporal_env.client.service_client.config.target_host)


@pytest.fixture(scope="session")
def temporal_client(temporal_env: WorkflowEnvironment) -> Client:
    return temporal_env.client


@asynccontextmanager
async def serve(app: Any) -> AsyncIterator[str]:
    """Run an ASGI app under uvicorn on a free loopback port, in this event loop."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
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
    a client of it with `token`."""
    app = create_app(settings)
    async with serve(app) as url:
        client = ParleyClient(url, token)
        try:
            yield app, client
        finally:
            await client.aclose()


@pytest_asyncio.fixture(scope="session")
async def northwind_url() -> AsyncIterator[str]:
    """The Northwind demo backend over real HTTP (orders, refunds, the email service)."""
    async with serve(create_backend()) as url:
        yield url


@pytest_asyncio.fixture
async def northwind(northwind_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client for the backend's inspection and fault endpoints; faults are cleared after."""
    async with httpx.AsyncClient(base_url=northwind_url) as client:
        yield client
        await client.delete("/faults")
        await client.put("/clock", json={"today": "2026-10-28"})


@pytest.fixture(scope="session")
def settings(database_url: str, temporal_address: str, northwind_url: str) -> Settings:
    return Settings(
        database_url=database_url,
        temporal_address=temporal_address,
        northwind_url=northwind_url,
        task_queue=f"test-{uuid.uuid4().hex[:8]}",
        demo_token_delay_ms=5,
        outbox_grace_s=1.0,
        tool_timeout_s=2.0,
        # Long, so an open breaker stays open however slow the machine is; the tests that
        # need the cooldown to pass move the `breaker_clock` forward.
        breaker_cooldown_s=60.0,
        # Read once: a commit made while the suite runs must not give the workers it starts
        # later another build (whose promotion the server would refuse: it would strand the
        # session version's task queues).
        worker_build_id=build_id(Settings(database_url="postgresql://unused")),
        **SHARED_STACK_LIMITS,
    )


# Priya drives most of the suite's turns from one token, faster than any person: the shared
# stack lifts the per-user limits (as the bench does). tests/test_limits.py runs the default
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


@pytest_asyncio.fixture(scope="session")
async def sessions(database_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = create_socket_checked_engine(database_url)
    factory = session_factory(engine)
    async with factory() as db:
        await seed_demo(db)
        await load_library(db, read_library())
        await db.commit()
    yield factory
    await engine.dispose()


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
    sessions: async_sessionmaker[AsyncSession],
    provider: ModelProvider,
    screens: tuple[Screen, Screen] | None = None,
    fallback: ModelProvider | None = None,
    breaker_clock: SteppedClock | None = None,
) -> AsyncIterator[None]:
    async with httpx.AsyncClient() as http:
        async with build_worker(
            client,
            settings,
            sessions,
            http,
            provider=provider,
            fallback=fallback,
            screens=screens,
            breaker_clock=breaker_clock or time.monotonic,
        ):
            # Versioned by default, as `parley worker` is: its version becomes current.
            await promote_configured(client, settings)
            yield


@pytest.fixture(scope="session")
def breaker_clock() -> SteppedClock:
    """The clock of the session worker's circuit breaker."""
    return SteppedClock()


@pytest_asyncio.fixture(scope="session")
async def worker(
    temporal_client: Client,
    settings: Settings,
    sessions: async_sessionmaker[AsyncSession],
    breaker_clock: SteppedClock,
) -> AsyncIterator[DemoModel]:
    """The session's worker; yields its demo model so tests can read its token counter."""
    model = DemoModel(token_delay_s=settings.demo_token_delay_ms / 1000)
    async with running_worker(
        temporal_client, settings, sessions, model, breaker_clock=breaker_clock
    ):
        yield model


@asynccontextmanager
async def serve_api(settings: Settings) -> AsyncIterator[str]:
    """Run the real API app under uvicorn on a free loopback port, in this event loop."""
    async with serve(create_app(settings)) as url:
        yield url


@pytest_asyncio.fixture(scope="session")
async def api_url(settings: Settings, worker: DemoModel) -> AsyncIterator[str]:
    async with serve_api(settings) as url:
        yield url


@pytest_asyncio.fixture(scope="session")
async def tokens(sessions: async_sessionmaker[AsyncSession]) -> dict[str, str]:
    async with sessions() as db:
        minted = {
            "priya": await create_token(db, tenant_id="northwind", user_id="cust_2291"),
            "marco": await create_token(db, tenant_id="northwind", user_id="cust_3301"),
            "ines": await create_token(db, tenant_id="southwind", user_id="cust_9001"),
            "admin": await create_token(db, tenant_id="northwind", user_id="ops_admin"),
        }
        await db.commit()
        return minted


@pytest_asyncio.fixture
async def priya(api_url: str, tokens: dict[str, str]) -> AsyncIterator[ParleyClient]:
    client = ParleyClient(api_url, tokens["priya"])
    yield client
    await client.aclose()


@pytest_asyncio.fixture
async def marco(api_url: str, tokens: dict[str, str]) -> AsyncIterator[ParleyClient]:
    client = ParleyClient(api_url, tokens["marco"])
    yield client
    await client.aclose()


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
        **extra,
    }


def spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, *args], env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=None
    )
