"""A turn's steps: its model calls (one row per step, its attempts counted and its outcome
written back) and the reads the steps make of the turn they work on.

A model call is read and written on a `Db` as a typed row (`CallRow`) that nobody
mutates: a write is a named function here, and hands back the row as written. The turn's
reads (`store.turns.reads.TurnRow`, `TurnFacts`) are typed too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from psycopg.types.json import Jsonb

from parley.contracts import TERMINAL_TURN_STATES, EventType
from parley.ids import new_id, tool_call_row_id
from parley.statuses import ToolCallStatus
from parley.store.costs import LEDGER_ROW
from parley.store.db import Db
from parley.store.turns.reads import TurnFacts, TurnRow
from parley.store.turns.tool_calls import ToolCallRow
from parley.tenancy import TenantConfig


@dataclass(frozen=True)
class CallRow:
    """A model call as stored."""

    id: str
    turn_id: str
    step: int
    provider: str
    model: str
    request: dict[str, Any]
    response_text: str | None
    response_tool_calls: list[dict[str, Any]] | None
    finish_reason: str | None
    attempts: int
    first_token_ms: float | None
    total_ms: float | None
    usage: dict[str, Any] | None


@dataclass(frozen=True)
class ForAttempt:
    """What an attempt at a model call starts from: the turn (locked), the call (None when
    it is missing), whether the turn's tenant is paused, and the tenant's own prices (its
    configuration's `prices`, which the call's cost is priced with: parley/costs.py)."""

    turn: TurnRow
    call: CallRow | None
    paused: bool
    prices: dict[str, Any] | None = None
    budgets: dict[str, Any] | None = None  # its configuration's `budgets`
    owner: tuple[str, str] | None = None  # the turn's tenant and user (`OWNER_COLUMNS`)


async def get_call(conn: Db, *, model_call_id: str) -> CallRow | None:
    """The model call as stored, or None."""
    return await conn.row(_CALL, {"id": model_call_id}, CallRow)


async def step_call(conn: Db, *, turn_id: str, step: int) -> CallRow | None:
    """The step's model call, if an earlier attempt stored it."""
    return await conn.row(_STEP_CALL, {"turn_id": turn_id, "step": step}, CallRow)


# One model call per turn step (migration 0002's `uq_model_calls_turn_step`).
_ONE_CALL_PER_STEP = "uq_model_calls_turn_step"


def step_taken(exc: BaseException) -> bool:
    """Whether a store error says the step's model call was already stored (by another
    build of the same step)."""
    diag = getattr(getattr(exc, "orig", None), "diag", None)
    return getattr(diag, "constraint_name", None) == _ONE_CALL_PER_STEP


async def get_tool_call(db: Db, *, call_id: str) -> ToolCallRow | None:
    """The tool call as it stands now, on a `Db` or in a session's transaction."""
    return await db.row(_TOOL_CALL, {"id": call_id}, ToolCallRow)


_TOOL_CALL = f"SELECT {ToolCallRow.COLUMNS} FROM tool_calls WHERE id = %(id)s"


@dataclass(frozen=True)
class ForToolCall:
    """What an attempt at a tool call starts from: its turn (locked), the call, and the
    configuration of the turn's tenant (the code defaults when the tenant is unknown)."""

    turn: TurnFacts
    call: ToolCallRow
    tenant: TenantConfig


async def lock_for_tool_call(conn: Db, *, turn_id: str, call_id: str) -> ForToolCall:
    """`ForToolCall`, the turn's row locked (in the caller's transaction): one round trip.
    LookupError for a call that is not the turn's."""
    found = await conn.made(_FOR_TOOL_CALL, {"turn": turn_id, "call": call_id}, _for_tool_call)
    if found is None:
        raise LookupError(call_id)
    return found


def _for_tool_call(*, tenant_config: dict[str, Any] | None, **columns: Any) -> ForToolCall:
    turn = TurnFacts(**{k[2:]: v for k, v in columns.items() if k.startswith("t_")})
    call = ToolCallRow(**{k: v for k, v in columns.items() if not k.startswith("t_")})
    return ForToolCall(turn, call, TenantConfig.model_validate(tenant_config or {}))


