"""Screening activities: the user's message before the model sees it, the model's answer
before it is stored, and follow-up suggestions offered alongside."""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity

from activities import tracing
from parley.contracts import TERMINAL_TURN_STATES, EventType, ScreenInput, ScreenResult
from parley.followups import suggest
from parley.screens import Screen
from parley.statuses import ToolCallStatus
from parley.wire import FollowupsData
from store.events import append_event
from store.models import Message, ModelCall, ToolCall, Turn

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
            turn = await db.get(Turn, inp.turn_id)
            assert turn is not None
            message = await db.get(Message, turn.user_message_id)
            assert message is not None
            text = message.text
        verdict = await self._input.check(text)
        tracing.annotate(allowed=verdict.allowed, category=verdict.category)
        return ScreenResult(verdict.allowed, verdict.category)

    @activity.defn(name="screen_output")
    async def screen_output(self, inp: ScreenInput) -> ScreenResult:
        async with self._sessions() as db:
            call = await db.get(ModelCall, inp.model_call_id)
            assert call is not None
            text = call.response_text or ""
        verdict = await self._output.check(text)
        tracing.annotate(allowed=verdict.allowed, category=verdict.category)
        if not verdict.allowed:
            log.info(
                "output screen withdrew an answer in turn %s (%s)", inp.turn_id, verdict.category
            )
        return ScreenResult(verdict.allowed, verdict.category)

    @activity.defn(name="suggest_followups")
    async def suggest_followups(self, inp: ScreenInput) -> None:
        """Best effort: offered only while the turn is still open, never after its end."""
        async with self._sessions() as db:
            turn = await db.get(Turn, inp.turn_id, with_for_update=True)
            assert turn is not None
            if turn.state in TERMINAL_TURN_STATES:
                await db.commit()
                return
            tools = list(
                await db.scalars(
                    select(ToolCall.name)
                    .where(ToolCall.turn_id == turn.id, ToolCall.status == ToolCallStatus.ok)
                    .order_by(ToolCall.created_at)
                )
            )
            asked = await db.get(Message, turn.user_message_id)
            suggestions = suggest(tools, asked=asked.text if asked else "")
            if suggestions:
                await append_event(
                    db,
                    turn_id=turn.id,
                    type=EventType.followups,
                    data=FollowupsData(suggestions=suggestions),
                )
            await db.commit()
