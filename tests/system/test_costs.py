"""The cost ledger against a provider's own account: seven turns of Priya through the real
OpenAI SDK against the fake OpenAI-compatible server, which reports usage (its cached tokens
too) as OpenAI does and logs what it reported. The ledger's cost equals the sum worked out
here, independently, from that log and the published prices."""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal

import pytest_asyncio
from sqlalchemy import select
from temporalio.client import Client

from parley.config import Settings
from parley.gateway.errors import Timeouts
from parley.gateway.fake_provider.server import FakeProvider
from parley.gateway.fake_provider.wire import request_from_openai
from parley.gateway.openai_compat import OpenAICompatProvider
from parley.memory import is_summary_request
from parley.store.db import Database
from parley.store.models import ModelCost
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.stack import serve
from tests.support.toolkit import own_stack

# gpt-4o as the price table has it, in USD per million tokens (written out here, not read
# from the table: the test checks the table's use, not the table against itself).
INPUT, CACHED_INPUT, OUTPUT = Decimal("2.50"), Decimal("1.25"), Decimal("10.00")

SEVEN = [
    "Where is my order?",
    "What about the refund?",
    "Thanks. And the other one?",
    "The order. Can I still return it?",
    "When did it arrive?",
    "And the refund for it?",
    "Thanks, that is all.",
]


@pytest_asyncio.fixture(scope="module")
async def fake_openai(
    settings: Settings, temporal_client: Client, sessions: Database
) -> AsyncIterator[tuple[FakeProvider, str]]:
    fake = FakeProvider(brain=True)
    async with serve(fake.app) as fake_url:
        provider = OpenAICompatProvider(
            base_url=fake_url + "/v1",
            api_key="test-key",
            timeouts=Timeouts(connect_s=2.0, first_token_s=5.0, total_s=30.0),
        )
        async with own_stack(
            temporal_client,
            settings,
            sessions,
            provider,
            prefix="cost",
            model_provider="openai",
            model="gpt-4o",
        ) as running:
            yield fake, running.url
        await provider.aclose()


async def test_the_ledger_of_seven_turns_equals_the_providers_own_account(
    fake_openai: tuple[FakeProvider, str], tokens: dict[str, str], sessions: Database
) -> None:
    fake, url = fake_openai
    fake.reset()
    client = ParleyClient(url, tokens["priya"])
    try:
        session_id = await client.new_session()
        turn_ids = []
        for text in SEVEN:
            turn_id, events = await client.turn(session_id, text)
            assert events[-1].type == "done", [e.type for e in events]
            turn_ids.append(turn_id)
    finally:
        await client.aclose()

    # The provider's account: every answered request of the turns (the rolling summary's
    # run on its own schedule and is left out on both sides).
    billed = [
        r.usage
        for r in fake.requests
        if r.usage is not None and not is_summary_request(request_from_openai(r.body).messages)
    ]
    assert len(billed) >= len(SEVEN)  # tool rounds add calls
    assert any(u["cached_tokens"] for u in billed), "the fake reported no cached tokens"
    expected = sum(
        (
            (u["input_tokens"] - u["cached_tokens"]) * INPUT
            + u["cached_tokens"] * CACHED_INPUT
            + u["output_tokens"] * OUTPUT
        )
        / 1_000_000
        for u in billed
    )

    async with orm(sessions) as db:
        rows = (
            await db.scalars(
                select(ModelCost).where(
                    ModelCost.session_id == session_id, ModelCost.kind == "turn"
                )
            )
        ).all()
    # One row per model call (a turn code answers, such as a plain thanks, calls none).
    assert {r.turn_id for r in rows} <= set(turn_ids)
    assert len({r.turn_id for r in rows}) >= len(SEVEN) - 1
    assert len(rows) == len(billed)
    assert not any(r.estimated for r in rows)  # the provider reported every call's usage
    assert sum(r.cached_tokens for r in rows) == sum(u["cached_tokens"] for u in billed)
    ledger = sum(Decimal(r.cost_usd or 0) for r in rows)
    assert ledger == expected
    assert ledger.quantize(Decimal("0.01")) == expected.quantize(Decimal("0.01")) > 0
