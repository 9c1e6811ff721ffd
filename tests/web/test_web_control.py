"""The chat page when answers are long, hostile or interrupted: Markdown and inert HTML,
reload mid-stream and with a waiting card, a network drop, Stop and Retry, the operators' turn
link. A worker of its own runs a model the tests steer (slow enough to interrupt)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, Route, expect
from temporalio.client import Client

from parley.config import Settings
from parley.gateway.base import ModelRequest
from parley.store.db import Database
from tests.support.client import ParleyClient
from tests.support.models import ControlledModel
from tests.support.toolkit import Stack, emails, own_stack, wait_for_stored_state
from tests.support.webpage import (
    WATCH_STREAMING,
    DroppingRelay,
    finished_answer,
    last_answer,
    opener,
    send,
    sign_in,
    streamed_snapshots,
)

UI = "http://temporal-ui.invalid"
LONG = " ".join(f"word{i}" for i in range(70))  # about 2 s at the stack's pace
MARKDOWN = (
    "Here is what I found:\n\n"
    "- **Order 8472** has shipped\n"
    "- the refund is *settling*\n\n"
    "See [the policy](https://example.com/returns).\n\n"
    "<img src=x onerror=alert(1)>\n\n"
    "<script>alert(2)</script>\n\n"
    "```\nan unclosed fence"
)
WebStack = Stack[ControlledModel]


@pytest_asyncio.fixture(scope="module")
async def stack(
    settings: Settings, temporal_client: Client, sessions: Database
) -> AsyncIterator[WebStack]:
    model = ControlledModel(token_delay_s=0.03)
    async with own_stack(
        temporal_client, settings, sessions, model, prefix="web", temporal_ui_url=UI
    ) as stack:
        yield stack


@pytest.fixture
def replies(stack: WebStack) -> Callable[[dict[str, str]], None]:
    """Fixed replies by a word of the user's message; anything else is the demo model."""

    def set_replies(by_word: dict[str, str]) -> None:
        def reply(request: ModelRequest) -> str | None:
            users = [m for m in request.messages if m.get("role") == "user"]
            text = str(users[-1].get("content", "")) if users else ""
            return next((r for word, r in by_word.items() if word in text), None)

        stack.model.reply = reply

    return set_replies


@pytest_asyncio.fixture
async def page(browser: Browser, stack: WebStack) -> AsyncIterator[Page]:
    tab = await opener(browser)(stack.url)
    await sign_in(tab.page, "cust_2291")
    yield tab.page
    tab.assert_clean()
    await tab.context.close()
    stack.model.reply = lambda request: None


async def streaming_shows(page: Page, text: str) -> None:
    await expect(page.locator("#transcript .msg.streaming .body")).to_contain_text(text)


async def test_markdown_renders_and_html_in_model_text_stays_inert(
    page: Page, replies: Callable[[dict[str, str]], None]
) -> None:
    replies({"markdown": MARKDOWN})
    await send(page, "Show me markdown please", reply_has="Here is what I found")
    body = last_answer(page).locator(".body")
    await expect(body.locator("ul > li")).to_have_count(2)
    await expect(body.locator("strong")).to_have_text("Order 8472")
    await expect(body.locator("em")).to_have_text("settling")
    link = body.locator("a")
    await expect(link).to_have_attribute("href", "https://example.com/returns")
    await expect(link).to_have_attribute("rel", "noopener noreferrer nofollow")
    await expect(body.locator("pre code")).to_have_text("an unclosed fence\n")
    # The tags are shown as text; no element, no handler ran (the fixture checks dialogs).
    await expect(body).to_contain_text("<img src=x onerror=alert(1)>")
    await expect(body).to_contain_text("<script>alert(2)</script>")
    await expect(page.locator("#transcript img, #transcript script")).to_have_count(0)


async def test_each_answer_links_its_turn_in_the_temporal_ui(page: Page) -> None:
    await send(page, "Where is my order?", reply_has="8472")
    answer = last_answer(page)
    turn_id = await answer.get_attribute("data-turn-id")
    assert turn_id and turn_id.startswith("trn_")
    link = answer.locator("a.turn-link")
    await expect(link).to_have_text("turn")
    await expect(link).to_have_attribute(
        "href", f"{UI}/namespaces/default/workflows/turn-{turn_id}"
    )
    await expect(page.locator("#transcript .msg-user a.turn-link")).to_have_count(0)


async def test_a_reload_mid_stream_resumes_the_answer_whole(
    page: Page, replies: Callable[[dict[str, str]], None]
) -> None:
    replies({"long": LONG})
    await page.locator("#input").fill("A long answer please")
    await page.locator("#input").press("Enter")
    await streaming_shows(page, "word5 ")
    await page.reload()
    # The same tab reopens its conversation and follows the turn from the event log.
    await expect(page.locator("#transcript .msg-user .body")).to_have_text(["A long answer please"])
    text = await finished_answer(page, "word69")
    assert text == LONG
    await expect(page.locator("#transcript .msg-assistant")).to_have_count(1)
    await expect(page.locator("#transcript .badge")).to_have_count(0)


