"""The summarizer's model call is held to the budgets as a turn's is (issue 46), against the
real PostgreSQL: a user's daily budget that cannot take a summary run's worst case skips the
run before the model is asked and folds nothing, so no message is lost; once the budget can
take it, the next pass folds them, and its reservation settles to the ledger's cost.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal

from sqlalchemy import select, update

from parley.activities.memory import MemoryActivities
from parley.config import Settings
from parley.contracts import SummarizeInput
from parley.gateway.base import Finish, ModelRequest, StreamEvent, TextDelta
from parley.gateway.registry import ProviderPool
from parley.store import budgets, tenants
from parley.store.db import Database, connect
from parley.store.models import ChatSession, ConversationSummary, Message, ModelCost
from parley.tenancy import BudgetConfig, ModelPrice, TenantConfig
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.tenants import new_admin_tenant, new_customer

FILLER = "Question number {n} about the delivery of order 8472, with a few more words."
PROVIDER, MODEL = "counting", "counting-1"
# Output tokens cost a tenth of a cent each: a summary run's worst case is its output reserve
# (1,500 tokens, 1.50 USD); this run's real cost is its five output tokens.
PRICE = ModelPrice(input="0", output="1000")


class CountingSummarizer:
    """Answers every summary request with an empty summary, reporting its usage."""

    name = PROVIDER

    def __init__(self) -> None:
        self.asked = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.asked += 1
        yield TextDelta(json.dumps({"lines": [], "facts": []}))
        yield Finish("stop", {"input_tokens": 200, "output_tokens": 5})


async def _config(sessions: Database, tenant_id: str, daily: str) -> None:
    config = TenantConfig(
        prices={f"{PROVIDER}/{MODEL}": PRICE}, budgets=BudgetConfig(user_daily_usd=daily)
    )
    async with sessions() as db:
        await tenants.set_config(db, tenant_id=tenant_id, config=config)
        await db.commit()


async def test_a_budget_that_cannot_take_a_summary_skips_it_and_loses_nothing(
    api_url: str, sessions: Database, settings: Settings
) -> None:
    made = await new_admin_tenant(sessions, prefix="bgtsum")
    token = await new_customer(sessions, tenant_id=made.tenant_id, user_id="cust_s")
    client = ParleyClient(api_url, token)
    try:
        sid = await client.new_session()
    finally:
        await client.aclose()
    async with orm(sessions) as db:
        seq = 0
        for n in range(6):
            for role, text in (("user", FILLER.format(n=n)), ("assistant", f"Answer {n}.")):
                seq += 1
                db.add(
                    Message(
                        id=f"msg_{uuid.uuid4().hex[:20]}",
                        session_id=sid,
                        seq=seq,
                        role=role,
                        text=text,
                    )
                )
        await db.execute(update(ChatSession).where(ChatSession.id == sid).values(last_seq=seq))
        await db.commit()
    tight = settings.model_copy(
        update={
            "context_conversation_tokens": 300,
            "summary_min_new_tokens": 1,
            "model_provider": PROVIDER,
            "model": MODEL,
        }
    )
    model = CountingSummarizer()
    memory = MemoryActivities(
        sessions=sessions, providers=ProviderPool(tight, primary=model), settings=tight
    )
    subject = f"user:{made.tenant_id}/cust_s"

    await _config(sessions, made.tenant_id, daily="1")  # under the run's worst case
    skipped = await memory.summarize(SummarizeInput(sid, "trn_budget"))
    assert not skipped.summarized and skipped.through_seq == 0
    assert model.asked == 0  # refused before the model was asked
    async with orm(sessions) as db:
        versions = (
            await db.scalars(
                select(ConversationSummary).where(ConversationSummary.session_id == sid)
            )
        ).all()
        billed = (await db.scalars(select(ModelCost).where(ModelCost.session_id == sid))).all()
    assert versions == [] and billed == []

    await _config(sessions, made.tenant_id, daily="100")  # the budget raised
    folded = await memory.summarize(SummarizeInput(sid, "trn_budget"))
    assert folded.summarized and folded.through_seq > 0
    assert model.asked == 1
    async with orm(sessions) as db:
        (row,) = (await db.scalars(select(ModelCost).where(ModelCost.session_id == sid))).all()
    assert row.kind == "summary" and row.cost_usd == Decimal("0.005")
    async with connect(sessions) as db:
        (day,) = await budgets.spend(db, subject=subject)
    assert day.spent_usd == row.cost_usd and day.reserved_usd == 0
