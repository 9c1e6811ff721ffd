"""The tool executor: runs what the model asked for, with the server's authority.

Identity comes from the turn's session, never from arguments. Arguments are schema-checked
before anything runs; results are schema-checked, stripped to what the model needs and
size-limited; every failure becomes a structured result the model can read. Writes run only
from `send_email`, which the workflow calls after the user's own bound confirmation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from parley.activities.delegation import delegate_returns
from parley.activities.email_proposal import (
    NO_VERIFIED_ADDRESS,
    mask_email,
    propose_send_email,
    verified_address,
)
from parley.activities.handoffs import HandoffActivities
from parley.activities.heartbeat import heartbeating
from parley.activities.mcp import McpTools
from parley.activities.metrics import HANDOFFS_OPENED
from parley.activities.northwind import (
    BackendError,
    BackendNotFound,
    BackendUnavailable,
    NorthwindClient,
)
from parley.activities.result_sets import RESULT_SET_TOOLS, ResultSetTools
from parley.activities.skills import SkillTools
from parley.activities.skills import events as skill_events
from parley.config import Settings
from parley.contracts import (
    TOOL_ATTEMPTS,
    EventType,
    ExecuteToolInput,
    ToolOutcome,
    TurnState,
    WarningCode,
)
from parley.ids import handoff_id_for_call
from parley.mcp import is_mcp_name
from parley.resolver import ACTIVE_ORDER, Slot
from parley.skills import RUN_SKILL, RUN_SKILL_LABEL
from parley.specialists import DELEGATE_RETURNS
from parley.statuses import (
    ToolCallStatus,
)
from parley.store import handoffs as handoff_store
from parley.store import steps, turns
from parley.store.db import Database, Db, connect
from parley.store.events import append_events
from parley.store.turns.reads import TurnFacts
from parley.store.turns.tool_calls import ToolCallRow, store_tool_result
from parley.tenancy import TenantConfig
from parley.tools import TOOLS, ProposeEmailArgs, ToolError, parse_arguments
from parley.wire import ToolData, WarningData

# A tool result the model reads is cut to this many characters of JSON.
MAX_RESULT_CHARS = 4000


# --- result shapes: what the model gets to see -------------------------------------------


class _View(BaseModel):
    model_config = {"extra": "ignore"}


class Money(_View):
    amount: str
    currency: str


class Item(_View):
    name: str
    qty: int


class OrderView(_View):
    order_id: str
    status: str
    items: list[Item] = []
    total: Money | None = None
    shipped_on: str | None = None
    eta: str | None = None
    delivered_on: str | None = None
    # Free text from the carrier: data for the model, never instructions.
    carrier_note: str | None = None


class RefundView(_View):
    refund_id: str
    order_id: str
    amount: Money
    status: str
    stage: str | None = None
    approved_on: str | None = None
    completed_on: str | None = None


class ReturnView(_View):
    order_id: str
    eligible: bool
    window_days: int
    delivered_on: str | None = None
    window_ends: str | None = None
    days_left: int | None = None
    reason: str | None = None


def _limited(result: dict[str, Any]) -> dict[str, Any]:
    """Keep results small: drop list items from the end until the JSON fits."""
    while len(json.dumps(result)) > MAX_RESULT_CHARS:
        lists = [k for k, v in result.items() if isinstance(v, list) and v]
        if not lists:
            return ToolError("result_too_large", "the result was too large to use").as_result()
        result[lists[0]] = result[lists[0]][:-1]
        result["truncated"] = True
    return result


# The warning beside a tool result that says the order system did not answer.
_UNAVAILABLE = WarningData(
    code=WarningCode.tool_unavailable, message="The order system did not answer; the reply says so."
)


def render_email(template: str, order: OrderView, extra: dict[str, Any]) -> tuple[str, str]:
    """Subject and body from a fixed template: the model supplies no text of the email."""
    if template == "refund_status" and "refund" in extra:
        refund = RefundView.model_validate(extra["refund"])
        return (
            f"Your refund {refund.refund_id} for order {order.order_id}",
            f"Refund {refund.refund_id} of {refund.amount.currency} {refund.amount.amount} "
            f"for order {order.order_id} is {refund.status}"
            + (f" ({refund.stage})" if refund.stage else "")
            + ".",
        )
    if template == "return_instructions":
        return (
            f"Returning order {order.order_id}",
            f"To return order {order.order_id}, reply to this email within the return window "
            "and we will send you a prepaid label.",
        )
    lines = [f"Order {order.order_id} is {order.status}."]
    if order.shipped_on:
        lines.append(f"Shipped on {order.shipped_on}.")
    if order.eta:
        lines.append(f"Expected to arrive on {order.eta}.")
    if order.delivered_on:
        lines.append(f"Arrived on {order.delivered_on}.")
    return f"Your Northwind order {order.order_id}: status summary", " ".join(lines)


@dataclass(frozen=True)
class _ToolRun:
    """A pending tool call about to run, with what its attempt needs to know."""

    turn: TurnFacts
    call: ToolCallRow
    tenant: TenantConfig  # the turn's tenant's configuration, as the call started
    label: str  # what the user sees while it runs

    @property
    def allowed(self) -> bool:
        """The tenant offers this tool."""
        return self.tenant.offered(self.call.name)

    def shown(self, phase: Literal["start", "end"], status: str | None = None) -> _Event:
        """The call starting or ending, as the stream shows it."""
        call = self.call
        return tool_shown(call.provider_call_id, call.name, phase, self.label, status)


_Event = tuple[EventType, BaseModel]


def _label(name: str) -> str:
    """What the user sees while the tool runs."""
    if name == RUN_SKILL:
        return RUN_SKILL_LABEL
    spec = TOOLS.get(name)
    return spec.label if spec else "Working on it…"


def _outcome(call: ToolCallRow) -> ToolOutcome:
    ok = call.status == ToolCallStatus.ok
    action_id = (call.result or {}).get("action_id") if ok else None
    return ToolOutcome(call.id, ToolCallStatus(call.status), action_id)


def tool_shown(
    call_id: str,
    name: str,
    phase: Literal["start", "end"],
    label: str,
    status: str | None = None,
) -> _Event:
    """A tool call starting or ending, as the turn's stream shows it (`tool`)."""
    return EventType.tool, ToolData(
        call_id=call_id, name=name, phase=phase, label=label, status=status
    )