async def test_a_reload_brings_back_the_waiting_card_and_it_still_works(
    page: Page, northwind: httpx.AsyncClient
) -> None:
    await send(page, "Where is my order?", reply_has="8472")
    await page.locator("#input").fill("Can you email me?")
    await page.locator("#input").press("Enter")
    card = page.locator("#confirm-card")
    await expect(card).to_be_visible()
    action_id = await card.get_attribute("data-action-id")
    assert action_id

    await page.reload()
    await expect(card).to_be_visible()
    await expect(card).to_have_attribute("data-action-id", action_id)
    await expect(card).to_contain_text("p***@example.com")
    await expect(page.locator("#transcript .msg-assistant")).to_have_count(2)
    await expect(page.locator("#transcript .badge")).to_have_count(0)
    await page.locator("#confirm-btn").click()
    await finished_answer(page, "Sent")
    await expect(page.locator("#transcript .badge")).to_have_count(0)
    assert len(await emails(northwind, action_id=action_id)) == 1


async def test_a_network_drop_mid_stream_reconnects_with_nothing_lost_or_repeated(
    browser: Browser,
    stack: WebStack,
    replies: Callable[[dict[str, str]], None],
) -> None:
    replies({"long": LONG})
    relay = DroppingRelay(stack.url)
    tab = await opener(browser)(await relay.start())
    page = tab.page
    try:
        await sign_in(page, "cust_2291")
        await page.evaluate(WATCH_STREAMING)
        await page.locator("#input").fill("A long answer please")
        await page.locator("#input").press("Enter")
        await streaming_shows(page, "word5 ")

        async def refuse(route: Route) -> None:
            await route.abort("internetdisconnected")

        # The network goes away for 3 s: the open stream breaks and every reconnect fails.
        await page.route("**/events*", refuse)
        relay.cut()
        await expect(page.locator("#status")).to_contain_text("Reconnecting")
        await asyncio.sleep(3)  # the length of the outage is what is under test
        await page.unroute("**/events*", refuse)

        text = await finished_answer(page, "word69")
        assert text == LONG
        message_id = await last_answer(page).get_attribute("data-message-id")
        shown = await streamed_snapshots(page, message_id or "")
        # Each text the bubble showed while it streamed, the answer's start: the ones that were
        # not (a word lost, or shown twice) are what a failure prints.
        assert shown and [s for s in shown if not LONG.startswith(s)] == []
        await expect(page.locator("#status")).not_to_contain_text("Reconnecting")
        tab.assert_clean()
    finally:
        await tab.context.close()
        await relay.stop()


async def test_stop_keeps_the_partial_answer_and_retry_replaces_it_in_place(
    page: Page, replies: Callable[[dict[str, str]], None], stack: WebStack
) -> None:
    replies({"long": LONG})
    await page.locator("#input").fill("A long answer please")
    await page.locator("#input").press("Enter")
    await streaming_shows(page, "word5 ")
    await page.locator("#stop").click()
    answer = last_answer(page)
    await expect(answer).to_have_attribute("data-status", "cancelled")
    await expect(answer.locator(".badge")).to_have_text("Stopped")
    stopped_id = await answer.get_attribute("data-message-id")

    stack.model.token_delay_s = 0.005
    try:
        await answer.locator(".retry").click()
        text = await finished_answer(page, "word69")
    finally:
        stack.model.token_delay_s = 0.03
    assert text == LONG
    answers = page.locator("#transcript .msg-assistant")
    await expect(answers).to_have_count(1)  # replaced, in its place
    assert await answers.get_attribute("data-message-id") != stopped_id
    await expect(page.locator("#transcript .badge")).to_have_count(0)
    await expect(page.locator("#transcript .retry")).to_have_count(0)


async def test_deleting_a_conversation_cancels_its_running_turn(
    stack: WebStack,
    replies: Callable[[dict[str, str]], None],
    tokens: dict[str, str],
    sessions: Database,
) -> None:
    replies({"long": LONG})
    priya = ParleyClient(stack.url, tokens["priya"])
    try:
        sid = await priya.new_session()
        turn_id = (await priya.post(sid, "A long answer please")).json()["turn_id"]
        await wait_for_stored_state(sessions, turn_id, ["calling_model"], timeout=20)
        assert (await priya.http.delete(f"/v1/sessions/{sid}")).status_code == 204
        await wait_for_stored_state(sessions, turn_id, ["cancelled"], timeout=20)
        assert (await priya.http.get(f"/v1/sessions/{sid}/turns/{turn_id}")).status_code == 404
    finally:
        await priya.aclose()
