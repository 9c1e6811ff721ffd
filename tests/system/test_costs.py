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
from parley.gateway.anthropic import AnthropicProvider
from parley.gateway.errors import Timeouts
from parley.gateway.fake_provider.server import FakeProvider
from parley.gateway.fake_provider.wire import Reply, request_from_openai
from parley.gateway.openai_compat import OpenAICompatProvider
from parley.memory import is_summary_request
from parley.store.db import Database
from parley.store.models import ModelCost
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.stack import serve
from tests.support.tenants import new_admin_tenant, new_customer
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
            # No rolling summary: its call, on its own schedule after a test's turns, would
            # take the reply a later test scripted for its turn (the fake answers in order).
            summary_min_new_tokens=1_000_000,
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

    # The provider's account: every answered request of the turns (no rolling summary runs
    # in this module; one would be left out on both sides).
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


@pytest_asyncio.fixture(scope="module")
async def fake_anthropic(
    settings: Settings, temporal_client: Client, sessions: Database
) -> AsyncIterator[tuple[FakeProvider, str]]:
    fake = FakeProvider(brain=True)
    async with serve(fake.app) as fake_url:
        provider = AnthropicProvider(
            base_url=fake_url,
            api_key="test-key",
            timeouts=Timeouts(connect_s=2.0, first_token_s=5.0, total_s=30.0),
        )
        async with own_stack(
            temporal_client,
            settings,
            sessions,
            provider,
            prefix="cache",
            model_provider="anthropic",
            model="claude-sonnet-4-5",
            # No rolling summary, as above: the drop test scripts the fake's next replies.
            summary_min_new_tokens=1_000_000,
        ) as running:
            yield fake, running.url
        await provider.aclose()


# A brand voice of a realistic length: with the tools of a tenant that delegates to a
# specialist, the standing prompt passes Anthropic's minimum for a cached prefix.
PERSONA = (
    "You are the assistant of Northwind Outfitters, a family-run outdoor clothing shop. "
    "Speak plainly and warmly, in short sentences, as a helpful person at the counter would. "
    "Use the customer's words for things, never internal codes. When something went wrong "
    "with an order, say so first, then say what happens next and when. Offer one next step "
    "at a time. Never promise a refund, a delivery date or an exception the tools have not "
    "confirmed. When a question is outside orders, returns and refunds, say what you can "
    "help with instead. Prices are in the customer's currency with two decimals. Dates are "
    "written as 'Tuesday 3 March'. Do not use exclamation marks or emoji. Thank the customer "
    "once, at the end of the conversation, not in every answer. If the customer is upset, "
    "acknowledge it in one sentence before anything else. Our returns desk answers e-mail "
    "within one working day; our shop is open Monday to Saturday, nine to six. Orders "
    "over fifty pounds ship free; smaller ones pay a flat four pounds ninety-five. Boots and "
    "jackets can be exchanged for another size within sixty days if unworn, with the tags "
    "on. Sale items can be returned but not exchanged. Gift cards never expire and cannot "
    "be refunded. We repair zips and seams on our own jackets free for two years; the "
    "customer posts the jacket to the workshop in Kendal and we post it back. Never ask "
    "for a card number, a password or a full address in the chat. When the customer asks "
    "about an order, name it by what was bought and when, not by its number alone. When two "
    "orders match, ask which one with both named. Explain a refund's state in plain words: "
    "asked for, approved, sent to the bank, or received. Banks take three to five working "
    "days to show a refund. Keep every answer under eighty words unless asked for detail."
)


