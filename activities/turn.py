"""The turn's activities: build context, call the model (streaming), rest, finalize, fail.

Each is idempotent under Temporal's retries: a retried attempt finds what an earlier attempt
already stored and carries on from there rather than doing it twice.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from parley.activities import knowledge, ledger, tracing
from parley.activities.budgets import BUDGET_EXHAUSTED_TEXT, hold_for_call
from parley.activities.context import ContextBuilder
from parley.activities.ending import Finalized
from parley.activities.frame_writer import FrameWriter
from parley.activities.frames import FrameClock, coalesce
from parley.activities.heartbeat import heartbeating
from parley.activities.metrics import MODEL_CALLS, record_usage
from parley.activities.stop_watch import STOP_CHECK_S, Steered, Watch, checking_while_quiet
from parley.config import Settings
from parley.contracts import (
    TERMINAL_TURN_STATES,
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
from parley.gateway.base import Finish, ModelRequest, ToolCallRequest, reads_ahead
from parley.gateway.errors import ProviderFatal, ProviderRetryable
from parley.gateway.registry import ProviderPool
from parley.ids import message_id_for_call, override_message_id, tool_call_row_id
from parley.screens import RETRACTION_TEXT, Screen
from parley.statuses import FinalizeOutcome, FinishReason, TurnErrorCode
from parley.store import actions, steps, turns
from parley.store.db import Database, Db, connect
from parley.store.events import append_event, withdraw_turn_text
from parley.store.steps import CallRow
from parley.store.turns import attempts
from parley.store.turns.reads import turn_facts
from parley.tools import args_hash
from parley.wire import ActionView, DeltaData, ResetData, RetractedData

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Attempt:
    """One attempt at a stored model call: the request, who answers it, and the call's row
    as the attempt found it (its outcome is written to it without reading it again)."""

    message_id: str
    provider: str
    model: str
    request: ModelRequest
    call: CallRow
    # The tenant's own prices and its budgets (store/steps.py `ForAttempt`).
    prices: dict[str, Any] | None
    budgets: dict[str, Any] | None


@dataclass
class _Streamed:
    """What an attempt's stream brought: text, tool calls, the finish, and when."""

    started: float
    parts: list[str] = field(default_factory=list)
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    finish: Finish = field(default_factory=lambda: Finish(FinishReason.stop))
    first_token_at: float | None = None

    @property
    def first_token_ms(self) -> float | None:
        if self.first_token_at is None:
            return None
        return (self.first_token_at - self.started) * 1000

    def take(self, item: str | ToolCallRequest | Finish) -> str | None:
        """Keep one coalesced item; return it when it is text for the user to see."""
        if isinstance(item, Finish):
            self.finish = item
            return None
        if isinstance(item, ToolCallRequest):
            self.tool_calls.append(item)
            return None
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
        self.parts.append(item)
        return item


