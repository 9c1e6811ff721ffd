"""The Returns specialist's steps (workflows/specialist.py orchestrates them).

Each step is idempotent under retries: a question is shown once per interaction id, the
proposal's action id is derived from the turn, and the confirmed return is created under the
action's idempotency key (`create_confirmed_return`, called by `send_email`, so the confirm,
re-check and settle machinery of emails is the same for returns).

    begin ─▶ ask (item) ─▶ ask (reason) ─▶ check window ─▶ propose ─▶ [send_email] ─▶ end
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from parley.activities.email_proposal import mask_email
from parley.activities.heartbeat import heartbeating
from parley.activities.northwind import BackendError, BackendUnavailable, NorthwindClient
from parley.activities.tools import tool_event
from parley.config import Settings
from parley.contracts import (
    TOOL_ATTEMPTS,
    AskInput,
    EventType,
    ProposeReturnInput,
    ReturnWindowResult,
    SpecialistEndInput,
    SpecialistInput,
    SpecialistPlan,
    TurnState,
)
from parley.gateway.demo import DemoModel
from parley.ids import return_idempotency_key, specialist_action_id
from parley.returns_agent import AGENT_MAX_STEPS
from parley.screens import Screen
from parley.specialists import (
    CLOSING_TEXT,
    ITEM_QUESTION,
    REASON_QUESTION,
    REASONS,
    RETURNS,
    SpecialistOutcome,
    closing_text,
    reason_label,
)
from parley.statuses import ActionStatus
from parley.store import actions, steps, turns
from parley.store.actions import ActionRow
from parley.store.db import Database, Db, connect
from parley.store.events import append_event
from parley.store.interactions import has_event
from parley.store.turns.reads import TurnFacts, turn_facts
from parley.tools import TOOLS
from parley.wire import ActionData, ActionView, InteractionData, Option, SubagentData

log = logging.getLogger(__name__)


async def create_confirmed_return(
    nw: NorthwindClient, action: ActionRow
) -> tuple[ActionStatus, dict[str, Any]]:
    """Create the confirmed return under the action's idempotency key: a retry after a lost
    answer gets the same RMA back, never a second return."""
    try:
        made = await nw.create_return(
            idempotency_key=return_idempotency_key(action_id=action.id),
            tenant=action.tenant_id,
            customer=action.user_id,
            args=action.args,
        )
    except BackendUnavailable as exc:
        if not exc.breaker_open and activity.info().attempt < TOOL_ATTEMPTS:
            raise ApplicationError(str(exc), type="backend_unavailable") from exc
        return ActionStatus.unknown, {"accepted": None}
    except BackendError as exc:
        return ActionStatus.failed, {"accepted": False, "error": type(exc).__name__}
    return ActionStatus.executed, {"accepted": True, "rma_id": str(made["rma_id"])}


class SpecialistActivities:
    def __init__(
        self,
        *,
        sessions: Database,
        northwind: NorthwindClient,
        settings: Settings,
        output_screen: Screen | None = None,
    ) -> None:
        self._sessions = sessions
        self._northwind = northwind
        self._settings = settings
        self._output_screen = output_screen

    @activity.defn(name="specialist_begin")
    async def begin(self, inp: SpecialistInput) -> SpecialistPlan:
        """Show the hand-over (`subagent` start) and fix the specialist's bounds; a real model
        (any provider but the demo) drives it as an agent loop (parley/returns_agent.py)."""
        async with self._sessions() as db:
            call = await steps.get_tool_call(db, call_id=inp.call_id)
            assert call is not None
            order_id = str((call.arguments or {}).get("order_id", ""))
            asked_by = await steps.get_call(db, model_call_id=call.model_call_id)
            agent = asked_by is not None and asked_by.provider != DemoModel.name
            if not await has_event(
                db, turn_id=inp.turn_id, type_=EventType.subagent, key="phase", value="start"
            ):
                start = SubagentData(name=inp.name, phase="start")
                await append_event(db, turn_id=inp.turn_id, type=EventType.subagent, data=start)
                await db.commit()
        return SpecialistPlan(
            order_id=order_id,
            wait_s=self._settings.specialist_wait_s,
            confirmation_timeout_s=self._settings.confirmation_timeout_s,
            max_steps=AGENT_MAX_STEPS if agent else SpecialistPlan.max_steps,
            agent=agent,
        )

    @activity.defn(name="specialist_ask")
    async def ask(self, inp: AskInput) -> None:
        """Ask the user (an `interaction`) and rest the turn in `awaiting_input`; once per
        interaction id, however often the step is retried."""
        if inp.question == "item":
            question, options = ITEM_QUESTION, await self._item_options(inp)
        else:
            question, options = REASON_QUESTION, list(REASONS)
        await self.show_question(inp.turn_id, inp.interaction_id, question, options)

    async def show_question(
        self, turn_id: str, interaction_id: str, question: str, options: list[Option]
    ) -> None:
        """The `interaction` the turn rests on in `awaiting_input`; once per interaction id."""
        async with self._sessions() as db:
            if await has_event(
                db,
                turn_id=turn_id,
                type_=EventType.interaction,
                key="interaction_id",
                value=interaction_id,
            ):
                return
            await turns.advance_turn(db, turn_id=turn_id, to=TurnState.executing_tools)
            data = InteractionData(
                agent=RETURNS, question=question, options=options, interaction_id=interaction_id
            )
            await turns.move_turn(
                db,
                turn_id=turn_id,
                to=TurnState.awaiting_input,
                then=[(EventType.interaction, data)],
            )
            await db.commit()

    async def _item_options(self, inp: AskInput) -> list[Option]:
        items = await self.order_items(await self.turn(inp.turn_id), inp.order_id)
        return [Option(label=i["name"], value=i["item_id"]) for i in items]

    @activity.defn(name="specialist_check_window")
    async def check_window(self, inp: AskInput) -> ReturnWindowResult:
        """The existing eligibility check, shown as a tool call on the stream."""
        call_id = f"{inp.interaction_id}:window"
        result = await self.eligibility(inp.turn_id, call_id, inp.order_id)
        return ReturnWindowResult(eligible=bool(result.get("eligible")))

    async def eligibility(self, turn_id: str, call_id: str, order_id: str) -> dict[str, Any]:
        """The backend's return-window answer for the order, shown as a tool call."""
        name = "check_return_eligibility"
        label = TOOLS[name].label
        async with self._sessions() as db:
            await turns.advance_turn(db, turn_id=turn_id, to=TurnState.executing_tools)
            if activity.info().attempt == 1:
                await tool_event(db, turn_id, call_id, name, "start", label)
            await db.commit()
        turn = await self.turn(turn_id)
        async with heartbeating():  # a dead worker is noticed within the heartbeat timeout
            result = await self._backend(
                self._northwind.order_resource(
                    turn.tenant_id, turn.user_id, order_id, "/return-eligibility"
                )
            )
        async with self._sessions() as db:
            await tool_event(db, turn_id, call_id, name, "end", label, status="ok")
            await db.commit()
        return dict(result)

    @activity.defn(name="specialist_propose_return")
    async def propose_return(self, inp: ProposeReturnInput) -> str:
        """Record the return as a pending action and show its card; the action's id."""
        turn = await self.turn(inp.turn_id)
        items = await self.order_items(turn, inp.order_id)
        item = next(i for i in items if i["item_id"] == inp.item_id)
        return await self.propose(turn, inp, item_name=str(item["name"]))

    async def order_items(self, turn: TurnFacts, order_id: str) -> list[dict[str, Any]]:
        """The order's items as the backend lists them (an outage is retried)."""
        nw = self._northwind
        body = await self._backend(
            nw.order_resource(turn.tenant_id, turn.user_id, order_id, "/items")
        )
        return list(body["items"])

    async def propose(self, turn: TurnFacts, inp: ProposeReturnInput, *, item_name: str) -> str:
        """The pending `create_return` action and its card (once, whoever proposes it); the
        action's id."""
        customer = await self._backend(self._northwind.get_customer(turn.tenant_id, turn.user_id))
        masked = mask_email(str(customer.get("email") or ""))
        async with self._sessions() as db:
            action = await actions.create_action(
                db,
                turn=turn,
                action_id=specialist_action_id(turn_id=turn.id, step=0),
                tool="create_return",
                args={"order_id": inp.order_id, "item_id": inp.item_id, "reason": inp.reason},
                summary=(
                    f"Return “{item_name}” from order {inp.order_id} "
                    f"(reason: {reason_label(inp.reason).lower()}); "
                    f"a prepaid label goes to {masked} by email"
                ),
                recipient_masked=masked,
                ttl=timedelta(seconds=inp.confirmation_timeout_s),
            )
            await turns.advance_turn(db, turn_id=turn.id, to=TurnState.executing_tools)
            card = ActionData(action=ActionView.from_row(action))
            await turns.move_turn(
                db,
                turn_id=turn.id,
                to=TurnState.awaiting_confirmation,
                then=[(EventType.confirmation_required, card)],
            )
            await db.commit()
            return action.id

    @activity.defn(name="specialist_end")
    async def end(self, inp: SpecialistEndInput) -> str:
        """Hand back (`subagent` end); the words the turn ends with."""
        async with self._sessions() as db:
            rma_id = None
            if inp.action_id:
                action = await actions.get_action(db, action_id=inp.action_id)
                rma_id = ((action.outcome or {}) if action else {}).get("rma_id")
            if not await has_event(
                db, turn_id=inp.turn_id, type_=EventType.subagent, key="phase", value="end"
            ):
                end = SubagentData(name=inp.name, phase="end")
                await append_event(db, turn_id=inp.turn_id, type=EventType.subagent, data=end)
                await db.commit()
            said = await self._own_words(db, inp)
        if said:
            return said
        outcome = inp.outcome if inp.outcome in CLOSING_TEXT else SpecialistOutcome.failed
        return closing_text(outcome, rma_id)

    async def _own_words(self, db: Db, inp: SpecialistEndInput) -> str:
        """A real model's last words, when it ended in words: screened as a turn's answer
        is (declined, code's closing words stand instead; a screen that errors lets them)."""
        if not inp.model_call_id or inp.outcome != SpecialistOutcome.answered:
            return ""
        call = await steps.get_call(db, model_call_id=inp.model_call_id)
        text = ((call.response_text if call else None) or "").strip()
        if not text or self._output_screen is None:
            return text
        try:
            verdict = await self._output_screen.check(text)
        except Exception:
            log.warning("output screen failed on the specialist of turn %s", inp.turn_id)
            return text
        return text if verdict.allowed else ""

    async def turn(self, turn_id: str) -> TurnFacts:
        """The turn's owners, for the backend's reads (one statement, autocommit)."""
        async with connect(self._sessions) as conn:
            turn = await turn_facts(conn, turn_id=turn_id)
        assert turn is not None
        return turn

    async def _backend(self, call: Any) -> Any:
        """A backend read: an outage is retried by Temporal while attempts remain."""
        try:
            return await call
        except BackendUnavailable as exc:
            raise ApplicationError(str(exc), type="backend_unavailable") from exc
