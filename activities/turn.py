"""The turn's activities: build context, call the model (streaming), rest, finalize, fail.

Each is idempotent under Temporal's retries: a retried attempt finds what an earlier attempt
already stored and carries on from there rather than doing it twice.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.heartbeat import heartbeating
from activities.metrics import MODEL_CALLS, record_usage
from activities.northwind import BackendError, NorthwindClient
from activities.tracing import span
from gateway.base import Finish, ModelRequest, TextDelta, ToolCallRequest
from gateway.errors import ProviderFatal, ProviderRetryable
from gateway.registry import ProviderPool
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
    RequestConfirmationInput,
    ToolCallRef,
    TurnState,
)
from parley.ids import (
    message_id_for_call,
    new_id,
    override_message_id,
    prompt_cache_key,
    tool_call_row_id,
)
from parley.resolver import PENDING_CLARIFICATION, Entity, NeedsCandidates, Slot, resolve
from parley.statuses import FinalizeOutcome, FinishReason
from parley.tools import args_hash, model_tools
from store import slots, tenants, turns
from store.events import append_event, append_events
from store.models import Action, Message, ModelCall, Turn, TurnEvent, User


class TurnActivities:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        providers: ProviderPool,
        settings: Settings,
        northwind: NorthwindClient,
    ) -> None:
        self._sessions = sessions
        self._providers = providers
        self._settings = settings
        self._northwind = northwind

    # --- context ---------------------------------------------------------------------------

    @activity.defn(name="build_context")
    async def build_context(self, inp: BuildContextInput) -> BuildContextResult:
        async with span(self._sessions, inp.turn_id, "build_context"):
            return await self._build_context(inp)

    async def _build_context(self, inp: BuildContextInput) -> BuildContextResult:
        async with self._sessions() as db:
            if inp.step == 0:
                await turns.advance_turn(db, turn_id=inp.turn_id, to=TurnState.building_context)
                await db.commit()  # the stream shows the step before it runs
            turn = await db.get(Turn, inp.turn_id)
            assert turn is not None
            # A retry after a crash reuses the request it already packed.
            existing = await db.scalar(
                select(ModelCall).where(ModelCall.turn_id == turn.id, ModelCall.step == inp.step)
            )
            if existing is not None:
                return BuildContextResult(existing.id, existing.provider == "resolver")
            if inp.step == 0:
                clarification = await self._resolve_references(db, turn)
                if clarification is not None:
                    return clarification
            state = await self._state(db, turn)
            tenant = await tenants.tenant_config(db, tenant_id=turn.tenant_id)
            window_size = tenant.context_window_messages or self._settings.context_window_messages
            hidden = [turn.retry_of] if turn.retry_of else []
            rows = await db.scalars(
                select(Message)
                .where(
                    Message.session_id == turn.session_id,
                    Message.replaced_by.is_(None),
                    # A retry does not show the model the answer it is replacing.
                    ~(
                        Message.turn_id.in_(hidden)
                        & (Message.role == "assistant")
                        & Message.tool_calls.is_(None)
                    ),
                )
                .order_by(Message.seq.desc())
                .limit(window_size)
            )
            window = [
                WindowMessage(m.seq, m.role, m.text, m.status, m.tool_calls, m.tool_call_id)
                for m in rows
            ]
            messages = pack_context(
                system_prompt=self._settings.system_prompt
                + (f"\n\n{tenant.persona}" if tenant.persona else ""),
                window=window,
                max_messages=window_size,
                state=state,
            )
            call = ModelCall(
                id=new_id("mc"),
                turn_id=turn.id,
                step=inp.step,
                provider=tenant.model_provider or self._settings.model_provider,
                model=tenant.model or self._settings.model,
                request={
                    "messages": messages,
                    "tools": [t for t in model_tools() if tenant.offered(t["name"])],
                    "max_output_tokens": tenant.output_reserve_tokens or 1024,
                    "reasoning_effort": tenant.reasoning_effort,
                    "cache_key": prompt_cache_key(tenant_id=turn.tenant_id),
                },
            )
            db.add(call)
            await db.commit()
            return BuildContextResult(call.id)

    async def _resolve_references(self, db: AsyncSession, turn: Turn) -> BuildContextResult | None:
        """Run the reference resolver; if it must ask, answer with the question (no model)."""
        user_message = await db.get(Message, turn.user_message_id)
        assert user_message is not None
        current = await slots.get_slots(db, session_id=turn.session_id)
        try:
            resolution = resolve(user_message.text, slots=current, user_seq=turn.user_seq)
        except NeedsCandidates:
            resolution = resolve(
                user_message.text,
                slots=current,
                user_seq=turn.user_seq,
                entities=await self._known_entities(db, turn),
            )
        writes = dict(resolution.slot_writes)
        if resolution.clarification is not None:
            writes[PENDING_CLARIFICATION] = Slot(
                resolution.clarification.as_slot_value(), "resolver", turn.user_seq
            )
        clears = tuple(c for c in resolution.slot_clears if c not in writes)
        await slots.write_slots(db, session_id=turn.session_id, writes=writes, clears=clears)
        turn.resolution = {
            "kind": resolution.kind,
            "order_id": resolution.order_id,
            "entity_type": resolution.entity_type,
            "assumption": resolution.assumption,
        }
        if resolution.clarification is None:
            await db.commit()
            return None
        question = resolution.clarification.question
        call = ModelCall(
            id=new_id("mc"),
            turn_id=turn.id,
            step=0,
            provider="resolver",
            model="reference-resolver",
            request={"resolution": turn.resolution},
            response_text=question,
            finish_reason=FinishReason.clarification,
        )
        db.add(call)
        await db.flush()
        options = [{"label": o.label, "value": o.value} for o in resolution.clarification.options]
        await append_events(
            db,
            turn_id=turn.id,
            events=[
                (EventType.clarification, {"question": question, "options": options}),
                (
                    EventType.delta,
                    {"message_id": message_id_for_call(call.id), "text": question},
                ),
            ],
        )
        await db.commit()
        return BuildContextResult(call.id, clarification=True)

    async def _known_entities(self, db: AsyncSession, turn: Turn) -> list[Entity]:
        """The customer's orders and refunds, as candidates for the resolver."""
        try:
            orders = await self._northwind.list_orders(
                turn.tenant_id, turn.user_id, open_only=False
            )
            refunds = await self._northwind.list_refunds(turn.tenant_id, turn.user_id)
        except BackendError:
            await append_event(
                db,
                turn_id=turn.id,
                type=EventType.warning,
                data={
                    "code": "tool_unavailable",
                    "message": "The order system did not answer; I could not check your orders.",
                },
            )
            return []
        return [Entity("order", str(o["order_id"]), str(o["order_id"])) for o in orders] + [
            Entity("refund", str(r["refund_id"]), str(r["order_id"])) for r in refunds
        ]

    async def _state(self, db: AsyncSession, turn: Turn) -> dict[str, Any]:
        """The state block: facts the server knows, for the model to read (not obey)."""
        user = await db.get(User, (turn.tenant_id, turn.user_id))
        current = await slots.get_slots(db, session_id=turn.session_id)
        action = await db.scalar(
            select(Action).where(Action.turn_id == turn.id).order_by(Action.created_at.desc())
        )
        return {
            "customer": {"name": user.display_name if user else None},
            "slots": slots.slots_view(
                {k: v for k, v in current.items() if k != PENDING_CLARIFICATION}
            ),
            "resolution": turn.resolution or {},
            "action": None
            if action is None
            else {
                "id": action.id,
                "tool": action.tool,
                "status": action.status,
                "order_id": action.args.get("order_id"),
                "summary": f"the status summary for order {action.args.get('order_id')}",
                "recipient_masked": action.recipient_masked,
                "outcome": action.outcome,
            },
        }

    # --- the model call --------------------------------------------------------------------

    @activity.defn(name="call_model")
    async def call_model(self, inp: CallModelInput) -> CallModelResult:
        async with span(self._sessions, inp.turn_id, "call_model") as attrs:
            return await self._call_model(inp, attrs)

    async def _call_model(self, inp: CallModelInput, attrs: dict[str, Any]) -> CallModelResult:
        if inp.fallback and not self._settings.fallback_model_provider:
            # Before anything is reset: the failed attempt's text stays as the user saw it.
            raise ApplicationError(
                "no fallback model is configured", type="no_fallback", non_retryable=True
            )
        async with self._sessions() as db:
            await turns.advance_turn(db, turn_id=inp.turn_id, to=TurnState.calling_model)
            await db.commit()  # the stream shows the step before it runs
            call = await db.get(ModelCall, inp.model_call_id)
            assert call is not None
            if call.finish_reason is not None:  # finished by an attempt that died reporting it
                return _result(call)
            message_id = message_id_for_call(call.id)
            if call.attempts:  # only an earlier attempt can have streamed for this message
                await _reset_partial_stream(db, turn_id=inp.turn_id, message_id=message_id)
            call.attempts += 1
            await db.commit()
            provider_name, model = call.provider, call.model
            if inp.fallback:
                provider_name = self._settings.fallback_model_provider
                model = self._settings.fallback_model or model
            request = ModelRequest(
                model=model,
                messages=call.request["messages"],
                tools=call.request.get("tools", []),
                max_output_tokens=call.request.get("max_output_tokens", 1024),
                reasoning_effort=call.request.get("reasoning_effort"),
                cache_key=call.request.get("cache_key"),
            )
        attrs.update(provider=provider_name, model=model, fallback=inp.fallback)
        provider = self._providers.get(provider_name)

        started = time.monotonic()
        first_token_at: float | None = None
        parts: list[str] = []
        tool_calls: list[ToolCallRequest] = []
        finish = Finish(FinishReason.stop)
        upstream = provider.stream(request)
        frames = _coalesce(upstream, self._settings.frame_seconds)
        try:
            # One connection for the whole stream: a frame costs one round trip and a commit.
            async with heartbeating(), self._sessions() as stream_db:
                async for item in frames:
                    if isinstance(item, Finish):
                        finish = item
                        continue
                    if isinstance(item, ToolCallRequest):
                        tool_calls.append(item)
                        continue
                    if first_token_at is None:
                        first_token_at = time.monotonic()
                    parts.append(item)
                    await append_event(
                        stream_db,
                        turn_id=inp.turn_id,
                        type=EventType.delta,
                        data={"message_id": message_id, "text": item},
                    )
                    await stream_db.commit()
                    activity.heartbeat()
        except ProviderFatal as exc:
            MODEL_CALLS.labels(provider_name, model, exc.code).inc()
            raise ApplicationError(
                f"{exc.provider} refused the request ({exc.code})",
                type=exc.code,
                non_retryable=True,
            ) from None
        except ProviderRetryable as exc:
            MODEL_CALLS.labels(provider_name, model, exc.code).inc()
            delay = timedelta(seconds=exc.retry_after_s) if exc.retry_after_s else None
            raise ApplicationError(
                f"{exc.provider} is unavailable ({exc.code})", type=exc.code, next_retry_delay=delay
            ) from None
        finally:
            # Closing the generators stops the upstream generation at once (a cancelled
            # turn pays for no more tokens); what streamed stays in the event log.
            await frames.aclose()
            close = getattr(upstream, "aclose", None)
            if close is not None:
                await close()

        text = "".join(parts)
        requested = [
            {"id": c.id, "name": c.name, "arguments": _as_json(c.arguments)} for c in tool_calls
        ]
        async with self._sessions() as db:
            call = await db.get(ModelCall, inp.model_call_id)
            assert call is not None
            call.response_text = text
            call.response_tool_calls = requested or None
            call.finish_reason = finish.reason
            call.usage = finish.usage
            call.first_token_ms = (
                (first_token_at - started) * 1000 if first_token_at is not None else None
            )
            call.total_ms = (time.monotonic() - started) * 1000
            if inp.fallback:
                call.provider, call.model = provider_name, model
            # One commit for the call's outcome and its tool calls: a retry after a crash
            # finds both or neither, so the stored calls always match their results.
            if requested:
                await turns.store_tool_requests(
                    db,
                    turn_id=inp.turn_id,
                    model_call_id=inp.model_call_id,
                    text=text,
                    tool_calls=requested,
                    hashes=[args_hash(c["name"], c["arguments"]) for c in requested],
                )
            await db.commit()
            attrs.update(
                first_token_ms=call.first_token_ms, total_ms=call.total_ms, usage=finish.usage
            )
            record_usage(provider_name, model, finish.usage)
            return _result(call)

    # --- endings ---------------------------------------------------------------------------

    @activity.defn(name="request_confirmation")
    async def request_confirmation(self, inp: RequestConfirmationInput) -> None:
        async with self._sessions() as db:
            call = await db.get(ModelCall, inp.model_call_id)
            action = await db.get(Action, inp.action_id)
            assert call is not None and action is not None
            await turns.rest_awaiting_confirmation(
                db,
                turn_id=inp.turn_id,
                model_call_id=call.id,
                text=call.response_text or "",
                action=action,
            )
            await db.commit()

    @activity.defn(name="finalize_turn")
    async def finalize_turn(self, inp: FinalizeTurnInput) -> str:
        async with span(self._sessions, inp.turn_id, "finalize_turn"):
            return await self._finalize_turn(inp)

    async def _finalize_turn(self, inp: FinalizeTurnInput) -> str:
        async with self._sessions() as db:
            call = await db.get(ModelCall, inp.model_call_id)
            assert call is not None
            text, message_id = call.response_text or "", message_id_for_call(call.id)
            if inp.override_text is not None:
                text = inp.override_text
                if not inp.retract:
                    # Code's own words get their own message id: the model call's message
                    # may already hold its tool calls. A retraction replaces the streamed one.
                    message_id = override_message_id(model_call_id=call.id)
            message = await turns.complete_turn(
                db,
                turn_id=inp.turn_id,
                message_id=message_id,
                text=text,
                outcome=FinalizeOutcome(inp.outcome),
                retracted=inp.retract,
            )
            await db.commit()
            return message.id if message is not None else ""

    @activity.defn(name="cancel_turn")
    async def cancel_turn(self, inp: FailTurnInput) -> None:
        """End a cancelled turn: keep what streamed as a `cancelled` message."""
        async with self._sessions() as db:
            await turns.end_unfinished_turn(db, turn_id=inp.turn_id, state=TurnState.cancelled)
            await db.commit()

    @activity.defn(name="fail_turn")
    async def fail_turn(self, inp: FailTurnInput) -> None:
        async with self._sessions() as db:
            await turns.fail_turn(
                db,
                turn_id=inp.turn_id,
                code=inp.code,
                message=inp.message,
                retryable=inp.retryable,
            )
            await db.commit()


