"""Issue 43, acceptance 2: a hand-off's wait for a claim survives its worker killed with
SIGKILL. The case's workflow runs on real worker processes of this module's own queue; the
first is killed while the case waits (its summary written, the timer running), a second takes
over: when the tenant's timeout (seconds here) passes, the customer is told once and offered
an email follow-up, and the team's webhook gets `unclaimed` once; a late claim still ends the
case."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from temporalio.client import Client

from parley.config import Settings
from parley.dispatch.handoffs import start_handoff, tell_handoff
from parley.handoffs import UNCLAIMED_TEXT, HandoffChange, handoff_workflow_id
from parley.store import handoffs
from parley.store.db import Database
from tests.support.handoffs import new_case
from tests.support.processes import Workers
from tests.support.receiver import Receiver, listening
from tests.support.stack import own_queue
from tests.support.toolkit import eventually

CLAIM_TIMEOUT_S = 4.0


@pytest_asyncio.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, int]]:
    async with listening(Receiver()) as port_of:
        yield port_of


@pytest.fixture
def workers(settings: Settings, receiver: tuple[Receiver, int]) -> Iterator[Workers]:
    _, port = receiver
    pool = Workers(own_queue(settings, "handoffcrash"))
    pool.env["PARLEY_MCP_ALLOWED_HOSTS"] = f'["127.0.0.1:{port}"]'
    yield pool
    pool.stop_all()


@pytest.mark.timeout(180)
async def test_a_worker_killed_during_the_wait_changes_nothing(
    settings: Settings,
    sessions: Database,
    temporal_client: Client,
    workers: Workers,
    receiver: tuple[Receiver, int],
) -> None:
    heard, port = receiver
    case = await new_case(
        sessions, f"http://127.0.0.1:{port}/hooks", claim_timeout_s=CLAIM_TIMEOUT_S
    )
    queue = workers.env["PARLEY_TASK_QUEUE"]
    doomed = workers.start()
    await start_handoff(temporal_client, case.inp, task_queue=queue)

    async def waiting() -> bool:  # the summary written and `new` delivered: the timer runs
        async with sessions() as db:
            row = await handoffs.get_case(db, handoff_id=case.inp.handoff_id)
        return row is not None and row.summary is not None and "new" in heard.events()

    await eventually(waiting, timeout=90, what="the case waits for a claim", every=0.1)
    doomed.kill()  # SIGKILL, mid-wait
    assert doomed.wait(10) == -9
    workers.start()

    async def told() -> bool:
        return "unclaimed" in heard.events()

    await eventually(told, timeout=90, what="the customer is told nobody came", every=0.1)
    for status in ("claimed", "handed_back"):
        change = HandoffChange(case.inp.handoff_id, status)
        await tell_handoff(temporal_client, session_id=case.inp.session_id, change=change)
    handle = temporal_client.get_workflow_handle(
        handoff_workflow_id(session_id=case.inp.session_id, handoff_id=case.inp.handoff_id)
    )
    async with asyncio.timeout(60):
        assert (await handle.result())["status"] == "handed_back"
    assert sorted(heard.events()) == ["new", "unclaimed"]
    assert sum(b'"unclaimed"' in body for _, body in heard.requests) == 1  # sent once
    async with sessions() as db:
        said = await handoffs.conversation(db, session_id=case.inp.session_id)
    assert [m.text for m in said].count(UNCLAIMED_TEXT) == 1
