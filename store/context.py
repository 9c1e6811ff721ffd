"""What a context build reads, in one statement on the build's `Db`, at its start.

The turn as a typed row, its user message (`StoredMessage`), what the build asks of the
user, the session and the tenant (the user's name and membership, the session's tenant, the
tenant's configuration, whether it has knowledge documents), the step's model call if an
earlier attempt stored it, and the session's facts that every step asks (slots, the user's
consent to durable memory, the tool offer's facts, the rolling summary, the pinned facts and
the recent window), each a scalar subquery.

At step 0 the same statement moves the turn to `building_context` and announces it on the
stream (its `state` event appended and the doorbell rung: store/events.py's append), in
autocommit: the stream shows the step before the build's slow parts run, with no `BEGIN` and
`COMMIT` around it. The move is guarded in SQL (the turn in a state the table lets move
there, no Stop recorded, no call of the step stored yet), so a row that changed since a
caller looked cannot be moved by mistake; `store.turns.may_move` then says why it did not.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from parley.context import WindowMessage
from parley.contracts import TurnState
from parley.memory import PinnedFact
from parley.prompt import Memory, StoredSummary
from parley.resolver import PENDING_CLARIFICATION, Slot
from parley.statuses import ImportState
from parley.store import branches, result_sets
from parley.store import memory as memory_store
from parley.store.db import Db
from parley.store.events import EVENTS_INSERTED, RUNG, append_params, counter, state_event
from parley.store.sessions import StoredMessage
from parley.store.turns.reads import TurnFacts
from parley.tokens import TokenCounter


@dataclass(frozen=True)
class SessionFacts:
    """What the build asks of the session and its user in every step, read with the turn:
    the slots (the resolver's and the packing's), whether the user consented to durable
    memory (the hints), the tool offer's facts (store/result_sets.py `offer_facts`), and the
    session's memory as `memory_store.summary_and_facts` reads it."""

    slots: dict[str, Slot]
    consent: bool
    has_sets: bool
    recently_used: frozenset[str]
    summary: StoredSummary | None = None
    pinned: list[PinnedFact] = field(default_factory=list)
    # The recent window's rows (`memory_store.parse_window` reads them), from where this
    # summary lets it start (None: read by `window_messages`, with the summary it is given).
    window: list[list[Any]] | None = None
    # The tokens of the session's distinct text before the turn (parley/budget.py; None:
    # read by `remembered_tokens`).
    remembered: int | None = None
    # Whether an import of earlier messages into the session is still being indexed: recall
    # of its part is pending (store/imports.py).
    importing: bool = False
    # Actions executed on another version of the conversation (None: read by
    # `session_memory`).
    elsewhere: list[branches.Elsewhere] | None = None


@dataclass(frozen=True)
class BuildRows:
    """What `read_for_build` read: the rows the build's phases ask, as values."""

    turn: TurnFacts
    # The message the turn answers (None: missing, which only a damaged record shows).
    message: StoredMessage | None
    # The user's name for the state block; whether the user is a member of the turn's
    # tenant, and the session's tenant (knowledge is searched only for a member, in the
    # tenant's own session).
    user_name: str | None
    user_known: bool
    session_tenant: str | None
    # The tenant's stored configuration ({}: none, or an unknown tenant).
    tenant_config: dict[str, Any]
    # Whether the tenant has current knowledge documents (none: nothing to search).
    has_knowledge: bool
    # The step's model call an earlier attempt stored (its id and provider), or None.
    packed: tuple[str, str] | None
    # The turn moved to `building_context` by this read (step 0, and the first attempt).
    moved: bool
    facts: SessionFacts
    # The session's steer doorbell as the build read it (store/steering.py): the request
    # records it, and the window read with it holds every steer up to it.
    steer_seq: int | None = None


class TurnChanged(Exception):
    """The turn changed between the statement's snapshot and its move (a Stop recorded in
    between): the build fails this attempt, and the next one reads the turn as it is."""


async def read_for_build(
    conn: Db, turn_id: str, step: int, *, move: bool, recent_turns: int
) -> BuildRows:
    """The build's rows (see the module's docstring), in one statement; with `move`, the
    turn entering `building_context` in the same statement. LookupError for an unknown
    turn. `recent_turns`: how many turns before this one the tool offer looks back at."""
    params: dict[str, Any] = {"turn_id": turn_id, "step": step, "turns": recent_turns + 1}
    if move:
        params |= append_params(turn_id, [state_event(_TO)], moving_to=_TO)
    read = await conn.made(_READ_AND_MOVE if move else _READ, params, _build_rows)
    if read is None:
        raise LookupError(turn_id)
    return read