async def test_anthropics_prompt_cache_is_written_then_read_and_the_ledger_shows_it_cheaper(
    fake_anthropic: tuple[FakeProvider, str], sessions: Database
) -> None:
    fake, url = fake_anthropic
    fake.reset()
    tenant = await new_admin_tenant(sessions, prefix="cache")
    admin = ParleyClient(url, tenant.token)
    config = {"persona": PERSONA, "specialists": True}
    put = await admin.http.put(f"/v1/admin/tenants/{tenant.tenant_id}/config", json=config)
    await admin.aclose()
    assert put.status_code == 200, put.text
    token = await new_customer(sessions, tenant_id=tenant.tenant_id, user_id="cust_cache")
    client = ParleyClient(url, token)
    try:
        session_id = await client.new_session()
        turns = []
        for _ in range(2):
            turn_id, events = await client.turn(session_id, "Tell me about yourself, please.")
            assert events[-1].type == "done", [e.type for e in events]
            turns.append(turn_id)
    finally:
        await client.aclose()

    # The standing prompt (the tools and the first system block, up to its cache_control
    # breakpoint) reaches Anthropic's minimum for Sonnet, so the provider caches it.
    first = fake.requests[0].body
    assert first["system"][0]["cache_control"] == {"type": "ephemeral"} and first["tools"]
    async with orm(sessions) as db:
        rows = {
            r.turn_id: r
            for r in await db.scalars(select(ModelCost).where(ModelCost.session_id == session_id))
        }
    written, read = rows[turns[0]], rows[turns[1]]
    assert written.cache_write_tokens >= 1024 and written.cached_tokens == 0
    assert read.cached_tokens == written.cache_write_tokens and read.cache_write_tokens == 0
    # Sonnet: input 3.00, cache write 3.75, cache read 0.30 per million tokens.
    uncached = Decimal("3.00") * read.input_tokens + Decimal("15.00") * read.output_tokens
    assert read.cost_usd is not None and written.cost_usd is not None
    assert read.cost_usd < uncached / 1_000_000 < written.cost_usd + Decimal("0.001")
    saving = (Decimal("3.00") - Decimal("0.30")) * read.cached_tokens / 1_000_000
    assert uncached / 1_000_000 - read.cost_usd == saving


async def test_a_call_whose_provider_reports_no_usage_is_billed_from_parleys_own_count(
    fake_openai: tuple[FakeProvider, str], tokens: dict[str, str], sessions: Database
) -> None:
    fake, url = fake_openai
    fake.reset()
    fake.script(Reply(text="We sell outdoor clothing and boots.", report_usage=False))
    client = ParleyClient(url, tokens["priya"])
    try:
        session_id = await client.new_session()
        turn_id, events = await client.turn(session_id, "Tell me about your shop, please.")
        assert events[-1].type == "done", [e.type for e in events]
    finally:
        await client.aclose()
    assert fake.requests[0].usage is None  # the provider said nothing of its usage
    async with orm(sessions) as db:
        [row] = (await db.scalars(select(ModelCost).where(ModelCost.turn_id == turn_id))).all()
    # Priced from Parley's count of the prompt it sent and the answer it streamed, and
    # marked so: never a free call, never passed off as the provider's figure.
    assert row.estimated
    assert row.input_tokens > 0 and row.output_tokens > 0
    assert Decimal(row.cost_usd or 0) > 0


async def test_an_attempt_dropped_after_anthropic_reported_its_input_is_billed_too(
    fake_anthropic: tuple[FakeProvider, str], sessions: Database
) -> None:
    fake, url = fake_anthropic
    fake.reset()
    # The first attempt breaks after a word (Anthropic has reported, and bills, its input);
    # Temporal retries the call, and the second attempt answers.
    fake.script(
        Reply(text=["Part ", "of ", "an ", "answer"], drop_after=1, input_tokens=4000),
        Reply(text="The whole answer.", input_tokens=4100, output_tokens=5),
    )
    tenant = await new_admin_tenant(sessions, prefix="dropped")
    token = await new_customer(sessions, tenant_id=tenant.tenant_id, user_id="cust_drop")
    client = ParleyClient(url, token)
    try:
        session_id = await client.new_session()
        turn_id, events = await client.turn(session_id, "Tell me about yourself, please.")
        assert events[-1].type == "done", [e.type for e in events]
    finally:
        await client.aclose()
    async with orm(sessions) as db:
        rows = {
            r.key: r
            for r in await db.scalars(select(ModelCost).where(ModelCost.turn_id == turn_id))
        }
    dropped = [r for key, r in rows.items() if ":dropped:" in key]
    answered = [r for key, r in rows.items() if ":dropped:" not in key]
    assert len(dropped) == 1 and len(answered) == 1
    assert dropped[0].input_tokens == 4000 and not dropped[0].estimated
    assert answered[0].input_tokens == 4100 and answered[0].output_tokens == 5
    assert dropped[0].cost_usd is not None and dropped[0].cost_usd > 0
