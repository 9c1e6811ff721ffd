"""The chat page at `/`, driven like a user drives it: a real headless Chromium against the real
API server (PostgreSQL, Temporal, worker and the deterministic demo model behind it).

Needs Debian's Chromium at /usr/bin/chromium (`make browser`); Playwright's own browser download
is not used.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, async_playwright, expect

from tests.client import ParleyClient
from tests.toolkit import emails

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
TIMEOUT_MS = 20_000  # a whole turn (Temporal workflow + streamed demo reply) fits well inside
expect.set_options(timeout=TIMEOUT_MS)
FIRST = "Where is my order?"
SECOND = "What about the refund?"
# Each answer follows a tool call and its result, which the page does not show as bubbles:
# user seq n, assistant tool call n+1, tool result n+2, answer n+3.
ANSWER_OFFSET = 3

# Records, for every assistant bubble, whether it was ever seen mid-stream and what it showed
# then, so a test can tell a streamed reply from one that was painted in one go.
WATCH_STREAMING = """() => {
  window.__streamed = {};
  const seen = (b) => {
    if (!b.classList.contains('streaming')) return;
    const id = b.dataset.messageId;
    const rec = window.__streamed[id] || (window.__streamed[id] = { snapshots: [] });
    rec.snapshots.push(b.textContent);
  };
  new MutationObserver((records) => {
    for (const r of records) {
      const node = r.target.nodeType === 1 ? r.target : r.target.parentElement;
      const bubble = node && node.closest && node.closest('#transcript .msg-assistant');
      if (bubble) seen(bubble);
      for (const n of r.addedNodes) {
        if (n.nodeType === 1 && n.matches('.msg-assistant')) seen(n);
      }
    }
  }).observe(document.getElementById('transcript'), {
    subtree: true, childList: true, characterData: true,
    attributes: true, attributeFilter: ['class'],
  });
}"""


@dataclass
class Tab:
    page: Page
    errors: list[str] = field(default_factory=list)

    def assert_no_script_errors(self) -> None:
        assert self.errors == [], f"uncaught errors in the page: {self.errors}"


@pytest_asyncio.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: the browser tests need Debian's Chromium. "
            "Run `make browser` (installs it with apt-get), then run the tests again."
        )
    async with async_playwright() as pw:
        chromium = await pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            await chromium.close()


@pytest_asyncio.fixture
async def tab(browser: Browser, api_url: str) -> AsyncIterator[Tab]:
    """A fresh browser profile (empty localStorage) with the chat page open."""
    context = await browser.new_context(base_url=api_url, viewport={"width": 1280, "height": 800})
    context.set_default_timeout(TIMEOUT_MS)
    page = await context.new_page()
    tab = Tab(page)
    page.on("pageerror", lambda exc: tab.errors.append(str(exc)))
    response = await page.goto("/")
    assert response is not None and response.status == 200
    try:
        yield tab
    finally:
        await context.close()


async def use_token(page: Page, token: str) -> int:
    """Paste a token and press "Use token"; waits until the page has drawn the session list it
    fetched with it. Returns that list request's HTTP status."""
    await page.locator("#token").fill(token)
    async with page.expect_response(
        lambda r: r.url.endswith("/v1/sessions") and r.request.method == "GET"
    ) as listing:
        await page.locator("#use-token").click()
    response = await listing.value
    if response.ok:
        count = len((await response.json())["sessions"])
        await expect(page.locator("#sessions li")).to_have_count(count)
    return response.status


async def new_session(page: Page) -> str:
    """Click "New session"; returns the id of the session the page opened (and listed)."""
    listed = page.locator("#sessions button")
    before = set(await listed.evaluate_all("bs => bs.map(b => b.dataset.sid)"))
    await page.locator("#new-session").click()
    active = page.locator("#sessions li.active button")
    await expect(active).to_have_count(1)
    session_id = await active.get_attribute("data-sid")
    assert session_id and session_id.startswith("ses_") and session_id not in before
    await expect(page.locator("#transcript .msg")).to_have_count(0)
    return session_id