_TO = TurnState.building_context


def _build_rows(
    *,
    moved: int | None,
    notified: Any = None,
    user_name: str | None,
    user_known: bool,
    session_tenant: str | None,
    tenant_config: dict[str, Any] | None,
    has_knowledge: bool,
    call_id: str | None,
    call_provider: str | None,
    slots: list[list[Any]],
    consent: bool | None,
    has_sets: bool,
    used: list[str] | None,
    summary: list[Any] | None,
    facts: list[list[Any]],
    window: list[list[Any]],
    remembered: int,
    importing: bool,
    elsewhere: list[list[Any]] | None,
    steer_seq: int | None = None,
    **columns: Any,
) -> BuildRows:
    turn = TurnFacts(**{f.name: columns[f"t_{f.name}"] for f in fields(TurnFacts)})
    message = None
    if columns["m_id"] is not None:
        message = StoredMessage(**{f.name: columns[f"m_{f.name}"] for f in fields(StoredMessage)})
    if moved is not None:
        turn = replace(turn, state=_TO.value)
    stored_summary, pinned = memory_store.parse_summary_and_facts(summary, facts)
    return BuildRows(
        turn=turn,
        message=message,
        user_name=user_name,
        user_known=user_known,
        session_tenant=session_tenant,
        tenant_config=tenant_config or {},
        has_knowledge=has_knowledge,
        packed=None if call_id is None else (call_id, str(call_provider)),
        moved=moved is not None,
        steer_seq=steer_seq,
        facts=SessionFacts(
            slots={name: Slot(value, source, seq) for name, value, source, seq in slots},
            consent=bool(consent),
            has_sets=has_sets,
            recently_used=frozenset(used or ()),
            summary=stored_summary,
            pinned=pinned,
            window=window,
            remembered=remembered,
            importing=importing,
            elsewhere=branches.parse_elsewhere(elsewhere),
        ),
    )


_SUMMARY_THROUGH = """coalesce((SELECT through_seq FROM conversation_summaries
    WHERE session_id = t.session_id AND NOT off_path ORDER BY through_seq DESC LIMIT 1), 0)"""
_WINDOW_START = memory_store.WINDOW_START.format(
    summary_through=_SUMMARY_THROUGH, session="t.session_id"
)
_TURN = ", ".join(f"t.{f.name} AS t_{f.name}" for f in fields(TurnFacts))
_MESSAGE = ", ".join(f"m.{f.name} AS m_{f.name}" for f in fields(StoredMessage))
# The session's facts, each a subquery of the turn `t` (the same reads as the memory store's
# own: `memory_store.summary_and_facts`, `window_messages`, `result_sets.offer_facts`).
_FACTS = f"""
    (SELECT coalesce(json_agg(json_build_array(name, value, source, set_at_seq)), '[]')
        FROM slots WHERE session_id = t.session_id) AS slots,
    (SELECT consent FROM memory_consents
        WHERE tenant_id = t.tenant_id AND user_id = t.user_id) AS consent,
    {result_sets.HAS_SETS.format(session="t.session_id")} AS has_sets,
    {result_sets.RECENTLY_USED.format(session="t.session_id", user_seq="t.user_seq")} AS used,
    {memory_store.SUMMARY_OF_SESSION.format(session="t.session_id")} AS summary,
    {memory_store.FACTS_OF_SESSION.format(session="t.session_id")} AS facts,
    (SELECT coalesce(json_agg(json_build_array(w.seq, w.role, w.text, w.status, w.tool_calls,
        w.tool_call_id, w.token_count, w.token_counter, CAST(w.created_at AS date), w.turn_id,
        w.author_name)
        ORDER BY w.seq), '[]')
        FROM messages AS w
        WHERE w.session_id = t.session_id AND w.replaced_by IS NULL AND NOT w.off_path
            AND w.seq > {_WINDOW_START}
            AND NOT (t.retry_of IS NOT NULL AND w.turn_id = t.retry_of
                AND w.role = 'assistant' AND w.tool_calls IS NULL)) AS window,
    ({memory_store.REMEMBERED_SQL.format(session="t.session_id", before="t.user_seq")})
        AS remembered,
    EXISTS (SELECT 1 FROM imports WHERE session_id = t.session_id
        AND status <> '{ImportState.done.value}') AS importing,
    {branches.ELSEWHERE_OF_SESSION.format(session="t.session_id")} AS elsewhere
"""
_ROWS = f"""
    {_TURN}, {_MESSAGE},
    u.display_name AS user_name, u.id IS NOT NULL AS user_known, s.tenant_id AS session_tenant,
    s.steer_seq,
    n.config AS tenant_config,
    EXISTS (SELECT 1 FROM knowledge_documents
        WHERE tenant_id = t.tenant_id AND current) AS has_knowledge,
    c.id AS call_id, c.provider AS call_provider,
    {_FACTS}
    FROM turns AS t
    LEFT JOIN messages AS m ON m.id = t.user_message_id
    LEFT JOIN users AS u ON u.tenant_id = t.tenant_id AND u.id = t.user_id
    LEFT JOIN sessions AS s ON s.id = t.session_id
    LEFT JOIN tenants AS n ON n.id = t.tenant_id
    LEFT JOIN model_calls AS c ON c.turn_id = t.id AND c.step = %(step)s
    WHERE t.id = %(turn_id)s
"""
_READ = f"SELECT NULL AS moved, {_ROWS}"
# The move is `store.events`' append moving the turn, its counter guarded (the turn in a state
# the table lets move there, no Stop recorded, no call of the step stored yet). The SELECT
# reads the turn as the statement found it, before the move.
_MAY_BUILD = """WHERE turns.id = %(turn_id)s AND turns.state = ANY(%(from)s)
            AND turns.cancel_requested_at IS NULL
            AND NOT EXISTS (
                SELECT 1 FROM model_calls WHERE turn_id = %(turn_id)s AND step = %(step)s)"""