_FOR_TOOL_CALL = """
    SELECT t.id AS t_id, t.session_id AS t_session_id, t.tenant_id AS t_tenant_id,
        t.user_id AS t_user_id, t.user_message_id AS t_user_message_id,
        t.user_seq AS t_user_seq, t.state AS t_state,
        t.cancel_requested_at AS t_cancel_requested_at, t.resolution AS t_resolution,
        t.retry_of AS t_retry_of,
        c.id, c.turn_id, c.model_call_id, c.provider_call_id, c.name, c.arguments,
        c.args_hash, c.status, c.result, c.attempts, c.completed_at,
        n.config AS tenant_config
    FROM turns AS t
    JOIN tool_calls AS c ON c.id = %(call)s AND c.turn_id = t.id
    LEFT JOIN tenants AS n ON n.id = t.tenant_id
    WHERE t.id = %(turn)s
    FOR UPDATE OF t
"""


async def insert_call(
    conn: Db,
    *,
    turn_id: str,
    step: int,
    provider: str,
    model: str,
    request: dict[str, Any],
    response_text: str | None = None,
    finish_reason: str | None = None,
    resolution: dict[str, Any] | None = None,
) -> CallRow:
    """A new model call (a fresh id), written now (within the caller's transaction, if any),
    and the call as written. With a `finish_reason`, a call no model made: its answer is
    given. With a `resolution`, what the reference resolver made of the turn's message is
    written to the turn by the same statement (the build holds it in its `TurnFacts` till then)."""
    params = {
        "id": new_id("mc"),
        "turn_id": turn_id,
        "step": step,
        "provider": provider,
        "model": model,
        "request": Jsonb(request),
        "response_text": response_text,
        "finish_reason": finish_reason,
    }
    if resolution is None:
        written = await conn.row(_INSERT_CALL, params, CallRow)
    else:
        params["resolution"] = Jsonb(resolution)
        written = await conn.row(_INSERT_CALL_RESOLVED, params, CallRow)
    assert written is not None
    return written


async def lock_for_attempt(conn: Db, *, turn_id: str, model_call_id: str) -> ForAttempt:
    """The turn locked, its model call, and whether its tenant is paused: one round trip
    (in the caller's transaction). LookupError for an unknown turn."""
    found = await conn.made(_FOR_ATTEMPT, {"turn": turn_id, "call": model_call_id}, _for_attempt)
    if found is None:
        raise LookupError(turn_id)
    return found


def _for_attempt(
    *,
    paused: bool | None,
    prices: dict[str, Any] | None,
    budgets: dict[str, Any] | None,
    owner_tenant_id: str,
    owner_user_id: str,
    **columns: Any,
) -> ForAttempt:
    turn = TurnRow.from_columns(columns)
    call = {k: v for k, v in columns.items() if not k.startswith("t_")}
    found = CallRow(**call) if call["id"] is not None else None
    owner = (owner_tenant_id, owner_user_id)
    return ForAttempt(turn, found, bool(paused), prices, budgets, owner)


OWNER_COLUMNS = "t.tenant_id AS owner_tenant_id, t.user_id AS owner_user_id"
CALL_COLUMNS = """c.id, c.turn_id, c.step, c.provider, c.model, c.request, c.response_text,
    c.response_tool_calls, c.finish_reason, c.attempts, c.first_token_ms, c.total_ms, c.usage"""
_FOR_ATTEMPT = f"""
    SELECT {TurnRow.COLUMNS}, {CALL_COLUMNS}, n.paused, n.config -> 'prices' AS prices,
        n.config -> 'budgets' AS budgets, {OWNER_COLUMNS}
    FROM turns AS t
    LEFT JOIN model_calls AS c ON c.id = %(call)s
    LEFT JOIN tenants AS n ON n.id = t.tenant_id
    WHERE t.id = %(turn)s
    FOR UPDATE OF t
"""
_CALL = f"SELECT {CALL_COLUMNS} FROM model_calls AS c WHERE c.id = %(id)s"
_STEP_CALL = (
    f"SELECT {CALL_COLUMNS} FROM model_calls AS c WHERE c.turn_id = %(turn_id)s"
    " AND c.step = %(step)s"
)
_INSERT_CALL = f"""
    INSERT INTO model_calls AS c
        (id, turn_id, step, provider, model, request, response_text, finish_reason)
    VALUES (%(id)s, %(turn_id)s, %(step)s, %(provider)s, %(model)s, %(request)s,
        %(response_text)s, %(finish_reason)s)
    RETURNING {CALL_COLUMNS}
"""
_INSERT_CALL_RESOLVED = f"""
    WITH resolved AS (
        UPDATE turns SET resolution = %(resolution)s WHERE id = %(turn_id)s
    )
    INSERT INTO model_calls AS c
        (id, turn_id, step, provider, model, request, response_text, finish_reason)
    VALUES (%(id)s, %(turn_id)s, %(step)s, %(provider)s, %(model)s, %(request)s,
        %(response_text)s, %(finish_reason)s)
    RETURNING {CALL_COLUMNS}
"""


