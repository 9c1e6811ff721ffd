"""A tenant's monthly budget used up mid-day asks an operator (issue 46, acceptance 3), with
the real Temporal and PostgreSQL: the refused turn commits the month's approval and starts its
workflow (`budget-<tenant>-<YYYY-MM>`, by the tenant's search attribute); an approval lets the
next turn answer, a decline or a timeout keeps it refused; a second refusal of the month asks
nothing again; another tenant's operator cannot decide it; an approval whose start was lost is
started by the sweep.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest_asyncio
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle

from parley.activities.budgets import BUDGET_EXHAUSTED_TEXT
from parley.budget_approvals import BudgetApprovalOutcome, approval_id
from parley.config import Settings
from parley.contracts import SA_TENANT_ID
from parley.dispatch.budgets import sweep_approvals
from parley.store import budgets
from parley.store.db import Database, connect
from tests.support.client import ParleyClient
from tests.support.tenants import new_admin_tenant, new_customer

# Output tokens cost a tenth of a cent each: a call's worst case is its whole output reserve
# (about a dollar), so a budget of a cent is used up before the first answer.
PRICES = {"demo/demo-1": {"input": "0", "output": "1000"}}
TEXT = "Tell me about yourself, please."
DEADLINE_S = 20.0  # a bound on the worker's background work, never a wait


@dataclass
class Tenant:
    admin: ParleyClient
    admin_id: str
    base: str
    tenant_id: str
    customer: ParleyClient

    @property
    def approval_id(self) -> str:
        return approval_id(tenant_id=self.tenant_id, period_start=_month())


def _month() -> date:
    return datetime.now(UTC).date().replace(day=1)


async def _tenant(api_url: str, sessions: Database, budget: dict[str, Any]) -> Tenant:
    made = await new_admin_tenant(sessions, prefix="bgtok")
    admin = ParleyClient(api_url, made.token)
    base = f"/v1/admin/tenants/{made.tenant_id}"
    put = await admin.http.put(f"{base}/config", json={"prices": PRICES, "budgets": budget})
    assert put.status_code == 200, put.text
    token = await new_customer(sessions, tenant_id=made.tenant_id, user_id="cust_a")
    return Tenant(admin, made.admin_id, base, made.tenant_id, ParleyClient(api_url, token))


@pytest_asyncio.fixture
async def tenant(api_url: str, sessions: Database) -> AsyncIterator[Tenant]:
    made = await _tenant(api_url, sessions, {"monthly_usd": "0.01"})
    yield made
    await made.admin.aclose()
    await made.customer.aclose()


async def _refused(client: ParleyClient, session_id: str) -> None:
    _, events = await client.turn(session_id, TEXT)
    assert events[-1].type == "error", events[-1]
    assert events[-1].data["code"] == "budget_exhausted"
    assert events[-1].data["message"] == BUDGET_EXHAUSTED_TEXT
    assert "delta" not in [e.type for e in events]


async def _answered(client: ParleyClient, session_id: str) -> None:
    _, events = await client.turn(session_id, TEXT)
    assert events[-1].type == "done", events[-1]


async def _asked(tenant: Tenant, client: Client) -> WorkflowHandle[Any, BudgetApprovalOutcome]:
    """The month's approval, stored as waiting, and its workflow running (found by the
    tenant's search attribute, as an operator finds it in the UI)."""
    got = await tenant.admin.http.get(f"{tenant.base}/budget/approval")
    assert got.status_code == 200, got.text
    assert got.json()["status"] == "waiting" and got.json()["approval_id"] == tenant.approval_id
    handle = client.get_workflow_handle(tenant.approval_id, result_type=BudgetApprovalOutcome)
    described = await handle.describe()
    assert described.status == WorkflowExecutionStatus.RUNNING
    assert described.typed_search_attributes.get(SA_TENANT_ID) == tenant.tenant_id
    return handle


async def test_an_operators_approval_lets_the_next_turn_answer(
    tenant: Tenant, temporal_client: Client
) -> None:
    session_id = await tenant.customer.new_session()
    await _refused(tenant.customer, session_id)
    handle = await _asked(tenant, temporal_client)
    first_run = (await handle.describe()).run_id

    # A second refusal of the month asks nothing again: the same run waits.
    await _refused(tenant.customer, session_id)
    assert (await handle.describe()).run_id == first_run

    posted = await tenant.admin.http.post(
        f"{tenant.base}/budget/approval", json={"decision": "approve"}
    )
    assert posted.status_code == 200, posted.text
    decided = posted.json()
    assert decided["status"] == "approved" and decided["decided_by"] == tenant.admin_id
    assert decided["monthly_usd"] is None and decided["decided_at"] is not None

    ended = await handle.result()
    assert (ended.status, ended.decided_by) == ("approved", tenant.admin_id)
    history = await handle.fetch_history()
    signalled = [
        e
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    ]
    assert len(signalled) == 1
    await _answered(tenant.customer, session_id)

    # Decided once: a second decision is refused, and says how it ended.
    again = await tenant.admin.http.post(
        f"{tenant.base}/budget/approval", json={"decision": "decline"}
    )
    assert again.status_code == 409, again.text
    assert again.json()["error"]["code"] == "budget_approval_decided"
    assert again.json()["error"]["status"] == "approved"


