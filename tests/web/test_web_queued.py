"""The chat page when the user types while an answer streams (issue 30 item 4): the message
waits under the streaming answer, marked as pending, and is answered when that answer ends;
Stop asks whether to drop the waiting message too. A worker of its own runs a model the test
steers (slow enough to type during), with the outbox loop that starts queued turns."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest_asyncio
from playwright.async_api import Browser, Page, Route, expect
from temporalio.client import Client

from parley.config import Settings
from parley.gateway.base import ModelRequest
from parley.store.db import Database
from tests.support.models import ControlledModel
from tests.support.stack import running_outbox
from tests.support.toolkit import Stack, own_stack
from tests.support.webpage import (
    Tab,
    finished_answer,
    hold_second_read,
    last_answer,
    opener,
    sign_in,
)

LONG = " ".join(f"word{i}" for i in range(70))  # about 2 s at the stack's pace
WebStack = Stack[ControlledModel]


@pytest_asyncio.fixture(scope="module")
async def stack(
    settings: Settings, temporal_client: Client, sessions: Database
) -> AsyncIterator[WebStack]:
    model = ControlledModel(token_delay_s=0.03)

    def reply(request: ModelRequest) -> str | None:
        users = [m for m in request.messages if m.get("role") == "user"]
        text = str(users[-1].get("content", "")) if users else ""
        if "long" in text:
            return LONG
        return "Queued answer: " + text if "next" in text else None

    model.reply = reply
    async with own_stack(temporal_client, settings, sessions, model, prefix="webq") as stack:
        async with running_outbox(temporal_client, stack.settings, sessions):
            yield stack


# An upper bound on waiting for a page to ask for what is held, not a target.
ASKED_TIMEOUT_S = 45


@pytest_asyncio.fixture
async def page(browser: Browser, stack: WebStack) -> AsyncIterator[Page]:
    tab = await opener(browser)(stack.url)
    await sign_in(tab.page, "cust_2291")
    yield tab.page
    tab.assert_clean()
    await tab.context.close()


async def _type(page: Page, text: str) -> None:
    await page.locator("#input").fill(text)
    await page.locator("#input").press("Enter")


async def _queue(page: Page, text: str) -> None:
    """While an answer streams, the button queues (Enter would steer it)."""
    await expect(page.locator("#send")).to_have_text("Queue")
    await page.locator("#input").fill(text)
    await page.locator("#send").click()


async def _streaming(page: Page, fragment: str) -> None:
    answer = last_answer(page)
    await expect(answer).to_have_class("msg msg-assistant streaming")
    await expect(answer.locator(".body")).to_contain_text(fragment)


async def test_a_message_typed_during_a_stream_waits_under_it_then_is_answered(
    page: Page,
) -> None:
    await _type(page, "A long answer please")
    await _streaming(page, "word3 ")
    await _queue(page, "And the next thing")
    pending = page.locator("#transcript .msg.pending")
    await expect(pending.locator(".body")).to_have_text("And the next thing")
    await expect(pending.locator(".badge")).to_have_text("Sends when this answer ends")
    await expect(page.locator("#send")).to_be_disabled()  # one message waits at most
    # Under the answer that still streams.
    last = page.locator("#transcript .msg").last
    await expect(last).to_have_class("msg msg-user pending")
    await expect(last_answer(page)).to_have_class("msg msg-assistant streaming")

    text = await finished_answer(page, "Queued answer: And the next thing")
    assert text == "Queued answer: And the next thing"
    await expect(page.locator("#transcript .msg.pending")).to_have_count(0)
    bodies = page.locator("#transcript .msg .body")
    await expect(bodies).to_have_text(
        ["A long answer please", LONG, "And the next thing", "Queued answer: And the next thing"]
    )
    seqs = await page.locator("#transcript .msg").evaluate_all(
        "bs => bs.map(b => Number(b.dataset.seq))"
    )
    assert seqs == sorted(seqs) and len(set(seqs)) == 4


async def test_stop_asks_whether_to_drop_the_waiting_message(page: Page) -> None:
    await _type(page, "A long answer please")
    await _streaming(page, "word3 ")
    await _queue(page, "Then the next thing")
    await expect(page.locator("#transcript .msg.pending")).to_have_count(1)
    await page.locator("#stop").click()
    ask = page.locator("#stop-queued")
    await expect(ask).to_be_visible()
    await expect(page.locator("#drop-queued")).to_be_focused()
    await page.locator("#drop-queued").click()
    await expect(ask).to_be_hidden()
    answer = last_answer(page)
    await expect(answer).to_have_attribute("data-status", "cancelled")
    await expect(page.locator("#transcript .msg.pending")).to_have_count(0)
    await expect(page.locator("#stop")).to_be_hidden()
    await expect(page.locator("#send")).to_be_enabled()
    await expect(page.locator("#transcript .msg-user")).to_have_count(1)  # dropped, not sent
    await expect(page.locator("#transcript .msg-assistant")).to_have_count(1)


async def test_stop_pressed_while_the_message_is_still_on_its_way_asks_too(page: Page) -> None:
    """Stop while the waiting message's POST has not been answered yet: the page waits for
    it, then asks as for any waiting message (it does not let it start unasked)."""
    await _type(page, "A long answer please")
    await _streaming(page, "word3 ")
    held, release = asyncio.Event(), asyncio.Event()

    async def hold(route: Route) -> None:
        held.set()
        await release.wait()
        await route.continue_()

    await page.route("**/messages", hold)
    await _queue(page, "Stop before the next thing arrives")
    await held.wait()
    await page.locator("#stop").click()
    release.set()
    ask = page.locator("#stop-queued")
    await expect(ask).to_be_visible()
    await page.locator("#drop-queued").click()
    await expect(last_answer(page)).to_have_attribute("data-status", "cancelled")
    await expect(page.locator("#transcript .msg.pending")).to_have_count(0)
    await expect(page.locator("#send")).to_be_enabled()
    await expect(page.locator("#transcript .msg-user")).to_have_count(1)  # dropped, not sent


async def test_stop_can_keep_the_waiting_message_which_is_then_answered(page: Page) -> None:
    await _type(page, "A long answer please")
    await _streaming(page, "word3 ")
    await _queue(page, "Keep the next thing")
    await expect(page.locator("#transcript .msg.pending")).to_have_count(1)
    await page.locator("#stop").click()
    await page.locator("#keep-queued").click()
    await finished_answer(page, "Queued answer: Keep the next thing")
    statuses = await page.locator("#transcript .msg-assistant").evaluate_all(
        "bs => bs.map(b => b.dataset.status)"
    )
    assert statuses == ["cancelled", "complete"]


async def test_a_reload_shows_the_waiting_message_and_then_its_answer(page: Page) -> None:
    await _type(page, "A long answer please")
    await _streaming(page, "word3 ")
    await _queue(page, "Reload and the next thing")
    await expect(page.locator("#transcript .msg.pending")).to_have_count(1)
    await page.reload()
    pending = page.locator("#transcript .msg.pending")
    await expect(pending.locator(".body")).to_have_text("Reload and the next thing")
    await finished_answer(page, "Queued answer: Reload and the next thing")
    await expect(page.locator("#transcript .msg.pending")).to_have_count(0)
    await expect(page.locator("#transcript .msg-user .body")).to_have_text(
        ["A long answer please", "Reload and the next thing"]
    )


@asynccontextmanager
async def _another_tab(page: Page, browser: Browser, stack: WebStack) -> AsyncIterator[Tab]:
    """The page's conversation with one answered turn, and a second tab of the same user
    signed in beside it (its conversation not open yet); closed afterwards."""
    await _type(page, "The first next")
    await finished_answer(page, "Queued answer: The first next")
    other = await opener(browser)(stack.url)
    try:
        await sign_in(other.page, "cust_2291")
        yield other
        other.assert_clean()
    finally:
        await other.context.close()


async def _open_holding_the_second_read(tab: Tab, sid: str, release: asyncio.Event) -> None:
    """Open the conversation in `tab`; return once it has made its first read and asked for
    its second, which waits for `release`."""
    asked = await hold_second_read(tab.page, sid, release)
    await tab.page.locator(f'#sessions li[data-sid="{sid}"] .session-open').click()
    await asyncio.wait_for(asked.wait(), ASKED_TIMEOUT_S)


async def _session_id(page: Page) -> str:
    return str(await page.evaluate("sessionStorage.getItem('parley_session')"))


async def test_a_message_queued_while_another_tab_opens_the_conversation_waits_there(
    page: Page, browser: Browser, stack: WebStack
) -> None:
    """Queued between the other tab's two reads as it opens the conversation: neither read
    has it, whichever came first, unless the stream starts where the transcript ended and
    the session is read after it (api/web/js/app.js `openSession`)."""
    async with _another_tab(page, browser, stack) as other:
        release = asyncio.Event()
        stack.model.first_token_gate = gate = asyncio.Event()  # the answer runs, says nothing
        stack.model.waiting.clear()
        try:
            await _type(page, "A long answer please")
            await asyncio.wait_for(stack.model.waiting.wait(), ASKED_TIMEOUT_S)
            await _open_holding_the_second_read(other, await _session_id(page), release)
            await _queue(page, "And the next thing, meanwhile")
            await expect(page.locator("#transcript .msg.pending")).to_have_count(1)
            release.set()
            pending = other.page.locator("#transcript .msg.pending")
            await expect(pending.locator(".body")).to_have_text("And the next thing, meanwhile")
            await expect(pending.locator(".badge")).to_have_text("Sends when this answer ends")
        finally:
            stack.model.first_token_gate = None
            gate.set()
            release.set()
        await finished_answer(other.page, "Queued answer: And the next thing, meanwhile")
        await expect(other.page.locator("#transcript .msg.pending")).to_have_count(0)
        await expect(other.page.locator("#transcript .msg-user .body")).to_have_text(
            ["The first next", "A long answer please", "And the next thing, meanwhile"]
        )


async def test_a_turn_that_ends_while_another_tab_opens_the_conversation_shows_there_whole(
    page: Page, browser: Browser, stack: WebStack
) -> None:
    """Between the other tab's two reads the running answer ends and the message queued
    behind it starts: the first read has neither the answer nor that message, the second
    shows the queued turn running. Both are drawn, then its answer."""
    async with _another_tab(page, browser, stack) as other:
        release, later = asyncio.Event(), asyncio.Event()
        stack.model.first_token_gate = first = asyncio.Event()
        stack.model.waiting.clear()
        try:
            await _type(page, "A long answer please")
            await asyncio.wait_for(stack.model.waiting.wait(), ASKED_TIMEOUT_S)
            await _queue(page, "And the next thing, later on")
            await expect(page.locator("#transcript .msg.pending")).to_have_count(1)
            await _open_holding_the_second_read(other, await _session_id(page), release)
            # The long answer goes (its stream is past the gate it waited at); the queued
            # turn starts once it ends, and waits at the next gate: running, silent.
            stack.model.waiting.clear()
            stack.model.first_token_gate = later
            first.set()
            await asyncio.wait_for(stack.model.waiting.wait(), ASKED_TIMEOUT_S)
            release.set()
            bodies = other.page.locator("#transcript .msg .body")
            await expect(bodies.nth(2)).to_have_text("A long answer please")
            await expect(bodies.nth(3)).to_have_text(LONG)
            await expect(bodies.nth(4)).to_have_text("And the next thing, later on")
        finally:
            stack.model.first_token_gate = None
            first.set()
            later.set()
            release.set()
        await finished_answer(other.page, "Queued answer: And the next thing, later on")
        await expect(other.page.locator("#transcript .msg .body")).to_have_text(
            [
                "The first next",
                "Queued answer: The first next",
                "A long answer please",
                LONG,
                "And the next thing, later on",
                "Queued answer: And the next thing, later on",
            ]
        )
