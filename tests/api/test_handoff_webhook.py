"""A hand-off's clock and its webhook (issue 43, acceptance 2 and 4), with the real Temporal
and PostgreSQL: the case's workflow on a worker of this module's own, a receiver on a local
port the worker's egress rules name.

- A receiver that fails twice, then takes it, gets `new` once: three attempts (Temporal's
  retries) of the same body under the same idempotency key, each validly signed; `resolved`
  follows when the agent resolves the case. The delivery log says so.
- Nobody claims within the tenant's timeout (one second here): the customer is told and
  offered an email follow-up, and the webhook gets `unclaimed` once.
- A case opened while the team is away (its business hours, build 2 of the workflow): the
  customer is told when a person is back, once, and the claim clock waits for the hours.
- A receiver on a private address is refused by the egress rules: at save time (422) and at
  delivery time (the log says `refused`, nothing is sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from datetime import time as clock
from typing import Any

import httpx
import pytest_asyncio
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

from parley.activities.handoffs import HandoffActivities
from parley.business_hours import DAYS, BusinessWeek, local_text
from parley.config import Settings
from parley.dispatch.handoffs import start_handoff, tell_handoff
from parley.gateway.demo import DemoModel
from parley.gateway.registry import ProviderPool
from parley.handoffs import AWAY_TEXT, UNCLAIMED_TEXT, HandoffChange, handoff_workflow_id
from parley.store import handoffs
from parley.store.db import Database
from parley.webhooks import verify
from parley.workflows.handoff import HandoffWorkflow
from tests.support.handoffs import Case, new_case
from tests.support.receiver import Receiver, listening
from tests.support.stack import own_queue

DEADLINE_S = 20.0  # a bound on the worker's background work, never a wait


@pytest_asyncio.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, int]]:
    async with listening(Receiver(fails=2)) as port_of:
        yield port_of


async def _until(check: Callable[[], Any]) -> None:
    async with asyncio.timeout(DEADLINE_S):
        while not await check():
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def _running(
    client: Client, settings: Settings, sessions: Database, case: Case, port: int | None
) -> AsyncIterator[WorkflowHandle[Any, Any]]:
    """The case's workflow on a worker of its own, whose egress rules name the receiver's
    port (the deployment's default, `*`, when None): its handle while it runs."""
    allowed = [f"127.0.0.1:{port}"] if port is not None else ["*"]
    mine = own_queue(settings, "handoff", mcp_allowed_hosts=allowed)
    pool = ProviderPool(mine, primary=DemoModel(token_delay_s=0))
    steps = HandoffActivities(sessions=sessions, providers=pool, settings=mine)
    async with Worker(
        client, task_queue=mine.task_queue, workflows=[HandoffWorkflow], activities=steps.steps()
    ):
        await start_handoff(client, case.inp, task_queue=mine.task_queue)
        yield client.get_workflow_handle(
            handoff_workflow_id(session_id=case.inp.session_id, handoff_id=case.inp.handoff_id)
        )


async def _tell(client: Client, case: Case, status: str) -> None:
    change = HandoffChange(case.inp.handoff_id, status)
    await tell_handoff(client, session_id=case.inp.session_id, change=change)


async def _delivery_log(api_url: str, case: Case) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=api_url, timeout=30) as http:
        answer = await http.get(
            f"/v1/admin/tenants/{case.tenant.tenant_id}/webhook",
            headers={"Authorization": f"Bearer {case.tenant.token}"},
        )
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def test_a_receiver_that_fails_twice_gets_each_event_once_signed(
    temporal_client: Client,
    settings: Settings,
    sessions: Database,
    api_url: str,
    receiver: tuple[Receiver, int],
) -> None:
    heard, port = receiver
    case = await new_case(sessions, f"http://127.0.0.1:{port}/hooks", claim_timeout_s=600)
    async with _running(temporal_client, settings, sessions, case, port) as handle:
        await _until(lambda: _kept(heard, "new"))
        await _tell(temporal_client, case, "claimed")
        await _tell(temporal_client, case, "resolved")
        async with asyncio.timeout(DEADLINE_S):
            await handle.result()
    assert heard.events() == ["new", "resolved"]
    new = [(h, b) for h, b in heard.requests if json.loads(b)["event"] == "new"]
    assert len(new) == 3  # refused twice by the receiver, then taken
    assert len({h["idempotency-key"] for h, _ in new}) == 1 and len({b for _, b in new}) == 1
    log = await _delivery_log(api_url, case)
    now = int(time.time())
    assert all(verify(log["secret"], h["parley-signature"], b, now=now) for h, b in heard.requests)
    assert not verify("another-secret", new[0][0]["parley-signature"], new[0][1], now=now)
    payload = json.loads(new[0][1])
    assert payload["handoff_id"] == case.inp.handoff_id and "8472" not in payload["reason"]
    assert payload["summary"]  # the case summary, for the team's tools
    delivered = {d["event"]: d for d in log["deliveries"]}
    assert delivered["new"]["status"] == "delivered" and delivered["new"]["attempts"] == 3
    assert delivered["new"]["id"] == new[0][0]["idempotency-key"]


