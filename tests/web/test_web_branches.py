"""The chat page's versions of a conversation (issue 42, acceptance 7 for Branches): edit a
message in place, regenerate an answer, and flip between versions with "< 2/3 >", at desktop
and phone width, axe clean with the controls shown. One flow on one page, resized: the edit at
390 px, the switch and the regeneration on the desktop, axe at both widths at each check (the
controls do not depend on the width). Against the session's API and demo model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from playwright.async_api import Page, expect

from tests.support.webpage import (
    DESKTOP,
    PHONE,
    finished_answer,
    send,
    serious_accessibility_violations,
    sign_in,
)


def user_bubble(page: Page, text: str) -> Any:
    return page.locator("#transcript .msg-user", has_text=text)


async def edit(page: Page, old: str, new: str) -> None:
    bubble = user_bubble(page, old)
    await bubble.get_by_role("button", name="Edit this message").click()
    box = bubble.get_by_role("textbox", name="Edit your message")
    await expect(box).to_be_focused()
    await box.fill(new)
    await box.press("Tab")
    await bubble.get_by_role("button", name="Save").click()


async def accessible_at_both_widths(page: Page, what: str, widths: tuple[Any, ...]) -> None:
    """axe-core finds nothing serious at each width in turn (the page stays at the last)."""
    for viewport in widths:
        await page.set_viewport_size(viewport)
        violations = await serious_accessibility_violations(page)
        assert violations == [], f"{what}, at {viewport['width']} px"


async def test_edit_regenerate_and_the_version_switcher(
    open_tab: Callable[..., Any], api_url: str
) -> None:
    tab = await open_tab(api_url, PHONE)
    page = tab.page
    await sign_in(page, "cust_2291")
    await send(page, "Hello there", reply_has="")
    await send(page, "Where is my order?", reply_has="8472")

    # An edit: the message is replaced in place, answered again, and its switcher says 2/2.
    await edit(page, "Hello there", "What about the refund?")
    await expect(user_bubble(page, "What about the refund?")).to_have_count(1)
    await finished_answer(page, "")
    await expect(user_bubble(page, "Where is my order?")).to_have_count(0)  # on the other branch
    edited = user_bubble(page, "What about the refund?")
    await expect(edited.locator(".version-position")).to_have_text("2/2")
    await accessible_at_both_widths(page, "with the version switcher", (PHONE, DESKTOP))

    # Back to the first version: the conversation as it was.
    await edited.get_by_role("button", name="Previous version").click()
    first = user_bubble(page, "Hello there")
    await expect(first.locator(".version-position")).to_have_text("1/2")
    await expect(user_bubble(page, "Where is my order?")).to_have_count(1)
    await expect(first.get_by_role("button", name="Previous version")).to_be_disabled()

    # Regenerate the last answer: a second version of it, shown, with its own switcher.
    answer = page.locator("#transcript .msg-assistant").last
    await answer.get_by_role("button", name="Regenerate this answer").click()
    await finished_answer(page, "8472")
    answer = page.locator("#transcript .msg-assistant").last
    await expect(answer.locator(".version-position")).to_have_text("2/2")
    await expect(page.locator("#transcript .msg-assistant .version-position")).to_have_count(1)
    await answer.get_by_role("button", name="Previous version").click()
    answer = page.locator("#transcript .msg-assistant").last
    await expect(answer.locator(".version-position")).to_have_text("1/2")
    await accessible_at_both_widths(page, "after switching back", (DESKTOP, PHONE))

    # A reload shows the same version.
    await page.reload()
    await expect(page.locator("#app")).to_be_visible()
    await expect(
        page.locator("#transcript .msg-assistant").last.locator(".version-position")
    ).to_have_text("1/2")
    tab.assert_clean()
    await tab.context.close()
