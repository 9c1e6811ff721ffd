"""The log lines' owners of a turn (activities/tracing.py `TurnOwners`): the context build
tells them to the steps that start with it, and a step nobody told has them looked up."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from parley.activities.tracing import TurnOwners


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The turns whose owners were looked up in the database (stood in for here); the
    fallback runs at the loop's next turn rather than after a second."""
    asked: list[str] = []

    async def look_up(self: TurnOwners, turn_id: str) -> tuple[str, str]:
        asked.append(turn_id)
        return "ses_looked", "northwind"

    monkeypatch.setattr(TurnOwners, "_look_up", look_up)
    monkeypatch.setattr(TurnOwners, "REPORT_WITHIN_S", 0.0)
    return asked


def _owners() -> TurnOwners:
    sessions: Any = None  # never reached: the lookup is stood in for
    return TurnOwners(sessions)


async def _loop_turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_owners_the_build_tells_reach_the_waiting_step_without_a_lookup(
    lookups: list[str],
) -> None:
    owners = _owners()
    waiting = owners.told("trn_1")
    owners.read("trn_1", "ses_1", "northwind")
    assert await waiting == ("ses_1", "northwind")
    await _loop_turns()  # the fallback's turn comes and finds them told
    assert lookups == []
    assert owners.known("trn_1") == ("ses_1", "northwind")


async def test_a_step_nobody_tells_has_its_owners_looked_up(lookups: list[str]) -> None:
    owners = _owners()
    assert await asyncio.wait_for(owners.told("trn_2"), timeout=5) == ("ses_looked", "northwind")
    assert lookups == ["trn_2"]


async def test_two_steps_told_together_share_one_wait(lookups: list[str]) -> None:
    owners = _owners()
    first, second = owners.told("trn_3"), owners.told("trn_3")
    assert first is second
    owners.read("trn_3", "ses_3", "northwind")
    assert await second == ("ses_3", "northwind")
