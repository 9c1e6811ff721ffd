"""The web tier: the chat page in a real headless Chromium (Debian's) against a real API, as a
user drives it (tests/support/webpage.py). One browser per test process; each test opens fresh
profiles (browser contexts), which are closed when it ends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Browser, async_playwright

from tests.support.webpage import CHROMIUM, CHROMIUM_ARGS, opener


@pytest_asyncio.fixture(scope="session")
async def chromium() -> AsyncIterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: the browser tests need Debian's Chromium. "
            "Run `make browser` (installs it with apt-get), then run the tests again."
        )
    async with async_playwright() as pw:
        launched = await pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


@pytest_asyncio.fixture
async def browser(chromium: Browser) -> AsyncIterator[Browser]:
    """The process's browser; the profiles a test opened are closed after it, so no page of
    an earlier test (and its event stream) lives on beside the next."""
    before = set(chromium.contexts)
    yield chromium
    for context in chromium.contexts:
        if context not in before:
            await context.close()


@pytest.fixture
def open_tab(browser: Browser) -> Callable[..., Any]:
    """`await open_tab(base_url, viewport)`: a fresh profile on the page."""
    return opener(browser)
