"""The Returns specialist's agent loop with a real model (workflows/specialist.py, `_agent`).

Each model call and each tool call is its own step, idempotent under retries: a model call
is a `model_calls` row of the turn (steps from `AGENT_STEP_BASE`), written before the model
is asked and answered from the store once finished; a tool's result is a finished
`tool_calls` row, written once, read back into the next request. Neither reaches the
session's transcript: the specialist's words reach the user as its questions, its card and
its last words. Only ids and option values travel through the workflow's history.

    step ─▶ (list items | check window) ─▶ step ─▶ ask ─▶ [answer] ─▶ step … ─▶ propose
"""

from __future__ import annotations

import logging
import time
from typing import Any

from temporalio import activity

from parley.activities import ledger
from parley.activities.budgets import hold_for_call
from parley.activities.heartbeat import heartbeating
from parley.activities.metrics import MODEL_CALLS, record_usage
from parley.activities.specialist import SpecialistActivities
from parley.activities.turn import parsed_arguments, provider_failure, refuse_if_paused
from parley.contracts import (
    AgentCall,
    AgentStep,
    AgentStepInput,
    AgentToolInput,
    ProposeReturnInput,
    TurnState,
)
from parley.gateway.base import Finish, ModelRequest, TextDelta, ToolCallRequest
from parley.gateway.errors import ProviderFatal, ProviderRetryable
from parley.gateway.registry import ProviderPool
from parley.ids import tool_call_row_id
from parley.returns_agent import (
    AGENT_STEP_BASE,
    ASK_USER,
    CHECK_WINDOW,
    LIST_ITEMS,
    PastStep,
    agent_messages,
    agent_tool_schemas,
    check_call,
)
from parley.screens import Screen
from parley.statuses import FinishReason, ToolCallStatus
from parley.store import agent_steps, steps, turns
from parley.store.db import Database, connect
from parley.store.steps import CallRow, ForAttempt
from parley.wire import Option

log = logging.getLogger(__name__)


