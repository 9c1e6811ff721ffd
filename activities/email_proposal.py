"""An email the assistant proposes, shared by the order tools and the result-set tools so both
ask the same way: only to the customer's verified address, shown masked, and through a
`send_email` action that waits for the customer's yes."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Protocol

from parley.ids import action_id_for_call
from parley.store import actions
from parley.store.actions import ActionRow, ProposingTurn
from parley.store.db import Database, connect
from parley.tools import ToolError

# What the tool answers when there is nowhere safe to send the email.
NO_VERIFIED_ADDRESS = ToolError("no_verified_address", "there is no verified address on file")


class ProposingCall(Protocol):
    """The tool call that proposes (its row, of whichever kind): its id names the action."""

    @property
    def id(self) -> str: ...


def mask_email(address: str) -> str:
    local, _, domain = address.partition("@")
    return f"{local[:1]}***@{domain}"


def verified_address(customer: Mapping[str, Any]) -> str | None:
    """The customer's email if the shop has verified it; an unverified one is never written to."""
    if not customer.get("email") or not customer.get("email_verified"):
        return None
    return str(customer["email"])


async def propose_send_email(
    sessions: Database,
    *,
    turn: ProposingTurn,
    call: ProposingCall,
    args: dict[str, Any],
    summary: str,
    ttl_s: float,
) -> ActionRow:
    """The pending `send_email` action for `call`, committed (one statement, autocommit);
    `args["to"]` is the recipient."""
    async with connect(sessions) as conn:
        return await actions.create_action(
            conn,
            turn=turn,
            # Derived from the call, so a retried attempt finds the same action.
            action_id=action_id_for_call(tool_call_id=call.id),
            tool="send_email",
            args=args,
            summary=summary,
            recipient_masked=mask_email(args["to"]),
            ttl=timedelta(seconds=ttl_s),
        )
