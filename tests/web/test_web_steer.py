"""The chat page steering a running answer (issue 42, point 7): while an answer streams, a
hint says Enter steers it and the button queues; Enter sends the message into the running
answer, which is struck through as superseded, and the one answer that follows takes the
message into account. At 390 px and on a desktop, with axe-core finding nothing serious: one
flow, the same page resized while the answer streams and after it (steering does not depend on
the width). A worker of its own runs a model the test steers, slow enough to type during."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from playwright.async_api import Browser, Page, expect
from temporalio.client import Client

from parley.config import Settings
from parley.gateway.base import ModelRequest
from parley.store.db import Database
from tests.support.models import ControlledModel
from tests.support.toolkit import Stack, own_stack
from tests.support.webpage import (
    DESKTOP,
    PHONE,
    finished_answer,
    last_answer,
    opener,
    serious_accessibility_violations,
    sign_in,
)

# About 15 s at the stack's pace if it ran to its end: room for two axe runs while it streams;
# the steer ends it early.
LONG_WORDS = 300
LONG = " ".join(f"word{i}" for i in range(LONG_WORDS))
SHORT = "Short version: order 8472 has shipped."
WebStack = Stack[ControlledModel]


@pytest_asyncio.fixture(scope="module")
async def stack(
    settings: Settings, temporal_client: Client, sessions: Database
) -> AsyncIterator[WebStack]:
    model = ControlledModel(token_delay_s=0.05)

    def reply(request: ModelRequest) -> str | None:
        users = [m for m in request.messages if m.get("role") == "user"]
        text = str(users[-1].get("content", "")) if users else ""
        if "shorter" in text:
            return SHORT
        return LONG if "long" in text else None

    model.reply = reply
    async with own_stack(temporal_client, settings, sessions, model, prefix="websteer") as stack:
        yield stack


async def test_enter_steers_a_streaming_answer_and_the_button_queues(
    browser: Browser, stack: WebStack
) -> None:
    tab = await opener(browser)(stack.url, PHONE)
    page: Page = tab.page
    await sign_in(page, "cust_2291")
    hint = page.locator("#steer-hint")
    await expect(hint).to_be_hidden()
    await expect(page.locator("#send")).to_have_text("Send")
    await page.locator("#input").fill("A long answer please")
    await page.locator("#input").press("Enter")
    streaming = last_answer(page)
    await expect(streaming).to_have_class("msg msg-assistant streaming")
    await expect(streaming.locator(".body")).to_contain_text("word3")
    # That bubble, by its message id (the last answer is another one once the steer is taken).
    first_id = await streaming.get_attribute("data-message-id")
    first = page.locator(f'#transcript .msg[data-message-id="{first_id}"]')
    # While it streams: the hint, and the button that queues instead.
    await expect(hint).to_be_visible()
    await expect(hint).to_contain_text("Enter steers")
    await expect(page.locator("#send")).to_have_text("Queue")
    assert await serious_accessibility_violations(page) == [], "streaming, with the hint, 390px"
    await page.set_viewport_size(DESKTOP)
    await expect(hint).to_be_visible()
    await expect(hint).to_contain_text("Enter steers")
    await expect(page.locator("#send")).to_have_text("Queue")
    await expect(first).to_have_class("msg msg-assistant streaming")
    assert await serious_accessibility_violations(page) == [], "streaming, with the hint, desktop"

    await page.locator("#input").fill("Make it shorter")
    await page.locator("#input").press("Enter")
    await expect(first).to_have_class("msg msg-assistant superseded")
    await expect(first.locator(".badge-superseded")).to_have_text("Superseded by your message")
    assert await finished_answer(page, SHORT) == SHORT
    # One answer: the steered message after the first, then the answer; nothing queued.
    bodies = page.locator("#transcript .msg:not(.superseded) .body")
    await expect(bodies).to_have_text(["A long answer please", "Make it shorter", SHORT])
    await expect(page.locator("#transcript .msg.pending")).to_have_count(0)
    last_word = f"word{LONG_WORDS - 1}"
    assert last_word not in (await first.locator(".body").text_content() or "")
    await expect(hint).to_be_hidden()
    await expect(page.locator("#send")).to_have_text("Send")
    assert await serious_accessibility_violations(page) == [], "after a steered answer, desktop"
    await page.set_viewport_size(PHONE)
    await expect(bodies).to_have_text(["A long answer please", "Make it shorter", SHORT])
    await expect(first.locator(".badge-superseded")).to_be_visible()
    await expect(hint).to_be_hidden()
    await expect(page.locator("#send")).to_have_text("Send")
    assert await serious_accessibility_violations(page) == [], "after a steered answer, 390px"
    tab.assert_clean()
    await tab.context.close()
