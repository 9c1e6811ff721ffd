"""Conversational memory in PostgreSQL as a prompt reads it: the messages it is built from,
pinned facts and the latest rolling summary of a session. Full-text recall is in
`store.recall`; the summary's runs write their versions through `store.summaries`.

Like every store module these never commit; the caller does.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from parley.context import WindowMessage, written_by_person
from parley.memory import PinnedFact, SummaryLine
from parley.prompt import StoredSummary
from parley.store.db import Db
from parley.tokens import MESSAGE_OVERHEAD, TokenCounter, count_message

# Messages loaded before the summary's end, so the recent window can reach back that far.
WINDOW_REACH = 200

# What there is to remember before a seq (parley/budget.py): the tokens of the session's
# shown messages, each distinct text counted once (a canned reply said forty times is one
# thing to remember), with each message's framing. `{session}` and `{before}` are SQL
# expressions: a bound parameter, or a column of the statement it is part of.
REMEMBERED_SQL = (
    "SELECT coalesce(sum(n), 0)::int FROM (SELECT max(coalesce(r.token_count, 0)) + "
    f"{MESSAGE_OVERHEAD} AS n FROM messages AS r "
    "WHERE r.session_id = {session} AND r.seq < {before} AND r.replaced_by IS NULL "
    "AND NOT r.off_path "
    "AND r.role IN ('user', 'assistant') AND r.status <> 'retracted' AND r.text <> '' "
    "GROUP BY r.text) AS distinct_texts"
)


# The speakers a transcript names, as a JSON array: each `Name: ` label that starts at least
# three of the session's messages before `{before}` and a tenth of them (a conversation
# brought in from elsewhere, or typed as one, names its speaker in every line). Recall by
# meaning leaves their names out of the question (parley/recall.py `without_speakers`). The
# label is cut by `split_part` and matched once per label, not per message: a pattern on
# every message took ten times as long (40 ms against 4 on 675 lines, at load 7).
SPEAKERS_SQL = (
    "SELECT coalesce(json_agg(label ORDER BY label), '[]') FROM ("
    "SELECT CASE WHEN position(': ' IN left(r.text, 33)) > 0 "
    "THEN split_part(left(r.text, 33), ': ', 1) END AS label, "
    "count(*) AS n, sum(count(*)) OVER () AS total FROM messages AS r "
    "WHERE r.session_id = {session} AND r.seq < {before} AND r.replaced_by IS NULL "
    "AND NOT r.off_path "
    "AND r.role IN ('user', 'assistant') AND r.status <> 'retracted' AND r.text <> '' "
    "GROUP BY 1) AS labels "
    "WHERE n >= 3 AND n * 10 >= total AND label ~ '^[A-Z][[:alnum:]_''-]{{0,30}}$'"
)


async def speakers(db: Db, *, session_id: str, before_seq: int) -> list[str]:
    """The speakers the session's messages before `before_seq` name (`SPEAKERS_SQL`)."""
    found = await db.value(_SPEAKERS, {"session_id": session_id, "before": before_seq})
    return [str(name) for name in found or []]


_SPEAKERS = SPEAKERS_SQL.format(session="%(session_id)s", before="%(before)s")


async def remembered_tokens(db: Db, *, session_id: str, before_seq: int) -> int:
    """The tokens of the session's distinct text before `before_seq` (`REMEMBERED_SQL`)."""
    found = await db.value(_REMEMBERED, {"session_id": session_id, "before": before_seq})
    return int(found or 0)


_REMEMBERED = REMEMBERED_SQL.format(session="%(session_id)s", before="%(before)s")

# The session's latest summary as one value, [through_seq, lines, model] (NULL: none yet),
# and its pinned facts, [[key, value, seq, source], …] by key, for the session `{session}`
# (a bound parameter, or a column of the statement they are part of).
SUMMARY_OF_SESSION = """(SELECT json_build_array(through_seq, lines, model)
    FROM conversation_summaries WHERE session_id = {session} AND NOT off_path
    ORDER BY through_seq DESC LIMIT 1)"""
