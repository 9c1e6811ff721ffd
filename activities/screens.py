"""Screening activities: the user's message before the model sees it, the model's answer
before it is stored, and follow-up suggestions offered alongside."""

from __future__ import annotations

import logging

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity

from activities import tracing
from parley.contracts import TERMINAL_TURN_STATES, EventType, ScreenInput, ScreenResult
from parley.followups import suggest
from parley.screens import Screen
from parley.statuses import ToolCallStatus
from parley.wire import FollowupsData
from store.db import autocommit
from store.events import append_event
from store.models import Message, ModelCall, Turn

log = logging.getLogger(__name__)


class ScreenActivities:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        input_screen: Screen,
        output_screen: Screen,
    ) -> None:
        self._sessions = sessions
        self._input = input_screen
        self._output = output_screen

    @activity.defn(name="screen_input")
    async def screen_input(self, inp: ScreenInput) -> ScreenResult:
        async with self._sessions() as db:
            await autocommit(db)  # reads only
            text = await db.scalar(
                select(Message.text)
                .join(Turn, Turn.user_message_id == Message.id)
                .where(Turn.id == inp.turn_id)
            )
            assert text is not None
        verdict = await self._input.check(text)
        tracing.annotate(allowed=verdict.allowed, category=verdict.category)
        return ScreenResult(verdict.allowed, verdict.category)

    @activity.defn(name="screen_output")
    async def screen_output(self, inp: ScreenInput) -> ScreenResult:
        """Every text the model produced in this turn reaches the user (what accompanied its
        tool calls and proposals streamed too), so all of it is screened, not only the last
        call's; a decline withdraws all of it."""
        async with self._sessions() as db:
            await autocommit(db)  # reads only
            texts = await db.scalars(
                select(ModelCall.response_text)
                .where(ModelCall.turn_id == inp.turn_id)
                .order_by(ModelCall.step)
            )
            text = "\n".join(t for t in texts if t)
        verdict = await self._output.check(text)
        tracing.annotate(allowed=verdict.allowed, category=verdict.category)
        if not verdict.allowed:
            log.info(
                "output screen withdrew an answer in turn %s (%s)", inp.turn_id, verdict.category
            )
        return ScreenResult(verdict.allowed, verdict.category)

    @activity.defn(name="suggest_followups")
    async def suggest_followups(self, inp: ScreenInput) -> None:
        """Best effort: offered only while the turn is still open, never after its end or its
        Stop (a Stop during the turn's last workflow task runs this step again)."""
        async with self._sessions() as db:
            open_turn, tools, asked = await _lock_turn_with_tools_and_question(db, inp.turn_id)
            if not open_turn:
                await db.commit()
                return
            suggestions = [
                s for s in suggest(tools, asked=asked) if (await self._output.check(s)).allowed
            ]
            if suggestions:
                await append_event(
                    db,
                    turn_id=inp.turn_id,
                    type=EventType.followups,
                    data=FollowupsData(suggestions=suggestions),
                )
            await db.commit()


async def _lock_turn_with_tools_and_question(
    db: AsyncSession, turn_id: str
) -> tuple[bool, list[str], str]:
    """Whether the turn is still open (not ended, no Stop recorded), its row locked; the
    tools it ran successfully, in call order; and the user's message (empty when missing):
    one round trip."""
    found = (await db.execute(_TURN_TOOLS_AND_QUESTION, {"turn_id": turn_id})).one()
    terminal = {state.value for state in TERMINAL_TURN_STATES}
    still_open = found.state not in terminal and found.cancel_requested_at is None
    return still_open, list(found.tools or []), found.asked or ""


# Plain SQL: it runs once a turn, and its ORM form cost more to prepare than to run.
_TURN_TOOLS_AND_QUESTION = text(
    """
    SELECT t.state, t.cancel_requested_at, (
        SELECT array_agg(c.name ORDER BY c.created_at) FROM tool_calls AS c
        WHERE c.turn_id = t.id AND c.status = :ok
    ) AS tools, (SELECT m.text FROM messages AS m WHERE m.id = t.user_message_id) AS asked
    FROM turns AS t WHERE t.id = :turn_id
    FOR UPDATE OF t
    """
).bindparams(ok=ToolCallStatus.ok.value)
