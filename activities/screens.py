"""Screening activities: the user's message before the model sees it, the model's answer
before it is stored, and follow-up suggestions offered alongside."""

from __future__ import annotations

import logging

from temporalio import activity

from parley.activities import tracing
from parley.activities.handover import Handover
from parley.contracts import EventType, ScreenInput, ScreenResult
from parley.followups import suggest
from parley.screens import Screen
from parley.store import steering, steps
from parley.store.db import Database, connect
from parley.store.events import append_while_open
from parley.store.steps import AnswerFacts
from parley.wire import FollowupsData

log = logging.getLogger(__name__)

# How long the input screen waits for the build to hand over the user's message (it reads
# the message with its first statement) before it reads the message itself.
HANDED_WITHIN_S = 1.0


class ScreenActivities:
    def __init__(
        self,
        *,
        sessions: Database,
        input_screen: Screen,
        output_screen: Screen,
        asked: Handover[str] | None = None,
    ) -> None:
        self._sessions = sessions
        self._input = input_screen
        self._output = output_screen
        # The user's message as the context build beside this step read it (None: read here).
        self._asked = asked

    @activity.defn(name="screen_input")
    async def screen_input(self, inp: ScreenInput) -> ScreenResult:
        """The turn's message, or (`steers_after`) the messages that steered it since."""
        if inp.steers_after is not None:
            async with connect(self._sessions) as conn:
                steers = await steering.steer_texts(
                    conn, turn_id=inp.turn_id, after=inp.steers_after
                )
            text = "\n".join(steers)
        else:
            text = await self._question(inp.turn_id)
        verdict = await self._input.check(text)
        tracing.annotate(allowed=verdict.allowed, category=verdict.category)
        return ScreenResult(verdict.allowed, verdict.category)

    async def _question(self, turn_id: str) -> str:
        """The turn's user message: as the build started beside this step read it and handed
        it over, or read here (nothing handed over in time, or a retry of this step)."""
        first = activity.in_activity() and activity.info().attempt == 1
        if self._asked is not None and first:
            text = await self._asked.take(turn_id, within_s=HANDED_WITHIN_S)
            if text is not None:
                return text
        async with connect(self._sessions) as conn:
            text = await steps.question(conn, turn_id=turn_id)
        assert text is not None
        return text

    async def answer_facts(self, turn_id: str) -> AnswerFacts:
        """What the turn's tail reads once for both its parts below: the texts to screen and
        what follow-ups are made from."""
        async with connect(self._sessions) as conn:
            return await steps.answer_facts(conn, turn_id=turn_id)

    async def judge_output(
        self, inp: ScreenInput, facts: AnswerFacts | None = None
    ) -> ScreenResult:
        """Every text the model produced in this turn reaches the user (what accompanied its
        tool calls and proposals streamed too), so all of it is screened, not only the last
        call's; a decline withdraws all of it. `facts`: the texts as the caller read them."""
        if facts is not None:
            texts = facts.texts
        else:
            async with connect(self._sessions) as conn:
                texts = await steps.response_texts(conn, turn_id=inp.turn_id)
        verdict = await self._output.check("\n".join(texts))
        tracing.annotate(allowed=verdict.allowed, category=verdict.category)
        if not verdict.allowed:
            log.info(
                "output screen withdrew an answer in turn %s (%s)", inp.turn_id, verdict.category
            )
        return ScreenResult(verdict.allowed, verdict.category)

    async def offer_followups(self, inp: ScreenInput, facts: AnswerFacts | None = None) -> None:
        """Best effort: offered only while the turn is still open, never after its end or its
        Stop (a Stop during the turn's last workflow task runs this step again). The turn is
        not locked while the suggestions are screened: their append checks it again.
        `facts`: the turn as the caller read it."""
        if facts is None:
            facts = await self.answer_facts(inp.turn_id)
        if not facts.still_open:
            return
        suggestions = [
            s
            for s in suggest(facts.tools, asked=facts.asked)
            if (await self._output.check(s)).allowed
        ]
        if suggestions:
            async with connect(self._sessions) as conn:
                await append_while_open(
                    conn,
                    turn_id=inp.turn_id,
                    type=EventType.followups,
                    data=FollowupsData(suggestions=suggestions),
                )