FACTS_OF_SESSION = """(SELECT coalesce(json_agg(
        json_build_array(key, value, source_seq, source) ORDER BY key), '[]')
    FROM pinned_facts WHERE session_id = {session})"""


async def latest_summary(db: Db, *, session_id: str) -> StoredSummary | None:
    found = await db.value(_LATEST_SUMMARY, {"session_id": session_id})
    return None if found is None else _summary(*found)


_LATEST_SUMMARY = "SELECT " + SUMMARY_OF_SESSION.format(session="%(session_id)s")


def _summary(through_seq: int, lines: list[dict[str, Any]], model: str) -> StoredSummary:
    kept = [SummaryLine(int(x["seq"]), str(x["text"]), dict(x.get("refs") or {})) for x in lines]
    return StoredSummary(through_seq, kept, model)


@dataclass(frozen=True)
class _SummaryAndFacts:
    summary: list[Any] | None
    facts: list[list[Any]]


async def summary_and_facts(
    db: Db, *, session_id: str
) -> tuple[StoredSummary | None, list[PinnedFact]]:
    """The latest summary (as `latest_summary` reads it) and the pinned facts, by key, in one
    statement (every context build reads both)."""
    row = await db.row(_SUMMARY_AND_FACTS, {"session_id": session_id}, _SummaryAndFacts)
    assert row is not None  # a select list without FROM: always one row
    return parse_summary_and_facts(row.summary, row.facts)


def parse_summary_and_facts(
    summary: list[Any] | None, facts: list[list[Any]]
) -> tuple[StoredSummary | None, list[PinnedFact]]:
    """The summary and facts as `summary_and_facts` reads them, from the JSON of its two
    subqueries (`SUMMARY_OF_SESSION`, `FACTS_OF_SESSION`, when another statement carries
    them)."""
    return (
        None if summary is None else _summary(*summary),
        [PinnedFact(key, value, seq, source) for key, value, seq, source in facts],
    )


_SUMMARY_AND_FACTS = f"SELECT {SUMMARY_OF_SESSION} AS summary, {FACTS_OF_SESSION} AS facts".format(
    session="%(session_id)s"
)


async def pin_facts(db: Db, *, session_id: str, facts: Iterable[PinnedFact]) -> None:
    """Upsert facts; a stored fact from a later seq is never overwritten by an older one."""
    for fact in facts:
        params = {"session_id": session_id, "key": fact.key, "value": fact.value}
        await db.run(_PIN_FACT, params | {"seq": fact.seq, "source": fact.source})


_PIN_FACT = """
    INSERT INTO pinned_facts (session_id, key, value, source_seq, source, updated_at)
    VALUES (%(session_id)s, %(key)s, %(value)s, %(seq)s, %(source)s, now())
    ON CONFLICT (session_id, key) DO UPDATE SET value = excluded.value,
        source_seq = excluded.source_seq, source = excluded.source,
        updated_at = excluded.updated_at
    WHERE pinned_facts.source_seq <= excluded.source_seq
"""


async def session_messages(
    db: Db,
    *,
    session_id: str,
    after_seq: int,
    hide_answers_of: str | None,
    counter: TokenCounter,
    before_seq: int | None = None,
) -> list[WindowMessage]:
    """Messages after `after_seq` (and before `before_seq`), with their token counts (the
    stored count when the same counter made it)."""
    params: dict[str, Any] = {"session_id": session_id, "after": after_seq}
    params |= {"before": before_seq, "hide": hide_answers_of}
    query = _messages(
        after="%(after)s", before=before_seq is not None, hiding=hide_answers_of is not None
    )
    return _window_rows(await db.rows(query, params, _WindowRow), counter)