_READ_AND_MOVE = f"""
    WITH {counter(moving=True, rest=_MAY_BUILD)}, {EVENTS_INSERTED}
    SELECT (SELECT max(id) FROM inserted) AS moved, {RUNG} AS notified, {_ROWS}
"""


async def window_messages(
    db: Db,
    turn: TurnFacts,
    summary_through: int | None,
    counter: TokenCounter,
    read: SessionFacts | None = None,
) -> list[WindowMessage]:
    """The session's messages from where the window may start (after the summary, or wider
    when the summary lags), a retried turn's earlier answers hidden; `read`: as the build
    read them with its turn (None, or read for another summary: read here)."""
    if read is not None and read.window is not None:
        return memory_store.parse_window(read.window, counter)
    return await memory_store.window_messages(
        db,
        session_id=turn.session_id,
        summary_through=summary_through,
        hide_answers_of=turn.retry_of,
        counter=counter,
    )


async def remembered_tokens(db: Db, turn: TurnFacts, read: SessionFacts | None) -> int:
    """The tokens of the session's distinct text before the turn, as the build read them
    with its turn (or read here)."""
    if read is not None and read.remembered is not None:
        return read.remembered
    return await memory_store.remembered_tokens(
        db, session_id=turn.session_id, before_seq=turn.user_seq
    )


async def memory_read_again(db: Db, turn: TurnFacts, read: SessionFacts) -> SessionFacts:
    """`read` with the session's summary and pinned facts as they stand now (the build
    pinned some after reading them with the turn)."""
    summary, pinned = await memory_store.summary_and_facts(db, session_id=turn.session_id)
    window = read.window if _through(summary) == _through(read.summary) else None
    return replace(read, summary=summary, pinned=pinned, window=window)


def _through(summary: StoredSummary | None) -> int | None:
    return None if summary is None else summary.through_seq


async def session_memory(
    db: Db, turn: TurnFacts, current: dict[str, Slot], read: SessionFacts | None = None
) -> Memory:
    """The session's summary, pinned facts and slots (slots outrank summary lines); `read`:
    the summary and facts as the build read them (None: read here)."""
    if read is None:
        summary, facts = await memory_store.summary_and_facts(db, session_id=turn.session_id)
    else:
        summary, facts = read.summary, read.pinned
    if read is None or read.elsewhere is None:
        elsewhere = await branches.effects_elsewhere(db, session_id=turn.session_id)
    else:
        elsewhere = read.elsewhere
    return Memory(
        summary=summary,
        facts=facts,
        slots={
            k: (v.value, v.set_at_seq) for k, v in current.items() if k != PENDING_CLARIFICATION
        },
        elsewhere=[elsewhere_line(e) for e in elsewhere],
    )


def elsewhere_line(done: branches.Elsewhere) -> str:
    """An action of another version, as the prompt states it."""
    to = f" to {done.recipient_masked}" if done.recipient_masked else ""
    return f"{done.summary}{to}: {done.status} ({done.tool}, action {done.action_id})"
