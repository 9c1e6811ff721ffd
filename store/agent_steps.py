"""A specialist agent's steps in a turn (activities/specialist_agent.py): its model calls,
each with its tool calls' results, read back into its next request; and each tool call's
result, written once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parley.statuses import ToolCallStatus
from parley.store.db import Db
from parley.store.steps import CALL_COLUMNS, CallRow, add_tool_call
from parley.tools import args_hash


async def record_agent_result(
    db: Db,
    *,
    turn_id: str,
    model_call_id: str,
    position: int,
    requested: dict[str, Any],
    status: ToolCallStatus,
    result: dict[str, Any],
) -> None:
    """A specialist's tool call and its result, written once (a retried step finds it).
    Stored finished, never pending, and kept out of the session's transcript: the calls are
    the specialist's own, read back only into its next request (`agent_steps`)."""
    await add_tool_call(
        db,
        turn_id=turn_id,
        model_call_id=model_call_id,
        position=position,
        requested=requested,
        args_hash=args_hash(requested["name"], requested["arguments"]),
        status=status,
        result=result,
        attempts=1,
    )


async def agent_steps(
    db: Db, *, turn_id: str, first_step: int, before_step: int
) -> list[tuple[CallRow, dict[str, dict[str, Any]]]]:
    """The specialist's model calls of the turn in `[first_step, before_step)`, in order,
    each with its tool calls' results by provider call id."""
    params = {"turn_id": turn_id, "first": first_step, "before": before_step}
    calls = await db.rows(_AGENT_CALLS, params, CallRow)
    results: dict[str, dict[str, dict[str, Any]]] = {c.id: {} for c in calls}
    if calls:
        for row in await db.rows(_AGENT_RESULTS, {"ids": list(results)}, _AgentResult):
            results[row.model_call_id][row.provider_call_id] = row.result or {}
    return [(c, results[c.id]) for c in calls]


@dataclass(frozen=True)
class _AgentResult:
    model_call_id: str
    provider_call_id: str
    result: dict[str, Any] | None


_AGENT_CALLS = f"""
    SELECT {CALL_COLUMNS} FROM model_calls AS c
    WHERE c.turn_id = %(turn_id)s AND c.step >= %(first)s AND c.step < %(before)s
    ORDER BY c.step
"""
_AGENT_RESULTS = """
    SELECT model_call_id, provider_call_id, result FROM tool_calls
    WHERE model_call_id = ANY(%(ids)s)
"""
