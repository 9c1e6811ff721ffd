"""The turn's activities: build context, call the model (streaming), finalize, fail.

Each is idempotent under Temporal's retries: a retried attempt finds what an earlier attempt
already stored and carries on from there rather than doing it twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity

from gateway.base import Finish, ModelProvider, ModelRequest, TextDelta
from parley.config import Settings
from parley.context import WindowMessage, pack_context
from parley.contracts import (
    BuildContextInput,
    BuildContextResult,
    CallModelInput,
    CallModelResult,
    EventType,
    FailTurnInput,
    FinalizeTurnInput,
    TurnState,
)
from parley.ids import assistant_message_id, new_id
from store import chat
from store.events import append_event
from store.models import Message, ModelCall, Turn, TurnEvent

# Well inside the workflow's 5 s heartbeat timeout for the model call.
HEARTBEAT_INTERVAL_S = 1.0


class TurnActivities:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        provider: ModelProvider,
        settings: Settings,
    ) -> None:
        self._sessions = sessions
        self._provider = provider
        self._settings = settings

    @activity.defn(name="build_context")
    async def build_context(self, inp: BuildContextInput) -> BuildContextResult:
        async with self._sessions() as db:
            await chat.set_turn_state(db, turn_id=inp.turn_id, state=TurnState.building_context)
            turn = await db.get(Turn, inp.turn_id)
            assert turn is not None
            # A retry after a crash reuses the request it already packed.
            existing = await db.scalar(
                select(ModelCall.id)
                .where(ModelCall.turn_id == turn.id)
                .order_by(ModelCall.created_at.desc())
            )
            if existing is not None:
                return BuildContextResult(model_call_id=existing)
            rows = await db.scalars(
                select(Message)
                .where(Message.session_id == turn.session_id, Message.seq <= turn.user_seq)
                .order_by(Message.seq.desc())
                .limit(self._settings.context_window_messages)
            )
            window = [WindowMessage(m.seq, m.role, m.text, m.status) for m in rows]
            messages = pack_context(
                system_prompt=self._settings.system_prompt,
                window=window,
                max_messages=self._settings.context_window_messages,
            )
            call = ModelCall(
                id=new_id("mc"),
                turn_id=turn.id,
                provider=self._provider.name,
                model=self._settings.model,
                request={"messages": messages},
            )
            db.add(call)
            await db.commit()
            return BuildContextResult(model_call_id=call.id)

    @activity.defn(name="call_model")
    async def call_model(self, inp: CallModelInput) -> CallModelResult:
        async with self._sessions() as db:
            await chat.set_turn_state(db, turn_id=inp.turn_id, state=TurnState.calling_model)
            call = await db.get(ModelCall, inp.model_call_id)
            assert call is not None
            if call.finish_reason is not None:  # finished by an attempt that died reporting it
                return CallModelResult(call.id, call.finish_reason, len(call.response_text or ""))
            message_id = assistant_message_id(inp.turn_id)
            await _reset_partial_stream(db, turn_id=inp.turn_id, message_id=message_id)
            call.attempts += 1
            await db.commit()
            request = ModelRequest(model=call.model, messages=call.request["messages"])

        started = time.monotonic()
        first_token_at: float | None = None
        parts: list[str] = []
        finish = Finish("stop")
        async with _heartbeating(HEARTBEAT_INTERVAL_S):
            frames = _coalesce(self._provider.stream(request), self._settings.frame_seconds)
            async for item in frames:
                if isinstance(item, Finish):
                    finish = item
                    continue
                if first_token_at is None:
                    first_token_at = time.monotonic()
                parts.append(item)
                async with self._sessions() as db:
                    await append_event(
                        db,
                        turn_id=inp.turn_id,
                        type=EventType.delta,
                        data={"message_id": message_id, "text": item},
                    )
                    await db.commit()
                activity.heartbeat()

        text = "".join(parts)
        async with self._sessions() as db:
            call = await db.get(ModelCall, inp.model_call_id)
            assert call is not None
            call.response_text = text
            call.finish_reason = finish.reason
            call.usage = finish.usage
            call.first_token_ms = (
                (first_token_at - started) * 1000 if first_token_at is not None else None
            )
            call.total_ms = (time.monotonic() - started) * 1000
            await db.commit()
        return CallModelResult(inp.model_call_id, finish.reason, len(text))

    @activity.defn(name="finalize_turn")
    async def finalize_turn(self, inp: FinalizeTurnInput) -> str:
        async with self._sessions() as db:
            call = await db.get(ModelCall, inp.model_call_id)
            assert call is not None
            message = await chat.complete_turn(
                db, turn_id=inp.turn_id, text=call.response_text or ""
            )
            return message.id

    @activity.defn(name="fail_turn")
    async def fail_turn(self, inp: FailTurnInput) -> None:
        async with self._sessions() as db:
            await chat.fail_turn(
                db,
                turn_id=inp.turn_id,
                code=inp.code,
                message=inp.message,
                retryable=inp.retryable,
            )


async def _reset_partial_stream(db: AsyncSession, *, turn_id: str, message_id: str) -> None:
    """If an earlier attempt streamed text for this message, tell clients to drop it."""
    last = await db.scalar(
        select(TurnEvent.type)
        .where(TurnEvent.turn_id == turn_id, TurnEvent.type.in_(["delta", "reset"]))
        .order_by(TurnEvent.id.desc())
        .limit(1)
    )
    if last == EventType.delta:
        await append_event(
            db,
            turn_id=turn_id,
            type=EventType.reset,
            data={"message_id": message_id, "reason": "retry"},
        )


async def _coalesce(
    stream: AsyncIterator[TextDelta | Finish], frame_s: float
) -> AsyncIterator[str | Finish]:
    """Join text deltas into frames of at least `frame_s`; the first token goes out at once."""
    buffer: list[str] = []
    last_flush = float("-inf")
    async for event in stream:
        if isinstance(event, Finish):
            if buffer:
                yield "".join(buffer)
                buffer.clear()
            yield event
            continue
        buffer.append(event.text)
        now = time.monotonic()
        if now - last_flush >= frame_s:
            yield "".join(buffer)
            buffer.clear()
            last_flush = now
    if buffer:
        yield "".join(buffer)


@contextlib.asynccontextmanager
async def _heartbeating(interval_s: float) -> AsyncIterator[None]:
    """Heartbeat on a timer too, so a slow first token does not look like a dead worker."""

    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(interval_s)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