async def count_attempt(conn: Db, call: CallRow) -> CallRow:
    """One more attempt at the call; the call as it now stands."""
    await conn.run(_COUNT_ATTEMPT, {"id": call.id})
    return replace(call, attempts=call.attempts + 1)


_COUNT_ATTEMPT = "UPDATE model_calls SET attempts = attempts + 1 WHERE id = %(id)s"


async def record_outcome(conn: Db, call: CallRow, **outcome: Any) -> CallRow:
    """Write the call's outcome (`answered`'s arguments; without reading the row again) and
    return the call as written."""
    written = answered(call, **outcome)
    await write_outcome(conn, written)
    return written


async def write_outcome(conn: Db, written: CallRow, *, bill: dict[str, Any] | None = None) -> bool:
    """Write the call's outcome as `written` holds it (`answered`), and with `bill` (the
    ledger's `store.costs.ledger_params`) its ledger row in the same statement; whether that
    wrote the row (False: written already, or no `bill`)."""
    if bill is None:
        await conn.run(_RECORD_OUTCOME, outcome_params(written))
        return False
    return bool(await conn.value(_RECORD_BILLED_OUTCOME, {**outcome_params(written), **bill}))


def answered(
    call: CallRow,
    *,
    text: str,
    tool_calls: list[dict[str, Any]] | None,
    finish_reason: str,
    usage: dict[str, Any] | None,
    first_token_ms: float | None,
    total_ms: float,
    answered_by: tuple[str, str] | None = None,
) -> CallRow:
    """The call as its outcome will be written. `answered_by`: the provider and model that
    answered, when not the call's own (a fallback)."""
    provider, model = answered_by or (call.provider, call.model)
    return replace(
        call,
        provider=provider,
        model=model,
        response_text=text,
        response_tool_calls=tool_calls,
        finish_reason=finish_reason,
        usage=usage,
        first_token_ms=first_token_ms,
        total_ms=total_ms,
    )


def outcome_params(written: CallRow) -> dict[str, Any]:
    """The parameters of a statement that writes the call's outcome (`_RECORD_OUTCOME`'s)."""
    tool_calls, usage = written.response_tool_calls, written.usage
    return {
        "id": written.id,
        "provider": written.provider,
        "model": written.model,
        "text": written.response_text,
        "tool_calls": None if tool_calls is None else Jsonb(tool_calls),
        "finish_reason": written.finish_reason,
        "usage": None if usage is None else Jsonb(usage),
        "first_token_ms": written.first_token_ms,
        "total_ms": written.total_ms,
    }


# The UPDATE of a model call that writes its outcome, up to its WHERE (parameters
# `outcome_params`): `_RECORD_OUTCOME` here, and store/turns/attempts.py
# `record_tool_requests` (a reply asking for tools, with its message and calls).
OUTCOME_WRITTEN = """UPDATE model_calls SET provider = %(provider)s, model = %(model)s,
            response_text = %(text)s, response_tool_calls = %(tool_calls)s,
            finish_reason = %(finish_reason)s, usage = %(usage)s,
            first_token_ms = %(first_token_ms)s, total_ms = %(total_ms)s"""
_RECORD_OUTCOME = f"""
    {OUTCOME_WRITTEN}
    WHERE id = %(id)s
"""
_RECORD_BILLED_OUTCOME = f"""
    WITH outcome AS ({OUTCOME_WRITTEN} WHERE id = %(id)s), billed AS ({LEDGER_ROW})
    SELECT count(*) FROM billed
"""


async def lock_with_call(conn: Db, *, turn_id: str, model_call_id: str) -> tuple[TurnRow, CallRow]:
    """The turn's row, locked (`FOR UPDATE` of the turn only), and the model call, in the
    caller's transaction."""
    found = await lock_for_attempt(conn, turn_id=turn_id, model_call_id=model_call_id)
    assert found.call is not None, f"model call {model_call_id} is missing"
    return found.turn, found.call


async def response_texts(conn: Db, *, turn_id: str) -> list[str]:
    """Every text the turn's model calls produced, in step order (empty ones left out)."""
    found = await conn.value(_RESPONSE_TEXTS, {"turn_id": turn_id})
    return list(found or [])


_RESPONSE_TEXTS = """
    SELECT array_agg(response_text ORDER BY step) FROM model_calls
    WHERE turn_id = %(turn_id)s AND response_text <> ''
"""


async def first_step_tools(db: Db, *, turn_id: str) -> list[dict[str, Any]] | None:
    """The tools the turn's first model call was offered (None before it is stored)."""
    found = await db.value(_FIRST_STEP_TOOLS, {"turn_id": turn_id})
    return None if found is None else list(found)