async def test_an_approval_with_a_new_ceiling_holds_turns_to_it(
    tenant: Tenant, temporal_client: Client, sessions: Database
) -> None:
    session_id = await tenant.customer.new_session()
    await _refused(tenant.customer, session_id)
    await _asked(tenant, temporal_client)
    # A ceiling over one answer's worst case (the whole output reserve, about a dollar).
    posted = await tenant.admin.http.post(
        f"{tenant.base}/budget/approval", json={"decision": "approve", "monthly_usd": "50"}
    )
    assert posted.status_code == 200, posted.text
    assert posted.json()["monthly_usd"] == "50"
    await _answered(tenant.customer, session_id)
    async with connect(sessions) as db:
        (month,) = await budgets.spend(db, subject=f"tenant:{tenant.tenant_id}")
    assert month.limit_usd == 50 and month.spent_usd > 0


async def test_a_decline_keeps_turns_refused(tenant: Tenant, temporal_client: Client) -> None:
    session_id = await tenant.customer.new_session()
    await _refused(tenant.customer, session_id)
    handle = await _asked(tenant, temporal_client)
    posted = await tenant.admin.http.post(
        f"{tenant.base}/budget/approval", json={"decision": "decline"}
    )
    assert posted.status_code == 200, posted.text
    ended = await handle.result()
    assert (ended.status, ended.decided_by) == ("declined", tenant.admin_id)
    await _refused(tenant.customer, session_id)
    got = await tenant.admin.http.get(f"{tenant.base}/budget/approval")
    assert got.json()["status"] == "declined"


async def test_nobody_deciding_in_time_keeps_turns_refused(
    api_url: str, sessions: Database, temporal_client: Client
) -> None:
    tenant = await _tenant(api_url, sessions, {"monthly_usd": "0.01", "approval_timeout_s": 1.0})
    try:
        session_id = await tenant.customer.new_session()
        await _refused(tenant.customer, session_id)
        handle = temporal_client.get_workflow_handle(
            tenant.approval_id, result_type=BudgetApprovalOutcome
        )
        async with asyncio.timeout(DEADLINE_S):
            ended = await handle.result()  # its timer, a second
        assert ended == BudgetApprovalOutcome("timed_out")
        got = await tenant.admin.http.get(f"{tenant.base}/budget/approval")
        assert got.json()["status"] == "timed_out" and got.json()["decided_by"] is None
        await _refused(tenant.customer, session_id)
        late = await tenant.admin.http.post(
            f"{tenant.base}/budget/approval", json={"decision": "approve"}
        )
        assert late.status_code == 409 and late.json()["error"]["status"] == "timed_out"
    finally:
        await tenant.admin.aclose()
        await tenant.customer.aclose()


async def test_another_tenants_operator_cannot_decide_it(
    api_url: str, sessions: Database, tenant: Tenant, temporal_client: Client
) -> None:
    session_id = await tenant.customer.new_session()
    await _refused(tenant.customer, session_id)
    await _asked(tenant, temporal_client)
    other = await new_admin_tenant(sessions, prefix="bgtother")
    stranger = ParleyClient(api_url, other.token)
    try:
        posted = await stranger.http.post(
            f"{tenant.base}/budget/approval", json={"decision": "approve"}
        )
        assert posted.status_code == 404, posted.text
        assert (await stranger.http.get(f"{tenant.base}/budget/approval")).status_code == 404
        got = await tenant.admin.http.get(f"{tenant.base}/budget/approval")
        assert got.json()["status"] == "waiting"
        # Its own tenant's budget never refused a turn: nothing to decide (404).
        own = f"/v1/admin/tenants/{other.tenant_id}/budget/approval"
        assert (await stranger.http.post(own, json={"decision": "approve"})).status_code == 404
        with_ceiling = await stranger.http.post(
            own, json={"decision": "decline", "monthly_usd": "5"}
        )
        assert with_ceiling.status_code == 422
    finally:
        await stranger.aclose()


async def test_an_approval_whose_start_was_lost_is_started_by_the_sweep(
    sessions: Database, settings: Settings, temporal_client: Client
) -> None:
    # Committed by a refused call whose worker died before starting its run.
    made = await new_admin_tenant(sessions, prefix="bgtlost")
    month = _month()
    wanted = approval_id(tenant_id=made.tenant_id, period_start=month)
    async with connect(sessions) as db:
        asked = await budgets.ask_approval(
            db, approval_id=wanted, tenant_id=made.tenant_id, period_start=month, timeout_s=600
        )
        assert asked is not None
        # Asked at once again (another refused turn): nothing new.
        again = await budgets.ask_approval(
            db, approval_id=wanted, tenant_id=made.tenant_id, period_start=month, timeout_s=600
        )
        assert again is None
    started = await sweep_approvals(
        temporal_client, sessions, task_queue=settings.task_queue, grace=timedelta(0)
    )
    assert started >= 1
    handle = temporal_client.get_workflow_handle(wanted)
    assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    async with connect(sessions) as db:
        found = await budgets.approval(db, tenant_id=made.tenant_id, period_start=month)
    assert found is not None and found.workflow_started_at is not None
    await handle.terminate("test over")
