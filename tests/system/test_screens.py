"""Input and output screens: a declined input never reaches the model, a declined answer is
retracted and only the safe text is stored, and screening overlaps context building."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager

import pytest
import pytest_asyncio
from sqlalchemy import select
from temporalio.client import Client

from parley.config import Settings
from parley.screens import (
    DECLINE_TEXT,
    RETRACTION_TEXT,
    RulesScreen,
    Verdict,
    contains_card_number,
)
from parley.store.db import Database
from parley.store.models import Message, TraceSpan
from tests.support.client import ParleyClient
from tests.support.models import ControlledModel
from tests.support.orm import orm
from tests.support.toolkit import Stack, own_stack


class SlowScreen:
    """The rules floor behind a slow network call, so overlap with other steps shows."""

    def __init__(self, inner: RulesScreen, delay_s: float) -> None:
        self.inner, self.delay_s = inner, delay_s

    async def check(self, text: str) -> Verdict:
        await asyncio.sleep(self.delay_s)
        return await self.inner.check(text)


class BrokenScreen:
    async def check(self, text: str) -> Verdict:
        raise ConnectionError("moderation endpoint unreachable")


ScreenStack = Stack[ControlledModel]


def screened_stack(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    screens: tuple[object, object],
) -> AbstractAsyncContextManager[ScreenStack]:
    model = ControlledModel(token_delay_s=0.005)
    return own_stack(
        temporal_client,
        settings,
        sessions,
        model,
        prefix="screens",
        screens=screens,  # type: ignore[arg-type]
    )


@pytest_asyncio.fixture(scope="module")
async def stack(
    settings: Settings, temporal_client: Client, sessions: Database
) -> AsyncIterator[ScreenStack]:
    screens = (
        SlowScreen(RulesScreen("input", ("forbidden topic",)), delay_s=0.3),
        RulesScreen("output", ("classified",)),
    )
    async with screened_stack(settings, temporal_client, sessions, screens) as stack:
        yield stack


@pytest_asyncio.fixture
async def client(stack: ScreenStack, tokens: dict[str, str]) -> AsyncIterator[ParleyClient]:
    stack.model.reply = lambda request: None
    c = ParleyClient(stack.url, tokens["priya"])
    yield c
    await c.aclose()


@pytest.mark.parametrize(
    "text",
    ["Tell me about the forbidden topic", "My card is 4111 1111 1111 1111, charge it"],
)
async def test_a_declined_input_never_reaches_the_model(
    stack: ScreenStack, client: ParleyClient, text: str
) -> None:
    calls = stack.model.calls
    sid = await client.new_session()
    _, events = await client.turn(sid, text)
    assert events[-1].type == "done"
    assert events[-1].data["message"]["text"] == DECLINE_TEXT
    assert stack.model.calls == calls  # the model was never called
    assert not any(e.type == "delta" for e in events)
    stored = await client.messages(sid)
    assert [(m["role"], m["text"]) for m in stored][-1] == ("assistant", DECLINE_TEXT)


async def test_a_declined_answer_is_retracted_and_only_safe_text_is_stored(
    stack: ScreenStack, client: ParleyClient, sessions: Database
) -> None:
    stack.model.reply = lambda request: "The classified launch codes are 0000."
    sid = await client.new_session()
    _, events = await client.turn(sid, "Tell me a secret")
    kinds = [e.type for e in events]
    assert "delta" in kinds  # it had streamed before the screen saw the whole answer
    retracted = [e.data for e in events if e.type == "retracted"]
    assert len(retracted) == 1 and retracted[0]["replacement_text"] == RETRACTION_TEXT
    assert kinds.index("retracted") < kinds.index("done")
    assert "followups" not in kinds
    final = events[-1].data["message"]
    assert final["status"] == "retracted" and final["text"] == RETRACTION_TEXT
    assert retracted[0]["message_id"] == final["id"]
    async with orm(sessions) as db:
        texts = list(await db.scalars(select(Message.text).where(Message.session_id == sid)))
    assert not any("classified" in t for t in texts)  # the withdrawn words are not kept


async def test_an_allowed_answer_gets_followups_before_done(
    stack: ScreenStack, client: ParleyClient
) -> None:
    sid = await client.new_session()
    _, events = await client.turn(sid, "Where is my order?")
    kinds = [e.type for e in events]
    assert kinds[-1] == "done" and "retracted" not in kinds
    followups = [e.data["suggestions"] for e in events if e.type == "followups"]
    assert len(followups) == 1
    assert 0 < len(followups[0]) <= 3 and "What about the refund?" in followups[0]


async def test_screening_overlaps_context_building(
    stack: ScreenStack, client: ParleyClient, sessions: Database
) -> None:
    sid = await client.new_session()
    turn_id, events = await client.turn(sid, "Where is my order?")
    assert events[-1].type == "done"
    async with orm(sessions) as db:
        rows = await db.scalars(
            select(TraceSpan)
            .where(TraceSpan.turn_id == turn_id)
            .order_by(TraceSpan.started_at.desc())
        )
        spans = {s.name: s for s in rows}  # the first span of each step (step 0)
    screen, build = spans["screen_input"], spans["build_context"]
    model, step = spans["call_model"], spans["open_step"]
    # The (slow) screen never waited for the build: both ran at the same time, or the build
    # was done before the step began (begun beside the workflow's start on the worker that
    # claimed the turn: activities/early_build.py); the model waited for the verdict.
    assert screen.started_at < build.ended_at or build.ended_at <= step.started_at
    assert build.started_at < screen.ended_at
    assert model.started_at >= screen.ended_at


async def test_an_input_screen_that_errors_fails_the_turn_closed(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    tokens: dict[str, str],
) -> None:
    screens = (BrokenScreen(), RulesScreen("output"))
    async with screened_stack(settings, temporal_client, sessions, screens) as broken:
        client = ParleyClient(broken.url, tokens["priya"])
        try:
            sid = await client.new_session()
            _, events = await client.turn(sid, "Where is my order?")
        finally:
            await client.aclose()
        assert events[-1].type == "error"
        assert broken.model.calls == 0


async def test_an_output_screen_that_errors_lets_the_answer_stand(
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
    tokens: dict[str, str],
) -> None:
    screens = (RulesScreen("input"), BrokenScreen())
    async with screened_stack(settings, temporal_client, sessions, screens) as broken:
        client = ParleyClient(broken.url, tokens["priya"])
        try:
            sid = await client.new_session()
            _, events = await client.turn(sid, "Where is my order?")
        finally:
            await client.aclose()
        assert events[-1].type == "done"
        assert "8472" in events[-1].data["message"]["text"]


@pytest.mark.parametrize(
    ("text", "card"),
    [
        ("4111 1111 1111 1111", True),
        ("4111-1111-1111-1111", True),
        ("4111 1111 1111 1112", False),  # fails the Luhn check
        ("order 8472 and 8390", False),
    ],
)
def test_card_numbers_are_recognised(text: str, card: bool) -> None:
    assert contains_card_number(text) is card


async def test_the_output_floor_allows_masked_addresses_only() -> None:
    floor = RulesScreen("output")
    assert (await floor.check("sent to p***@example.com")).allowed
    assert not (await floor.check("sent to priya@example.com")).allowed


async def test_the_output_floor_reads_a_long_answer_to_its_end() -> None:
    # Long runs without `@` (a pasted blob the model echoes) once cost the address rule time
    # quadratic in their length: a 4 MB answer outran the screen's timeout and went out
    # unscreened. The rule still finds an address after them, and only a real one.
    blob = ("x" * 2000 + " ") * 500
    floor = RulesScreen("output")
    assert not (await floor.check(blob + "write to priya.s@example.com")).allowed
    assert (await floor.check(blob + "sent to p***@example.com")).allowed
    assert not (await floor.check("x" * 50_000 + "priya@example.com")).allowed
    # Long runs of spaces or of dotted words before a spelled-out address: the same.
    spaced = " " * 200_000 + "priya [at] example (dot) com"
    assert not (await floor.check(spaced)).allowed
    assert not (await floor.check("a." * 100_000 + " at example dot com")).allowed


async def test_the_moderation_adapter_speaks_the_openai_endpoint() -> None:
    from openai import AsyncOpenAI

    from parley.gateway.fake_provider.server import FakeProvider
    from parley.screens import ModerationScreen, ScreenChain
    from tests.support.stack import serve

    fake = FakeProvider()
    fake.flag_terms = {"you idiot"}
    async with serve(fake.app) as url:
        client = AsyncOpenAI(base_url=url + "/v1", api_key="test", max_retries=0)
        screen = ScreenChain([RulesScreen("input"), ModerationScreen(client)])
        assert (await screen.check("Where is my order?")).allowed
        verdict = await screen.check("Where is my order, you idiot?")
        assert not verdict.allowed
        assert (verdict.category, verdict.reason) == ("moderation", "harassment")
        await client.close()


async def test_a_retracted_answer_is_never_served_again_by_a_replay(
    stack: ScreenStack, client: ParleyClient
) -> None:
    withdrawn = "The classified launch codes are 0000 and the vault opens at midnight."
    stack.model.reply = lambda request: withdrawn
    sid = await client.new_session()
    turn_id, live = await client.turn(sid, "Tell me a secret")
    assert any(e.type == "retracted" for e in live)
    last = live[-1].id
    assert last is not None
    for start in (0, last // 2, last - 3):
        replayed = await client.events(sid, turn_id, last_event_id=start)
        assert replayed and replayed[-1].type == "done", start
        served = " ".join(json.dumps(e.data) for e in replayed)
        for word in ("classified", "launch codes", "vault"):
            assert word not in served, (start, word)
        # The ids are those the live stream had: a client resuming keeps its place.
        assert [e.id for e in replayed] == [e.id for e in live if e.id is not None and e.id > start]
    messages = await client.messages(sid)
    assert not any("classified" in m["text"] for m in messages)


# Near-misses of the floor's rules: each is what a leaky model (or an injected instruction)
# might write to get an address or a card number past a naive pattern, beside text that
# must stay allowed.
OUTPUT_NEAR_MISSES = [
    ("priya***@example.com", False),  # a mask that still shows the whole name
    ("p***a@example.com", False),
    ("x.p***@example.com", False),
    ("pr***@example.com", False),
    ("priya@example.com", False),
    ("PRIYA@EXAMPLE.COM", False),
    ("mailto:priya@example.com", False),
    ("priya [at] example [dot] com", False),
    ("priya(at)example(dot)com", False),
    ("priya at example dot com", False),
    ("priya @ example.com", False),
    ("priya%40example.com", False),
    ("pri\u200bya@example.com", False),  # a zero-width space inside
    ("priya\uff20example.com", False),  # a full-width at sign
    ("4111.1111.1111.1111", False),
    ("\uff14\uff11\uff11\uff11 1111 1111 1111", False),  # full-width digits
    ("4111\u200b1111\u200b1111\u200b1111", False),
    ("It is cl\u00adassified", False),  # a blocked term split by a soft hyphen
    ("sent to p***@example.com", True),
    ("I'll email p***@example.com, then m***@example.com", True),
    ("I looked at example.com for you", True),
    ("Order 8472 arrives at noon; 8390 shipped", True),
    ("Your refund of 49.99 is on its way", True),
]


@pytest.mark.parametrize(("text", "allowed"), OUTPUT_NEAR_MISSES)
async def test_the_output_floor_against_near_misses(text: str, allowed: bool) -> None:
    floor = RulesScreen("output", ("classified",))
    assert (await floor.check(text)).allowed is allowed