def _as_json(arguments: str) -> Any:
    """Keep the model's arguments as JSON when they parse, as raw text when they do not
    (the executor turns unparseable arguments into a structured error)."""
    try:
        return json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return arguments


def _result(call: ModelCall) -> CallModelResult:
    requested = call.response_tool_calls or []
    return CallModelResult(
        model_call_id=call.id,
        finish_reason=call.finish_reason or FinishReason.stop,
        output_chars=len(call.response_text or ""),
        output_tokens=int((call.usage or {}).get("output_tokens", 0)),
        tool_calls=[
            ToolCallRef(
                call_id=tool_call_row_id(model_call_id=call.id, provider_call_id=c["id"]),
                name=c["name"],
                args_hash=args_hash(c["name"], c["arguments"]),
            )
            for c in requested
        ],
    )


async def _reset_partial_stream(db: AsyncSession, *, turn_id: str, message_id: str) -> None:
    """If an earlier attempt streamed text for this message, tell clients to drop it."""
    last = await db.scalar(
        select(TurnEvent.type)
        .where(
            TurnEvent.turn_id == turn_id,
            TurnEvent.type.in_(["delta", "reset"]),
            TurnEvent.data["message_id"].astext == message_id,
        )
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
    stream: AsyncIterator[TextDelta | ToolCallRequest | Finish], frame_s: float
) -> AsyncGenerator[str | ToolCallRequest | Finish, None]:
    """Join text deltas into frames of at least `frame_s`; the first token goes out at once.
    Tool calls and the finish pass through after any buffered text. If the stream breaks,
    the text already received is yielded before the error: the user has seen it."""
    buffer: list[str] = []
    last_flush = float("-inf")
    try:
        async for event in stream:
            if not isinstance(event, TextDelta):
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
    except Exception:
        if buffer:
            yield "".join(buffer)
        raise
    if buffer:
        yield "".join(buffer)
