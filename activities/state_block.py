"""The state block of a step's prompt: facts the server knows about the turn (the customer,
the conversation's slots, the reference resolution, the turn's latest action)."""

from __future__ import annotations

from typing import Any

from parley.activities.result_sets import export_summary
from parley.mcp import is_mcp_name
from parley.resolver import PENDING_CLARIFICATION, Slot
from parley.store import actions, slots
from parley.store.db import Db
from parley.store.turns.reads import TurnFacts


async def state_block(
    db: Db,
    turn: TurnFacts,
    current: dict[str, Slot],
    *,
    user_name: str | None,
    has_actions: bool = True,
) -> dict[str, Any]:
    """The state block: facts the server knows, for the model to read (not obey).
    `user_name`: the customer's, as the build read it; `has_actions=False`: the caller knows
    the turn has proposed nothing yet (not read)."""
    action = await actions.latest_action(db, turn_id=turn.id) if has_actions else None
    return {
        "customer": {"name": user_name},
        "slots": slots.slots_view({k: v for k, v in current.items() if k != PENDING_CLARIFICATION}),
        "resolution": turn.resolution or {},
        "action": None
        if action is None
        else {
            "id": action.id,
            "tool": action.tool,
            "status": action.status,
            "order_id": action.args.get("order_id"),
            "summary": export_summary(action.args)
            or (action.summary if is_mcp_name(action.tool) else None)
            or f"the status summary for order {action.args.get('order_id')}",
            "recipient_masked": action.recipient_masked,
            "outcome": action.outcome,
        },
    }
