"""The useChat example page (examples/use-chat, served at /examples/use-chat) in Chromium, at
desktop and phone width: Priya's answer streams in, the email proposal is the AI SDK's
approval UI, the confirmation sends once and the answer says so; axe finds nothing serious."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from playwright.async_api import Page, expect

from tests.support.toolkit import emails
from tests.support.webpage import DESKTOP, PHONE, screenshot, serious_accessibility_violations

# Every text the answers' text parts showed, in order (React replaces nodes as it renders).
WATCH_ANSWERS = """() => {
  window.__shown = [];
  new MutationObserver(() => {
    const parts = document.querySelectorAll('.msg-assistant .text');
    const last = parts[parts.length - 1];
    if (last) window.__shown.push(last.textContent);
  }).observe(document.body, { childList: true, subtree: true, characterData: true });
}"""


async def ask(page: Page, text: str) -> None:
    await page.locator("#input").fill(text)
    await page.locator("#input").press("Enter")
    await expect(page.locator(".msg-user .text").last).to_have_text(text)


async def settled(page: Page) -> None:
    """The answer has finished: the composer offers Send again, and no error is shown."""
    await expect(page.get_by_role("button", name="Send")).to_be_visible()
    await expect(page.locator(".status")).to_have_text("")


@pytest.mark.parametrize("width", ["desktop", "phone"])
async def test_the_use_chat_page_streams_asks_for_approval_and_sends_once(
    open_tab: Callable[..., Any], api_url: str, northwind: httpx.AsyncClient, width: str
) -> None:
    tab = await open_tab(api_url, DESKTOP if width == "desktop" else PHONE)
    page = tab.page
    shot = f"use-chat-{width}-"
    response = await page.goto("/examples/use-chat")
    assert response is not None and response.status == 200
    assert "script-src 'self'" in response.headers["content-security-policy"]
    await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    assert await serious_accessibility_violations(page) == [], "sign-in"
    await page.get_by_role("button", name=re.compile("Priya")).click()
    await expect(page.locator("#input")).to_be_visible()

    # The answer streams: the page showed parts of it before the whole.
    await page.evaluate(WATCH_ANSWERS)
    await ask(page, "Where is my order?")
    answer = page.locator(".msg-assistant").last
    await expect(answer.locator(".text").last).to_contain_text("Oct 30")
    await settled(page)
    final = await answer.locator(".text").last.text_content()
    shown = await page.evaluate("() => window.__shown")
    assert final and "8472" in final
    partial = [s for s in shown if s and s != final]
    assert partial and all(final.startswith(s) for s in partial), shown
    await expect(answer.locator(".tool")).to_have_text("Looking up your orders… (done)")
    await screenshot(page, shot + "1-answer")

    # The proposal is the SDK's approval request; nothing is sent until it is answered.
    before = len(await emails(northwind))
    await ask(page, "Can you email me?")
    approval = page.get_by_role("region", name="Confirmation needed")
    await expect(approval).to_be_visible()
    await expect(approval.locator(".approval-summary")).to_contain_text("8472")
    await expect(approval).to_contain_text("p***@example.com")
    await settled(page)
    assert await serious_accessibility_violations(page) == [], "the approval"
    await screenshot(page, shot + "2-approval")
    assert len(await emails(northwind)) == before

    # Confirm: the SDK sends the answer, Parley confirms, the email goes once.
    await approval.get_by_role("button", name="Confirm").click()
    await expect(approval).to_have_count(0)
    answer = page.locator(".msg-assistant").last
    await expect(answer.locator(".text").last).to_contain_text("accepted")
    await expect(answer.locator(".tool").last).to_contain_text("(done)")
    await settled(page)
    assert len(await emails(northwind)) == before + 1
    assert await serious_accessibility_violations(page) == [], "the result"
    await screenshot(page, shot + "3-sent")
    tab.assert_clean()
