"""The user's message handed from the context build to the input screen started beside it
(activities/handover.py): the screen screens what the build read without reading it again,
and reads it itself when nothing is handed over in time or when it is retried."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from parley.activities.handover import Handover
from parley.activities.screens import ScreenActivities
from parley.contracts import ScreenInput
from parley.screens import RulesScreen


class ReadHere(Exception):
    """The screen went to the database for the message."""


class NoDatabase:
    """A `Database` whose every use is a read the test did not expect."""

    def connect(self) -> Any:
        raise ReadHere

    def __call__(self) -> Any:
        raise ReadHere


def _screens(asked: Handover[str]) -> ScreenActivities:
    sessions: Any = NoDatabase()
    return ScreenActivities(
        sessions=sessions,
        input_screen=RulesScreen("input", ("forbidden",)),
        output_screen=RulesScreen("output"),
        asked=asked,
    )


async def test_a_value_given_first_is_taken_once() -> None:
    asked: Handover[str] = Handover()
    asked.give("trn_1", "hello")
    assert await asked.take("trn_1", within_s=1.0) == "hello"
    assert await asked.take("trn_1", within_s=0.0) is None


async def test_a_taker_that_comes_first_gets_the_value_when_it_is_given() -> None:
    asked: Handover[str] = Handover()
    taking = asyncio.ensure_future(asked.take("trn_2", within_s=5.0))
    await asyncio.sleep(0)
    asked.give("trn_2", "hello")
    assert await taking == "hello"


async def test_nothing_given_in_time_is_none() -> None:
    asked: Handover[str] = Handover()
    assert await asked.take("trn_3", within_s=0.0) is None


async def test_a_value_nobody_takes_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Handover, "KEEP_S", 0.0)
    asked: Handover[str] = Handover()
    asked.give("trn_4", "hello")
    for _ in range(5):
        await asyncio.sleep(0)
    assert await asked.take("trn_4", within_s=0.0) is None


async def test_the_input_screen_screens_the_handed_text_without_a_read() -> None:
    asked: Handover[str] = Handover()
    screens = _screens(asked)
    asked.give("trn_5", "a forbidden word")
    verdict = await ActivityEnvironment().run(screens.screen_input, ScreenInput("trn_5"))
    assert (verdict.allowed, verdict.category) == (False, "blocked_term")
    asked.give("trn_6", "a fine question")
    verdict = await ActivityEnvironment().run(screens.screen_input, ScreenInput("trn_6"))
    assert verdict.allowed


async def test_the_input_screen_reads_for_itself_when_nothing_is_handed_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("parley.activities.screens.HANDED_WITHIN_S", 0.0)
    screens = _screens(Handover())
    with pytest.raises(ReadHere):
        await ActivityEnvironment().run(screens.screen_input, ScreenInput("trn_7"))


async def test_a_retried_input_screen_reads_for_itself() -> None:
    asked: Handover[str] = Handover()
    screens = _screens(asked)
    asked.give("trn_8", "a fine question")
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=2)
    with pytest.raises(ReadHere):
        await env.run(screens.screen_input, ScreenInput("trn_8"))