class TurnActivities:
    def __init__(
        self,
        *,
        sessions: Database,
        providers: ProviderPool,
        settings: Settings,
        context: ContextBuilder,
        output_screen: Screen | None = None,
    ) -> None:
        self._sessions = sessions
        self._providers = providers
        self._settings = settings
        self._context = context
        self._output_screen = output_screen
        # One per worker: how long its streams' frames are (activities/frames.py), and the
        # writer of those frames, whose flushes a busy worker spaces by a part of that length.
        self._clock = FrameClock(settings)
        self._frames = FrameWriter(sessions, spacing_s=self._clock.flush_spacing_s)

    @activity.defn(name="build_context")
    async def build_context(self, inp: BuildContextInput) -> BuildContextResult:
        return await self._context.build(inp)

    # --- the model call --------------------------------------------------------------------

    @activity.defn(name="call_model")
    async def call_model(self, inp: CallModelInput) -> CallModelResult:
        if inp.fallback and not self._settings.fallback_model_provider:
            # Before anything is reset: the failed attempt's text stays as the user saw it.
            raise ApplicationError(
                "no fallback model is configured", type="no_fallback", non_retryable=True
            )
        # In autocommit: the opening, each frame's append and the outcome are a statement
        # each, which commits by itself. No connection is held while the model streams: the
        # frames go through the worker's writer (activities/frame_writer.py).
        async with heartbeating():
            async with connect(self._sessions) as conn:
                attempt = await self._begin_attempt(conn, inp)
            if isinstance(attempt, CallModelResult):
                return attempt
            tracing.annotate(provider=attempt.provider, model=attempt.model, fallback=inp.fallback)
            with self._clock.streaming():
                streamed = await self._stream(inp.turn_id, attempt)
            async with connect(self._sessions) as conn:
                return await self._store_outcome(conn, inp, attempt, streamed)

    async def _begin_attempt(self, conn: Db, inp: CallModelInput) -> _Attempt | CallModelResult:
        """Enter `calling_model` and count the attempt; a call that an earlier attempt
        finished is answered from the store."""
        # The state and the attempt's count are committed by one statement, before the
        # stream starts: the stream shows the step before it runs (a paused tenant's too).
        opened = await attempts.open_attempt(
            conn, turn_id=inp.turn_id, model_call_id=inp.model_call_id, to=TurnState.calling_model
        )
        found, call = opened.found, opened.found.call
        assert call is not None, f"model call {inp.model_call_id} is missing"
        if call.finish_reason is not None:
            # Finished by an attempt that died reporting it, or run again with the rest of
            # its workflow task after a crash (wherever the turn has got to). Billed now if
            # that attempt died before it could be (the ledger row is written once).
            await ledger.bill_call(conn, call, prices=found.prices, budgets=found.budgets)
            return _result(call)
        # What the statement wrote nothing for: a turn stopped or ended, a refused move.
        turns.may_move(found.turn, to=TurnState.calling_model)
        if opened.counted and call.attempts > 1:
            # Only an earlier attempt can have streamed for the call.
            await _reset_partial_stream(
                conn, turn_id=inp.turn_id, message_id=message_id_for_call(call.id)
            )
        refuse_if_paused(found.paused)
        await hold_for_call(conn, call, found, sessions=self._sessions)
        # The step's answer path; a re-answer names the capped step it is the child of.
        tracing.annotate(path=call.request.get("path", "tools"))
        if call.request.get("reanswer_of"):
            tracing.annotate(reanswer_of=call.request["reanswer_of"])
        provider, model = call.provider, call.model
        if inp.fallback:
            provider = self._settings.fallback_model_provider
            model = self._settings.fallback_model or model
        request = ModelRequest(
            model=model,
            messages=call.request["messages"],
            tools=call.request.get("tools", []),
            max_output_tokens=call.request.get("max_output_tokens", 1024),
            reasoning_effort=call.request.get("reasoning_effort"),
            cache_key=call.request.get("cache_key"),
        )
        message_id = message_id_for_call(call.id)
        return _Attempt(message_id, provider, model, request, call, found.prices, found.budgets)

    async def _stream(self, turn_id: str, attempt: _Attempt) -> _Streamed:
        """Relay the provider's stream into the event log, a frame at a time: each frame is
        committed by the worker's writer, whose flush also says whether the user's Stop is
        recorded or a steer came in (activities/stop_watch.py). A steer ends the stream: what
        streamed is kept as the call's superseded text, its tool calls (never run) dropped."""
        provider = self._providers.get(attempt.provider)
        streamed = _Streamed(started=time.monotonic())
        upstream = provider.stream(attempt.request)
        frames = coalesce(upstream, self._clock.frame_s, reads_ahead=reads_ahead(provider))
        watch = Watch(self._sessions, turn_id, attempt.call.request.get("steer_seq"))
        try:
            async for item in checking_while_quiet(frames, watch, STOP_CHECK_S):
                text = streamed.take(item)
                if text is None:
                    continue
                delta = DeltaData(message_id=attempt.message_id, text=text)
                appended = await self._frames.append(turn_id, delta)
                watch.heard(appended)
        except Steered:
            streamed.tool_calls.clear()
            streamed.finish = Finish(FinishReason.steered)
        except (ProviderFatal, ProviderRetryable) as exc:
            MODEL_CALLS.labels(attempt.provider, attempt.model, exc.code).inc()
            async with connect(self._sessions) as conn:  # the stream holds none
                await ledger.bill_dropped(
                    conn,
                    attempt.call,
                    provider=attempt.provider,
                    model=attempt.model,
                    usage=exc.usage,
                    prices=attempt.prices,
                )
            raise provider_failure(exc) from None
        finally:
            # Closing the generators stops the upstream generation at once (a cancelled
            # turn pays for no more tokens); what streamed stays in the event log.
            await frames.aclose()
            close = getattr(upstream, "aclose", None)
            if close is not None:
                await close()
        return streamed

    async def _store_outcome(
        self, conn: Db, inp: CallModelInput, attempt: _Attempt, streamed: _Streamed
    ) -> CallModelResult:
        """Store the answer, its timing and usage, and the tool calls it asked for."""
        text = "".join(streamed.parts)
        requested = [
            {"id": c.id, "name": c.name, "arguments": parsed_arguments(c.arguments)}
            for c in streamed.tool_calls
        ]
        finish = streamed.finish
        total_ms = (time.monotonic() - streamed.started) * 1000

        call = steps.answered(
            attempt.call,
            text=text,
            tool_calls=requested or None,
            finish_reason=finish.reason,
            usage=finish.usage,
            first_token_ms=streamed.first_token_ms,
            total_ms=total_ms,
            answered_by=(attempt.provider, attempt.model) if inp.fallback else None,
        )
        # One statement (the row `_begin_attempt` read, written without a read): the call's
        # outcome, its ledger row, and its tool calls when it asked for any.
        entry = ledger.priced_call(call, attempt.prices)
        bill = ledger.bill_params(call, entry)
        if requested:
            billed = await attempts.record_tool_requests(conn, call, bill=bill)
        else:
            billed = await steps.write_outcome(conn, call, bill=bill)
        tracing.annotate(
            first_token_ms=call.first_token_ms, total_ms=call.total_ms, usage=finish.usage
        )
        record_usage(attempt.provider, attempt.model, finish.usage)
        if billed:
            ledger.count(entry, "turn")
        await ledger.settle(conn, call.id, entry, attempt.budgets)
        return _result(call)

    # --- endings ---------------------------------------------------------------------------

    @activity.defn(name="request_confirmation")
    async def request_confirmation(self, inp: RequestConfirmationInput) -> None:
        """Rest on the proposal. The text that accompanies it is shown for as long as the
        user takes to answer, so it is screened here, before the card: a declined text is
        withdrawn (its deltas blanked, `retracted`) and the safe text stored instead."""
        async with self._sessions() as db:
            call = await steps.get_call(db, model_call_id=inp.model_call_id)
            action = await actions.get_action(db, action_id=inp.action_id)
            turn = await turn_facts(db, turn_id=inp.turn_id)
            assert call is not None and action is not None and turn is not None
            text = call.response_text or ""
            resting = turn.state == TurnState.awaiting_confirmation
            if not resting and turn.state not in TERMINAL_TURN_STATES:
                if await self._declined_by_screen(db, turn_id=inp.turn_id):
                    text = RETRACTION_TEXT
                    await withdraw_turn_text(db, turn_id=inp.turn_id)
                    retraction = RetractedData(
                        message_id=message_id_for_call(call.id), replacement_text=text
                    )
                    await append_event(
                        db, turn_id=inp.turn_id, type=EventType.retracted, data=retraction
                    )
            await turns.rest_awaiting_confirmation(
                db,
                turn_id=inp.turn_id,
                model_call_id=call.id,
                text=text,
                action=ActionView.from_row(action),
            )
            await db.commit()

    async def _declined_by_screen(self, db: Db, *, turn_id: str) -> bool:
        """Whether the output screen declines what the model has said in this turn so far;
        a screen that errors lets it stand (the output screen fails open)."""
        if self._output_screen is None:
            return False
        texts = await steps.response_texts(db, turn_id=turn_id)
        try:
            verdict = await self._output_screen.check("\n".join(texts))
        except Exception:
            log.warning("output screen failed on a proposal of turn %s", turn_id, exc_info=True)
            return False
        return not verdict.allowed

    async def finalize(self, inp: FinalizeTurnInput, *, backlog: bool = False) -> Finalized:
        """Store the turn's ending, a part of the tail step (activities/ending.py); with
        `backlog`, the session's backlog for the rolling summary's check as the ending's last
        statement read it."""
        async with self._sessions() as db:
            # The session's transaction, its statements on its own connection (`Db`): an
            # ending that must also promote a queued turn or answer open tool calls does so
            # in the same commit (store/turns/).
            # The turn locked and its call, in one statement: the citations read both, and
            # the ending below needs the lock anyway.
            turn, call = await steps.lock_with_call(
                db, turn_id=inp.turn_id, model_call_id=inp.model_call_id
            )
            text, message_id = call.response_text or "", message_id_for_call(call.id)
            if inp.override_text is not None:
                text = inp.override_text
                if not inp.retract:
                    # Code's own words get their own message id: the model call's message
                    # may already hold its tool calls. A retraction replaces the streamed one.
                    message_id = override_message_id(model_call_id=call.id)
            if inp.retract:
                # In the same commit as `retracted`: no replay after it serves the old words.
                await withdraw_turn_text(db, turn_id=inp.turn_id)
            else:
                await knowledge.emit_citations(
                    db, turn=turn, call=call, message_id=message_id, text=text
                )
            try:
                completed = await turns.complete_turn(
                    db,
                    turn=turn,
                    message_id=message_id,
                    text=text,
                    outcome=FinalizeOutcome(inp.outcome),
                    retracted=inp.retract,
                    backlog=backlog,
                    steered_through=_steer_seq(call) if inp.steerable else None,
                )
            except turns.TurnStopped:
                await db.commit()  # the cancelled ending, when the user's Stop came first
                raise
            await db.commit()
            return Finalized(completed.message.id, completed.backlog)

    @activity.defn(name="cancel_turn")
    async def cancel_turn(self, inp: FailTurnInput) -> None:
        """End a cancelled turn: keep what streamed as a `cancelled` message."""
        async with self._sessions() as db:
            await turns.end_unfinished_turn(db, turn_id=inp.turn_id, state=TurnState.cancelled)
            await db.commit()

    @activity.defn(name="fail_turn")
    async def fail_turn(self, inp: FailTurnInput) -> None:
        # The user is told why when a budget stopped the turn (not what it costs).
        message = BUDGET_EXHAUSTED_TEXT if inp.code == TurnErrorCode.budget_exhausted else None
        async with self._sessions() as db:
            await turns.fail_turn(
                db,
                turn_id=inp.turn_id,
                code=inp.code,
                message=message or inp.message,
                retryable=inp.retryable,
            )
            await db.commit()


