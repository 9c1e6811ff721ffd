"""The useChat example page (examples/use-chat, served at /examples/use-chat) in Chromium, at
desktop and phone width: Priya's answer streams in, the email proposal is the AI SDK's
approval UI, the confirmation sends once and the answer says so; axe finds nothing serious.
A reload keeps the conversation (its id in the address) and follows the running answer
through the SDK's resume request."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import pytest_asyncio
from playwright.async_api import Page, Response, expect
from temporalio.client import Client

from parley.config import Settings
from parley.gateway.base import ModelRequest
from parley.store.db import Database
from tests.support.client import ParleyClient
from tests.support.models import ControlledModel
from tests.support.toolkit import Stack, emails, own_stack
from tests.support.webpage import DESKTOP, PHONE, screenshot, serious_accessibility_violations

LONG_QUESTION = "A long answer please"
LONG = " ".join(f"word{i}" for i in range(150))  # about 4.5 s at the slow stack's pace

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


@pytest_asyncio.fixture(scope="module")
async def slow(
    settings: Settings, temporal_client: Client, sessions: Database
) -> AsyncIterator[Stack[ControlledModel]]:
    """A stack whose model answers `LONG_QUESTION` with `LONG`, slowly enough to reload
    during; the Stop grace is the deployment's default (3 s), which a reload must beat."""
    model = ControlledModel(token_delay_s=0.03)

    def reply(request: ModelRequest) -> str | None:
        users = [m for m in request.messages if m.get("role") == "user"]
        return LONG if users and users[-1].get("content") == LONG_QUESTION else None

    model.reply = reply
    async with own_stack(temporal_client, settings, sessions, model, prefix="usechat") as stack:
        yield stack


async def test_a_reload_keeps_the_conversation_and_resumes_the_running_answer(
    open_tab: Callable[..., Any], slow: Stack[ControlledModel], tokens: dict[str, str]
) -> None:
    tab = await open_tab(slow.url)
    page = tab.page
    await page.goto("/examples/use-chat")
    await page.get_by_role("button", name=re.compile("Priya")).click()
    await expect(page.locator("#input")).to_be_visible()
    await expect(page).to_have_url(re.compile(r"[?&]chat=ses_\w+"))
    kept = re.search(r"chat=(ses_\w+)", page.url)
    assert kept is not None
    session_id = kept[1]
    await ask(page, "Where is my order?")
    await expect(page.locator(".msg-assistant").last.locator(".text").last).to_contain_text("8472")
    await settled(page)

    resumed: list[int] = []

    def on_response(response: Response) -> None:
        if response.url.endswith(f"/v1/ai-sdk/chat/{session_id}/stream"):
            resumed.append(response.status)

    page.on("response", on_response)
    await ask(page, LONG_QUESTION)
    await expect(page.locator(".msg-assistant").last.locator(".text")).to_contain_text("word5 ")
    await page.reload()

    # The same conversation, shown again from what Parley stored (the first answer's tool too),
    # and the running answer followed to its end, whole and once.
    assert f"chat={session_id}" in page.url
    await expect(page.locator(".msg-user .text")).to_have_text(
        ["Where is my order?", LONG_QUESTION]
    )
    answers = page.locator(".msg-assistant")
    await expect(answers).to_have_count(2)
    await expect(answers.first.locator(".tool")).to_have_text("Looking up your orders… (done)")
    await expect(answers.first.locator(".text")).to_contain_text(["8472"])
    await expect(answers.last.locator(".text")).to_have_text([LONG])
    await settled(page)
    assert resumed == [200], "the reload resumed the running turn (200), not an ended one (204)"

    priya = ParleyClient(slow.url, tokens["priya"])
    try:
        stored = [m for m in await priya.messages(session_id) if m["role"] == "assistant"]
    finally:
        await priya.aclose()
    long_turn = [m for m in stored if m["turn_id"] == stored[-1]["turn_id"]]
    assert [(m["status"], m["text"]) for m in long_turn] == [("complete", LONG)]
    tab.assert_clean()
