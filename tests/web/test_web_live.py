"""Every tab live (issue 42, acceptance 7's second tab): the same customer has the
conversation open on two devices. What is typed on one appears on the other with its answer
streaming, a card shows on both, and confirmed on one it turns confirmed on the other at
once; the follower's page stays accessible. At a phone's 390 px and on a desktop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from playwright.async_api import Page, expect

from tests.support.webpage import (
    DESKTOP,
    PHONE,
    WATCH_STREAMING,
    finished_answer,
    last_answer,
    send,
    serious_accessibility_violations,
    sign_in,
    streamed_snapshots,
)


async def open_conversation(page: Page, sid: str, *, phone: bool) -> None:
    """Open the conversation from the list, as a user does (behind the menu on a phone)."""
    if phone:
        await page.locator("#menu").click()
    await page.locator(f'#sessions li[data-sid="{sid}"] .session-open').click()
    await expect(page.locator("#transcript .msg-user")).to_have_count(1)


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["390px", "desktop"])
async def test_a_second_device_follows_the_conversation_live(
    open_tab: Callable[..., Any], api_url: str, viewport: dict[str, int]
) -> None:
    laptop = await open_tab(api_url, viewport)
    await sign_in(laptop.page, "cust_2291")
    await send(laptop.page, "Where is my order?", reply_has="8472")
    sid = await laptop.page.evaluate("sessionStorage.getItem('parley_session')")
    phone = await open_tab(api_url, viewport)
    await sign_in(phone.page, "cust_2291")
    await open_conversation(phone.page, sid, phone=viewport == PHONE)
    # Its session stream is open (its `ready` frame read) before the laptop types: it starts
    # from now, so a message sent while it was still connecting would not show here.
    await expect(phone.page.locator(f'html[data-live-session="{sid}"]')).to_have_count(1)
    await phone.page.evaluate(WATCH_STREAMING)

    # Typed on the laptop: on the phone, the message and its answer, streamed.
    await laptop.page.locator("#input").fill("What about the refund?")
    await laptop.page.locator("#input").press("Enter")
    users = phone.page.locator("#transcript .msg-user")
    await expect(users.last.locator(".body")).to_have_text("What about the refund?")
    refund = await finished_answer(phone.page, "24.00")
    assert "8472" in refund
    answer_id = await last_answer(phone.page).get_attribute("data-message-id")
    assert await streamed_snapshots(phone.page, answer_id or ""), "painted whole, not streamed"
    await finished_answer(laptop.page, "24.00")

    # A card on both; confirmed on the laptop, confirmed on the phone.
    await laptop.page.locator("#input").fill("Can you email me?")
    await laptop.page.locator("#input").press("Enter")
    await expect(laptop.page.locator("#confirm-card")).to_be_visible()
    await expect(phone.page.locator("#confirm-card")).to_be_visible()
    await expect(phone.page.locator("#confirm-card .summary")).to_have_text(
        await laptop.page.locator("#confirm-card .summary").inner_text()
    )
    assert await serious_accessibility_violations(phone.page) == [], "follower with a card"
    await laptop.page.locator("#confirm-btn").click()
    await expect(phone.page.locator("#confirm-card")).to_have_count(0)
    await expect(phone.page.locator(".notice").last).to_contain_text("You confirmed")
    await finished_answer(phone.page, "accepted")
    await finished_answer(laptop.page, "accepted")
    assert await serious_accessibility_violations(phone.page) == [], "follower after the send"
    laptop.assert_clean()
    phone.assert_clean()
