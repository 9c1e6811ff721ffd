"""The agent inbox page (`/inbox`, issue 43, acceptance 7) in a real Chromium, at desktop and
at phone width (390 px): an agent signs in with their token, opens the waiting case (its
summary names the order), claims it, replies (the customer's messages show the reply under
the agent's name), writes an internal note (never in the customer's messages), resolves it;
axe finds nothing serious; a customer's token is refused. One case worked on one page, resized:
opened and claimed at 390 px, resolved on the desktop, axe and a screenshot at both widths."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from playwright.async_api import Page, expect

from parley.store.db import Database
from parley.store.identity import create_token
from tests.support.client import ParleyClient
from tests.support.toolkit import eventually
from tests.support.webpage import DESKTOP, PHONE, screenshot, serious_accessibility_violations


async def _token(sessions: Database, user_id: str) -> str:
    async with sessions() as db:
        token = await create_token(db, tenant_id="northwind", user_id=user_id)
        await db.commit()
    return token


async def _waiting_case(priya: ParleyClient) -> tuple[str, str]:
    """Priya asks about her order, then for a person: her session and the case, once its
    summary is written."""
    sid = await priya.new_session()
    await priya.turn(sid, "Where is my order?")
    asked = await priya.post(sid, "I want to talk to a person")  # the case opens from the POST
    assert asked.status_code == 202 and asked.json()["handoff_id"], asked.text
    case_id = (await priya.http.get(f"/v1/sessions/{sid}/handoff")).json()["id"]
    return sid, case_id


async def _sign_in(page: Page, token: str) -> None:
    """The inbox page (the tab opened on the chat page), signed in with `token`."""
    await page.goto("/inbox")
    await page.locator("#token").fill(token)
    await page.locator("#token-submit").click()


async def test_an_agent_claims_replies_notes_and_resolves_in_the_inbox(
    open_tab: Callable[..., Any],
    api_url: str,
    sessions: Database,
    priya: ParleyClient,
) -> None:
    sid, case_id = await _waiting_case(priya)
    sam = ParleyClient(api_url, await _token(sessions, "agent_sam"))

    async def summarized() -> bool:
        return bool((await sam.http.get(f"/v1/handoffs/{case_id}")).json()["handoff"]["summary"])

    await eventually(summarized, timeout=20, what="the case summary is written", every=0.1)
    await sam.aclose()
    tab = await open_tab(api_url, PHONE)
    page = tab.page
    await _sign_in(page, await _token(sessions, "agent_sam"))
    case = page.locator(f'.case-button[data-handoff-id="{case_id}"]')
    await expect(case).to_contain_text("priority 1 · the customer asked · waiting")
    await case.click()
    await expect(page.locator("#summary")).to_contain_text("8472")
    await expect(page.locator("#conversation")).to_contain_text("I want to talk to a person")
    assert await serious_accessibility_violations(page) == [], "the case, at 390 px"
    await page.set_viewport_size(DESKTOP)
    await expect(page.locator("#summary")).to_be_visible()
    assert await serious_accessibility_violations(page) == [], "the case, on the desktop"
    await page.set_viewport_size(PHONE)

    await page.locator("#claim").click()
    await expect(page.locator("#case-state")).to_have_text("Held by Sam")
    await page.locator("#reply").fill("Hi Priya, Sam here. I am on it.")
    await page.get_by_role("button", name="Send reply").click()
    await expect(page.locator("#conversation .from-agent").last).to_contain_text("Sam here")
    await page.locator("#note").fill("INTERNAL check the carrier")
    await page.get_by_role("button", name="Add note").click()
    await expect(page.locator("#notes")).to_contain_text("Sam: INTERNAL check the carrier")
    # The customer's message reaches the page through the case's stream.
    await priya.post(sid, "Thank you, Sam!")
    await expect(page.locator("#conversation .from-customer").last).to_contain_text("Thank you")
    await screenshot(page, "inbox-phone-1-claimed")
    assert await serious_accessibility_violations(page) == [], "claimed, at 390 px"
    await page.set_viewport_size(DESKTOP)
    await expect(page.locator("#case-state")).to_have_text("Held by Sam")
    await screenshot(page, "inbox-desktop-1-claimed")
    assert await serious_accessibility_violations(page) == [], "claimed, on the desktop"

    await page.locator("#resolve").click()
    await expect(page.locator("#case-state")).to_have_text("Resolved")
    await expect(case).to_have_count(0)  # no longer open
    said = await priya.messages(sid)
    assert any(m.get("author_name") == "Sam" and "Sam here" in m["text"] for m in said)
    assert not any("INTERNAL" in m["text"] for m in said)
    tab.assert_clean()
    await tab.context.close()


async def test_a_customer_token_is_no_agents(
    open_tab: Callable[..., Any], api_url: str, tokens: dict[str, str]
) -> None:
    tab = await open_tab(api_url, PHONE)
    await _sign_in(tab.page, tokens["priya"])
    await expect(tab.page.locator("#signin-error")).to_contain_text('role "agent"')
    await expect(tab.page.locator("#inbox")).to_be_hidden()
    await tab.context.close()
