"""The page's memory panel, driven like a customer drives it: consent off by default, turned
on with the checkbox, a stated preference listed after the turn that stated it, one item
forgotten, consent turned off again; checked by axe and against the API each step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from playwright.async_api import expect

from tests.support.client import ParleyClient
from tests.support.webpage import (
    send,
    serious_accessibility_violations,
    sign_in,
)


async def memory(client: ParleyClient) -> dict[str, Any]:
    response = await client.http.get("/v1/memory")
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_the_memory_panel_gives_consent_lists_forgets_and_withdraws(
    open_tab: Callable[..., Any], api_url: str, marco: ParleyClient
) -> None:
    reset = await marco.http.put("/v1/memory/consent", json={"consent": False})
    assert reset.status_code == 200
    tab = await open_tab(api_url)
    page = tab.page
    try:
        await sign_in(page, "cust_3301")
        consent = page.get_by_label("Remember my preferences between conversations")
        await expect(consent).not_to_be_checked()
        items = page.locator("#memory-items")
        await expect(items).to_contain_text("Nothing is remembered between conversations.")

        await consent.check()
        await expect(page.locator("#memory-status")).to_have_text(
            "Your preferences will be remembered."
        )
        assert (await memory(marco))["consent"] is True

        await send(page, "Please contact me by phone.", reply_has="orders")
        item = items.locator('li[data-key="contact_channel"]')
        await expect(item).to_contain_text("How to contact you: phone")
        assert [i["value"] for i in (await memory(marco))["items"]] == ["phone"]
        assert await serious_accessibility_violations(page) == [], "the panel with an item"

        await item.get_by_role("button", name="Forget: How to contact you").click()
        await expect(item).to_have_count(0)
        await expect(items).to_contain_text("Nothing remembered yet.")
        assert (await memory(marco))["items"] == []

        await consent.uncheck()
        await expect(page.locator("#memory-status")).to_have_text(
            "Everything remembered was deleted."
        )
        assert await memory(marco) == {"consent": False, "items": []}
        tab.assert_clean()
    finally:
        await tab.context.close()
        await marco.http.put("/v1/memory/consent", json={"consent": False})
