"""Forgetting one message: the message and every stored copy of its text, in one transaction.

The rules (what goes with a message, how a copy is scrubbed) are pure: `parley/forgetting.py`.
Here is where the copies live:

- the message rows (their full-text vectors are columns of the row), their embeddings and the
  feedback on them;
- the turn event log: events that streamed a forgotten message keep their ids, without text;
- pinned facts stated at a forgotten seq, and consented memory items a forgotten message
  wrote (with the facts written with them);
- every summary version that folded a forgotten seq, or carried a forgotten memory item's
  hint: deleted, so the summary workflow rewrites the summary from the messages that remain
  (`Withdrawn.sessions_to_summarize` names the sessions; the caller asks after the commit);
- prompts (`model_calls`), tool calls, result sets and trace spans of the owner's turns since
  the message was written: every occurrence of a forgotten text, or of a copy above, replaced
  by `[forgotten]` (the rows stay: they are the operators' record of what ran).

Like every store module this never commits; the caller does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Text, cast, delete, exists, func, or_, select, text, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncSession

from parley.errors import NotFound, TurnInProgress
from parley.forgetting import Forgotten, Scrubber, emptied_event, needles_of
from parley.store import embeddings as embedding_store
from parley.store import summaries
from parley.store.identity import Identity
from parley.store.models import (
    ChatSession,
    ConversationSummary,
    Feedback,
    Message,
    ModelCall,
    PinnedFactRow,
    ResultSet,
    ToolCall,
    TraceSpan,
    Turn,
    TurnEvent,
    UserMemoryItem,
)
from parley.store.sessions import lock_session

MESSAGE_NOT_FOUND = "message not found"
# Event types that can carry a forgotten message's text (parley/forgetting.py `emptied_event`).
_TEXT_EVENTS = (
    *("delta", "done", "cancelled", "retracted"),
    *("clarification", "interaction", "followups"),
)


@dataclass(frozen=True)
class Withdrawn:
    """What was removed, and the sessions whose summary lost a version (to be rewritten)."""

    message_ids: list[str]
    removed: Forgotten
    sessions_to_summarize: list[str]


@dataclass
class _Doomed:
    """The forgotten messages and what their text reached, gathered as the copies go."""

    owner: Identity
    session_id: str
    ids: set[str]
    seqs: list[int]
    turn_ids: set[str]  # the turns that streamed a forgotten message
    exchange_turns: set[str]  # the turns that answered a forgotten user message
    since: datetime
    needles: set[str] = field(default_factory=set)
    summarized: set[str] = field(default_factory=set)
    memory_keys: list[str] = field(default_factory=list)


async def forget_message(
    db: AsyncSession, *, owner: Identity, session_id: str, message_id: str
) -> Withdrawn:
    """Forget the owner's message and every copy of it (`NotFound` for a message that is not
    in the owner's session, or was forgotten already; `TurnInProgress` while a turn of the
    session runs: its prompt may hold the message and its answer is still being written)."""
    session = await lock_session(db, owner=owner, session_id=session_id)
    message = await db.scalar(
        select(Message).where(Message.id == message_id, Message.session_id == session_id)
    )
    if message is None:
        raise NotFound(MESSAGE_NOT_FOUND)
    if session.active_turn_id is not None:
        raise TurnInProgress(
            "a turn of this session is still running; forget the message once it has ended",
            active_turn_id=session.active_turn_id,
        )
    # A summary pass that read the message before this commits is refused at its save
    # (`forgotten_meanwhile`), under the lock its save takes.
    await summaries.lock_session_memory(db, session_id=session_id)
    doomed = await _gather(db, owner, message)
    removed = Forgotten()
    removed = replace(removed, **await _memory(db, doomed))
    removed = replace(removed, summaries=await _summaries(db, doomed))
    removed = replace(removed, events=await _events(db, doomed))
    removed = replace(removed, **await _records(db, doomed, Scrubber(doomed.needles)))
    removed = replace(removed, **await _rows(db, doomed))
    return Withdrawn(sorted(doomed.ids), removed, sorted(doomed.summarized))


async def _gather(db: AsyncSession, owner: Identity, message: Message) -> _Doomed:
    """The messages that go: a user message's exchange (every turn that answered it, a retry
    included), a tool round's messages together (a call is never left without its result, nor
    a result without its call: a provider refuses either), or an answer alone."""
    exchange: set[str] = set()
    if message.role == "user":
        answered = await db.scalars(select(Turn.id).where(Turn.user_message_id == message.id))
        exchange = set(answered)
    going = or_(Message.id == message.id, Message.turn_id.in_(exchange))
    if message.turn_id and (message.role == "tool" or message.tool_calls):
        in_round = (Message.role == "tool") | (func.jsonb_typeof(Message.tool_calls) == "array")
        going = or_(going, (Message.turn_id == message.turn_id) & in_round)
    rows = (
        await db.execute(
            select(Message.id, Message.seq, Message.text, Message.turn_id, Message.created_at)
            .where(Message.session_id == message.session_id)
            .where(going)
        )
    ).all()
    return _Doomed(
        owner=owner,
        session_id=message.session_id,
        ids={r.id for r in rows},
        seqs=sorted(r.seq for r in rows),
        turn_ids={r.turn_id for r in rows if r.turn_id} | exchange,
        exchange_turns=exchange,
        since=min(r.created_at for r in rows),
        needles={needle for r in rows for needle in needles_of(r.text or "")},
    )


def _owned_sessions(owner: Identity) -> Any:
    return select(ChatSession.id).where(
        ChatSession.tenant_id == owner.tenant_id, ChatSession.user_id == owner.user_id
    )


async def _memory(db: AsyncSession, doomed: _Doomed) -> dict[str, int]:
    """Consented memory items a forgotten message wrote, and every pinned fact stated at a
    forgotten seq or written with such an item (in any of the owner's sessions)."""
    items = (
        await db.execute(
            delete(UserMemoryItem)
            .where(
                UserMemoryItem.tenant_id == doomed.owner.tenant_id,
                UserMemoryItem.user_id == doomed.owner.user_id,
                UserMemoryItem.source.in_([f"message:{i}" for i in doomed.ids]),
            )
            .returning(UserMemoryItem.key, UserMemoryItem.value)
        )
    ).all()
    keys = [r.key for r in items]
    doomed.needles.update(r.value for r in items)
    stated_here = (PinnedFactRow.session_id == doomed.session_id) & PinnedFactRow.source_seq.in_(
        doomed.seqs
    )
    with_item = PinnedFactRow.session_id.in_(_owned_sessions(doomed.owner)) & (
        PinnedFactRow.memory_key.in_(keys)
    )
    facts = (
        await db.execute(
            delete(PinnedFactRow)
            .where(or_(stated_here, with_item) if keys else stated_here)
            .returning(PinnedFactRow.value)
        )
    ).all()
    doomed.needles.update(r.value for r in facts)
    doomed.memory_keys = keys
    return {"memory_items": len(items), "pinned_facts": len(facts)}


async def _summaries(db: AsyncSession, doomed: _Doomed) -> int:
    """Every summary version that folded a forgotten seq (a version older than the record of
    its seqs: any that reaches one), or that carried a forgotten memory item's hint."""
    seqs = func.jsonb_array_elements(ConversationSummary.folded_seqs).table_valued("value")
    folded = exists(
        select(1)
        .select_from(seqs)
        .where(cast(seqs.c.value, Text).in_([str(s) for s in doomed.seqs]))
    )
    legacy = ConversationSummary.folded_seqs.is_(None) & (
        ConversationSummary.through_seq >= doomed.seqs[0]
    )
    condition: ColumnElement[bool] = (ConversationSummary.session_id == doomed.session_id) & (
        folded | legacy
    )
    keys = doomed.memory_keys
    if keys:
        condition = condition | (
            ConversationSummary.session_id.in_(_owned_sessions(doomed.owner))
            & ConversationSummary.memory_keys.has_any(cast(keys, ARRAY(Text)))
        )
    gone = (
        await db.execute(
            delete(ConversationSummary)
            .where(condition)
            .returning(ConversationSummary.session_id, ConversationSummary.lines)
        )
    ).all()
    wanted = set(doomed.seqs)
    for row in gone:
        doomed.summarized.add(row.session_id)
        if row.session_id == doomed.session_id:
            doomed.needles.update(str(x["text"]) for x in row.lines if int(x["seq"]) in wanted)
    return len(gone)


async def _events(db: AsyncSession, doomed: _Doomed) -> int:
    """The events that streamed a forgotten message, emptied of text in place (their ids and
    order stay, so a replay from any id is still whole)."""
    rows = (
        await db.execute(
            select(TurnEvent.turn_id, TurnEvent.id, TurnEvent.type, TurnEvent.data).where(
                TurnEvent.turn_id.in_(doomed.turn_ids), TurnEvent.type.in_(_TEXT_EVENTS)
            )
        )
    ).all()
    changed = 0
    for row in rows:
        whole = row.turn_id in doomed.exchange_turns
        emptied = emptied_event(row.type, row.data, doomed.ids, whole_turn=whole)
        if emptied is None or emptied == row.data:
            continue
        await db.execute(
            update(TurnEvent)
            .where(TurnEvent.turn_id == row.turn_id, TurnEvent.id == row.id)
            .values(data=emptied)
        )
        changed += 1
    return changed


async def _records(db: AsyncSession, doomed: _Doomed, scrub: Scrubber) -> dict[str, int]:
    """Prompts, tool calls, result sets and trace spans of the owner's turns since the first
    forgotten message, with every needle replaced."""
    if not scrub:
        return {}
    turns = select(Turn.id).where(
        Turn.tenant_id == doomed.owner.tenant_id,
        Turn.user_id == doomed.owner.user_id,
        Turn.created_at >= doomed.since,
    )
    counts = {}
    for kind, table, key, columns in (
        ("prompts", ModelCall, ModelCall.id, ("request", "response_text", "response_tool_calls")),
        ("tool_calls", ToolCall, ToolCall.id, ("arguments", "result")),
        ("result_sets", ResultSet, ResultSet.id, ("query", "rows")),
        ("trace_spans", TraceSpan, TraceSpan.id, ("attrs",)),
    ):
        selected = [key, *(getattr(table, c) for c in columns)]
        rows = (await db.execute(select(*selected).where(table.turn_id.in_(turns)))).all()
        changed = 0
        for row in rows:
            values = {c: scrub.json(row[i + 1]) for i, c in enumerate(columns)}
            values = {c: v for i, (c, v) in enumerate(values.items()) if v != row[i + 1]}
            if values:
                await db.execute(update(table).where(key == row[0]).values(**values))
                changed += 1
        counts[kind] = changed
    return counts


async def _rows(db: AsyncSession, doomed: _Doomed) -> dict[str, int]:
    """The messages themselves, with their embeddings and the feedback on them."""
    ids = sorted(doomed.ids)
    embeddings = 0
    if await embedding_store.available(db):
        result = await db.execute(
            text("DELETE FROM message_embeddings WHERE message_id = ANY(:ids)"), {"ids": ids}
        )
        embeddings = int(getattr(result, "rowcount", 0) or 0)
    feedback = await db.execute(delete(Feedback).where(Feedback.message_id.in_(ids)))
    messages = await db.execute(delete(Message).where(Message.id.in_(ids)))
    return {
        "embeddings": embeddings,
        "feedback": int(getattr(feedback, "rowcount", 0) or 0),
        "messages": int(getattr(messages, "rowcount", 0) or 0),
    }


async def forgotten_meanwhile(db: AsyncSession, *, session_id: str, seqs: Iterable[int]) -> bool:
    """Whether any of these seqs of the session is no longer stored (forgotten since a summary
    pass read them): that pass must not save what it wrote from them."""
    wanted = sorted(set(seqs))
    stored = await db.scalar(
        select(func.count())
        .select_from(Message)
        .where(Message.session_id == session_id, Message.seq.in_(wanted))
    )
    return int(stored or 0) < len(wanted)
