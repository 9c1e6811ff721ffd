"""The turn's tail as one step: the answer screened with follow-ups offered beside it, the
ending stored, the rolling summary started when it is due, and the tenant's hand-off policy
applied (repeated tool outages or retractions open a case for a person).

The parts are the screens' `judge_output` and `offer_followups`, the turn's `finalize` and
the summary's `start_when_due`, called in one local activity so that a plain turn's answer
ends in the workflow task that streamed it. A retry after a crash runs the parts again: each is
idempotent (the ending is stored once, follow-ups are offered only while the turn is open,
asking the session's summary workflow twice costs at most a pass that finds nothing to do).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Protocol

from temporalio import activity

from parley.contracts import (
    FinalizeTurnInput,
    FinishTurnInput,
    ScreenInput,
    ScreenResult,
    SummarizeInput,
)
from parley.screens import RETRACTION_TEXT
from parley.store.steps import AnswerFacts
from parley.store.summaries import Backlog

log = logging.getLogger(__name__)

# Follow-ups are a courtesy: this long at most once the screen has answered, never a wait
# for `done` beyond it.
FOLLOWUPS_GRACE_S = 0.3


@dataclasses.dataclass(frozen=True)
class Finalized:
    """A stored ending: the answer's message id (empty if none), and the session's backlog
    as the ending's last statement read it for the summary's check (None: not read there)."""

    message_id: str
    backlog: Backlog | None = None


class Ending(Protocol):
    """Stores a turn's ending (activities/turn.py `TurnActivities`)."""

    async def finalize(self, inp: FinalizeTurnInput, *, backlog: bool = False) -> Finalized: ...


class Screens(Protocol):
    """Screens an answer and suggests follow-ups (activities/screens.py), from what one read
    of the turn found (None: each part reads what it needs itself)."""

    async def answer_facts(self, turn_id: str) -> AnswerFacts | None: ...

    async def judge_output(
        self, inp: ScreenInput, facts: AnswerFacts | None = None
    ) -> ScreenResult: ...

    async def offer_followups(self, inp: ScreenInput, facts: AnswerFacts | None = None) -> None: ...


class Summaries(Protocol):
    """Starts a session's rolling summary when due (activities/memory.py)."""

    async def start_when_due(self, inp: SummarizeInput, backlog: Backlog | None = None) -> None: ...


class Policy(Protocol):
    """Opens a hand-off when the tenant's policy says the assistant keeps failing the
    customer (activities/handoffs.py, parley/handoff_rules.py)."""

    async def open_by_policy(self, *, session_id: str, turn_id: str) -> str | None: ...


class EndingActivities:
    def __init__(self, *, turn: Ending, screens: Screens, memory: Summaries) -> None:
        self._turn = turn
        self._screens = screens
        self._memory = memory
        self._policy: Policy | None = None

    def attach(self, policy: Policy) -> None:
        """What opens a policy hand-off as a turn ends (None: no policy is applied)."""
        self._policy = policy

    @activity.defn(name="finish_turn")
    async def finish_turn(self, inp: FinishTurnInput) -> str:
        """Store the turn's ending; returns the answer's message id (empty if none)."""
        ending = inp.finalize
        if inp.screen and not await self._screened_and_offered(
            ending.turn_id, ending.model_call_id
        ):
            ending = dataclasses.replace(ending, override_text=RETRACTION_TEXT, retract=True)
        # The ending's last statement reads what the summary's check asks, so the check
        # reads nothing of its own (unless the ending could not read it).
        ended = await self._turn.finalize(ending, backlog=True)
        summary = SummarizeInput(inp.session_id, ending.turn_id, local=True)
        await self._start_summary(summary, ended.backlog)
        await self._apply_policy(inp.session_id, ending.turn_id)
        return ended.message_id

    async def _apply_policy(self, session_id: str, turn_id: str) -> None:
        """Best effort, after the answer is stored: a policy that cannot be applied now is
        applied as a later turn ends (it counts since the session's last case)."""
        if self._policy is None:
            return
        try:
            await self._policy.open_by_policy(session_id=session_id, turn_id=turn_id)
        except Exception:
            log.warning("the hand-off policy was not applied after turn %s", turn_id, exc_info=True)

    async def _screened_and_offered(self, turn_id: str, model_call_id: str) -> bool:
        """Whether the output screen lets the answer stand (a screen that errors does: it
        fails open). Follow-ups are suggested meanwhile; a withdrawn answer gets none."""
        check = ScreenInput(turn_id, model_call_id)
        # One read of the turn for both parts (the texts, the tools, the question).
        facts = await self._screens.answer_facts(turn_id)
        followups = asyncio.ensure_future(self._screens.offer_followups(check, facts))
        try:
            try:
                verdict = await self._screens.judge_output(check, facts)
            except Exception:
                log.warning(
                    "output screen failed in turn %s; the answer stands", turn_id, exc_info=True
                )
                verdict = ScreenResult(True, "screen_error")
            if verdict.allowed:
                await asyncio.wait([followups], timeout=FOLLOWUPS_GRACE_S)
        finally:
            # Past the grace, withdrawn, or this step cancelled: the suggestions are dropped.
            followups.cancel()
            await asyncio.wait([followups])  # its end, without taking its error for ours
        if followups.cancelled() or followups.exception() is not None:
            log.info("no follow-ups offered in turn %s", turn_id)
        return verdict.allowed

    async def _start_summary(self, inp: SummarizeInput, backlog: Backlog | None) -> None:
        """Best effort: a summary that does not start now is started by a later turn."""
        try:
            await self._memory.start_when_due(inp, backlog)
        except Exception:
            log.warning(
                "the rolling summary did not start after turn %s", inp.turn_id, exc_info=True
            )
