"""The demo as `make run` shows it, through the chat page in headless Chromium: tenant
`northwind` seeded by the code `parley dev` runs (launch/seeding.py `seed`: its MCP server,
the chart skill and the Returns specialist), on a stack and a Northwind backend of this
module's own.

Priya hands a return to the Returns specialist, answers its two questions by clicking options,
confirms the card (double-clicked) and gets one `RMA-` return; her plain question before it
carries no hand-over schema. Dana's chart shows inline under its answer, with a download link,
at desktop and at phone width, fetched from the owner-only files route under the page's
Content-Security-Policy, and again after a reload. Every step is screenshotted; axe-core
finds nothing serious.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio
from playwright.async_api import Page, expect
from temporalio.client import Client

from parley.config import Settings
from parley.demo_backend.app import create_app as create_backend
from parley.gateway.demo import DemoModel
from parley.launch.devstate import with_demo_backend
from parley.launch.seeding import seed
from parley.specialists import DELEGATE_RETURNS
from parley.store import tenants
from parley.store.db import Database
from parley.tool_offer import NO_RETURN
from tests.support.stack import serve
from tests.support.toolkit import model_calls, own_stack
from tests.support.webpage import (
    DESKTOP,
    PHONE,
    finished_answer,
    last_answer,
    screenshot,
    send,
    serious_accessibility_violations,
    sign_in,
)

RETURN = "I want to return something from order 8390."
CHART = "Make me a chart of my October spending by week."
# Waits for the image to be decoded (it rejects when the image cannot be loaded).
LOADED = "img => img.decode().then(() => img.naturalWidth > 0, () => false)"


@dataclass
class Demo:
    url: str
    northwind: httpx.AsyncClient
    sessions: Database


@pytest_asyncio.fixture(scope="module")
async def demo(
    settings: Settings, temporal_client: Client, sessions: Database
) -> AsyncIterator[Demo]:
    """The page on a stack seeded as `make run` seeds it; the tenant's configuration is put
    back afterwards (the session's other stacks share the database)."""
    async with sessions() as db:
        before = await tenants.tenant_config(db, tenant_id="northwind")
    async with (
        serve(create_backend()) as backend_url,
        httpx.AsyncClient(base_url=backend_url) as northwind,
        own_stack(
            temporal_client,
            settings,
            sessions,
            DemoModel(token_delay_s=0.002),
            prefix="web-demo",
            northwind_url=backend_url,
            # `parley dev` lets its turns reach the demo backend's MCP server (loopback).
            mcp_allowed_hosts=with_demo_backend(
                settings.model_copy(update={"northwind_url": backend_url})
            ),
        ) as running,
    ):
        try:
            await seed(running.settings)
            yield Demo(running.url, northwind, sessions)
        finally:
            async with sessions() as db:
                await tenants.set_config(db, tenant_id="northwind", config=before)
                await db.commit()


async def model_requests(demo: Demo, page: Page) -> list[dict[str, Any]]:
    """The stored model requests of the turn of the last message sent (the tools each
    offered, and in its budget plan what it withheld and why)."""
    turn_id = await page.locator("#transcript .msg-user").last.get_attribute("data-turn-id")
    assert turn_id
    calls = await model_calls(demo.sessions, turn_id)
    requests = [c.request for c in calls if c.provider != "resolver"]
    assert requests
    return requests


def tool_names(request: dict[str, Any]) -> set[str]:
    return {t["name"] for t in request["tools"]}


async def choose(page: Page, question: str, option: str) -> None:
    group = page.get_by_role("group", name=question)
    await expect(group).to_be_visible()
    await expect(page.locator("#send")).to_be_enabled()  # the turn rests on the question
    await group.get_by_role("button", name=option).click()


@pytest.mark.parametrize("width", ["desktop", "phone"])
async def test_priya_returns_an_item_through_the_specialist_in_the_page(
    open_tab: Callable[..., Any], demo: Demo, width: str
) -> None:
    tab = await open_tab(demo.url, DESKTOP if width == "desktop" else PHONE)
    page = tab.page
    shot = f"demo-returns-{width}-"
    await sign_in(page, "cust_2291")

    # A plain question: the hand-over's schema is not in its prompt.
    await send(page, "Where is my order?", reply_has="8472")
    for request in await model_requests(demo, page):
        assert DELEGATE_RETURNS not in tool_names(request)
        assert request["budget"]["tools_withheld"][DELEGATE_RETURNS] == NO_RETURN

    # The return is handed over; the specialist asks which item, with both items as options.
    returns_before = (await demo.northwind.get("/returns")).json()["returns"]
    await page.locator("#input").fill(RETURN)
    await page.locator("#input").press("Enter")
    await expect(page.locator("#transcript")).to_contain_text("Returns specialist is helping")
    which = page.get_by_role("group", name="Which item?")
    await expect(which.get_by_role("button")).to_have_text(
        ["Trail Runner shoes, size 8", "Wool socks (3-pack)"]
    )
    assert all(DELEGATE_RETURNS in tool_names(r) for r in await model_requests(demo, page))
    await screenshot(page, shot + "1-which-item")
    await choose(page, "Which item?", "Trail Runner shoes, size 8")

    why = page.get_by_role("group", name="Why are you returning it?")
    await expect(why.get_by_role("button")).to_have_text(
        ["Too small", "Too large", "Damaged", "Changed my mind"]
    )
    await screenshot(page, shot + "2-why")
    await choose(page, "Why are you returning it?", "Too small")

    # The card; nothing is created before the confirm, and a double click creates one return.
    card = page.locator("#confirm-card")
    await expect(card).to_be_visible()
    await expect(card).to_contain_text("Trail Runner shoes")
    await expect(card).to_contain_text("too small")
    assert await serious_accessibility_violations(page) == [], "the specialist's card"
    await screenshot(page, shot + "3-card")
    assert (await demo.northwind.get("/returns")).json()["returns"] == returns_before
    await page.locator("#confirm-btn").dblclick()
    done = await finished_answer(page, "RMA-")
    await expect(card).to_have_count(0)
    returns = (await demo.northwind.get("/returns")).json()["returns"]
    [made] = returns[len(returns_before) :]
    assert re.fullmatch(r"RMA-\d+", made["rma_id"]) and made["rma_id"] in done
    assert (made["order_id"], made["item_id"], made["reason"]) == ("8390", "8390-1", "too_small")
    await screenshot(page, shot + "4-created")
    assert await serious_accessibility_violations(page) == [], "the created return"
    tab.assert_clean()
    await tab.context.close()


@pytest.mark.parametrize("width", ["desktop", "phone"])
async def test_danas_chart_shows_inline_under_its_answer_with_a_download_link(
    open_tab: Callable[..., Any], demo: Demo, width: str
) -> None:
    viewport = DESKTOP if width == "desktop" else PHONE
    tab = await open_tab(demo.url, viewport)
    page = tab.page
    refused: list[str] = []
    page.on(
        "console",
        lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None,
    )
    await sign_in(page, "cust_4410")

    await send(page, CHART, reply_has="chart")
    answer = last_answer(page)
    image = answer.locator(".extras .artifact img.artifact-image")
    await expect(image).to_have_count(1)
    await expect(image).to_have_attribute("src", re.compile(r"^blob:"))
    await expect(image).to_have_attribute("alt", re.compile(r"^Spending by week"))
    await image.scroll_into_view_if_needed()
    loaded = await image.evaluate(LOADED)
    assert loaded, "the chart did not load"
    box = await image.bounding_box()
    assert box is not None and box["width"] > 100
    assert box["x"] >= 0 and box["x"] + box["width"] <= viewport["width"], box

    # The download link beside it hands over the same bytes, as the file's own name.
    link = answer.locator(".artifact a.file-download")
    await expect(link).to_have_attribute("download", "spending_by_week.png")
    async with page.expect_download() as downloading:
        await link.click()
    download = await downloading.value
    assert download.suggested_filename == "spending_by_week.png"
    path = await download.path()
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")

    await screenshot(page, f"demo-chart-{width}")
    assert await serious_accessibility_violations(page) == [], "the chart under its answer"

    # Drawn again from the stored messages after a reload: once, under the same answer.
    await page.reload()
    await expect(last_answer(page)).to_contain_text("chart of spending by week")
    await expect(page.locator("#transcript img")).to_have_count(1)
    await expect(image).to_have_attribute("src", re.compile(r"^blob:"))
    await expect(page.locator("#transcript .turn-activity:empty")).to_have_count(0)
    loaded = await image.evaluate(LOADED)
    assert loaded, "the chart did not load after a reload"
    assert refused == [], refused
    tab.assert_clean()
    await tab.context.close()