async def send_and_wait(page: Page, text: str, *, user_seq: int, reply_has: str) -> str:
    """Type a message, click Send, check both bubbles through the streamed reply; returns the
    assistant's final text."""
    await page.evaluate(WATCH_STREAMING)
    await page.locator("#input").fill(text)
    await page.locator("#send").click()

    user = page.locator(f'#transcript .msg-user[data-seq="{user_seq}"]')
    await expect(user).to_have_text(text)
    await expect(user).to_have_attribute("data-status", "complete")

    answer_seq = user_seq + ANSWER_OFFSET
    assistant = page.locator(f'#transcript .msg-assistant[data-seq="{answer_seq}"]')
    await expect(assistant).to_have_attribute("data-status", "complete")
    await expect(assistant).not_to_have_class("streaming")
    await expect(assistant).to_contain_text(reply_has)
    await expect(page.locator("#send")).to_be_enabled()
    await expect(page.locator("#cancel")).to_be_hidden()
    await expect(page.locator("#turn-state")).to_have_text("")
    await expect(page.locator("#input")).to_have_value("")
    await expect(page.locator("#status")).not_to_have_class("error")

    final = await assistant.text_content()
    assert final
    # It streamed: the bubble was seen mid-reply, showing a growing prefix of the final text.
    message_id = await assistant.get_attribute("data-message-id")
    streamed = await page.evaluate("id => window.__streamed[id]", message_id)
    assert streamed, "the assistant bubble was never seen streaming"
    partial = [s for s in streamed["snapshots"] if s and s != final]
    assert partial, f"no partial text was shown before the final reply: {streamed}"
    assert all(final.startswith(s) for s in partial), streamed
    return final


async def transcript(page: Page) -> list[dict[str, str]]:
    return list(
        await page.locator("#transcript .msg").evaluate_all(
            """bs => bs.map(b => ({
                role: b.classList.contains('msg-user') ? 'user' : 'assistant',
                seq: b.dataset.seq, status: b.dataset.status, text: b.textContent,
            }))"""
        )
    )


async def chat_twice(page: Page, token: str) -> tuple[str, list[dict[str, str]]]:
    """Paste the token, start a session and hold a two-turn conversation in it."""
    assert await use_token(page, token) == 200
    await expect(page.locator("#status")).to_have_text("Token saved.")
    session_id = await new_session(page)
    first = await send_and_wait(page, FIRST, user_seq=1, reply_has="8472")
    second = await send_and_wait(page, SECOND, user_seq=5, reply_has="USD 24.00")
    # The second reply used the first exchange: "the refund" was resolved to order 8472.
    assert "On order 8472" in second
    await expect(page.locator("#transcript .msg")).to_have_count(4)
    shown = await transcript(page)
    assert shown == [
        {"role": "user", "seq": "1", "status": "complete", "text": FIRST},
        {"role": "assistant", "seq": "4", "status": "complete", "text": first},
        {"role": "user", "seq": "5", "status": "complete", "text": SECOND},
        {"role": "assistant", "seq": "8", "status": "complete", "text": second},
    ]
    return session_id, shown


async def test_a_user_chats_two_turns_in_a_new_session(
    tab: Tab, tokens: dict[str, str], priya: ParleyClient, tmp_path: Path
) -> None:
    page = tab.page
    await expect(page.locator("#status")).to_contain_text("Paste a bearer token")
    session_id, shown = await chat_twice(page, tokens["priya"])

    # The page shows exactly what the server stored, less the tool calls and their results.
    stored = [
        m
        for m in await priya.messages(session_id)
        if m["role"] != "tool" and not m.get("tool_calls")
    ]
    assert [(str(m["seq"]), m["role"], m["status"], m["text"]) for m in stored] == [
        (m["seq"], m["role"], m["status"], m["text"]) for m in shown
    ]
    # The finished turn refreshed the session list.
    listed = page.locator(f'#sessions button[data-sid="{session_id}"]')
    await expect(listed).to_contain_text("seq 8")

    shot = tmp_path / "chat-after-two-turns.png"
    await page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 0
    print(f"screenshot: {shot}")
    tab.assert_no_script_errors()


