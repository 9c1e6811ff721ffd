"""Issue 28, acceptance 3: an erasure whose worker is killed (`SIGKILL`) between two
committed batches resumes on a new worker and ends with the same receipt; running it again
is harmless.

The user's rows are made by real turns (an in-process worker and API on a queue of their
own); the erasure runs on another queue, served by real worker processes: the first kills
itself at the fault point `erasure_batch` (PARLEY_FAULT_KILL_AT) after its first committed
batch, the second has no fault and finishes. Batches of three rows, so tables take several.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from temporalio.client import Client

from parley.config import Settings
from parley.dispatch.erasure import start_erasure
from parley.erasure import ERASURE_WORKFLOW, ErasureInput, ErasureReceipt, ErasureScope
from parley.gateway.demo import DemoModel
from parley.store.db import Database
from parley.store.lifecycle import erasure, erasure_catalogue
from parley.store.lifecycle.erasure_catalogue import Subject
from parley.store.models import Erasure
from tests.support.canary import scan
from tests.support.client import ParleyClient
from tests.support.erasure import TENANT, add_user, done_turn, new_customers
from tests.support.orm import orm
from tests.support.processes import Workers
from tests.support.stack import own_queue
from tests.support.toolkit import eventually, own_stack


@pytest.fixture
def workers(settings: Settings) -> Iterator[Workers]:
    pool = Workers(own_queue(settings, "erasecrash"))
    pool.env["PARLEY_ERASURE_BATCH_ROWS"] = "3"
    yield pool
    pool.stop_all()


async def rows_of(sessions: Database, subject: Subject) -> dict[str, int]:
    async with sessions() as db:
        tables = await erasure_catalogue.tables_for(db, scope=subject.scope)
        return await erasure_catalogue.remaining(db, subject=subject, tables=tables)


async def counts_of(sessions: Database, erasure_id: str) -> dict[str, int]:
    async with orm(sessions) as db:
        row = await db.get(Erasure, erasure_id)
        assert row is not None
        await db.refresh(row)
        return dict(row.counts)


@pytest.mark.timeout(300)
async def test_an_erasure_killed_between_batches_resumes_and_running_it_again_is_harmless(
    settings: Settings,
    sessions: Database,
    temporal_client: Client,
    database_url: str,
    workers: Workers,
) -> None:
    [who] = new_customers(1)
    canary = who.canaries["msg"]
    async with own_stack(
        temporal_client, settings, sessions, DemoModel(token_delay_s=0), prefix="erasedata"
    ) as stack:
        client = ParleyClient(stack.url, await add_user(sessions, who))
        try:
            for _ in range(2):
                sid = await client.new_session()
                for n in range(3):
                    await done_turn(client, sid, f"Hello, tell me about yourself {n} {canary}")
        finally:
            await client.aclose()
    subject = Subject(ErasureScope.user, TENANT, who.user_id)
    expected = await rows_of(sessions, subject)
    assert expected["turn_events"] > 3 and expected["messages"] > 3, expected
    assert (await scan(database_url, [canary]))[canary]

    async with sessions() as db:
        row = await erasure.request_erasure(
            db, key=settings.erasure_receipt_key, tenant_id=TENANT, user_id=who.user_id
        )
        await db.commit()
    queue = workers.env["PARLEY_TASK_QUEUE"]
    workers.env["PARLEY_FAULT_KILL_AT"] = "erasure_batch"
    doomed = workers.start()
    handle = await start_erasure(
        temporal_client, sessions, ErasureInput(erasure_id=row.id), task_queue=queue
    )

    async def killed() -> int | None:
        return doomed.poll()

    assert await eventually(killed, timeout=90, what="the worker kills itself") == -9
    partial = await counts_of(sessions, row.id)
    assert 0 < sum(partial.values()) < sum(expected.values()), partial

    del workers.env["PARLEY_FAULT_KILL_AT"]
    workers.start()
    result = await handle.result(rpc_timeout=None)
    assert result.counts == expected
    assert await counts_of(sessions, row.id) == expected
    assert await rows_of(sessions, subject) == {}
    assert (await scan(database_url, [canary]))[canary] == {}

    # The same erasure run again (another run of its workflow): nothing more to delete, the
    # same receipt.
    again = await temporal_client.execute_workflow(
        ERASURE_WORKFLOW,
        ErasureInput(erasure_id=row.id),
        id=f"erasure-again-{uuid.uuid4().hex[:8]}",
        task_queue=queue,
        result_type=ErasureReceipt,
    )
    assert again.counts == expected
    # A new erasure of the user, now gone: a receipt of nothing.
    async with sessions() as db:
        second = await erasure.request_erasure(
            db, key=settings.erasure_receipt_key, tenant_id=TENANT, user_id=who.user_id
        )
        await db.commit()
    handle = await start_erasure(
        temporal_client, sessions, ErasureInput(erasure_id=second.id), task_queue=queue
    )
    assert (await handle.result()).counts == {}
