"""The system tier: Parley as a whole system. Each module builds what it tests on: a worker and
API of its own on a fresh task queue (own model, screens, limits or crash behaviour), a fake
model provider over real HTTP, real processes it starts, kills and restarts, or services it
takes away (the database, Temporal). The session's database and dev server
(tests/conftest.py) are shared with the other tiers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from temporalio.client import Client

from parley.config import Settings
from parley.store import tenants
from parley.store.db import (
    Database,
    create_socket_checked_engine,
    on_statement_sent,
    on_transaction_sent,
)
from tests.support.client import ParleyClient
from tests.support.counting import Counted
from tests.support.models import ControlledModel
from tests.support.toolkit import Stack, own_stack

# The stream tests' stack (tests/system/test_stream_control.py, test_review_regressions.py).
StreamStack = Stack[ControlledModel]

# Well past anything the flood test can take: within it, a stalled reader is never dropped
# (which would leave the flooding turn unwatched, and cancelled after the grace).
SEND_TIMEOUT_S = 120.0


@pytest_asyncio.fixture(scope="module")
async def stream_stack(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
) -> AsyncIterator[StreamStack]:
    """Its own task queue, a model the tests steer, and a short reconnect grace."""
    model = ControlledModel(token_delay_s=0.08)
    async with own_stack(
        temporal_client,
        settings,
        sessions,
        model,
        prefix="streams",
        stream_grace_s=1.5,
        stream_send_timeout_s=SEND_TIMEOUT_S,
    ) as stack:
        yield stack


@pytest_asyncio.fixture
async def stream_client(
    stream_stack: StreamStack, tokens: dict[str, str]
) -> AsyncIterator[ParleyClient]:
    stream_stack.model.reply = lambda request: None
    stream_stack.model.fail_after = lambda request: None
    c = ParleyClient(stream_stack.url, tokens["priya"])
    yield c
    await c.aclose()


@pytest_asyncio.fixture
async def specialists_on(sessions: Database) -> AsyncIterator[None]:
    """Tenant `northwind` allows specialists; its configuration is put back afterwards."""
    async with sessions() as db:
        before = await tenants.tenant_config(db, tenant_id="northwind")
        config = before.model_copy(update={"specialists": True})
        await tenants.set_config(db, tenant_id="northwind", config=config)
        await db.commit()
    try:
        yield
    finally:
        async with sessions() as db:
            await tenants.set_config(db, tenant_id="northwind", config=before)
            await db.commit()


@pytest_asyncio.fixture
async def counted(database_url: str) -> AsyncIterator[Counted]:
    """An engine for a worker of the test's own, every statement it sends recorded."""
    engine = create_socket_checked_engine(database_url)
    recorder = Counted(Database(engine))
    on_statement_sent(engine, lambda sql: recorder.sent.append(sql.strip()))
    on_transaction_sent(engine, recorder.transactions.append)
    yield recorder
    await engine.dispose()