def refuse_if_paused(paused: bool | None) -> None:
    """A paused tenant's turn calls no model: it ends with `agent_paused` (retryable)."""
    if paused:
        raise ApplicationError(
            "the assistant is paused for this tenant",
            type=TurnErrorCode.agent_paused,
            non_retryable=True,
        )


def provider_failure(exc: ProviderFatal | ProviderRetryable) -> ApplicationError:
    """A provider's failure as Temporal should treat it: a refusal is final; an outage is
    retried, after the provider's own `Retry-After` when it gave one."""
    if isinstance(exc, ProviderFatal):
        return ApplicationError(
            f"{exc.provider} refused the request ({exc.code})", type=exc.code, non_retryable=True
        )
    delay = timedelta(seconds=exc.retry_after_s) if exc.retry_after_s else None
    return ApplicationError(
        f"{exc.provider} is unavailable ({exc.code})", type=exc.code, next_retry_delay=delay
    )


def parsed_arguments(arguments: str) -> Any:
    """Keep the model's arguments as JSON when they parse, as raw text when they do not
    (the executor turns unparseable arguments into a structured error)."""
    try:
        return json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return arguments


def _steer_seq(call: CallRow) -> int | None:
    """The steer a call's request was built with (store/steering.py); None for a call built
    without the doorbell (the resolver's question), whose ending is not held by a steer."""
    if "steer_seq" not in call.request:
        return None
    return call.request["steer_seq"] or 0


def _result(call: CallRow) -> CallModelResult:
    requested = call.response_tool_calls or []
    return CallModelResult(
        attempts=max(1, call.attempts),
        model_call_id=call.id,
        finish_reason=call.finish_reason or FinishReason.stop,
        output_chars=len(call.response_text or ""),
        output_tokens=int((call.usage or {}).get("output_tokens", 0)),
        tool_calls=[
            ToolCallRef(
                call_id=tool_call_row_id(model_call_id=call.id, position=position),
                name=c["name"],
                args_hash=args_hash(c["name"], c["arguments"]),
            )
            for position, c in enumerate(requested)
        ],
    )


async def _reset_partial_stream(conn: Db, *, turn_id: str, message_id: str) -> None:
    """If an earlier attempt streamed text for this message, tell clients to drop it."""
    last = await steps.last_stream_event(conn, turn_id=turn_id, message_id=message_id)
    if last == EventType.delta:
        await append_event(
            conn,
            turn_id=turn_id,
            type=EventType.reset,
            data=ResetData(message_id=message_id, reason="retry"),
        )
