"""A turn's steps: its model calls (one row per step, its attempts counted and its outcome
written back) and the reads the steps make of the turn they work on.

The rows returned are the session's own (`Turn`, `ModelCall`): the caller reads them, and
hands them back to the functions here to be changed, so every write stays in store/.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, select, text

from parley.contracts import TERMINAL_TURN_STATES, EventType
from parley.ids import new_id, tool_call_row_id
from parley.statuses import ToolCallStatus
from parley.tools import args_hash
from store.db import Db
from store.models import ModelCall, Tenant, ToolCall, Turn, TurnEvent


async def get_turn(db: Db, *, turn_id: str) -> Turn | None:
    """The turn (from the session's identity map when it holds it)."""
    return await db.get(Turn, turn_id)


async def get_call(db: Db, *, model_call_id: str) -> ModelCall | None:
    """The model call (from the session's identity map when it holds it)."""
    return await db.get(ModelCall, model_call_id)


async def get_tool_call(db: Db, *, call_id: str, lock: bool = False) -> ToolCall | None:
    """The tool call (from the session's identity map when it holds it, unless `lock`:
    then read again with its row locked)."""
    return await db.get(ToolCall, call_id, with_for_update=lock or None)


def add_call(
    db: Db,
    *,
    turn_id: str,
    step: int,
    provider: str,
    model: str,
    request: dict[str, Any],
    response_text: str | None = None,
    finish_reason: str | None = None,
) -> ModelCall:
    """A new model call (a fresh id), written at the caller's commit, or at once with
    `insert_call`. With a `finish_reason`, a call no model made: its answer is given."""
    call = ModelCall(
        id=new_id("mc"),
        turn_id=turn_id,
        step=step,
        provider=provider,
        model=model,
        request=request,
        response_text=response_text,
        finish_reason=finish_reason,
    )
    db.add(call)
    return call


async def insert_call(db: Db, **call: Any) -> ModelCall:
    """`add_call`, written now (within the caller's transaction)."""
    added = add_call(db, **call)
    await db.flush()
    return added


def record_resolution(turn: Turn, resolution: dict[str, Any]) -> None:
    """What the reference resolver made of the turn's message, written at the caller's
    commit."""
    turn.resolution = resolution


async def read_again(db: Db, turn: Turn) -> None:
    """The turn's row as it stands now (another transaction may have moved it)."""
    await db.refresh(turn)


async def lock_for_attempt(
    db: Db, *, turn_id: str, model_call_id: str
) -> tuple[Turn, ModelCall | None, bool | None]:
    """The turn locked, its model call, and whether its tenant is paused: one round trip.
    LookupError for an unknown turn."""
    row = (await db.execute(_FOR_ATTEMPT, {"turn": turn_id, "call": model_call_id})).one_or_none()
    if row is None:
        raise LookupError(turn_id)
    turn, call, paused = row
    return turn, call, paused


_FOR_ATTEMPT = (
    select(Turn, ModelCall, Tenant.paused)
    .select_from(Turn)
    .outerjoin(ModelCall, ModelCall.id == bindparam("call"))
    .outerjoin(Tenant, Tenant.id == Turn.tenant_id)
    .where(Turn.id == bindparam("turn"))
    .with_for_update(of=Turn)
)


def count_attempt(call: ModelCall) -> None:
    """One more attempt at the call, written at the caller's commit."""
    call.attempts += 1


def record_outcome(
    db: Db,
    call: ModelCall,
    *,
    text: str,
    tool_calls: list[dict[str, Any]] | None,
    finish_reason: str,
    usage: dict[str, Any] | None,
    first_token_ms: float | None,
    total_ms: float,
    answered_by: tuple[str, str] | None = None,
) -> None:
    """The call's outcome, written at the caller's commit without reading the row again
    (`call` as `lock_for_attempt` read it, in an earlier session). `answered_by`: the
    provider and model that answered, when not the call's own (a fallback)."""
    db.add(call)
    call.response_text = text
    call.response_tool_calls = tool_calls
    call.finish_reason = finish_reason
    call.usage = usage
    call.first_token_ms = first_token_ms
    call.total_ms = total_ms
    if answered_by is not None:
        call.provider, call.model = answered_by


async def lock_with_call(db: Db, *, turn_id: str, model_call_id: str) -> tuple[Turn, ModelCall]:
    """The turn's row, locked (`FOR UPDATE` of the turn only), and the model call."""
    found = await db.execute(_WITH_CALL, {"turn": turn_id, "call": model_call_id})
    turn, call = found.one()
    assert call is not None
    return turn, call


_WITH_CALL = (
    select(Turn, ModelCall)
    .select_from(Turn)
    .outerjoin(ModelCall, ModelCall.id == bindparam("call"))
    .where(Turn.id == bindparam("turn"))
    .with_for_update(of=Turn)
)


async def response_texts(db: Db, *, turn_id: str) -> list[str]:
    """Every text the turn's model calls produced, in step order (empty ones left out)."""
    texts = await db.scalars(
        select(ModelCall.response_text).where(ModelCall.turn_id == turn_id).order_by(ModelCall.step)
    )
    return [t for t in texts if t]


async def first_step_tools(db: Db, *, turn_id: str) -> list[dict[str, Any]] | None:
    """The tools the turn's first model call was offered (None before it is stored)."""
    return await db.scalar(
        select(ModelCall.request["tools"]).where(ModelCall.turn_id == turn_id, ModelCall.step == 0)
    )


async def step_call(db: Db, *, turn_id: str, step: int) -> ModelCall | None:
    """The step's model call, if an earlier attempt stored it."""
    return await db.scalar(
        select(ModelCall).where(ModelCall.turn_id == turn_id, ModelCall.step == step)
    )


async def last_stream_event(db: Db, *, turn_id: str, message_id: str) -> str | None:
    """The type of the message's latest `delta` or `reset` event, if any."""
    return await db.scalar(
        select(TurnEvent.type)
        .where(
            TurnEvent.turn_id == turn_id,
            TurnEvent.type.in_([EventType.delta, EventType.reset]),
            TurnEvent.data["message_id"].astext == message_id,
        )
        .order_by(TurnEvent.id.desc())
        .limit(1)
    )


async def question(db: Db, *, turn_id: str) -> str | None:
    """The text of the turn's user message."""
    return await db.scalar(_QUESTION, {"turn_id": turn_id})


_QUESTION = text(
    "SELECT m.text FROM messages AS m JOIN turns AS t ON t.user_message_id = m.id"
    " WHERE t.id = :turn_id"
)


async def lock_with_tools_and_question(db: Db, *, turn_id: str) -> tuple[bool, list[str], str]:
    """Whether the turn is still open (not ended, no Stop recorded), its row locked; the
    tools it ran successfully, in call order; and the user's message (empty when missing):
    one round trip."""
    found = (await db.execute(_TURN_TOOLS_AND_QUESTION, {"turn_id": turn_id})).one()
    terminal = {state.value for state in TERMINAL_TURN_STATES}
    still_open = found.state not in terminal and found.cancel_requested_at is None
    return still_open, list(found.tools or []), found.asked or ""


# Plain SQL: it runs once a turn, and its ORM form cost more to prepare than to run.
_TURN_TOOLS_AND_QUESTION = text(
    """
    SELECT t.state, t.cancel_requested_at, (
        SELECT array_agg(c.name ORDER BY c.created_at) FROM tool_calls AS c
        WHERE c.turn_id = t.id AND c.status = :ok
    ) AS tools, (SELECT m.text FROM messages AS m WHERE m.id = t.user_message_id) AS asked
    FROM turns AS t WHERE t.id = :turn_id
    FOR UPDATE OF t
    """
).bindparams(ok=ToolCallStatus.ok.value)


async def add_tool_call(
    db: Db,
    *,
    turn_id: str,
    model_call_id: str,
    position: int,
    requested: dict[str, Any],
    args_hash: str,
    **outcome: Any,
) -> None:
    """The row of the call at `position` of a model call's reply (as the model asked for it),
    added unless a retried step wrote it already; `pending` unless `outcome` says otherwise
    (its status, result and attempts)."""
    row_id = tool_call_row_id(model_call_id=model_call_id, position=position)
    if await db.get(ToolCall, row_id) is not None:
        return
    db.add(
        ToolCall(
            id=row_id,
            turn_id=turn_id,
            model_call_id=model_call_id,
            provider_call_id=requested["id"],
            name=requested["name"],
            arguments=requested["arguments"],
            args_hash=args_hash,
            **{"status": ToolCallStatus.pending, **outcome},
        )
    )


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
    await db.flush()


async def agent_steps(
    db: Db, *, turn_id: str, first_step: int, before_step: int
) -> list[tuple[ModelCall, dict[str, dict[str, Any]]]]:
    """The specialist's model calls of the turn in `[first_step, before_step)`, in order,
    each with its tool calls' results by provider call id."""
    calls = list(
        await db.scalars(
            select(ModelCall)
            .where(
                ModelCall.turn_id == turn_id,
                ModelCall.step >= first_step,
                ModelCall.step < before_step,
            )
            .order_by(ModelCall.step)
        )
    )
    ids = [c.id for c in calls]
    rows = list(await db.scalars(select(ToolCall).where(ToolCall.model_call_id.in_(ids))))
    results: dict[str, dict[str, dict[str, Any]]] = {i: {} for i in ids}
    for row in rows:
        results[row.model_call_id][row.provider_call_id] = row.result or {}
    return [(c, results[c.id]) for c in calls]
