"""The chat page at `/`, driven like a customer drives it: a real headless Chromium against
the real API server (PostgreSQL, Temporal, the worker and the deterministic demo model).

Priya's reference conversation through the page, at desktop and at phone width, with a
screenshot of every step; sign-in; the conversation list; accessibility.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from playwright.async_api import Page, expect

from tests.support.client import ParleyClient
from tests.support.toolkit import emails
from tests.support.webpage import (
    DESKTOP,
    PHONE,
    finished_answer,
    last_answer,
    screenshot,
    send,
    serious_accessibility_violations,
    sign_in,
    streamed_snapshots,
)


async def no_badges(page: Page) -> None:
    await expect(page.locator("#transcript .badge")).to_have_count(0)


@pytest.mark.parametrize("width", ["desktop", "phone"])
async def test_priya_holds_the_reference_conversation_through_the_page(
    open_tab: Callable[..., Any],
    api_url: str,
    northwind: httpx.AsyncClient,
    width: str,
) -> None:
    tab = await open_tab(api_url, DESKTOP if width == "desktop" else PHONE)
    page = tab.page
    shot = f"{width}-"
    await expect(page.locator("#signin")).to_be_visible()
    await screenshot(page, shot + "1-sign-in")
    await sign_in(page, "cust_2291")
    await expect(page.locator("#whoami")).to_have_text("Signed in as Priya")

    # 1-2: answers stream in, rendered as Markdown text, with times and no badges.
    first = await send(page, "Where is my order?", reply_has="8472")
    assert "shipped" in first and "Oct 30" in first
    message_id = await last_answer(page).get_attribute("data-message-id")
    partial = [s for s in await streamed_snapshots(page, message_id or "") if s and s != first]
    assert partial and all(first.startswith(s) for s in partial), partial
    await expect(last_answer(page).locator(".meta time")).to_have_count(1)
    await expect(page.locator("#transcript .tool-chip")).to_have_count(1)
    await expect(page.locator("#transcript .tool-chip")).to_have_attribute("data-phase", "end")
    await screenshot(page, shot + "2-first-answer")
    second = await send(page, "What about the refund?", reply_has="USD 24.00")
    assert "On order 8472" in second and "R-5102" not in second

    # 3: the proposal waits on a card; its bubble carries no badge; nothing is sent yet.
    before = len(await emails(northwind))
    await page.locator("#input").fill("Can you email me?")
    await page.locator("#input").press("Enter")
    card = page.locator("#confirm-card")
    await expect(card).to_be_visible()
    await expect(card.locator(".summary")).to_contain_text("8472")
    await expect(card).to_contain_text("p***@example.com")
    await expect(card.locator(".countdown")).to_contain_text("left")
    await expect(last_answer(page)).to_contain_text("Nothing is sent until you confirm")
    await expect(last_answer(page)).not_to_have_class("streaming")
    await expect(last_answer(page)).to_have_attribute("data-status", "complete")
    await no_badges(page)
    await screenshot(page, shot + "3-confirmation-card")
    assert len(await emails(northwind)) == before

    # 4: Confirm, clicked twice: one email; the answer says sent; still no badge anywhere.
    action_id = await card.get_attribute("data-action-id")
    await page.locator("#confirm-btn").dblclick()
    sent = await finished_answer(page, "Sent")
    assert "accepted" in sent and "deliver" not in sent.lower()
    await expect(card).to_have_count(0)
    await no_badges(page)
    assert action_id and len(await emails(northwind, action_id=action_id)) == 1
    assert len(await emails(northwind)) == before + 1
    await screenshot(page, shot + "4-sent")

    # 5: one clarification: the question once (as the answer), the options under it.
    await page.locator("#input").fill("Thanks. And the other one?")
    await page.locator("#input").press("Enter")
    options = page.locator("#transcript .options")
    await expect(options).to_have_count(1)
    await expect(options.locator("button")).to_have_text(["Order 8390", "Refund R-5102"])
    await expect(page.locator("#transcript .msg-assistant .options")).to_have_count(1)
    question = await options.get_attribute("aria-label")
    assert question and question.startswith("Which one do you mean")
    await expect(page.get_by_text(question, exact=True)).to_have_count(1)
    await expect(page.locator("#transcript .clarification")).to_have_count(0)
    await screenshot(page, shot + "5-clarification")

    # 6-7: the option answers it; the follow-ups stay on order 8390.
    await options.get_by_role("button", name="Order 8390").click()
    await finished_answer(page, "8390")
    returnable = await send(page, "Can I still return it?", reply_has="4 days")
    assert "8390" in returnable
    arrived = await send(page, "When did it arrive?", reply_has="Oct 2")
    assert "8390" in arrived and "8472" not in arrived
    await no_badges(page)
    await screenshot(page, shot + "6-final-answer")

    # The conversation is listed under its first message.
    listed = page.locator("#sessions .session.active .session-title")
    if width == "phone":
        await page.locator("#menu").click()
    await expect(listed).to_have_text("Where is my order?")
    await expect(page.locator("#sessions .session.active .session-time")).to_have_text("just now")
    await screenshot(page, shot + "7-conversations")
    assert len(await emails(northwind)) == before + 1
    tab.assert_clean()
    await tab.context.close()


async def test_a_token_signs_in_for_the_tab_only_and_a_bad_one_is_refused(
    open_tab: Callable[..., Any], api_url: str, tokens: dict[str, str]
) -> None:
    tab = await open_tab(api_url)
    page = tab.page
    await page.locator("#token").fill("pk_not_a_real_token")
    await page.locator("#token").press("Enter")
    await expect(page.locator("#signin-error")).to_contain_text("not accepted")
    await expect(page.locator("#app")).to_be_hidden()

    await page.locator("#token").fill(tokens["marco"])
    await page.locator("#token-submit").click()
    await expect(page.locator("#app")).to_be_visible()
    stored = await page.evaluate(
        "() => [sessionStorage.getItem('parley_token'), localStorage.length]"
    )
    assert stored == [tokens["marco"], 0]  # kept for this tab, never in localStorage

    await page.reload()  # the same tab keeps it
    await expect(page.locator("#app")).to_be_visible()
    other = await tab.context.new_page()  # a new tab starts signed out
    await other.goto("/")
    await expect(other.locator("#signin")).to_be_visible()

    await page.locator("#sign-out").click()
    await expect(page.locator("#signin")).to_be_visible()
    assert await page.evaluate("() => sessionStorage.getItem('parley_token')") is None
    tab.assert_clean()
    await tab.context.close()


async def test_conversations_are_titled_newest_first_empty_ones_hidden_and_deletable(
    open_tab: Callable[..., Any], api_url: str, marco: ParleyClient
) -> None:
    empty = await marco.new_session()  # like the one `make run` creates
    tab = await open_tab(api_url)
    page = tab.page
    await sign_in(page, "cust_3301")
    await send(page, "Where is my order?", reply_has="order")
    await page.locator("#new-session").click()
    await expect(page.locator("#transcript .msg")).to_have_count(0)
    await send(page, "Thanks!", reply_has="welcome")

    titles = page.locator("#sessions .session-title")
    await expect(titles.nth(0)).to_have_text("Thanks!")
    await expect(titles.nth(1)).to_have_text("Where is my order?")
    await expect(page.locator(f'#sessions li[data-sid="{empty}"]')).to_have_count(0)

    # Delete takes two presses; then the conversation is gone here and from the API. (Marco
    # may have older conversations from other tests; ours are the two newest.)
    old_id = await page.locator("#sessions li").nth(1).get_attribute("data-sid")
    older = page.locator(f'#sessions li[data-sid="{old_id}"]')  # the same one, re-rendered
    await older.locator(".session-delete").click()
    await expect(older.locator(".session-delete")).to_have_text("Delete?")
    await older.locator(".session-delete").click()
    await expect(page.locator(f'#sessions li[data-sid="{old_id}"]')).to_have_count(0)
    assert (await marco.http.get(f"/v1/sessions/{old_id}")).status_code == 404
    await expect(titles.nth(0)).to_have_text("Thanks!")
    tab.assert_clean()
    await tab.context.close()


async def test_keyboard_only_use(open_tab: Callable[..., Any], api_url: str) -> None:
    tab = await open_tab(api_url)
    page = tab.page
    # The first demo customer's button has focus; Enter signs in, focus lands in the box.
    await expect(page.locator(".demo-user").first).to_be_focused()
    await page.keyboard.press("Enter")
    await expect(page.locator("#input")).to_be_focused()
    await page.keyboard.type("Where is")
    await page.keyboard.press("Shift+Enter")
    await page.keyboard.type("my order?")
    await expect(page.locator("#input")).to_have_value("Where is\nmy order?")
    await expect(page.locator("#transcript .msg")).to_have_count(0)  # Shift+Enter did not send
    await page.keyboard.press("Enter")
    await finished_answer(page, "8472")
    # Tab order after the box: Send, then nothing hidden (Stop is hidden when idle).
    await page.locator("#input").focus()
    await page.keyboard.press("Tab")
    await expect(page.locator("#send")).to_be_focused()
    tab.assert_clean()
    await tab.context.close()


async def test_axe_finds_no_serious_or_critical_violations(
    open_tab: Callable[..., Any], api_url: str
) -> None:
    for viewport in (DESKTOP, PHONE):
        tab = await open_tab(api_url, viewport)
        page = tab.page
        assert await serious_accessibility_violations(page) == [], "sign-in page"
        await sign_in(page, "cust_2291")
        await send(page, "Where is my order?", reply_has="8472")
        await page.locator("#input").fill("Can you email me?")
        await page.locator("#input").press("Enter")
        await expect(page.locator("#confirm-card")).to_be_visible()
        assert await serious_accessibility_violations(page) == [], "conversation with a card"
        await page.locator("#decline-btn").click()
        await finished_answer(page, "won't send")
        tab.assert_clean()
        await tab.context.close()
