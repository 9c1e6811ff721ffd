"""The customer's side of a hand-off in the chat page (issue 43): asking for a person, the
person joining under their name and replying into the conversation, the customer's message
going to them (no answer from the assistant), and the assistant answering again after the
hand-back. The agent acts through the inbox routes. One conversation on one page, resized: asked
for on the desktop, the person's reply shown (and shot) at both widths, the rest at 390 px, the
answer after the hand-back shown at both."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from playwright.async_api import expect

from parley.store.db import Database
from parley.store.identity import create_token
from tests.support.client import ParleyClient
from tests.support.webpage import DESKTOP, PHONE, screenshot, send, sign_in


async def test_a_person_joins_replies_and_hands_back_in_the_page(
    open_tab: Callable[..., Any], api_url: str, sessions: Database
) -> None:
    tab = await open_tab(api_url, DESKTOP)
    page = tab.page
    await sign_in(page, "cust_2291")
    await send(page, "Where is my order?", reply_has="8472")
    await send(page, "I want to talk to a person", reply_has="take over")
    notices = page.locator("#transcript .notice-handoff")
    await expect(notices.last).to_contain_text("will join this conversation")

    sid = await page.evaluate("sessionStorage.getItem('parley_session')")
    async with sessions() as db:
        token = await create_token(db, tenant_id="northwind", user_id="agent_sam")
        await db.commit()
    sam = ParleyClient(api_url, token)
    try:
        inbox = (await sam.http.get("/v1/handoffs")).json()["handoffs"]
        [case] = [c for c in inbox if c["session_id"] == sid]
        url = f"/v1/handoffs/{case['id']}"
        assert (await sam.http.post(url + "/claim")).status_code == 200
        await expect(notices.last).to_contain_text("Sam from our support team has joined")
        said = await sam.http.post(url + "/messages", json={"text": "Hi Priya, Sam here."})
        assert said.status_code == 201
        reply = page.locator("#transcript .msg-assistant").last
        await expect(reply.locator(".body")).to_contain_text("Sam here")
        await expect(reply.locator(".meta .author")).to_have_text("Sam")
        await screenshot(page, "handoff-desktop-1-person-replied")
        await page.set_viewport_size(PHONE)
        await expect(reply.locator(".body")).to_contain_text("Sam here")
        await expect(reply.locator(".meta .author")).to_be_visible()
        await expect(notices.last).to_be_visible()
        await screenshot(page, "handoff-phone-1-person-replied")

        # The customer's message goes to Sam: shown, and no answer from the assistant.
        answers = await page.locator("#transcript .msg-assistant").count()
        await page.locator("#input").fill("My parcel is late.")
        await page.locator("#input").press("Enter")
        await expect(page.locator("#transcript .msg-user").last).to_contain_text("parcel is late")
        detail = (await sam.http.get(url)).json()
        assert detail["messages"][-1]["text"] == "My parcel is late."
        assert await page.locator("#transcript .msg-assistant").count() == answers

        assert (await sam.http.post(url + "/hand-back")).status_code == 200
        await expect(notices.last).to_contain_text("handed the conversation back")
    finally:
        await sam.aclose()
    await send(page, "Thanks. Where is my order now?", reply_has="8472")
    await screenshot(page, "handoff-phone-2-handed-back")
    await page.set_viewport_size(DESKTOP)
    await expect(page.locator("#transcript .msg-assistant").last).to_contain_text("8472")
    await screenshot(page, "handoff-desktop-2-handed-back")
    tab.assert_clean()
    await tab.context.close()
