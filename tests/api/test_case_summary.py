"""The case summary step (activities/handoffs.py `write_case_summary`) against the real
database, with providers that misbehave (issue 43, acceptance 5): an answer in the wrong
format, one that loses the order in play, a provider that fails and one that never answers
all leave the agent a summary written by code that names the order and the reason; a good
answer is kept as the model's; a second run keeps what the first wrote."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from parley.activities.handoffs import HandoffActivities
from parley.config import Settings
from parley.gateway.base import Finish, ModelRequest, StreamEvent, TextDelta
from parley.gateway.errors import ProviderRetryable
from parley.gateway.registry import ProviderPool
from parley.handoffs import HandoffInput
from parley.resolver import ACTIVE_ORDER, Slot
from parley.store import handoffs, slots
from parley.store.db import Database
from parley.store.identity import Identity
from tests.support.toolkit import post_unstarted

PRIYA = Identity(tenant_id="northwind", user_id="cust_2291", roles=())
REASON = "I want to talk to a person"


class Misbehaving:
    """A provider that answers `text`, fails (`fail`), or never says a word (`silent`)."""

    name = "demo"

    def __init__(self, text: str = "", *, fail: bool = False, silent: bool = False) -> None:
        self.text, self.fail, self.silent = text, fail, silent
        self.asked = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.asked += 1
        if self.fail:
            raise ProviderRetryable("the provider is down", code="unavailable")
        if self.silent:
            await asyncio.Event().wait()
        yield TextDelta(self.text)
        yield Finish("stop")


async def _case(sessions: Database) -> HandoffInput:
    """A case opened in a session of Priya's whose active order is 8472."""
    async with sessions() as db:
        posted = await post_unstarted(db, owner=PRIYA, text="What about the refund?")
    assert posted.turn is not None
    session_id = posted.turn.session_id
    async with sessions() as db:
        writes = {ACTIVE_ORDER: Slot("8472", "tool:get_refund", 1)}
        await slots.write_slots(db, session_id=session_id, writes=writes)
        case, _ = await handoffs.open_handoff(
            db,
            handoff_id=f"hof_{posted.turn.id}",
            session_id=session_id,
            turn_id=posted.turn.id,
            reason=REASON,
        )
        await db.commit()
    return HandoffInput(case.id, session_id, "northwind", 60.0)


async def _written(
    sessions: Database, settings: Settings, provider: Misbehaving
) -> tuple[str, str]:
    inp = await _case(sessions)
    steps = HandoffActivities(
        sessions=sessions,
        providers=ProviderPool(settings, primary=provider),
        settings=settings,
        summary_timeout_s=0.5,
    )
    by = await steps.write_case_summary(inp)
    async with sessions() as db:
        case = await handoffs.get_case(db, handoff_id=inp.handoff_id)
    assert case is not None and case.summary is not None and case.summary_by == by
    assert await steps.write_case_summary(inp) == by and provider.asked == 1  # kept
    return case.summary, by


@pytest.mark.parametrize(
    "provider",
    [
        Misbehaving("Sure! Here is the summary: the customer wants a person."),
        Misbehaving('{"summary": "The customer wants a person about a late refund."}'),
        Misbehaving(fail=True),
        Misbehaving(silent=True),
    ],
    ids=["prose", "loses_the_order", "fails", "silent"],
)
async def test_a_bad_summary_gives_the_agent_one_written_by_code(
    sessions: Database, settings: Settings, provider: Misbehaving
) -> None:
    summary, by = await _written(sessions, settings, provider)
    assert by == "code"
    assert "8472" in summary and REASON in summary and "What about the refund?" in summary


async def test_a_good_summary_is_the_models(sessions: Database, settings: Settings) -> None:
    said = "Priya asked about the refund on order 8472 and now wants a person."
    summary, by = await _written(sessions, settings, Misbehaving(f'{{"summary": "{said}"}}'))
    assert (summary, by) == (said, "model")
