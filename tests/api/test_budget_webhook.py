"""Budgets tell the tenant's webhook (issue 46), with the real Temporal and PostgreSQL and a
receiver on a local port the egress rules name:

- a soft threshold crossed is delivered by the sweep's step, once per budget and period: a
  receiver that fails the first attempt gets the same signed body under the same idempotency
  key on the next sweep, and nothing after it took it;
- a user's erasure takes the notices delivered about them (their payload names the user);
- the operator's approval asked for (workflows/budget_approval.py, on a worker of this
  module's own) is delivered as a `budget` event too, once, and the run ends on the decision.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from decimal import Decimal

import pytest_asyncio
from sqlalchemy import select
from temporalio.client import Client
from temporalio.worker import Worker

from parley.activities.budget_approvals import BudgetApprovalActivities
from parley.activities.webhooks import WebhookSender
from parley.budget_approvals import BudgetApprovalOutcome, approval_id
from parley.config import Settings
from parley.costs import BudgetTake
from parley.dispatch.budgets import deliver_notices, start_budget_approval, tell_budget_approval
from parley.egress import Allowlist
from parley.erasure import ErasureScope
from parley.gateway.resolver import system_resolver
from parley.store import budgets, tenants, webhooks
from parley.store.db import Database, connect
from parley.store.lifecycle.erasure_catalogue import Subject, delete_batch
from parley.store.models import BudgetNotice
from parley.tenancy import BudgetConfig, TenantConfig
from parley.webhooks import HandoffWebhookConfig, verify
from parley.workflows.budget_approval import BudgetApprovalWorkflow
from tests.support.orm import orm
from tests.support.receiver import Receiver, listening
from tests.support.stack import own_queue
from tests.support.tenants import AdminTenant, new_admin_tenant

DEADLINE_S = 20.0  # a bound on the worker's background work, never a wait


@pytest_asyncio.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, int]]:
    async with listening(Receiver(fails=1)) as port_of:
        yield port_of


async def _hooked_tenant(sessions: Database, port: int) -> AdminTenant:
    """A tenant of the test's own with a monthly budget and its webhook on the receiver
    (stored as the API would, past its egress check)."""
    made = await new_admin_tenant(sessions, prefix="bgthook")
    config = TenantConfig(
        handoff_webhook=HandoffWebhookConfig(url=f"http://127.0.0.1:{port}/hooks"),
        budgets=BudgetConfig(monthly_usd="1"),
    )
    async with sessions() as db:
        await tenants.set_config(db, tenant_id=made.tenant_id, config=config)
        await db.commit()
    return made


async def _secret(sessions: Database, tenant_id: str) -> str:
    async with sessions() as db:
        secret = await webhooks.tenant_secret(db, tenant_id=tenant_id)
        await db.commit()
    assert secret is not None
    return secret


async def test_a_soft_threshold_reaches_the_webhook_once(
    sessions: Database, receiver: tuple[Receiver, int]
) -> None:
    heard, port = receiver
    made = await _hooked_tenant(sessions, port)
    subject = f"tenant:{made.tenant_id}"
    month = datetime.now(UTC).date().replace(day=1)
    takes = [BudgetTake(subject, "month", month, Decimal("1"))]
    async with connect(sessions) as db:  # a call settles past 80% of the month
        assert (
            await budgets.reserve(
                db, call_id=f"c_{made.tenant_id}", takes=takes, amount=Decimal("1")
            )
            == []
        )
        crossed = await budgets.settle(
            db, call_id=f"c_{made.tenant_id}", cost=Decimal("0.9"), soft_share=Decimal("0.8")
        )
    assert len(crossed) == 1

    sender = WebhookSender(
        sessions=sessions, allowlist=Allowlist.parse([f"127.0.0.1:{port}"]), resolve=system_resolver
    )
    # Three sweeps: the receiver fails the first attempt, takes the second; the third has
    # nothing left to send.
    taken = [await deliver_notices(sessions, sender) for _ in range(3)]
    ours = [(h, b) for h, b in heard.requests if json.loads(b)["tenant_id"] == made.tenant_id]
    assert len(ours) == 2 and sum(taken) >= 1
    assert len({h["idempotency-key"] for h, _ in ours}) == 1 and len({b for _, b in ours}) == 1
    headers, body = ours[-1]
    assert headers["parley-event"] == "budget"
    secret = await _secret(sessions, made.tenant_id)
    assert verify(secret, headers["parley-signature"], body, now=int(time.time()))
    payload = json.loads(body)
    assert payload["kind"] == "soft_threshold" and payload["subject"] == subject
    assert (payload["period"], payload["spent_usd"]) == ("month", "0.9000000000")
    async with orm(sessions) as db:
        notice = await db.scalar(select(BudgetNotice).where(BudgetNotice.subject == subject))
    assert notice is not None and notice.delivered_at is not None
    async with sessions() as db:
        log = await webhooks.deliveries(db, tenant_id=made.tenant_id)
    assert [(d.event, d.status, d.attempts, d.handoff_id) for d in log] == [
        ("budget", "delivered", 2, None)
    ]


async def test_the_approval_asked_reaches_the_webhook(
    temporal_client: Client,
    settings: Settings,
    sessions: Database,
    receiver: tuple[Receiver, int],
) -> None:
    heard, port = receiver
    made = await _hooked_tenant(sessions, port)
    month = datetime.now(UTC).date().replace(day=1)
    wanted = approval_id(tenant_id=made.tenant_id, period_start=month)
    mine = own_queue(settings, "budget", mcp_allowed_hosts=[f"127.0.0.1:{port}"])
    steps = BudgetApprovalActivities(sessions=sessions, settings=mine)
    async with Worker(
        temporal_client,
        task_queue=mine.task_queue,
        workflows=[BudgetApprovalWorkflow],
        activities=steps.steps(),
    ):
        async with connect(sessions) as db:
            asked = await budgets.ask_approval(
                db, approval_id=wanted, tenant_id=made.tenant_id, period_start=month, timeout_s=600
            )
        assert asked is not None
        await start_budget_approval(temporal_client, sessions, asked, task_queue=mine.task_queue)
        async with asyncio.timeout(DEADLINE_S):
            while not heard.kept:  # refused once by the receiver, then retried by Temporal
                await heard.heard.wait()
                heard.heard.clear()
        async with connect(sessions) as db:
            decided = await budgets.decide(
                db, approval_id=wanted, status="approved", by=made.admin_id, limit_usd=None
            )
        assert decided is not None
        await tell_budget_approval(temporal_client, decided)
        handle = temporal_client.get_workflow_handle(wanted, result_type=BudgetApprovalOutcome)
        async with asyncio.timeout(DEADLINE_S):
            ended = await handle.result()
    assert (ended.status, ended.decided_by) == ("approved", made.admin_id)
    assert len(heard.requests) == 2 and list(heard.kept) == [f"whk_{wanted}_budget"]
    body = heard.kept[f"whk_{wanted}_budget"]
    payload = json.loads(body)
    assert payload["kind"] == "approval_requested" and payload["approval_id"] == wanted
    assert payload["timeout_s"] > 0
    secret = await _secret(sessions, made.tenant_id)
    headers = heard.requests[-1][0]
    assert verify(secret, headers["parley-signature"], body, now=int(time.time()))


async def test_a_users_erasure_takes_the_budget_notices_delivered_about_them(
    sessions: Database, receiver: tuple[Receiver, int]
) -> None:
    heard, port = receiver
    made = await _hooked_tenant(sessions, port)
    today = datetime.now(UTC).date()
    for subject in (f"user:{made.tenant_id}/cust_n", f"tenant:{made.tenant_id}"):
        takes = [BudgetTake(subject, "day", today, Decimal("1"))]
        hold = f"c_{uuid.uuid4().hex[:12]}"
        async with connect(sessions) as db:
            assert await budgets.reserve(db, call_id=hold, takes=takes, amount=Decimal("1")) == []
            await budgets.settle(db, call_id=hold, cost=Decimal("0.9"), soft_share=Decimal("0.8"))
    sender = WebhookSender(
        sessions=sessions, allowlist=Allowlist.parse([f"127.0.0.1:{port}"]), resolve=system_resolver
    )
    for _ in range(2):  # the receiver fails its first request
        await deliver_notices(sessions, sender)
    async with sessions() as db:
        assert len(await webhooks.deliveries(db, tenant_id=made.tenant_id)) == 2
        subject = Subject(ErasureScope.user, made.tenant_id, "cust_n")
        erased = await delete_batch(db, subject=subject, table="webhook_deliveries", limit=100)
        await db.commit()
        kept = await webhooks.deliveries(db, tenant_id=made.tenant_id)
    assert erased == 1  # the user's; the tenant's stays
    assert [d.payload["subject"] for d in kept] == [f"tenant:{made.tenant_id}"]
