"""The rows a context build reads in every phase, loaded together at its start.

The session's identity map keeps only referenced objects; the build holds these for its whole
run, so each later `db.get` of them (the tool offer, the state block, the knowledge check,
the tenant's configuration) is answered from memory instead of by another round trip. The
same statement reads the session's facts that every step asks (slots, the user's consent to
durable memory, the tool offer's facts, the rolling summary and the pinned facts), each a
scalar subquery. Also the session's recent messages, which the packing reads once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import (
    Select,
    bindparam,
    exists,
    func,
    literal_column,
    select,
)
from sqlalchemy.orm import aliased

from parley.context import WindowMessage
from parley.memory import PinnedFact
from parley.prompt import Memory, StoredSummary
from parley.resolver import PENDING_CLARIFICATION, Slot
from parley.tokens import TokenCounter
from store import memory as memory_store
from store.db import Db, session_conn
from store.models import (
    ChatSession,
    ConversationSummary,
    MemoryConsent,
    Message,
    ModelCall,
    ResultSet,
    SessionSlot,
    Tenant,
    ToolCall,
    Turn,
    User,
)
from store.rows import typed_row
from store.steps import CallRow, step_call
from store.turn_rows import TurnFacts


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
    # The recent window's rows as `memory_store.window_column` reads them, from where this
    # summary lets it start (None: read by `window_messages`, with the summary it is given).
    window: list[list[Any]] | None = None


async def turn_with_rows(
    db: Db, turn_id: str, step: int, *, lock: bool, recent_turns: int
) -> tuple[TurnFacts, Sequence[Any] | None, SessionFacts]:
    """The turn as a typed row (its row locked, with `lock`) and the rows every phase reads:
    the turn's, its user message, user, session and tenant, and the step's model call if an
    earlier attempt stored it, with the session's facts, all in one statement. The rows are
    for the caller to hold, not to read (the session's identity map answers later `db.get`s
    from them; `packed_before` reads the call); they are None when the message is missing
    (each later `db.get` then reads on its own). `recent_turns`: how many turns before
    this one the tool offer looks back at."""
    params = {"turn_id": turn_id, "step": step, "turns": recent_turns + 1}
    found = (await db.execute(_LOCKED if lock else _UNLOCKED, params)).one_or_none()
    if found is None:
        raise LookupError(turn_id)
    turn, message, user, session, tenant, call, slots, consent, has_sets, used, *_ = found
    summary, pinned = memory_store.parse_summary_and_facts(found.summary, found.facts)
    facts = SessionFacts(
        slots={name: Slot(value, source, seq) for name, value, source, seq in slots},
        consent=bool(consent),
        has_sets=bool(has_sets),
        recently_used=frozenset(used or ()),
        summary=summary,
        pinned=pinned,
        window=found.window,
    )
    held = [turn, message, user, session, tenant, call]
    return typed_row(TurnFacts, turn), (held if message is not None else None), facts


def _statement(*, lock: bool) -> Select[Any]:
    """The statement `turn_with_rows` sends, built once (bound by name: turn id, step, and
    the tool offer's look-back in turns)."""
    user = (User.tenant_id == Turn.tenant_id) & (User.id == Turn.user_id)
    call = (ModelCall.turn_id == Turn.id) & (ModelCall.step == bindparam("step"))
    slots = (
        select(
            func.coalesce(
                func.json_agg(
                    func.json_build_array(
                        SessionSlot.name,
                        SessionSlot.value,
                        SessionSlot.source,
                        SessionSlot.set_at_seq,
                    )
                ),
                literal_column("'[]'::json"),
            )
        )
        .where(SessionSlot.session_id == Turn.session_id)
        .scalar_subquery()
    )
    consent = (
        select(MemoryConsent.consent)
        .where(MemoryConsent.tenant_id == Turn.tenant_id, MemoryConsent.user_id == Turn.user_id)
        .scalar_subquery()
    )
    has_sets = exists().where(ResultSet.session_id == Turn.session_id)
    recent = aliased(Turn)
    recent_ids = (
        select(recent.id)
        .where(recent.session_id == Turn.session_id, recent.user_seq <= Turn.user_seq)
        .order_by(recent.user_seq.desc())
        .limit(bindparam("turns"))
        .correlate(Turn)
    )
    used = (
        select(func.array_agg(ToolCall.name.distinct()))
        .where(ToolCall.turn_id.in_(recent_ids))
        .scalar_subquery()
    )
    memory = memory_store.summary_and_facts_columns(Turn.session_id)
    window = _window()
    statement = (
        select(
            *(Turn, Message, User, ChatSession, Tenant, ModelCall),
            *(slots, consent, has_sets, used, *memory, window),
        )
        .select_from(Turn)
        .outerjoin(Message, Message.id == Turn.user_message_id)
        .outerjoin(User, user)
        .outerjoin(ChatSession, ChatSession.id == Turn.session_id)
        .outerjoin(Tenant, Tenant.id == Turn.tenant_id)
        .outerjoin(ModelCall, call)
        .where(Turn.id == bindparam("turn_id"))
    )
    return statement.with_for_update(of=Turn) if lock else statement


def _window() -> Any:
    """The recent window as a column of `turn_with_rows`' statement: from where the turn's
    session's latest summary lets it start, a retried turn's earlier answer hidden."""
    through = (
        select(ConversationSummary.through_seq)
        .where(ConversationSummary.session_id == Turn.session_id)
        .order_by(ConversationSummary.through_seq.desc())
        .limit(1)
        .correlate(Turn)  # read inside the window's subquery, of this statement's turn
        .scalar_subquery()
    )
    return memory_store.window_column(Turn.session_id, func.coalesce(through, 0), Turn.retry_of)


_LOCKED = _statement(lock=True)
_UNLOCKED = _statement(lock=False)


async def packed_before(
    db: Db, turn: TurnFacts, step: int, held: Sequence[Any] | None
) -> CallRow | None:
    """The step's model call an earlier attempt stored, if any."""
    if held is None:
        return await step_call(await session_conn(db), turn_id=turn.id, step=step)
    stored = held[-1]
    return None if stored is None else typed_row(CallRow, stored)


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
    return Memory(
        summary=summary,
        facts=facts,
        slots={
            k: (v.value, v.set_at_seq) for k, v in current.items() if k != PENDING_CLARIFICATION
        },
    )