async def test_nobody_in_time_tells_the_customer_and_the_webhook_once(
    temporal_client: Client,
    settings: Settings,
    sessions: Database,
    receiver: tuple[Receiver, int],
) -> None:
    heard, port = receiver
    heard.fails = 0
    case = await new_case(sessions, f"http://127.0.0.1:{port}/hooks", claim_timeout_s=1)
    async with _running(temporal_client, settings, sessions, case, port) as handle:
        await _until(lambda: _kept(heard, "unclaimed"))
        await _tell(temporal_client, case, "claimed")
        await _tell(temporal_client, case, "handed_back")
        async with asyncio.timeout(DEADLINE_S):
            await handle.result()
    assert sorted(heard.events()) == ["new", "unclaimed"]  # handed back: no `resolved`
    async with sessions() as db:
        said = await handoffs.conversation(db, session_id=case.inp.session_id)
        stored = await handoffs.get_case(db, handoff_id=case.inp.handoff_id)
    assert [m.text for m in said].count(UNCLAIMED_TEXT) == 1
    assert "email" in UNCLAIMED_TEXT and stored is not None and stored.unclaimed_at is not None


async def test_opened_while_the_team_is_away_the_customer_hears_when_a_person_is_back(
    temporal_client: Client,
    settings: Settings,
    sessions: Database,
    receiver: tuple[Receiver, int],
) -> None:
    heard, port = receiver
    heard.fails = 0
    case = await new_case(sessions, f"http://127.0.0.1:{port}/hooks", claim_timeout_s=1)
    # The team works one day, the day after tomorrow: away now, whatever the time of the run.
    day = (datetime.now(UTC) + timedelta(days=2)).date()
    week = BusinessWeek("UTC", {DAYS[day.weekday()]: "09:00-17:00"})
    case.inp = replace(case.inp, business_hours=week)
    told = AWAY_TEXT.format(back=local_text(week, datetime.combine(day, clock(9), tzinfo=UTC)))

    async def said() -> list[str]:
        async with sessions() as db:
            messages = await handoffs.conversation(db, session_id=case.inp.session_id)
        return [m.text for m in messages if m.text == told]

    async with _running(temporal_client, settings, sessions, case, port) as handle:
        await _until(said)
        await _until(lambda: _kept(heard, "new"))  # the team's tools hear of it at once
        await _tell(temporal_client, case, "claimed")
        await _tell(temporal_client, case, "handed_back")
        async with asyncio.timeout(DEADLINE_S):
            await handle.result()
    # Its one second of claim time is one second of open hours, days away: never unclaimed.
    assert heard.events() == ["new"]
    assert len(await said()) == 1 and "keeps its place" in told


async def test_a_receiver_on_a_private_address_is_refused(
    temporal_client: Client,
    settings: Settings,
    sessions: Database,
    api_url: str,
    receiver: tuple[Receiver, int],
) -> None:
    heard, port = receiver
    case = await new_case(sessions, f"http://127.0.0.1:{port}/hooks", claim_timeout_s=600)
    # At save time: the deployment's rules (`*`: public addresses only) refuse it.
    async with httpx.AsyncClient(base_url=api_url, timeout=30) as http:
        saved = await http.put(
            f"/v1/admin/tenants/{case.tenant.tenant_id}/config",
            json={"handoff_webhook": {"url": f"http://127.0.0.1:{port}/hooks"}},
            headers={"Authorization": f"Bearer {case.tenant.token}"},
        )
    assert saved.status_code == 422, saved.text
    assert saved.json()["error"]["code"] == "url_not_allowed"
    # At delivery time (a name that moved, a config stored before the rule): not sent.
    async with _running(temporal_client, settings, sessions, case, None) as handle:
        await _until(lambda: _refused(api_url, case))
        await _tell(temporal_client, case, "claimed")
        await _tell(temporal_client, case, "handed_back")
        async with asyncio.timeout(DEADLINE_S):
            assert (await handle.result())["status"] == "handed_back"  # the case went on
    assert heard.requests == []


async def _kept(heard: Receiver, event: str) -> bool:
    return event in heard.events()


async def _refused(api_url: str, case: Case) -> bool:
    log = await _delivery_log(api_url, case)
    return any(d["status"] == "refused" for d in log["deliveries"])
