"""Approvals with an honest clock on the page (issue 42), in Chromium at phone width and on the
desktop: the card says when it expires and counts down, turns into "expires soon" once the
warning is written, stays after it lapsed and offers "Ask again", and the card asked again is
confirmed once (one email). Accessibility is checked on the waiting, the warned and the
expired card, each at 390 px and on the desktop: one flow, the same page resized (the card's
clock does not depend on the width, so the lapse is waited for once).

The page is served by an API whose cards lapse after `WINDOW_S` (the worker is the session's);
the warning is written by running the outbox sweep's step (`warn_expiring`) under a deadline.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest_asyncio
from playwright.async_api import Locator, Page, expect

from parley.config import Settings
from parley.dispatch.approvals import warn_expiring
from parley.store.db import Database
from tests.support.stack import serve_api
from tests.support.toolkit import emails, eventually
from tests.support.webpage import (
    DESKTOP,
    PHONE,
    send,
    serious_accessibility_violations,
    sign_in,
)

ISO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT")
WINDOW_S = 20.0
LEAD_S = 16.0
# The window in force when the card is asked again (a renewal takes the window configured at
# that moment): long enough that the steps between asking again and confirming, a reload
# among them, never race it on a loaded machine.
RENEWED_WINDOW_S = 600.0


@dataclass
class ShortWindow:
    """An API of its own whose cards wait `WINDOW_S`, and the settings it serves with."""

    url: str
    settings: Settings


@pytest_asyncio.fixture
async def short_window(settings: Settings, api_url: str) -> AsyncIterator[ShortWindow]:
    short = settings.model_copy(update={"confirmation_timeout_s": WINDOW_S})
    async with serve_api(short) as url:
        yield ShortWindow(url, short)


async def at_both_widths(page: Page, card: Locator, what: str) -> None:
    """The card shown and axe-core finding nothing serious at 390 px, then on the desktop (the
    page stays at the desktop width afterwards)."""
    for viewport in (PHONE, DESKTOP):
        await page.set_viewport_size(viewport)
        await expect(card).to_be_visible()
        await expect(card.locator(".countdown")).to_be_visible()
        violations = await serious_accessibility_violations(page)
        assert violations == [], f"{what}, at {viewport['width']} px"


async def test_the_card_counts_down_warns_lapses_and_is_asked_again(
    open_tab: Callable[..., Any],
    short_window: ShortWindow,
    northwind: httpx.AsyncClient,
    sessions: Database,
) -> None:
    tab = await open_tab(short_window.url, PHONE)
    page = tab.page
    await sign_in(page, "cust_2291")
    await send(page, "Where is my order?", reply_has="8472")
    await page.locator("#input").fill("Can you email me?")
    await page.locator("#input").press("Enter")
    card = page.locator("#confirm-card")
    await expect(card).to_have_attribute("data-state", "pending")
    await expect(card.locator(".countdown")).to_contain_text("Expires at")
    await expect(card.locator(".countdown")).to_contain_text("left")
    await expect(card.locator(".countdown time")).to_have_attribute("datetime", ISO_TIME)
    first = await card.get_attribute("data-action-id")
    assert first
    await at_both_widths(page, card, "the waiting card")

    # The warning, once the sweep writes it: a reload follows the resting turn's log.
    async def warned() -> int:
        return await warn_expiring(sessions, default_lead_s=LEAD_S)

    await eventually(warned, timeout=WINDOW_S, what="the expiry warning")
    await page.reload()
    await expect(card).to_have_class(re.compile(r"\bexpiring\b"))
    await expect(card.locator(".expiring-note")).to_be_visible()
    await at_both_widths(page, card, "the warned card")
    await expect(card.locator(".expiring-note")).to_be_visible()

    # It lapses: the card stays, says nothing was sent, and offers to ask again.
    await expect(card).to_have_attribute("data-state", "expired")
    await expect(card.locator(".countdown")).to_have_text("This request expired; nothing was sent.")
    await expect(page.locator("#confirm-btn")).to_be_disabled()
    again = page.locator("#renew-btn")
    await expect(again).to_be_enabled()
    await at_both_widths(page, card, "the expired card")
    await expect(again).to_be_enabled()
    await page.set_viewport_size(PHONE)  # asked again and confirmed at 390 px

    short_window.settings.confirmation_timeout_s = RENEWED_WINDOW_S
    await again.dblclick()  # asks once
    await expect(card).to_have_attribute("data-renewed-from", first)
    await expect(card).to_have_attribute("data-state", "pending")
    await expect(card.locator(".countdown")).to_contain_text("left")
    renewed = await card.get_attribute("data-action-id")
    assert renewed and renewed != first
    # After a reload the renewed card is back (its turn has ended: it waits on its own).
    await page.reload()
    await expect(card).to_have_attribute("data-action-id", renewed)
    await expect(card).to_have_attribute("data-state", "pending")

    await page.locator("#confirm-btn").dblclick()
    await expect(page.locator("#transcript .notice").last).to_contain_text("Sent:")
    await expect(card).to_have_count(0)
    assert len(await emails(northwind, action_id=renewed)) == 1
    assert await emails(northwind, action_id=first) == []
    tab.assert_clean()
