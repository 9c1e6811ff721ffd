"""The confirmed write: `send_email` runs only for an action the user confirmed, re-checks
what was confirmed right before sending, and sends under the action's idempotency key; and
`expire_action`, for a confirmation nobody answered in time. Both serve the turn's wait and
a renewed card's (workflows/renewal.py).
"""

from __future__ import annotations

from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from parley.activities.heartbeat import heartbeating
from parley.activities.mcp import McpTools
from parley.activities.northwind import BackendError, BackendUnavailable, NorthwindClient
from parley.activities.result_sets import attachments_to_send
from parley.activities.specialist import create_confirmed_return
from parley.activities.tools import tool_event
from parley.contracts import TOOL_ATTEMPTS, ActionInput, ActionResult, TurnState
from parley.ids import email_idempotency_key
from parley.mcp import is_mcp_name
from parley.specialists import CREATE_RETURN
from parley.statuses import (
    SENDABLE_ACTION_STATUSES,
    SETTLED_ACTION_STATUSES,
    ActionStatus,
    ToolCallStatus,
    TurnErrorCode,
)
from parley.store import actions, turns
from parley.store.actions import ActionRow
from parley.store.db import Database, connect
from parley.tools import TOOLS, args_hash


class SendActivities:
    def __init__(
        self,
        *,
        sessions: Database,
        northwind: NorthwindClient,
        mcp: McpTools | None = None,
    ) -> None:
        self._sessions = sessions
        self._northwind = northwind
        self._mcp = mcp or McpTools(sessions=sessions)

    @activity.defn(name="send_email")
    async def send_email(self, inp: ActionInput) -> ActionResult:
        action = await self._begin_send(inp)
        if isinstance(action, ActionResult):
            return action
        refusal = await self._recheck(action)
        if refusal is not None:
            status, outcome = ActionStatus.failed, {"accepted": False, "error": refusal}
        elif is_mcp_name(action.tool):  # a confirmed write of a tenant's tool server
            status, outcome = await self._mcp.execute_confirmed(action)
        elif action.tool == CREATE_RETURN:  # a specialist's proposal (activities/specialist.py)
            status, outcome = await create_confirmed_return(self._northwind, action)
        else:
            status, outcome = await self._deliver(action)
        async with self._sessions() as db:
            updated = await actions.set_action_status(
                db,
                action_id=action.id,
                status=status,
                outcome=outcome,
                only_from=SENDABLE_ACTION_STATUSES,
            )
            shown = ToolCallStatus.ok if status == ActionStatus.executed else status
            name, label = _shown(action)
            await tool_event(db, inp.turn_id, action.id, name, "end", label, shown)
            await db.commit()
            return ActionResult(action.id, updated.status if updated else status)

    async def _begin_send(self, inp: ActionInput) -> ActionRow | ActionResult:
        """Check the user's confirmation, enter `executing_action`, show the send starting; an
        action an earlier attempt settled is answered from the store."""
        async with self._sessions() as db:
            found = await actions.action_to_send(db, action_id=inp.action_id)
            assert found is not None
            action = found.action
            if action.status in SETTLED_ACTION_STATUSES:
                return ActionResult(action.id, action.status)
            if action.status not in SENDABLE_ACTION_STATUSES:
                # Only a confirmation recorded by the user's own request lets this run.
                raise ApplicationError(
                    f"action {action.id} is {action.status}, not confirmed",
                    type="not_confirmed",
                    non_retryable=True,
                )
            if found.paused:
                # A paused tenant sends nothing: the turn ends with `agent_paused`.
                raise ApplicationError(
                    "the assistant is paused for this tenant",
                    type=TurnErrorCode.agent_paused,
                    non_retryable=True,
                )
            if action.renewed_from is None:
                # A renewed card's turn has ended: its send (workflows/renewal.py) shows on
                # the turn's stream without moving the turn again.
                await turns.advance_turn(db, turn_id=inp.turn_id, to=TurnState.executing_action)
                await db.commit()  # the stream shows the step before it runs
            if activity.info().attempt == 1:
                name, label = _shown(action)
                await tool_event(db, inp.turn_id, action.id, name, "start", label)
                await db.commit()
            return action

    async def _recheck(self, action: ActionRow) -> str | None:
        """Right before the send: the stored arguments are still the ones the user confirmed,
        and the recipient is still the customer's verified address. The refusal's code, or
        None when the send may go ahead."""
        if args_hash(action.tool, action.args) != action.args_hash:
            return "action_changed"
        if is_mcp_name(action.tool) or action.tool == CREATE_RETURN:
            # No recipient to re-check: the tool server (or the backend, for a return) checks
            # the user it is called as.
            return None
        try:
            customer = await self._northwind.get_customer(action.tenant_id, action.user_id)
        except BackendUnavailable as exc:
            if not exc.breaker_open and activity.info().attempt < TOOL_ATTEMPTS:
                raise ApplicationError(str(exc), type="backend_unavailable") from exc
            return "recipient_unverified"
        except BackendError:
            return "recipient_unverified"
        if not customer.get("email_verified") or customer.get("email") != action.args.get("to"):
            return "recipient_unverified"
        return None

    async def _deliver(self, action: ActionRow) -> tuple[ActionStatus, dict[str, Any]]:
        """Send the email under the action's idempotency key; the action's next status and
        its outcome. A send whose fate is unknown is looked up by key before it is judged."""
        key = email_idempotency_key(action_id=action.id)
        try:
            async with heartbeating():
                message_id = await self._northwind.send_email(
                    idempotency_key=key,
                    tenant=action.tenant_id,
                    to=action.args["to"],
                    subject=action.args["subject"],
                    body=action.args["body"],
                    attachments=attachments_to_send(action.args),
                )
            return ActionStatus.executed, {"accepted": True, "message_id": message_id}
        except BackendUnavailable as exc:
            if not exc.breaker_open and activity.info().attempt < TOOL_ATTEMPTS:
                raise ApplicationError(str(exc), type="backend_unavailable") from exc
            try:
                found = await self._northwind.email_by_key(key)
            except BackendError:
                found = None
            if found is not None:
                return ActionStatus.executed, {"accepted": True, "message_id": found}
            return ActionStatus.unknown, {"accepted": None}
        except BackendError as exc:
            return ActionStatus.failed, {"accepted": False, "error": type(exc).__name__}

    @activity.defn(name="expire_action")
    async def expire_action(self, inp: ActionInput) -> ActionResult:
        """The wait ran out: expire the action unless the user's answer is already stored
        (a signal that was lost on its way counts all the same)."""
        async with connect(self._sessions) as conn, conn.transaction():
            updated = await actions.set_action_status(
                conn,
                action_id=inp.action_id,
                status=ActionStatus.expired,
                only_from=(ActionStatus.pending,),
            )
            if updated is not None:
                await actions.announce_resolution(conn, action=updated)
                return ActionResult(inp.action_id, ActionStatus.expired)
            action = await actions.get_action(conn, action_id=inp.action_id)
            if action is None:  # erased with its session meanwhile: nothing is left to send
                return ActionResult(inp.action_id, ActionStatus.expired)
            return ActionResult(inp.action_id, action.status)


def _shown(action: ActionRow) -> tuple[str, str]:
    """The tool name and label the stream shows while the confirmed action runs."""
    if is_mcp_name(action.tool):
        return action.tool, "Doing what you confirmed…"
    if action.tool == CREATE_RETURN:
        return action.tool, TOOLS[CREATE_RETURN].label
    return "send_email", TOOLS["send_email"].label
