"""Driving the chat page as a user does, for the browser tests: a real headless Chromium
(Debian's, at /usr/bin/chromium; Playwright's own download is not used) against a real API.

Every wait is one of Playwright's auto-waiting expectations on what the page shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from playwright.async_api import Browser, BrowserContext, Locator, Page, Route, expect

CHROMIUM = Path("/usr/bin/chromium")
# Headless Chromium still builds its browser window's own interface: for every new profile
# (a test's tab) it loads the address bar's drop-down, a page of Chrome's made of some 700
# chrome:// scripts and styles, in renderers of its own. A trace of a two-tab test showed those
# renderers' main threads busier than the tabs under test; switched off (the features below),
# test_web_live's Chromium CPU went from 32 to 17 s and the file's, all processes, 56 -> 40 s.
NO_BROWSER_UI = "WebUIOmniboxPopup,WebUIOmniboxAimPopup,WebUIOmniboxFullPopup,PreloadTopChromeWebUI"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    f"--disable-features={NO_BROWSER_UI}",
]
TIMEOUT_MS = 45_000  # an upper bound on a wait, not a target: a loaded 2-core run stays inside
expect.set_options(timeout=TIMEOUT_MS)
# Git-ignored (under .data/); the README shows two of them, copied to docs/.
SCREENSHOTS = Path(__file__).resolve().parents[2] / ".data" / "screenshots"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
AXE = "/static/vendor/axe-core/axe.min.js"
STORED = re.compile(r"^\d+$")  # a bubble with a seq shows a stored message

# Records every text an assistant bubble showed while it streamed, so a test can tell a
# streamed reply from one painted in one go, and see that no text was shown twice.
WATCH_STREAMING = """() => {
  window.__streamed = {};
  const seen = (b) => {
    if (!b.classList.contains('streaming')) return;
    const rec = window.__streamed[b.dataset.messageId] ||= { snapshots: [] };
    rec.snapshots.push(b.querySelector('.body').textContent.trim());
  };
  new MutationObserver((records) => {
    for (const r of records) {
      const node = r.target.nodeType === 1 ? r.target : r.target.parentElement;
      const bubble = node && node.closest && node.closest('#transcript .msg-assistant');
      if (bubble) seen(bubble);
    }
  }).observe(document.getElementById('transcript'), {
    subtree: true, childList: true, characterData: true, attributes: true,
    attributeFilter: ['class'],
  });
}"""


@dataclass
class Tab:
    page: Page
    context: BrowserContext
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def assert_clean(self) -> None:
        assert self.errors == [], f"uncaught errors in the page: {self.errors}"
        assert self.dialogs == [], f"the page opened dialogs: {self.dialogs}"


def opener(browser: Browser) -> Callable[..., Any]:
    """`await open_tab(base_url, viewport)` -> a fresh profile (empty storage) on the page."""

    async def open_tab(base_url: str, viewport: dict[str, int] = DESKTOP) -> Tab:
        context = await browser.new_context(base_url=base_url, viewport=viewport)
        context.set_default_timeout(TIMEOUT_MS)
        page = await context.new_page()
        tab = Tab(page, context)
        page.on("pageerror", lambda exc: tab.errors.append(str(exc)))

        async def on_dialog(dialog: Any) -> None:
            tab.dialogs.append(dialog.message)
            await dialog.dismiss()

        page.on("dialog", on_dialog)
        response = await page.goto("/")
        assert response is not None and response.status == 200
        return tab

    return open_tab


async def sign_in(page: Page, user_id: str) -> None:
    """Click the demo sign-in button of `user_id`; waits for the chat to be shown."""
    await page.locator(f'.demo-user[data-user-id="{user_id}"]').click()
    await expect(page.locator("#app")).to_be_visible()
    await expect(page.locator("#input")).to_be_focused()


def last_answer(page: Page) -> Locator:
    return page.locator("#transcript .msg-assistant").last


async def send(page: Page, text: str, *, reply_has: str) -> str:
    """Type a message and press Enter; waits for the whole streamed answer and returns its
    text."""
    await page.evaluate(WATCH_STREAMING)
    answers_before = await page.locator("#transcript .msg-assistant").count()
    await page.locator("#input").fill(text)
    await page.locator("#input").press("Enter")
    await expect(page.locator("#transcript .msg-user").last.locator(".body")).to_have_text(text)
    await expect(page.locator("#transcript .msg-assistant")).to_have_count(answers_before + 1)
    return await finished_answer(page, reply_has)


async def finished_answer(page: Page, reply_has: str) -> str:
    answer = last_answer(page)
    await expect(answer.locator(".body")).to_contain_text(reply_has)
    await expect(answer).not_to_have_class("streaming")
    await expect(answer).to_have_attribute("data-seq", STORED)
    await expect(page.locator("#send")).to_be_enabled()
    await expect(page.locator("#stop")).to_be_hidden()
    await expect(page.locator("#status")).not_to_have_attribute("data-kind", "error")
    text = await answer.locator(".body").text_content()
    assert text
    return text.strip()


async def streamed_snapshots(page: Page, message_id: str) -> list[str]:
    record = await page.evaluate("id => window.__streamed && window.__streamed[id]", message_id)
    return list(record["snapshots"]) if record else []


async def screenshot(page: Page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    await page.screenshot(path=str(path))
    assert path.stat().st_size > 0
    return path


async def serious_accessibility_violations(page: Page) -> list[dict[str, Any]]:
    """axe-core, run in the page (it is served from the page's own origin, as the page's
    Content-Security-Policy allows): the violations of impact serious or critical."""
    if not await page.evaluate("() => typeof window.axe === 'object'"):
        await page.add_script_tag(url=AXE)
    result = await page.evaluate("async () => (await window.axe.run(document)).violations")
    return [
        {"id": v["id"], "impact": v["impact"], "nodes": [n["target"] for n in v["nodes"]]}
        for v in result
        if v["impact"] in ("serious", "critical")
    ]


class DroppingRelay:
    """A TCP relay in front of the API whose open connections a test can cut at once, as a
    network drop does (Chromium's offline emulation leaves a stream already open untouched)."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self._upstream = (host, int(port))
        self._links: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def cut(self) -> None:
        for writer in self._links:
            writer.transport.abort()
        self._links.clear()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        self._links.update((writer, up_writer))

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def hold_second_read(page: Page, sid: str, release: asyncio.Event) -> asyncio.Event:
    """Hold the second of the page's two reads as it opens conversation `sid` (the session,
    the transcript's first page; whichever order it makes them) until `release`; the event
    returned is set once the page has asked for it. Later requests go through."""
    asked = asyncio.Event()
    reads = 0

    async def hold(route: Route) -> None:
        nonlocal reads
        reads += 1
        if reads == 2:
            asked.set()
            await release.wait()
        await route.continue_()

    await page.route(f"**/v1/sessions/{sid}", hold)
    await page.route(f"**/v1/sessions/{sid}/messages?*", hold)
    return asked