async def tool_event(
    db: Db,
    turn_id: str,
    call_id: str,
    name: str,
    phase: Literal["start", "end"],
    label: str,
    status: str | None = None,
) -> None:
    """Show a tool call starting or ending on the turn's stream (the caller commits)."""
    await append_events(
        db, turn_id=turn_id, events=[tool_shown(call_id, name, phase, label, status)]
    )


class ToolActivities:
    def __init__(
        self,
        *,
        sessions: Database,
        northwind: NorthwindClient,
        settings: Settings,
        mcp: McpTools | None = None,
        skills: SkillTools | None = None,
    ) -> None:
        self._sessions = sessions
        # Starts a case's workflow once its row is committed (None: the case waits unrun).
        self._handoffs: HandoffActivities | None = None
        self._northwind = northwind
        self._settings = settings
        self._mcp = mcp or McpTools(sessions=sessions, allowed=settings.mcp_allowlist)
        self._skills = skills or SkillTools(
            sessions=sessions, northwind=northwind, settings=settings
        )
        self._result_sets = ResultSetTools(sessions=sessions, northwind=northwind)

    def attach(self, handoffs: HandoffActivities) -> None:
        """What starts the workflow of a case a `handoff_to_human` call opens."""
        self._handoffs = handoffs

    @activity.defn(name="execute_tool")
    async def execute_tool(self, inp: ExecuteToolInput) -> ToolOutcome:
        started = await self._begin_call(inp)
        if isinstance(started, ToolOutcome):
            return started
        result = await self._call_result(inp, started)
        return await self._store_result(inp, started, result)

    async def _begin_call(self, inp: ExecuteToolInput) -> _ToolRun | ToolOutcome:
        """Enter `executing_tools` and show the call starting, in one statement and one
        commit, so the stream shows both before the call runs; a call that an earlier
        attempt finished is answered from the store."""
        async with connect(self._sessions) as conn, conn.transaction():
            found = await steps.lock_for_tool_call(conn, turn_id=inp.turn_id, call_id=inp.call_id)
            if found.call.status != ToolCallStatus.pending:  # an attempt died reporting it
                return _outcome(found.call)
            run = _ToolRun(found.turn, found.call, found.tenant, _label(found.call.name))
            start = [run.shown("start")] if activity.info().attempt == 1 else []
            await turns.advance_locked(conn, found.turn, to=TurnState.executing_tools, then=start)
        return run

    async def _call_result(self, inp: ExecuteToolInput, run: _ToolRun) -> dict[str, Any]:
        """The result the model reads: the tool's answer, or a structured error for a refusal,
        bad arguments, a tool the tenant does not offer or a backend that failed. A backend
        outage is retried by Temporal while attempts remain."""
        if inp.refuse is not None:
            return ToolError("refused", inp.refuse).as_result()
        call = run.call
        if is_mcp_name(call.name):  # a tenant's tool server: activities/mcp.py
            if not run.allowed:
                return ToolError(
                    "not_allowed", f"{call.name} is not enabled for this tenant"
                ).as_result()
            async with heartbeating():
                return _limited(
                    await self._mcp.run(
                        run.turn, call, run.tenant, ttl_s=inp.confirmation_timeout_s
                    )
                )
        if call.name == RUN_SKILL:  # a skill in a sandbox of its own: activities/skills.py
            return await self._run_skill(run)
        parsed = parse_arguments(call.name, call.arguments)
        if not isinstance(parsed, ToolError) and not run.allowed:
            parsed = ToolError("not_allowed", f"{call.name} is not enabled for this tenant")
        if isinstance(parsed, ToolError):
            return parsed.as_result()
        try:
            async with heartbeating():
                return _limited(await self._run(run.turn, call, parsed, inp))
        except BackendNotFound:
            return ToolError("not_found", "no such order on this customer's account").as_result()
        except BackendUnavailable as exc:
            if not exc.breaker_open and activity.info().attempt < TOOL_ATTEMPTS:
                raise ApplicationError(str(exc), type="backend_unavailable") from exc
            return ToolError("unavailable", str(exc), retryable=True).as_result()
        except (BackendError, ValidationError) as exc:
            return ToolError("bad_response", type(exc).__name__).as_result()

    async def _run_skill(self, run: _ToolRun) -> dict[str, Any]:
        if not run.allowed:
            return ToolError("not_allowed", "skills are not enabled for this tenant").as_result()
        async with heartbeating():
            return _limited(await self._skills.run(run.turn, run.call, run.tenant))

    async def _store_result(
        self, inp: ExecuteToolInput, run: _ToolRun, result: dict[str, Any]
    ) -> ToolOutcome:
        """Store the result and show the call ending, in one commit; the first attempt to get
        here wins (a later one reads what it stored)."""
        status = ToolCallStatus.error if "error" in result else ToolCallStatus.ok
        if inp.refuse is not None:
            status = ToolCallStatus.refused
        async with connect(self._sessions) as conn, conn.transaction():
            stored = await store_tool_result(
                conn,
                call=run.call,
                status=status,
                result=result,
                attempts=activity.info().attempt,
                referent=_referent(run, result),
            )
            if stored is None:  # an earlier attempt stored its result first
                stored = await steps.get_tool_call(conn, call_id=run.call.id)
                assert stored is not None
                return _outcome(stored)
            await append_events(conn, turn_id=run.turn.id, events=_ending(run, result, status))
        return _outcome(stored)

    async def _run(
        self, turn: TurnFacts, call: ToolCallRow, args: BaseModel, inp: ExecuteToolInput
    ) -> dict[str, Any]:
        nw, tenant, customer = self._northwind, turn.tenant_id, turn.user_id
        name = call.name
        if name == "list_open_orders":
            orders = await nw.list_orders(tenant, customer, open_only=True)
            return {"orders": [OrderView.model_validate(o).model_dump() for o in orders]}
        order_id = str(getattr(args, "order_id", ""))
        if name == "get_order":
            return OrderView.model_validate(
                await nw.order_resource(tenant, customer, order_id)
            ).model_dump()
        if name == "get_refund":
            return RefundView.model_validate(
                await nw.order_resource(tenant, customer, order_id, "/refund")
            ).model_dump()
        if name == "check_return_eligibility":
            return ReturnView.model_validate(
                await nw.order_resource(tenant, customer, order_id, "/return-eligibility")
            ).model_dump()
        if name == "propose_email":
            assert isinstance(args, ProposeEmailArgs)
            return await self._propose_email(turn, call, args, inp.confirmation_timeout_s)
        if name == DELEGATE_RETURNS:  # the turn then starts the specialist
            return await delegate_returns(nw, turn, order_id)
        if name == "handoff_to_human":
            return await self._handoff(turn, call, str(getattr(args, "reason", "")))
        if name in RESULT_SET_TOOLS:
            return await self._result_sets.run(turn, call, args, inp.confirmation_timeout_s)
        raise AssertionError(f"no executor for {name}")  # the registry and this list agree

    async def _propose_email(
        self, turn: TurnFacts, call: ToolCallRow, args: ProposeEmailArgs, ttl_s: float
    ) -> dict[str, Any]:
        nw = self._northwind
        order = OrderView.model_validate(
            await nw.order_resource(turn.tenant_id, turn.user_id, args.order_id)
        )
        recipient = verified_address(await nw.get_customer(turn.tenant_id, turn.user_id))
        if recipient is None:
            return NO_VERIFIED_ADDRESS.as_result()
        extra: dict[str, Any] = {}
        if args.template == "refund_status":
            extra["refund"] = await nw.order_resource(
                turn.tenant_id, turn.user_id, args.order_id, "/refund"
            )
        subject, body = render_email(args.template, order, extra)
        action = await propose_send_email(
            self._sessions,
            turn=turn,
            call=call,
            args={
                "order_id": args.order_id,
                "template": args.template,
                "to": recipient,
                "subject": subject,
                "body": body,
            },
            summary=f"Email “{subject}” to {mask_email(recipient)}",
            ttl_s=ttl_s,
        )
        return {
            "action_id": action.id,
            "status": "pending_confirmation",
            "order_id": args.order_id,
            "recipient_masked": action.recipient_masked,
            "subject": subject,
        }

    async def _handoff(self, turn: TurnFacts, call: ToolCallRow, reason: str) -> dict[str, Any]:
        """The case opens (committed), then its workflow starts: a retried attempt finds the
        case and starts the run again, which attaches to the one already running."""
        async with self._sessions() as db:
            case, opened = await handoff_store.open_handoff(
                db,
                # Derived from the call: a retried attempt finds the hand-off, not a second one.
                handoff_id=handoff_id_for_call(tool_call_id=call.id),
                session_id=turn.session_id,
                turn_id=turn.id,
                reason=reason,
            )
            await db.commit()
        if opened:
            HANDOFFS_OPENED.labels("tool").inc()
        if self._handoffs is not None:
            await self._handoffs.start_case(case)
        return {"handoff_id": case.id, "status": case.status}


def _referent(run: _ToolRun, result: dict[str, Any]) -> tuple[str, Slot] | None:
    """A successful lookup of one order makes it the conversation's active order."""
    call = run.call
    if "error" in result:
        return None
    if call.name == "list_open_orders" and len(result.get("orders", [])) == 1:
        order_id = str(result["orders"][0]["order_id"])
    elif isinstance(call.arguments, dict) and "order_id" in call.arguments:
        order_id = str(call.arguments["order_id"])
    else:
        return None
    return ACTIVE_ORDER, Slot(order_id, f"tool:{call.name}", run.turn.user_seq)


def _ending(run: _ToolRun, result: dict[str, Any], status: ToolCallStatus) -> list[_Event]:
    """What the stream shows as the call ends: a skill's files or failure, the order system's
    outage, then the call ending."""
    events = skill_events(result) if run.call.name == RUN_SKILL else []
    if result.get("error", {}).get("code") == "unavailable":
        events.append((EventType.warning, _UNAVAILABLE))
    return [*events, run.shown("end", status)]