async def window_messages(
    db: Db,
    *,
    session_id: str,
    summary_through: int | None,
    hide_answers_of: str | None,
    counter: TokenCounter,
) -> list[WindowMessage]:
    """The session's messages from where the window may start: a little before the summary's
    end, within reach of the newest message (`_WINDOW_START`), in one statement (every
    context build sends it); a retried turn's earlier answers hidden."""
    params = {"session_id": session_id, "summary_through": summary_through or 0}
    params |= {"hide": hide_answers_of}
    query = _messages(after=_WINDOW_START, before=False, hiding=hide_answers_of is not None)
    return _window_rows(await db.rows(query, params, _WindowRow), counter)


@dataclass(frozen=True)
class _WindowRow:
    """The columns a window needs, not the whole message: not the full-text vector, which
    is as long as the text."""

    seq: int
    role: str
    text: str
    status: str
    tool_calls: list[dict[str, Any]] | None
    tool_call_id: str | None
    token_count: int | None
    token_counter: str | None
    created_at: datetime
    turn_id: str | None
    author_name: str | None


# Where loading starts: a little before the summary's end (`{summary_through}`, 0: none),
# within reach of the session's newest message (`{session}`). Here, and among a context
# build's rows (store/context.py).
WINDOW_START = f"""least({{summary_through}}, greatest(0, coalesce(
        (SELECT max(seq) FROM messages WHERE session_id = {{session}} AND NOT off_path),
        0) - {WINDOW_REACH}))"""
_WINDOW_START = WINDOW_START.format(summary_through="%(summary_through)s", session="%(session_id)s")


@functools.cache  # a few statements, each built once
def _messages(*, after: str, before: bool, hiding: bool) -> str:
    """The session's shown messages after `after` (SQL), before `%(before)s` with `before`;
    with `hiding`, the answers of the turn `%(hide)s` left out (a retry does not show the
    model the answer it is replacing)."""
    return f"""
    SELECT seq, role, text, status, tool_calls, tool_call_id, token_count, token_counter,
        created_at, turn_id, author_name
    FROM messages
    WHERE session_id = %(session_id)s AND replaced_by IS NULL AND NOT off_path
        AND seq > {after}
        {"AND seq < %(before)s" if before else ""}
        {_HIDDEN if hiding else ""}
    ORDER BY seq
"""


_HIDDEN = "AND NOT (turn_id = %(hide)s AND role = 'assistant' AND tool_calls IS NULL)"


def _window_rows(rows: Iterable[_WindowRow], counter: TokenCounter) -> list[WindowMessage]:
    return [
        _window_message(
            counter,
            *(m.seq, m.role, m.text, m.status, m.tool_calls, m.tool_call_id),
            *(m.token_count, m.token_counter, m.created_at.date().isoformat(), m.turn_id),
            m.author_name,
        )
        for m in rows
    ]


def parse_window(rows: list[list[Any]], counter: TokenCounter) -> list[WindowMessage]:
    """The window as the context build reads it (store/context.py), from its JSON (one
    array per message)."""
    return [_window_message(counter, *row) for row in rows]


def _window_message(
    counter: TokenCounter,
    seq: int,
    role: str,
    text: str,
    status: str,
    tool_calls: list[dict[str, Any]] | None,
    tool_call_id: str | None,
    token_count: int | None,
    token_counter: str | None,
    created_at: str,
    turn_id: str | None,
    author_name: str | None = None,
) -> WindowMessage:
    if author_name is not None:  # a person's reply: marked, so its stored count is not it
        text, token_count = written_by_person(author_name, text), None
    if token_count is None or token_counter != counter.name:
        shown = {"role": role, "content": text, "tool_calls": tool_calls}
        token_count = count_message(counter, shown)
    return WindowMessage(
        seq,
        role,
        text,
        status,
        tool_calls,
        tool_call_id,
        tokens=token_count,
        created_at=created_at,
        turn_id=turn_id,
    )
