"""Budgets in money: a user's daily budget that covers two answers refuses the third before
any model call, and takes turns again the next day; concurrent reservations never together
pass a budget; a reservation is held and settled once per call, however often retried."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest_asyncio
from sqlalchemy import select, update

from parley.activities.budgets import BUDGET_EXHAUSTED_TEXT
from parley.costs import BudgetTake
from parley.store import budgets
from parley.store.db import Database, connect
from parley.store.models import BudgetNotice, BudgetSpend, ModelCall, ModelCost, ToolCall
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.tenants import AdminTenant, new_admin_tenant, new_customer

# Output tokens alone cost (a tenth of a cent each): a call's worst case is then its output
# reserve, and its real cost its answer's length.
PRICES = {"demo/demo-1": {"input": "0", "output": "1000"}}
PER_TOKEN = Decimal("0.001")
TEXT = "Tell me about yourself, please."


@dataclass
class Tenant:
    admin: ParleyClient
    base: str
    tenant_id: str


@pytest_asyncio.fixture
async def tenant(api_url: str, sessions: Database) -> AsyncIterator[Tenant]:
    made: AdminTenant = await new_admin_tenant(sessions, prefix="budget")
    admin = ParleyClient(api_url, made.token)
    yield Tenant(admin, f"/v1/admin/tenants/{made.tenant_id}", made.tenant_id)
    await admin.aclose()


async def customer(api_url: str, sessions: Database, tenant_id: str, user_id: str) -> ParleyClient:
    return ParleyClient(api_url, await new_customer(sessions, tenant_id=tenant_id, user_id=user_id))


async def costs_of(sessions: Database, turn_id: str) -> list[ModelCost]:
    async with orm(sessions) as db:
        return list((await db.scalars(select(ModelCost).where(ModelCost.turn_id == turn_id))).all())


async def test_a_daily_budget_for_two_answers_refuses_the_third_before_its_model_call(
    api_url: str, sessions: Database, tenant: Tenant
) -> None:
    put = await tenant.admin.http.put(f"{tenant.base}/config", json={"prices": PRICES})
    assert put.status_code == 200, put.text
    # What two answers cost, measured on a user without a budget.
    calibrating = await customer(api_url, sessions, tenant.tenant_id, "cust_cal")
    try:
        session_id = await calibrating.new_session()
        spent = []
        for _ in range(2):
            turn_id, events = await calibrating.turn(session_id, TEXT)
            assert events[-1].type == "done"
            rows = await costs_of(sessions, turn_id)
            assert len(rows) == 1  # one model call, no tools
            spent.append(Decimal(rows[0].cost_usd or 0))
        async with orm(sessions) as db:
            call = await db.scalar(select(ModelCall).where(ModelCall.turn_id == turn_id))
        assert call is not None
        reserve = int(call.request["max_output_tokens"])
    finally:
        await calibrating.aclose()
    # Room for the first two answers (each reserved at its worst case, the whole output
    # reserve, before it runs), not for a third's worst case.
    limit = spent[0] + spent[1] + (reserve - 1) * PER_TOKEN
    config = {"prices": PRICES, "budgets": {"user_daily_usd": format(limit.normalize(), "f")}}
    put = await tenant.admin.http.put(f"{tenant.base}/config", json=config)
    assert put.status_code == 200, put.text

    priya = await customer(api_url, sessions, tenant.tenant_id, "cust_b")
    try:
        session_id = await priya.new_session()
        for _ in range(2):
            _, events = await priya.turn(session_id, TEXT)
            assert events[-1].type == "done", events[-1]
        refused_turn, events = await priya.turn(session_id, TEXT)
        assert events[-1].type == "error"
        assert events[-1].data["code"] == "budget_exhausted"
        assert events[-1].data["message"] == BUDGET_EXHAUSTED_TEXT
        assert "delta" not in [e.type for e in events]  # no model spoke
        async with orm(sessions) as db:
            call = await db.scalar(select(ModelCall).where(ModelCall.turn_id == refused_turn))
            tools = (
                await db.scalars(select(ToolCall).where(ToolCall.turn_id == refused_turn))
            ).all()
            day = await db.scalar(
                select(BudgetSpend).where(
                    BudgetSpend.subject == f"user:{tenant.tenant_id}/cust_b",
                    BudgetSpend.period == "day",
                )
            )
        assert call is not None and call.finish_reason is None and call.usage is None
        assert tools == [] and await costs_of(sessions, refused_turn) == []
        assert day is not None
        assert day.spent_usd == spent[0] + spent[1] and day.reserved_usd == 0
        assert day.spent_usd <= day.limit_usd

        # The next day (its day's spend moved to yesterday, as the clock moving would): the
        # budget takes turns again.
        async with orm(sessions) as db:
            await db.execute(
                update(BudgetSpend)
                .where(BudgetSpend.subject == f"user:{tenant.tenant_id}/cust_b")
                .values(period_start=date(2000, 1, 1))
            )
            await db.commit()
        _, events = await priya.turn(session_id, TEXT)
        assert events[-1].type == "done", events[-1]
    finally:
        await priya.aclose()


def _take(subject: str, limit: str) -> list[BudgetTake]:
    return [BudgetTake(subject, "day", datetime.now(UTC).date(), Decimal(limit))]


async def test_two_concurrent_reservations_cannot_together_pass_the_budget(
    sessions: Database,
) -> None:
    subject = f"user:race/{datetime.now(UTC).timestamp()}"
    takes = _take(subject, "1.00")

    async def reserve(call_id: str) -> list[str]:
        async with connect(sessions) as db:
            return await budgets.reserve(db, call_id=call_id, takes=takes, amount=Decimal("0.60"))

    results = await asyncio.gather(reserve("call_a"), reserve("call_b"))
    assert sorted(len(r) for r in results) == [0, 1]  # one reserved, one refused
    async with connect(sessions) as db:
        (row,) = await budgets.spend(db, subject=subject)
    assert row.reserved_usd == Decimal("0.60") and row.spent_usd == 0


async def test_a_retried_call_reserves_and_settles_once_and_the_soft_share_notices_once(
    sessions: Database,
) -> None:
    subject = f"user:retry/{datetime.now(UTC).timestamp()}"
    takes = _take(subject, "1.00")
    async with connect(sessions) as db:
        for _ in range(2):  # the retry finds its hold
            assert await budgets.reserve(db, call_id="c1", takes=takes, amount=Decimal("0.5")) == []
        (row,) = await budgets.spend(db, subject=subject)
        assert row.reserved_usd == Decimal("0.5")
        settled = [
            await budgets.settle(db, call_id="c1", cost=Decimal("0.85"), soft_share=Decimal("0.8"))
            for _ in range(2)
        ]
        (row,) = await budgets.spend(db, subject=subject)
    assert row.spent_usd == Decimal("0.85") and row.reserved_usd == 0
    assert [len(s) for s in settled] == [1, 0]  # crossed 80% once
    async with orm(sessions) as db:
        notices = (
            await db.scalars(select(BudgetNotice).where(BudgetNotice.subject == subject))
        ).all()
    assert len(notices) == 1
