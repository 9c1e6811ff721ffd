"""The web tier: the chat page in a real headless Chromium (Debian's) against a real API, as a
user drives it (tests/support/webpage.py). One browser per module; each test opens fresh tabs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Browser, async_playwright

from tests.support.webpage import CHROMIUM, CHROMIUM_ARGS, opener


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


@pytest.fixture
def open_tab(browser: Browser) -> Callable[..., Any]:
    """`await open_tab(base_url, viewport)`: a fresh profile on the page."""
    return opener(browser)