async def test_after_a_reload_the_token_and_the_conversation_are_still_there(
    tab: Tab, tokens: dict[str, str]
) -> None:
    page = tab.page
    session_id, shown = await chat_twice(page, tokens["priya"])

    await page.reload()
    await expect(page.locator("#token")).to_have_value(tokens["priya"])
    listed = page.locator(f'#sessions button[data-sid="{session_id}"]')
    await expect(listed).to_have_count(1)
    await expect(listed).to_contain_text("seq 8")
    await expect(page.locator("#transcript .msg")).to_have_count(0)  # nothing open yet

    await listed.click()
    await expect(page.locator("#sessions li.active button")).to_have_attribute(
        "data-sid", session_id
    )
    await expect(page.locator("#transcript .msg")).to_have_count(4)
    assert await transcript(page) == shown
    await expect(page.locator("#send")).to_be_enabled()
    await expect(page.locator("#status")).not_to_have_class("error")
    tab.assert_no_script_errors()


async def test_a_bad_token_shows_401_and_no_sessions(tab: Tab, tokens: dict[str, str]) -> None:
    page = tab.page
    status = page.locator("#status")
    sessions = page.locator("#sessions li")

    assert await use_token(page, "pk_not_a_real_token") == 401
    await expect(status).to_have_class("error")
    await expect(status).to_contain_text("401")
    await expect(sessions).to_have_count(0)

    # Nor can it create one.
    await page.locator("#new-session").click()
    await expect(status).to_have_class("error")
    await expect(status).to_contain_text("401")
    await expect(sessions).to_have_count(0)
    await expect(page.locator("#transcript .msg")).to_have_count(0)

    # A user who had a working token and pastes a bad one no longer sees the old list.
    assert await use_token(page, tokens["priya"]) == 200
    await expect(status).to_have_text("Token saved.")
    await new_session(page)
    await expect(sessions).not_to_have_count(0)
    assert await use_token(page, "pk_not_a_real_token") == 401
    await expect(status).to_have_class("error")
    await expect(status).to_contain_text("401")
    await expect(sessions).to_have_count(0)
    tab.assert_no_script_errors()


async def test_a_user_confirms_an_email_from_the_card_and_it_is_sent_once(
    tab: Tab, tokens: dict[str, str], northwind: httpx.AsyncClient
) -> None:
    page = tab.page
    before = len(await emails(northwind))
    assert await use_token(page, tokens["priya"]) == 200
    await new_session(page)
    await send_and_wait(page, FIRST, user_seq=1, reply_has="8472")

    await page.locator("#input").fill("Can you email me?")
    await page.locator("#send").click()
    card = page.locator("#confirm-card")
    await expect(card).to_be_visible()
    await expect(card).to_contain_text("p***@example.com")
    await expect(card).to_contain_text("8472")
    # The proposal's own words are shown, and nothing has been sent yet.
    await expect(page.locator("#transcript .msg-assistant").last).to_contain_text(
        "Nothing is sent until you confirm"
    )
    assert len(await emails(northwind)) == before

    await page.locator("#confirm-btn").click()
    answer = page.locator("#transcript .msg-assistant").last
    await expect(answer).to_contain_text("Sent")
    await expect(answer).to_have_attribute("data-status", "complete")
    await expect(page.locator("#send")).to_be_enabled()
    sent = (await emails(northwind))[before:]
    assert [e["to"] for e in sent] == ["priya@example.com"]
    tab.assert_no_script_errors()


async def test_after_a_reload_a_waiting_confirmation_card_comes_back_and_still_works(
    tab: Tab, tokens: dict[str, str], northwind: httpx.AsyncClient
) -> None:
    page = tab.page
    assert await use_token(page, tokens["priya"]) == 200
    session_id = await new_session(page)
    await send_and_wait(page, FIRST, user_seq=1, reply_has="8472")
    await page.locator("#input").fill("Can you email me?")
    await page.locator("#send").click()
    await expect(page.locator("#confirm-card")).to_be_visible()
    action_id = await page.locator("#confirm-card").get_attribute("data-action-id")

    await page.reload()
    await page.locator(f'#sessions button[data-sid="{session_id}"]').click()
    card = page.locator("#confirm-card")
    await expect(card).to_be_visible()
    await expect(card).to_have_attribute("data-action-id", action_id or "")
    await expect(card).to_contain_text("p***@example.com")
    await page.locator("#confirm-btn").click()
    await expect(page.locator("#transcript .msg-assistant").last).to_contain_text("Sent")
    assert action_id is not None
    assert len(await emails(northwind, action_id=action_id)) == 1
    tab.assert_no_script_errors()