_FIRST_STEP_TOOLS = (
    "SELECT request -> 'tools' FROM model_calls WHERE turn_id = %(turn_id)s AND step = 0"
)


async def last_stream_event(conn: Db, *, turn_id: str, message_id: str) -> str | None:
    """The type of the message's latest `delta` or `reset` event, if any."""
    found = await conn.value(_LAST_STREAM_EVENT, {"turn_id": turn_id, "message_id": message_id})
    return str(found) if found is not None else None


_LAST_STREAM_EVENT = f"""
    SELECT type FROM turn_events
    WHERE turn_id = %(turn_id)s AND type IN ('{EventType.delta.value}', '{EventType.reset.value}')
        AND data ->> 'message_id' = %(message_id)s
    ORDER BY id DESC LIMIT 1
"""


async def question(conn: Db, *, turn_id: str) -> str | None:
    """The text of the turn's user message."""
    found = await conn.value(_QUESTION, {"turn_id": turn_id})
    return str(found) if found is not None else None


_QUESTION = (
    "SELECT m.text FROM messages AS m JOIN turns AS t ON t.user_message_id = m.id"
    " WHERE t.id = %(turn_id)s"
)


@dataclass(frozen=True)
class AnswerFacts:
    """What the turn's tail screens and makes follow-up suggestions from: whether the turn
    is still open (not ended, no Stop recorded), the tools it ran successfully, in call
    order, the user's message (empty when missing), and every text the turn's model calls
    produced, in step order (empty ones left out)."""

    still_open: bool
    tools: list[str]
    asked: str
    texts: list[str]


async def answer_facts(conn: Db, *, turn_id: str) -> AnswerFacts:
    """`AnswerFacts`, as the turn stands now: one round trip, no lock (the suggestions'
    append checks again that the turn is open: `store.events.append_while_open`)."""
    found = await conn.made(_ANSWER_FACTS, {"turn_id": turn_id}, _answer_facts)
    assert found is not None, f"turn {turn_id} is missing"
    return found


def _answer_facts(
    *,
    state: str,
    cancel_requested_at: Any,
    tools: list[str] | None,
    asked: str | None,
    texts: list[str] | None,
) -> AnswerFacts:
    still_open = state not in _TERMINAL and cancel_requested_at is None
    return AnswerFacts(still_open, list(tools or []), asked or "", list(texts or []))


_TERMINAL = frozenset(state.value for state in TERMINAL_TURN_STATES)
_ANSWER_FACTS = f"""
    SELECT t.state, t.cancel_requested_at, (
        SELECT array_agg(c.name ORDER BY c.created_at) FROM tool_calls AS c
        WHERE c.turn_id = t.id AND c.status = '{ToolCallStatus.ok.value}'
    ) AS tools, (SELECT m.text FROM messages AS m WHERE m.id = t.user_message_id) AS asked, (
        SELECT array_agg(mc.response_text ORDER BY mc.step) FROM model_calls AS mc
        WHERE mc.turn_id = t.id AND mc.response_text <> ''
    ) AS texts
    FROM turns AS t WHERE t.id = %(turn_id)s
"""


async def add_tool_call(
    db: Db,
    *,
    turn_id: str,
    model_call_id: str,
    position: int,
    requested: dict[str, Any],
    args_hash: str,
    status: ToolCallStatus = ToolCallStatus.pending,
    result: dict[str, Any] | None = None,
    attempts: int = 0,
) -> None:
    """The row of the call at `position` of a model call's reply (as the model asked for it),
    added unless a retried step wrote it already; `pending` unless `status` says otherwise
    (with its result and attempts)."""
    params = {
        "id": tool_call_row_id(model_call_id=model_call_id, position=position),
        "turn_id": turn_id,
        "model_call_id": model_call_id,
        "provider_call_id": requested["id"],
        "name": requested["name"],
        "arguments": Jsonb(requested["arguments"]),
        "args_hash": args_hash,
        "status": ToolCallStatus(status).value,
        "result": None if result is None else Jsonb(result),
        "attempts": attempts,
    }
    await db.run(_ADD_TOOL_CALL, params)


_ADD_TOOL_CALL = """
    INSERT INTO tool_calls (id, turn_id, model_call_id, provider_call_id, name, arguments,
        args_hash, status, result, attempts)
    VALUES (%(id)s, %(turn_id)s, %(model_call_id)s, %(provider_call_id)s, %(name)s,
        %(arguments)s, %(args_hash)s, %(status)s, %(result)s, %(attempts)s)
    ON CONFLICT (id) DO NOTHING
"""
