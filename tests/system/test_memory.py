"""Conversational memory through the whole stack: budgets, the rolling summary, pinned facts,
recall, warnings for what did not fit, and a summary run that crashes losing nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import Client

from parley.activities.memory import MemoryActivities
from parley.config import Settings
from parley.context import read_missing
from parley.contracts import SummarizeInput
from parley.gateway.base import Finish, ModelRequest, StreamEvent
from parley.gateway.demo import DemoModel
from parley.gateway.errors import Timeouts
from parley.gateway.fake_provider.server import FakeProvider
from parley.gateway.openai_compat import OpenAICompatProvider
from parley.gateway.registry import ProviderPool
from parley.memory import ORDER_SLOT
from parley.prompt import StoredSummary
from parley.resolver import Slot
from parley.store import memory as memory_store
from parley.store import slots
from parley.store.db import Database
from parley.store.models import ConversationSummary
from parley.tokens import count_messages, count_tools, default_counter
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.stack import serve
from tests.support.toolkit import model_calls, own_stack, reply, store_history


async def prompts(db_sessions: Database, turn_id: str) -> list[dict[str, Any]]:
    calls = await model_calls(db_sessions, turn_id)
    return [c.request for c in calls if c.provider != "resolver"]


def prompt_text(request: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content")) for m in request["messages"])


# --- acceptance 3: sixty turns through the public API and an OpenAI-compatible server ------------

SCRIPT = [
    "Where is my order?",
    "What about the refund?",
    "Thanks!",
    "The order. Can I still return it?",
    "When did it arrive?",
    "Thanks. And the other one?",
]


@pytest_asyncio.fixture
async def fake_stack(
    settings: Settings, temporal_client: Client, sessions: Database
) -> AsyncIterator[str]:
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
            prefix="memory",
            model_provider="openai",
            model="gpt-test",
        ) as running:
            yield running.url
        await provider.aclose()


async def test_sixty_turns_remember_turn_one_within_a_flat_budget(
    fake_stack: str, tokens: dict[str, str], sessions: Database
) -> None:
    client = ParleyClient(fake_stack, tokens["priya"])
    sid = await client.new_session()
    turn_ids = []
    texts = [
        "Hi, call me Pri. Where is my order?",
        "My old address was 12 Harbour Lane, if that matters.",
    ]
    texts += [SCRIPT[i % len(SCRIPT)] for i in range(57)]
    texts.append("What did I tell you about Harbour Lane?")
    for text in texts:
        turn_id, events = await client.turn(sid, text)
        assert events[-1].type == "done", (text, [(e.type, e.data) for e in events[-3:]])
        turn_ids.append(turn_id)
    await client.aclose()

    counter = default_counter()
    firsts: dict[int, dict[str, Any]] = {}  # turn number -> its first prompt
    for number, turn_id in enumerate(turn_ids, start=1):
        requests = await prompts(sessions, turn_id)
        for request in requests:
            budget = request["budget"]
            # Every prompt is within budget, by the stored figure and by a fresh count.
            recount = count_messages(counter, request["messages"]) + count_tools(
                counter, request["tools"]
            )
            assert budget["prompt_tokens"] <= budget["input_budget"]
            assert recount <= budget["input_budget"]
        if requests:  # none when the resolver asked the user instead of the model
            firsts[number] = requests[0]
    last = firsts[60]
    # The nickname from turn 1 is still in front of the model at turn 60 (a pinned fact).
    assert "preferred name: Pri (said at seq 1)" in prompt_text(last)
    # What turn 2 said is recalled by search, with its seq.
    assert "\n5 user: My old address was 12 Harbour Lane" in prompt_text(last)
    assert 5 in last["budget"]["recalled_seqs"]
    # A rolling summary carries the older turns; the prompt does not grow with the history.
    assert last["budget"]["summary_through_seq"] is not None
    assert last["budget"]["prompt_tokens"] <= 1.25 * firsts[10]["budget"]["prompt_tokens"], (
        firsts[10]["budget"],
        last["budget"],
    )


# --- acceptance 2: the summary and the window meet; slots outrank the summary ---------------------


async def test_a_stale_summary_is_met_by_the_fold_and_slots_outrank_it(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    tokens: dict[str, str],
) -> None:
    history = []
    for n in range(1, 7):  # seq 1..12: six short exchanges
        history += [
            ("user", f"Question number {n} about order 8472"),
            ("assistant", f"Answer {n}."),
        ]
    padding = " Some more words of a long message about the weather." * 14  # ~150 tokens
    history += [
        ("user", "Order 8472 arrived already?"),  # 13
        ("user", "seq fourteen: checking something else." + padding),  # 14 (no answer stored)
        ("user", "seq fifteen: and one more thing." + padding),  # 15
        ("user", "seq sixteen: now the other order." + padding),  # 16
        ("assistant", "That is order 8390." + padding),  # 17
    ]
    async with own_stack(
        temporal_client,
        settings,
        sessions,
        DemoModel(token_delay_s=0),
        prefix="widen",
        context_conversation_tokens=300,
    ) as running:
        client = ParleyClient(running.url, tokens["priya"])
        sid = await client.new_session()
        await store_history(sessions, sid, history)
        async with orm(sessions) as db:
            db.add(
                ConversationSummary(
                    session_id=sid,
                    through_seq=13,
                    lines=[
                        {
                            "seq": 2,
                            "text": "The user asked about order 8472.",
                            "refs": {ORDER_SLOT: "8472"},
                        },
                        {
                            "seq": 13,
                            "text": "Order 8472 arrived on Oct 2.",
                            "refs": {ORDER_SLOT: "8472"},
                        },
                        {"seq": 11, "text": "The user said: thanks for the help", "refs": {}},
                    ],
                    token_count=30,
                    provider="demo",
                    model="demo-1",
                )
            )
            await db.commit()
        async with sessions() as db:
            # The referent changed to order 8390 at seq 16, after the summary's lines.
            await slots.write_slots(
                db, session_id=sid, writes={ORDER_SLOT: Slot("8390", "user", 16)}
            )
            await db.commit()
        turn_id, events = await client.turn(sid, "When did it arrive?")
        await client.aclose()

    text = prompt_text((await prompts(sessions, turn_id))[0])
    budget = (await prompts(sessions, turn_id))[0]["budget"]
    assert budget["summary_through_seq"] == 13
    # The window keeps to its budget; the turns the summary has not reached (14, 15) are
    # folded by code between them, so none falls between the summary and the window.
    assert budget["window_from_seq"] == 16
    assert budget["folded"] == {"from_seq": 14, "through_seq": 15, "lines": 2}
    assert "seq fourteen" in text and "seq fifteen" in text and "seq sixteen" in text
    # Lines about order 8472 are stale (the slot moved to 8390 later); the others are sent.
    assert "Order 8472 arrived on Oct 2." not in text
    assert "thanks for the help" in text
    answer = reply(events)
    assert "8390" in answer and "8472" not in answer


# --- acceptance 1 in the stack: a drop warns the user and tells the model -----------------------


async def test_a_paste_that_does_not_fit_warns_and_the_prompt_says_what_is_missing(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    tokens: dict[str, str],
) -> None:
    chunk = "Shipment log: the refund for order 8472 was delayed at the warehouse scan. " * 12
    paste = "\n\n".join(f"Entry {i}. {chunk}" for i in range(30))
    text = paste + "\n\nWhy was the refund delayed?"
    assert 5000 <= default_counter().count(text) <= 9000
    async with own_stack(
        temporal_client,
        settings,
        sessions,
        DemoModel(token_delay_s=0),
        prefix="paste",
        context_window_tokens=6144,
        max_message_chars=60_000,
    ) as running:
        client = ParleyClient(running.url, tokens["priya"])
        sid = await client.new_session()
        turn_id, events = await client.turn(sid, text)
        await client.aclose()

    warnings = [e.data for e in events if e.type == "warning"]
    assert [w["code"] for w in warnings] == ["context_trimmed"]
    assert "pasted text" in warnings[0]["message"]
    request = (await prompts(sessions, turn_id))[0]
    missing = read_missing(request["messages"])
    assert missing and all("pasted text" in label for label in missing)
    assert request["budget"]["prompt_tokens"] <= request["budget"]["input_budget"]
    assert "read only the parts" in reply(events)


# --- acceptance 6: a crash while summarizing loses nothing ----------------------------------------


class Crashing:
    """A provider that dies mid-summary, like a worker killed during the call."""

    name = "demo"

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        raise RuntimeError("worker killed while summarizing")
        yield Finish("stop")  # pragma: no cover - makes this an async generator


async def test_a_crash_during_summarization_loses_nothing(
    settings: Settings,
    sessions: Database,
    priya: ParleyClient,
) -> None:
    sid = await priya.new_session()
    history = [("user", "Hi, my account nickname is trailblazer")]
    for n in range(1, 12):
        history += [
            ("assistant", f"Answer number {n}, with a few words to fold into the summary."),
            ("user", f"Question number {n} about order 8472 and its delivery."),
        ]
    await store_history(sessions, sid, history)

    async def latest() -> StoredSummary | None:
        async with sessions() as db:
            return await memory_store.latest_summary(db, session_id=sid)

    # A summary cap that holds the whole fold, so every folded message shows in it.
    tight = settings.model_copy(
        update={
            "context_conversation_tokens": 300,
            "context_summary_tokens": 500,
            "summary_min_new_tokens": 1,
        }
    )
    crashing = MemoryActivities(
        sessions=sessions,
        providers=ProviderPool(tight, primary=Crashing()),  # type: ignore[arg-type]
        settings=tight,
    )
    with pytest.raises(RuntimeError):
        await crashing.summarize(SummarizeInput(sid, "trn_seeded"))
    assert await latest() is None  # nothing half-written

    # The next run covers the gap: everything before the window, each message once.
    working = MemoryActivities(
        sessions=sessions,
        providers=ProviderPool(tight, primary=DemoModel(token_delay_s=0)),
        settings=tight,
    )
    result = await working.summarize(SummarizeInput(sid, "trn_seeded"))
    after = await latest()
    assert result.summarized and after is not None and after.through_seq == result.through_seq
    seqs = [line.seq for line in after.lines]
    assert seqs == list(range(1, after.through_seq + 1))
    async with sessions() as db:
        _, pinned = await memory_store.summary_and_facts(db, session_id=sid)
    assert [(f.key, f.value, f.seq) for f in pinned] == [("account_nickname", "trailblazer", 1)]
