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

from psycopg.types.json import Jsonb

from parley.errors import NotFound, TurnInProgress
from parley.forgetting import Forgotten, Scrubber, emptied_event, needles_of
from parley.store import embeddings as embedding_store
from parley.store import summaries
from parley.store.branches.path import facts_dropped
from parley.store.db import Db
from parley.store.identity import Identity
from parley.store.sessions import lock_session

MESSAGE_NOT_FOUND = "message not found"
# Event types that can carry a forgotten message's text (parley/forgetting.py `emptied_event`).
_TEXT_EVENTS = (
    *("delta", "done", "cancelled", "retracted"),
    *("clarification", "interaction", "followups"),
)
# The owner's sessions, as a subquery (bound: `tenant_id`, `user_id`).
_OWNED_SESSIONS = (
    "SELECT id FROM sessions WHERE tenant_id = %(tenant_id)s AND user_id = %(user_id)s"
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

    @property
    def owner_params(self) -> dict[str, str]:
        return {"tenant_id": self.owner.tenant_id, "user_id": self.owner.user_id}


@dataclass(frozen=True)
class _Message:
    id: str
    session_id: str
    role: str
    turn_id: str | None
    tool_calls: Any


async def forget_message(db: Db, *, owner: Identity, session_id: str, message_id: str) -> Withdrawn:
    """Forget the owner's message and every copy of it (`NotFound` for a message that is not
    in the owner's session, or was forgotten already; `TurnInProgress` while a turn of the
    session runs: its prompt may hold the message and its answer is still being written)."""
    session = await lock_session(db, owner=owner, session_id=session_id)
    message = await db.row(_MESSAGE, {"id": message_id, "session_id": session_id}, _Message)
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


_MESSAGE = """
    SELECT id, session_id, role, turn_id, tool_calls FROM messages
    WHERE id = %(id)s AND session_id = %(session_id)s
"""


@dataclass(frozen=True)
class _Id:
    id: str


@dataclass(frozen=True)
class _Going:
    id: str
    seq: int
    text: str | None
    turn_id: str | None
    created_at: datetime


async def _gather(conn: Db, owner: Identity, message: _Message) -> _Doomed:
    """The messages that go: a user message's exchange (every turn that answered it, a retry
    included), a tool round's messages together (a call is never left without its result, nor
    a result without its call: a provider refuses either), or an answer alone."""
    exchange: set[str] = set()
    if message.role == "user":
        exchange = {row.id for row in await conn.rows(_ANSWERED, {"id": message.id}, _Id)}
    params = {
        "id": message.id,
        "session_id": message.session_id,
        "exchange": sorted(exchange),
        "turn_id": message.turn_id,
        "round": bool(message.turn_id and (message.role == "tool" or message.tool_calls)),
    }
    rows = await conn.rows(_GOING, params, _Going)
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


_ANSWERED = "SELECT id FROM turns WHERE user_message_id = %(id)s"
# The message, its exchange's messages, and (`round`) its tool round's.
_GOING = """
    SELECT id, seq, text, turn_id, created_at FROM messages
    WHERE session_id = %(session_id)s
        AND (id = %(id)s
             OR turn_id = ANY(%(exchange)s::text[])
             OR (%(round)s AND turn_id = %(turn_id)s
                 AND (role = 'tool' OR jsonb_typeof(tool_calls) = 'array')))
"""


@dataclass(frozen=True)
class _Item:
    key: str
    value: str


@dataclass(frozen=True)
class _Value:
    value: str


async def _memory(conn: Db, doomed: _Doomed) -> dict[str, int]:
    """Consented memory items a forgotten message wrote, and every pinned fact stated at a
    forgotten seq or written with such an item (in any of the owner's sessions)."""
    sources = [f"message:{i}" for i in sorted(doomed.ids)]
    items = await conn.rows(_ITEMS, {**doomed.owner_params, "sources": sources}, _Item)
    keys = [r.key for r in items]
    doomed.needles.update(r.value for r in items)
    params = {
        **doomed.owner_params,
        "session_id": doomed.session_id,
        "seqs": doomed.seqs,
        "keys": keys,
    }
    facts = await conn.rows(_FACTS, params, _Value)
    await conn.run(_SAVED_FACTS, params)
    doomed.needles.update(r.value for r in facts)
    doomed.memory_keys = keys
    return {"memory_items": len(items), "pinned_facts": len(facts)}


_ITEMS = """
    DELETE FROM user_memory
    WHERE tenant_id = %(tenant_id)s AND user_id = %(user_id)s AND source = ANY(%(sources)s::text[])
    RETURNING key, value
"""
_FACTS = f"""
    DELETE FROM pinned_facts
    WHERE (session_id = %(session_id)s AND source_seq = ANY(%(seqs)s::int[]))
        OR (session_id IN ({_OWNED_SESSIONS}) AND memory_key = ANY(%(keys)s::text[]))
    RETURNING value
"""


# The same facts saved with the session's other branches (store/branches/path.py).
_SAVED_FACTS = f"""
    UPDATE branches SET {
    facts_dropped(
        "(branches.session_id = %(session_id)s AND CAST(f->>2 AS integer) = ANY(%(seqs)s::int[]))"
        " OR f->>4 = ANY(%(keys)s::text[])"
    )
}
    WHERE session_id IN ({_OWNED_SESSIONS}) AND saved IS NOT NULL
"""


@dataclass(frozen=True)
class _Summary:
    session_id: str
    lines: list[dict[str, Any]]


async def _summaries(conn: Db, doomed: _Doomed) -> int:
    """Every summary version that folded a forgotten seq (a version older than the record of
    its seqs: any that reaches one), or that carried a forgotten memory item's hint."""
    params = {
        **doomed.owner_params,
        "session_id": doomed.session_id,
        "seqs": [str(s) for s in doomed.seqs],
        "first": doomed.seqs[0],
        "keys": doomed.memory_keys,
    }
    gone = await conn.rows(_SUMMARIES, params, _Summary)
    wanted = set(doomed.seqs)
    for row in gone:
        doomed.summarized.add(row.session_id)
        if row.session_id == doomed.session_id:
            doomed.needles.update(str(x["text"]) for x in row.lines if int(x["seq"]) in wanted)
    return len(gone)


_SUMMARIES = f"""
    DELETE FROM conversation_summaries
    WHERE (session_id = %(session_id)s
           AND (EXISTS (SELECT 1 FROM jsonb_array_elements(folded_seqs) AS s(value)
                        WHERE s.value::text = ANY(%(seqs)s::text[]))
                OR (folded_seqs IS NULL AND through_seq >= %(first)s)))
        OR (session_id IN ({_OWNED_SESSIONS}) AND memory_keys ?| %(keys)s::text[])
    RETURNING session_id, lines
"""


@dataclass(frozen=True)
class _Event:
    turn_id: str
    id: int
    type: str
    data: dict[str, Any]


async def _events(conn: Db, doomed: _Doomed) -> int:
    """The events that streamed a forgotten message, emptied of text in place (their ids and
    order stay, so a replay from any id is still whole)."""
    params = {"turn_ids": sorted(doomed.turn_ids), "types": list(_TEXT_EVENTS)}
    changed = 0
    for row in await conn.rows(_EVENTS, params, _Event):
        whole = row.turn_id in doomed.exchange_turns
        emptied = emptied_event(row.type, row.data, doomed.ids, whole_turn=whole)
        if emptied is None or emptied == row.data:
            continue
        await conn.run(_EMPTY_EVENT, {"turn_id": row.turn_id, "id": row.id, "data": Jsonb(emptied)})
        changed += 1
    return changed


_EVENTS = """
    SELECT turn_id, id, type, data FROM turn_events
    WHERE turn_id = ANY(%(turn_ids)s::text[]) AND type = ANY(%(types)s::text[])
"""
_EMPTY_EVENT = "UPDATE turn_events SET data = %(data)s WHERE turn_id = %(turn_id)s AND id = %(id)s"
# The records a forgotten text may be copied into: the kind counted, the table, the columns
# scrubbed (JSON, but for the one text column below).
_RECORDS = (
    ("prompts", "model_calls", ("request", "response_text", "response_tool_calls")),
    ("tool_calls", "tool_calls", ("arguments", "result")),
    ("result_sets", "result_sets", ("query", "rows")),
    ("trace_spans", "trace_spans", ("attrs",)),
)
_TEXT_COLUMNS = frozenset({"response_text"})


@dataclass(frozen=True)
class _Record:
    id: str | int
    # The scrubbed columns' values, in order (a text column as a JSON string).
    values: list[Any]


async def _records(conn: Db, doomed: _Doomed, scrub: Scrubber) -> dict[str, int]:
    """Prompts, tool calls, result sets and trace spans of the owner's turns since the first
    forgotten message, with every needle replaced."""
    if not scrub:
        return {}
    params = {**doomed.owner_params, "since": doomed.since}
    counts = {}
    for kind, table, columns in _RECORDS:
        # Table and column names come from `_RECORDS`, never from a caller's text.
        rows = await conn.rows(
            f"SELECT id, jsonb_build_array({', '.join(columns)}) AS values FROM {table}"
            f" WHERE turn_id IN ({_SINCE})",
            params,
            _Record,
        )
        changed = 0
        for row in rows:
            values: dict[str, Any] = {}
            for column, old in zip(columns, row.values, strict=True):
                if (new := scrub.json(old)) != old:
                    values[column] = new if column in _TEXT_COLUMNS else Jsonb(new)
            if values:
                sets = ", ".join(f"{c} = %({c})s" for c in values)
                await conn.run(
                    f"UPDATE {table} SET {sets} WHERE id = %(id)s", {**values, "id": row.id}
                )
                changed += 1
        counts[kind] = changed
    return counts


_SINCE = """
    SELECT id FROM turns
    WHERE tenant_id = %(tenant_id)s AND user_id = %(user_id)s AND created_at >= %(since)s
"""


async def _rows(conn: Db, doomed: _Doomed) -> dict[str, int]:
    """The messages themselves, with their embeddings and the feedback on them."""
    ids = {"ids": sorted(doomed.ids)}
    embeddings = 0
    if await embedding_store.available(conn):
        embeddings = await conn.run(_EMBEDDINGS, ids)
    return {
        "embeddings": embeddings,
        "feedback": await conn.run(_FEEDBACK, ids),
        "messages": await conn.run(_MESSAGES, ids),
    }


_EMBEDDINGS = "DELETE FROM message_embeddings WHERE message_id = ANY(%(ids)s::text[])"
_FEEDBACK = "DELETE FROM feedback WHERE message_id = ANY(%(ids)s::text[])"
_MESSAGES = "DELETE FROM messages WHERE id = ANY(%(ids)s::text[])"


async def forgotten_meanwhile(db: Db, *, session_id: str, seqs: Iterable[int]) -> bool:
    """Whether any of these seqs of the session is no longer stored (forgotten since a summary
    pass read them): that pass must not save what it wrote from them."""
    wanted = sorted(set(seqs))
    stored = await db.value(_STORED, {"session_id": session_id, "seqs": wanted})
    return int(stored or 0) < len(wanted)


_STORED = """
    SELECT count(*) FROM messages WHERE session_id = %(session_id)s AND seq = ANY(%(seqs)s::int[])
"""
