"""Session-wide real services: one embedded PostgreSQL, one Temporal dev server, one worker,
one API server, each started the first time a test asks for it. Tests that need their own
worker or API (tests/system) build them from the same pieces (tests/support/stack.py) on a
fresh task queue. Each tier's own fixtures are in its conftest.py."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import pytest_asyncio
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from parley.config import Settings
from parley.contracts import SEARCH_ATTRIBUTES
from parley.demo_backend.app import create_app as create_backend
from parley.dispatch.deployment import build_id
from parley.gateway.demo import DemoModel
from parley.gateway.minilm import EmbeddingsUnavailable, MiniLMEmbedder
from parley.launch.dev import EAGER_ACTIVITIES, EAGER_WORKFLOW_START, PROMPT_TIMERS, temporal_cli
from parley.launch.knowledge import load_library, read_library
from parley.store.db import Database, create_socket_checked_engine
from parley.store.embedded import EmbeddedPostgres
from parley.store.identity import create_token, seed_demo
from parley.store.migrate import upgrade
from parley.tls import httpx_verified
from tests.support.client import ParleyClient
from tests.support.schedule import longest_first
from tests.support.stack import SHARED_STACK_LIMITS, SteppedClock, running_worker, serve, serve_api


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


# The server records how far its transfer and visibility queues got every 30 s by default,
# and deleting a closed execution (and then its visibility record) waits until that record
# shows the execution's close tasks done: an erased turn's workflow lingered up to a minute.
# Recorded every second here, the deletion is the same and lands within seconds.
QUICK_QUEUE_CHECKPOINTS = (
    "--dynamic-config-value",
    'history.transferProcessorUpdateAckInterval="1s"',
    "--dynamic-config-value",
    'history.visibilityProcessorUpdateAckInterval="1s"',
)


@pytest_asyncio.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(),
        search_attributes=SEARCH_ATTRIBUTES,
        dev_server_log_level="error",
        dev_server_extra_args=[
            *EAGER_ACTIVITIES,
            *EAGER_WORKFLOW_START,
            *PROMPT_TIMERS,
            *QUICK_QUEUE_CHECKPOINTS,
        ],
    )
    yield env
    await env.shutdown()


@pytest.fixture(scope="session")
def temporal_address(temporal_env: WorkflowEnvironment) -> str:
    return str(temporal_env.client.service_client.config.target_host)


@pytest.fixture(scope="session")
def temporal_client(temporal_env: WorkflowEnvironment) -> Client:
    return temporal_env.client


@pytest_asyncio.fixture(scope="session")
async def northwind_url() -> AsyncIterator[str]:
    """The Northwind demo backend over real HTTP (orders, refunds, the email service)."""
    async with serve(create_backend()) as url:
        yield url


@pytest_asyncio.fixture
async def northwind(northwind_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client for the backend's inspection and fault endpoints; faults are cleared after."""
    async with httpx.AsyncClient(base_url=northwind_url, verify=httpx_verified()) as client:
        yield client
        await client.delete("/faults")
        await client.put("/clock", json={"today": "2026-10-28"})


@pytest.fixture(scope="session")
def settings(
    database_url: str,
    temporal_address: str,
    northwind_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Settings:
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
        # Captured eval drafts, which erasures look for, in the session's own folder.
        eval_capture_dir=tmp_path_factory.mktemp("captured"),
        # Read once: a commit made while the suite runs must not give the workers it starts
        # later another build (whose promotion the server would refuse: it would strand the
        # session version's task queues).
        worker_build_id=build_id(Settings(database_url="postgresql://unused")),
        # Recall by meaning (on by default) where a test asks for it (tests/system/
        # test_context_cost.py, tests/api/test_recall.py, `make run`'s own test): elsewhere its
        # background embedding of every session's messages is CPU the suite's turns wait on.
        embeddings="",
        **SHARED_STACK_LIMITS,
    )


@pytest_asyncio.fixture(scope="session")
async def sessions(database_url: str) -> AsyncIterator[Database]:
    engine = create_socket_checked_engine(database_url)
    factory = Database(engine)
    async with factory() as db:
        await seed_demo(db)
        await load_library(db, read_library())
        await db.commit()
    yield factory
    await engine.dispose()


@pytest.fixture(scope="session")
def breaker_clock() -> SteppedClock:
    """The clock of the session worker's circuit breaker."""
    return SteppedClock()


@pytest_asyncio.fixture(scope="session")
async def worker(
    temporal_client: Client,
    settings: Settings,
    sessions: Database,
    breaker_clock: SteppedClock,
) -> AsyncIterator[DemoModel]:
    """The session's worker; yields its demo model so tests can read its token counter."""
    model = DemoModel(token_delay_s=settings.demo_token_delay_ms / 1000)
    async with running_worker(
        temporal_client, settings, sessions, model, breaker_clock=breaker_clock
    ):
        yield model


@pytest_asyncio.fixture(scope="session")
async def api_url(settings: Settings, worker: DemoModel) -> AsyncIterator[str]:
    async with serve_api(settings) as url:
        yield url


@pytest_asyncio.fixture(scope="session")
async def tokens(sessions: Database) -> dict[str, str]:
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


# `make test-fast` runs these tiers; none of them may wait for the database (and so for the
# session's worker or API). The workflow tier may use the dev server where the time-skipping
# server cannot stand in (tests/workflow/test_workflow_lifecycle.py).
FAST_TIERS = ("unit", "workflow", "replay")


@pytest.fixture(scope="session")
def minilm() -> MiniLMEmbedder:
    """The local MiniLM that recall by meaning runs. `make test` installs it (`make
    embeddings`), so its absence fails the tests that need it rather than skipping them:
    recall by meaning would otherwise go untested without a word."""
    try:
        return MiniLMEmbedder()
    except EmbeddingsUnavailable as exc:
        pytest.fail(f"recall by meaning needs the embeddings extra: run `make embeddings` ({exc})")


def pytest_configure(config: pytest.Config) -> None:
    # The files go to the test processes in the order collected, longest first (below), not
    # in pytest-xdist's order by number of tests.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    # What Parley keeps between processes (the encoder's graph: gateway/encoder_cache.py)
    # goes under the checkout's git-ignored .data/, not the runner's home: each checkout's
    # suite starts from its own cache, the spawned workers and `parley dev` stacks share it.
    os.environ.setdefault("PARLEY_CACHE_DIR", str(config.rootpath / ".data" / "test-cache"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    longest_first(items)
    slow = [
        item.nodeid
        for item in items
        if item.nodeid.split("/")[1:2]
        and item.nodeid.split("/")[1] in FAST_TIERS
        and "database_url" in getattr(item, "fixturenames", ())
    ]
    if slow:
        raise pytest.UsageError(
            f"tests in the fast tiers {FAST_TIERS} need the session's database; move them to "
            f"tests/api or tests/system: {slow}"
        )