class SpecialistAgentActivities:
    def __init__(
        self,
        *,
        sessions: Database,
        providers: ProviderPool,
        specialist: SpecialistActivities,
        output_screen: Screen | None = None,
    ) -> None:
        self._sessions = sessions
        self._providers = providers
        self._specialist = specialist
        self._output_screen = output_screen

    # --- the model call --------------------------------------------------------------------

    @activity.defn(name="specialist_agent_step")
    async def step(self, inp: AgentStepInput) -> AgentStep:
        """One model call of the loop: the request built from the specialist's steps so far,
        the reply stored; the tool calls it asked for, each checked."""
        call, found = await self._begin(inp)
        if call.finish_reason is None:
            # Held to the turn's budgets as the turn's own calls are (activities/budgets.py):
            # an exhausted one refuses the step before the model is asked.
            async with connect(self._sessions) as conn:
                await hold_for_call(conn, call, found, sessions=self._sessions)
            call = await self._ask_model(call)
        # Billed once, whichever attempt gets here first after the reply is stored, and the
        # reservation settled to its real cost.
        async with connect(self._sessions) as conn:
            await ledger.bill_call(
                conn, call, prices=found.prices, budgets=found.budgets, kind="specialist"
            )
        return _agent_step(call)

    async def _begin(self, inp: AgentStepInput) -> tuple[CallRow, ForAttempt]:
        """The step's stored call (written now on the first attempt), its attempt counted; a
        turn stopped or paused meanwhile refuses the step."""
        async with self._sessions() as db:
            stored = await steps.step_call(db, turn_id=inp.turn_id, step=AGENT_STEP_BASE + inp.step)
            if stored is None:
                made = await self._new_call(inp)
                stored = await steps.insert_call(
                    db, turn_id=inp.turn_id, step=AGENT_STEP_BASE + inp.step, **made
                )
            found = await steps.lock_for_attempt(db, turn_id=inp.turn_id, model_call_id=stored.id)
            call = found.call
            assert call is not None
            if call.finish_reason is not None:
                return call, found
            await turns.advance_locked(db, found.turn, to=TurnState.executing_tools)
            if not found.paused:
                call = await steps.count_attempt(db, call)
            await db.commit()  # the step was entered, whatever it finds
        refuse_if_paused(found.paused)
        return call, found

    async def _new_call(self, inp: AgentStepInput) -> dict[str, Any]:
        """Who answers the step (the model that delegated) and the request it is sent."""
        async with self._sessions() as db:
            delegated = await steps.get_tool_call(db, call_id=inp.call_id)
            assert delegated is not None
            asked_by = await steps.get_call(db, model_call_id=delegated.model_call_id)
            assert asked_by is not None
            order_id = str((delegated.arguments or {}).get("order_id", ""))
            message = await steps.question(db, turn_id=inp.turn_id) or ""
            past = await agent_steps.agent_steps(
                db,
                turn_id=inp.turn_id,
                first_step=AGENT_STEP_BASE,
                before_step=AGENT_STEP_BASE + inp.step,
            )
        request = {
            "path": "specialist",
            "messages": agent_messages(
                order_id,
                message,
                [PastStep(c.response_text or "", c.response_tool_calls or [], r) for c, r in past],
            ),
            "tools": agent_tool_schemas(),
            "max_output_tokens": 1024,
        }
        return {"provider": asked_by.provider, "model": asked_by.model, "request": request}

    async def _ask_model(self, call: CallRow) -> CallRow:
        """Ask the model and store its whole reply (nothing streams to the user: the loop
        shows what it decides through its tools)."""
        request = ModelRequest(
            model=call.model,
            messages=call.request["messages"],
            tools=call.request["tools"],
            max_output_tokens=call.request.get("max_output_tokens", 1024),
        )
        started = time.monotonic()
        parts: list[str] = []
        requested: list[ToolCallRequest] = []
        finish = Finish(FinishReason.stop)
        first_token_ms: float | None = None
        try:
            async with heartbeating():  # a dead worker is noticed within the heartbeat timeout
                async for event in self._providers.get(call.provider).stream(request):
                    if isinstance(event, TextDelta):
                        if first_token_ms is None:
                            first_token_ms = (time.monotonic() - started) * 1000
                        parts.append(event.text)
                    elif isinstance(event, ToolCallRequest):
                        requested.append(event)
                    else:
                        finish = event
        except (ProviderFatal, ProviderRetryable) as exc:
            MODEL_CALLS.labels(call.provider, call.model, exc.code).inc()
            raise provider_failure(exc) from None
        tool_calls = [
            {"id": c.id or f"call_{i}", "name": c.name, "arguments": parsed_arguments(c.arguments)}
            for i, c in enumerate(requested)
        ]
        async with connect(self._sessions) as conn:
            written = await steps.record_outcome(
                conn,
                call,
                text="".join(parts),
                tool_calls=tool_calls or None,
                finish_reason=finish.reason,
                usage=finish.usage,
                first_token_ms=first_token_ms,
                total_ms=(time.monotonic() - started) * 1000,
            )
        record_usage(call.provider, call.model, finish.usage)
        return written

    # --- its tools -------------------------------------------------------------------------

    @activity.defn(name="specialist_agent_tool")
    async def run_tool(self, inp: AgentToolInput) -> None:
        """A read: the order's items, or its return window (shown as the eligibility check)."""
        requested, args, done = await self._requested(inp)
        if done:
            return
        if args["order_id"] != inp.order_id:
            result: dict[str, Any] = {"error": f"you work on order {inp.order_id} only"}
        elif requested["name"] == LIST_ITEMS:
            turn = await self._specialist.turn(inp.turn_id)
            items = await self._specialist.order_items(turn, inp.order_id)
            result = {"items": [{"item_id": i["item_id"], "name": i["name"]} for i in items]}
        else:
            assert requested["name"] == CHECK_WINDOW
            row_id = tool_call_row_id(model_call_id=inp.model_call_id, position=inp.position)
            window = await self._specialist.eligibility(inp.turn_id, row_id, inp.order_id)
            result = {"eligible": bool(window.get("eligible"))}
        await self._record(inp, requested, result)

    @activity.defn(name="specialist_agent_ask")
    async def ask(self, inp: AgentToolInput) -> bool:
        """Show the model's question with its options (an `interaction`); False, its error
        recorded for the model, when the output screen declines the words."""
        requested, args, done = await self._requested(inp)
        if done:
            return False  # answered, or refused, by an earlier attempt
        options = [Option(label=o["label"], value=o["value"]) for o in args["options"]]
        shown = "\n".join([args["question"], *(o.label for o in options)])
        if not await self._allowed(shown):
            error = "the question was not shown: the output screen declined its words"
            await self._record(inp, requested, {"error": error}, ToolCallStatus.error)
            return False
        await self._specialist.show_question(
            inp.turn_id, inp.interaction_id, args["question"], options
        )
        return True

    @activity.defn(name="specialist_agent_answer")
    async def answer(self, inp: AgentToolInput) -> None:
        """The user's answer as the question's result: the option chosen, or none."""
        requested, args, _ = await self._requested(inp)
        label = next((o["label"] for o in args["options"] if o["value"] == inp.value), None)
        result: dict[str, Any] = {"chosen": {"value": inp.value, "label": label}}
        if label is None:
            result = {"chosen": None, "note": "the customer's words named none of the options"}
        await self._record(inp, requested, result)

    @activity.defn(name="specialist_agent_propose")
    async def propose(self, inp: AgentToolInput) -> str:
        """The pending `create_return` and its card, for what the user chose; the action's
        id, or "" with the reason recorded for the model (an item of another order, a
        choice the user never made, a closed window)."""
        requested, args, done = await self._requested(inp)
        if done:
            return await self._proposed(inp)
        turn = await self._specialist.turn(inp.turn_id)
        items = {
            i["item_id"]: i["name"] for i in await self._specialist.order_items(turn, inp.order_id)
        }
        chosen = await self._chosen(inp.turn_id)
        problem = ""
        if args["order_id"] != inp.order_id or args["item_id"] not in items:
            problem = f"no item {args['item_id']!r} in order {inp.order_id}"
        elif not {args["item_id"], args["reason"]} <= chosen:
            problem = "propose only the item and the reason the customer chose (ask_user)"
        else:
            row_id = tool_call_row_id(model_call_id=inp.model_call_id, position=inp.position)
            window = await self._specialist.eligibility(inp.turn_id, row_id, inp.order_id)
            if not window.get("eligible"):
                problem = "the order is outside its return window"
        if problem:
            await self._record(inp, requested, {"error": problem}, ToolCallStatus.error)
            return ""
        proposal = ProposeReturnInput(
            inp.turn_id, inp.order_id, args["item_id"], args["reason"], inp.confirmation_timeout_s
        )
        action_id = await self._specialist.propose(
            turn, proposal, item_name=str(items[args["item_id"]])
        )
        await self._record(inp, requested, {"proposed": True, "action_id": action_id})
        return action_id

    # --- helpers ---------------------------------------------------------------------------

    async def _requested(self, inp: AgentToolInput) -> tuple[dict[str, Any], dict[str, Any], bool]:
        """The call as the model asked for it, its checked arguments, and whether its result
        is already stored."""
        async with self._sessions() as db:
            call = await steps.get_call(db, model_call_id=inp.model_call_id)
            assert call is not None and call.response_tool_calls
            row_id = tool_call_row_id(model_call_id=call.id, position=inp.position)
            done = await steps.get_tool_call(db, call_id=row_id) is not None
        requested = call.response_tool_calls[inp.position]
        args, problem = check_call(requested["name"], requested["arguments"])
        assert args is not None, problem  # the workflow runs only the calls that checked
        return requested, args, done

    async def _record(
        self,
        inp: AgentToolInput,
        requested: dict[str, Any],
        result: dict[str, Any],
        status: ToolCallStatus = ToolCallStatus.ok,
    ) -> None:
        async with self._sessions() as db:
            await agent_steps.record_agent_result(
                db,
                turn_id=inp.turn_id,
                model_call_id=inp.model_call_id,
                position=inp.position,
                requested=requested,
                status=status,
                result=result,
            )
            await db.commit()

    async def _proposed(self, inp: AgentToolInput) -> str:
        async with self._sessions() as db:
            row_id = tool_call_row_id(model_call_id=inp.model_call_id, position=inp.position)
            row = await steps.get_tool_call(db, call_id=row_id)
        return str(((row.result or {}) if row else {}).get("action_id") or "")

    async def _chosen(self, turn_id: str) -> set[str]:
        """The option values the user chose in the specialist's questions."""
        async with self._sessions() as db:
            past = await agent_steps.agent_steps(
                db, turn_id=turn_id, first_step=AGENT_STEP_BASE, before_step=AGENT_STEP_BASE * 2
            )
        chosen = set()
        for call, results in past:
            for requested in call.response_tool_calls or []:
                answer = results.get(requested["id"], {}).get("chosen")
                if requested["name"] == ASK_USER and isinstance(answer, dict):
                    chosen.add(str(answer.get("value")))
        return chosen

    async def _allowed(self, text: str) -> bool:
        """The output screen's verdict on words the user will see; an erroring screen lets
        them stand, as it does a turn's answer."""
        if self._output_screen is None:
            return True
        try:
            return (await self._output_screen.check(text)).allowed
        except Exception:
            log.warning("output screen failed on a specialist question", exc_info=True)
            return True


def _agent_step(call: CallRow) -> AgentStep:
    calls = []
    for position, requested in enumerate(call.response_tool_calls or []):
        _, problem = check_call(requested["name"], requested["arguments"])
        calls.append(AgentCall(position, str(requested["name"])[:64], refused=bool(problem)))
    return AgentStep(call.id, calls, said=bool((call.response_text or "").strip()))
