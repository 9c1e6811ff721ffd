"""Every tab live (issue 42, acceptance 7's second tab): the same customer has the
conversation open on two devices. What is typed on one appears on the other with its answer
streaming, a card shows on both, and confirmed on one it turns confirmed on the other at
once; the follower's page stays accessible. At a phone's 390 px and on a desktop.

A message sent while the other device is still opening the conversation shows there too: sent
between its transcript read and its stream's connection, the stream takes up where the
transcript stopped (docs/api.md, Opening a conversation); begun between its reads of the
transcript and of the session, the turn is shown. Opened while the API cannot answer (the
network drops, the database restarts), the conversation opens, live, once it can."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from playwright.async_api import Page, Route, expect

from parley.api.errors import unavailable_response
from tests.support.webpage import (
    DESKTOP,
    PHONE,
    WATCH_STREAMING,
    Tab,
    finished_answer,
    hold_second_read,
    last_answer,
    send,
    serious_accessibility_violations,
    sign_in,
    streamed_snapshots,
)

# Every text the status line shows, kept in `window.__statuses`.
WATCH_STATUS = """() => {
  window.__statuses = [];
  const line = document.getElementById('status');
  new MutationObserver(() => window.__statuses.push(line.textContent)).observe(line, {
    subtree: true, childList: true, characterData: true,
  });
}"""

# An upper bound on waiting for the page to ask for what is held, not a target.
ASKED_TIMEOUT_S = 45


def held_until(release: asyncio.Event) -> tuple[asyncio.Event, Callable[[Route], Any]]:
    """A route handler that holds the page's request until `release`, and the event set when
    the page has asked."""
    asked = asyncio.Event()

    async def hold(route: Route) -> None:
        asked.set()
        await release.wait()
        await route.continue_()

    return asked, hold


async def two_devices(open_tab: Callable[..., Any], api_url: str) -> tuple[Tab, Tab, str]:
    """The customer's laptop, one answered turn into a conversation, and a phone signed in as
    the same customer that has not opened it yet; and the conversation's id."""
    laptop = await open_tab(api_url)
    await sign_in(laptop.page, "cust_2291")
    await send(laptop.page, "Where is my order?", reply_has="8472")
    sid = await laptop.page.evaluate("sessionStorage.getItem('parley_session')")
    phone = await open_tab(api_url)
    await sign_in(phone.page, "cust_2291")
    return laptop, phone, sid


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
    # Its session stream is open (its `ready` frame read) before the laptop types, so that the
    # answer is seen streaming here (one sent while it connects: the test below).
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


async def test_a_message_sent_while_the_other_device_opens_the_conversation_shows_there(
    open_tab: Callable[..., Any], api_url: str
) -> None:
    laptop, phone, sid = await two_devices(open_tab, api_url)
    # The phone's session stream is held at its request: the page has read the transcript and
    # is connecting when the laptop's message is sent and answered.
    release = asyncio.Event()
    asked, connecting = held_until(release)
    await phone.page.route(f"**/v1/sessions/{sid}/stream", connecting)
    await open_conversation(phone.page, sid, phone=False)
    await asyncio.wait_for(asked.wait(), ASKED_TIMEOUT_S)
    await send(laptop.page, "What about the refund?", reply_has="24.00")
    release.set()

    users = phone.page.locator("#transcript .msg-user")
    await expect(users).to_have_count(2)
    await expect(users.last.locator(".body")).to_have_text("What about the refund?")
    refund = await finished_answer(phone.page, "24.00")
    assert "8472" in refund
    await expect(phone.page.locator("#transcript .msg-assistant")).to_have_count(2)
    await expect(phone.page.locator(f'html[data-live-session="{sid}"]')).to_have_count(1)
    laptop.assert_clean()
    phone.assert_clean()


async def test_a_turn_begun_between_the_pages_reads_shows_there(
    open_tab: Callable[..., Any], api_url: str
) -> None:
    laptop, phone, sid = await two_devices(open_tab, api_url)
    # The phone has made the first of its two reads (the transcript, the session) and the
    # second is held while the laptop's next turn begins and comes to rest on its card.
    release = asyncio.Event()
    asked = await hold_second_read(phone.page, sid, release)
    await phone.page.locator(f'#sessions li[data-sid="{sid}"] .session-open').click()
    await asyncio.wait_for(asked.wait(), ASKED_TIMEOUT_S)
    await laptop.page.locator("#input").fill("Can you email me?")
    await laptop.page.locator("#input").press("Enter")
    await expect(laptop.page.locator("#confirm-card")).to_be_visible()
    release.set()

    await expect(phone.page.locator("#transcript .msg-user")).to_have_count(2)
    await expect(phone.page.locator("#confirm-card")).to_be_visible()
    await expect(phone.page.locator("#confirm-card .summary")).to_have_text(
        await laptop.page.locator("#confirm-card .summary").inner_text()
    )
    await phone.page.locator("#confirm-btn").click()
    await finished_answer(phone.page, "accepted")
    await finished_answer(laptop.page, "accepted")
    laptop.assert_clean()
    phone.assert_clean()


async def test_a_conversation_opened_while_the_api_cannot_answer_opens_live_once_it_can(
    open_tab: Callable[..., Any], api_url: str
) -> None:
    laptop, phone, sid = await two_devices(open_tab, api_url)
    # Each of the page's two reads fails once: the transcript's connection drops, and the
    # session's read gets the answer the API gives while its database is down.
    failing = {"messages": 1, "session": 1}

    async def fail_once(route: Route) -> None:
        read = "messages" if "/messages" in route.request.url else "session"
        if not failing[read]:
            return await route.continue_()
        failing[read] -= 1
        if read == "messages":
            return await route.abort("internetdisconnected")
        down = unavailable_response("database")  # the API's own answer, its Retry-After too
        await route.fulfill(status=down.status_code, body=bytes(down.body), headers=down.headers)

    await phone.page.route(f"**/v1/sessions/{sid}", fail_once)
    await phone.page.route(f"**/v1/sessions/{sid}/messages?*", fail_once)
    await phone.page.evaluate(WATCH_STATUS)
    await phone.page.locator(f'#sessions li[data-sid="{sid}"] .session-open').click()

    await expect(phone.page.locator(f'html[data-live-session="{sid}"]')).to_have_count(1)
    assert failing == {"messages": 0, "session": 0}
    await expect(phone.page.locator("#transcript .msg-user")).to_have_count(1)
    said = await phone.page.evaluate("window.__statuses")
    assert any("network is unreachable" in s and "Trying again in" in s for s in said), said
    assert any("database is unreachable" in s and "Trying again in" in s for s in said), said
    await expect(phone.page.locator("#status")).to_have_text("")
    await send(laptop.page, "What about the refund?", reply_has="24.00")
    await finished_answer(phone.page, "24.00")  # live: the laptop's turn streams here
    laptop.assert_clean()
    phone.assert_clean()
