"""Dana's five turns of design.md through the chat page, in headless Chromium, at desktop and at
phone width: a search, its refinement, a CSV export confirmed on the card (double-clicked, one
email with the three rows), a question about "them" and a new scope. Her worker, API and
Northwind backend are this module's own, so her email never shows up in other tests' counts."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import pytest_asyncio
from playwright.async_api import expect
from temporalio.client import Client

from parley.config import Settings
from parley.demo_backend.app import create_app as create_backend
from parley.gateway.demo import DemoModel
from parley.store.db import Database
from tests.support.stack import serve
from tests.support.toolkit import emails, own_stack
from tests.support.webpage import (
    DESKTOP,
    PHONE,
    finished_answer,
    last_answer,
    screenshot,
    send,
    sign_in,
)


@pytest_asyncio.fixture(scope="module")
async def dana_stack(
    settings: Settings, temporal_client: Client, sessions: Database
) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    """The page's URL and a client for the module's own Northwind backend."""
    async with (
        serve(create_backend()) as backend_url,
        httpx.AsyncClient(base_url=backend_url) as northwind,
        own_stack(
            temporal_client,
            settings,
            sessions,
            DemoModel(token_delay_s=0.002),
            prefix="web-dana",
            northwind_url=backend_url,
        ) as running,
    ):
        yield running.url, northwind


def order_ids(text: str) -> list[str]:
    return sorted(set(re.findall(r"\b9\d{3}\b", text)))


@pytest.mark.parametrize("width", ["desktop", "phone"])
async def test_dana_searches_refines_exports_and_starts_a_new_scope_through_the_page(
    open_tab: Callable[..., Any], dana_stack: tuple[str, httpx.AsyncClient], width: str
) -> None:
    url, northwind = dana_stack
    tab = await open_tab(url, DESKTOP if width == "desktop" else PHONE)
    page = tab.page
    shot = f"dana-{width}-"
    await sign_in(page, "cust_4410")
    await expect(page.locator("#whoami")).to_contain_text("Dana")

    # 1-2: last week's orders, then only those strictly over $500 (9114 is exactly 500.00).
    week = await send(page, "Show me my orders from last week.", reply_has="9114")
    assert order_ids(week) == ["9101", "9104", "9105", "9107", "9108", "9111", "9112", "9114"]
    await screenshot(page, shot + "1-last-week")
    over = await send(page, "Just the ones over $500.", reply_has="9111")
    assert order_ids(over) == ["9104", "9107", "9111"]
    await screenshot(page, shot + "2-over-500")

    # 3: the export waits on a card naming the file and its rows; nothing is sent before it.
    before = len(await emails(northwind))
    await page.locator("#input").fill("Export those as CSV.")
    await page.locator("#input").press("Enter")
    card = page.locator("#confirm-card")
    await expect(card).to_be_visible()
    await expect(card).to_contain_text("d***@example.com")
    await expect(card).to_contain_text("orders.csv (3 rows)")
    await expect(last_answer(page)).to_have_attribute("data-status", "complete")
    await screenshot(page, shot + "3-export-card")
    assert len(await emails(northwind)) == before

    # Confirm, clicked twice: one email, its CSV exactly the three referenced rows.
    action_id = await card.get_attribute("data-action-id")
    await page.locator("#confirm-btn").dblclick()
    sent = await finished_answer(page, "Sent")
    assert "orders.csv" in sent and "accepted" in sent
    await expect(card).to_have_count(0)
    assert action_id is not None
    [email] = await emails(northwind, action_id=action_id)
    [attachment] = email["attachments"]
    rows = list(csv.DictReader(io.StringIO(attachment["content"])))
    assert [r["order_id"] for r in rows] == ["9104", "9107", "9111"]
    await screenshot(page, shot + "4-exported")

    # 4-5: "them" is the same three; "everything over $1,000 in October" is a new scope.
    unshipped = await send(page, "Which of them hasn't shipped yet?", reply_has="processing")
    assert "9107" in unshipped and "Of those 3 orders" in unshipped
    october = await send(page, "And everything over $1,000 in October?", reply_has="9118")
    assert order_ids(october) == ["9097", "9107", "9118"]
    await screenshot(page, shot + "5-new-scope")

    # The final answers stay on screen, and still exactly one email went out.
    answers = page.locator("#transcript .msg-assistant")
    await expect(answers.last).to_contain_text("9118")
    await expect(page.locator("#transcript")).to_contain_text("Of those 3 orders")
    assert len(await emails(northwind)) == before + 1
    tab.assert_clean()
    await tab.context.close()
