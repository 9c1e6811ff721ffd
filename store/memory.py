"""Conversational memory in PostgreSQL as a prompt reads it: the messages it is built from,
pinned facts and the latest rolling summary of a session. Full-text recall is in
`store.recall`; the summary's runs write their versions through `store.summaries`.

Like every store module these never commit; the caller does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    Label,
    Row,
    Select,
    SQLColumnExpression,
    String,
    bindparam,
    func,
    literal_column,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import aggregate_order_by, insert
from sqlalchemy.ext.asyncio import AsyncSession

from parley.context import WindowMessage
from parley.memory import PinnedFact, SummaryLine
from parley.prompt import StoredSummary
from parley.store.models import ConversationSummary, Message, PinnedFactRow
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
    "AND r.role IN ('user', 'assistant') AND r.status <> 'retracted' AND r.text <> '' "
    "GROUP BY r.text) AS distinct_texts"
)


async def remembered_tokens(db: AsyncSession, *, session_id: str, before_seq: int) -> int:
    """The tokens of the session's distinct text before `before_seq` (`REMEMBERED_SQL`)."""
    statement = text(REMEMBERED_SQL.format(session=":session_id", before=":before"))
    found = await db.scalar(statement, {"session_id": session_id, "before": before_seq})
    return int(found or 0)


async def latest_summary(db: AsyncSession, *, session_id: str) -> StoredSummary | None:
    row = await db.scalar(
        select(ConversationSummary)
        .where(ConversationSummary.session_id == session_id)
        .order_by(ConversationSummary.through_seq.desc())
        .limit(1)
    )
    if row is None:
        return None
    return _summary(row.through_seq, row.lines, row.model)


def _summary(through_seq: int, lines: list[dict[str, Any]], model: str) -> StoredSummary:
    kept = [SummaryLine(int(x["seq"]), str(x["text"]), dict(x.get("refs") or {})) for x in lines]
    return StoredSummary(through_seq, kept, model)


async def summary_and_facts(
    db: AsyncSession, *, session_id: str
) -> tuple[StoredSummary | None, list[PinnedFact]]:
    """The latest summary (as `latest_summary` reads it) and the pinned facts, by key, in one
    statement (every context build reads both)."""
    row = (await db.execute(_SUMMARY_AND_FACTS, {"session_id": session_id})).one()
    return parse_summary_and_facts(row.summary, row.facts)


def parse_summary_and_facts(
    summary: list[Any] | None, facts: list[list[Any]]
) -> tuple[StoredSummary | None, list[PinnedFact]]:
    """The summary and facts as `summary_and_facts` reads them, from the JSON of its two
    subqueries (`summary_and_facts_columns`, when another statement carries them)."""
    return (
        None if summary is None else _summary(*summary),
        [PinnedFact(key, value, seq, source) for key, value, seq, source in facts],
    )


def summary_and_facts_columns(
    session_id: SQLColumnExpression[str],
) -> tuple[Label[Any], Label[Any]]:
    """`summary_and_facts`'s two subqueries as columns of another statement, for the session
    `session_id` names there (the context build reads them with its turn)."""
    latest = func.json_build_array(
        ConversationSummary.through_seq, ConversationSummary.lines, ConversationSummary.model
    )
    summary = (
        select(latest)
        .where(ConversationSummary.session_id == session_id)
        .order_by(ConversationSummary.through_seq.desc())
        .limit(1)
        .scalar_subquery()
        .label("summary")
    )
    fact = func.json_build_array(
        PinnedFactRow.key, PinnedFactRow.value, PinnedFactRow.source_seq, PinnedFactRow.source
    )
    facts = (
        select(
            func.coalesce(
                func.json_agg(aggregate_order_by(fact, PinnedFactRow.key)),
                literal_column("'[]'::json"),
            )
        )
        .where(PinnedFactRow.session_id == session_id)
        .scalar_subquery()
        .label("facts")
    )
    return summary, facts


_SUMMARY_AND_FACTS = select(*summary_and_facts_columns(bindparam("session_id", type_=String)))


async def pin_facts(db: AsyncSession, *, session_id: str, facts: Iterable[PinnedFact]) -> None:
    """Upsert facts; a stored fact from a later seq is never overwritten by an older one."""
    for fact in facts:
        values = {
            "value": fact.value,
            "source_seq": fact.seq,
            "source": fact.source,
            "updated_at": func.now(),
        }
        await db.execute(
            insert(PinnedFactRow)
            .values(session_id=session_id, key=fact.key, **values)
            .on_conflict_do_update(
                index_elements=["session_id", "key"],
                set_=values,
                where=PinnedFactRow.source_seq <= fact.seq,
            )
        )


async def session_messages(
    db: AsyncSession,
    *,
    session_id: str,
    after_seq: int,
    hide_answers_of: str | None,
    counter: TokenCounter,
    before_seq: int | None = None,
) -> list[WindowMessage]:
    """Messages after `after_seq` (and before `before_seq`), with their token counts (the
    stored count when the same counter made it)."""
    query = _messages(
        session_id=session_id, after_seq=after_seq, before_seq=before_seq, hide=hide_answers_of
    )
    return _window_rows(await db.execute(query), counter)


async def window_messages(
    db: AsyncSession,
    *,
    session_id: str,
    summary_through: int | None,
    hide_answers_of: str | None,
    counter: TokenCounter,
) -> list[WindowMessage]:
    """The session's messages from where the window may start: a little before the summary's
    end, within reach of the newest message (`_window_start`), in one statement built once
    (every context build sends it); a retried turn's earlier answers hidden."""
    params = {"session_id": session_id, "summary_through": summary_through or 0}
    if hide_answers_of:
        params["hide"] = hide_answers_of
    query = _WINDOW_HIDING if hide_answers_of else _WINDOW
    return _window_rows(await db.execute(query, params), counter)


def _messages(
    *,
    session_id: str | ColumnElement[str],
    after_seq: int | ColumnElement[int],
    before_seq: int | None = None,
    hide: str | ColumnElement[str] | None = None,
) -> Select[Any]:
    # The columns a window needs, not the mapped rows: no identity map to fill, and not the
    # full-text vector, which is as long as the text.
    query = select(
        Message.seq,
        Message.role,
        Message.text,
        Message.status,
        Message.tool_calls,
        Message.tool_call_id,
        Message.token_count,
        Message.token_counter,
        Message.created_at,
        Message.turn_id,
    ).where(
        Message.session_id == session_id,
        Message.replaced_by.is_(None),
        Message.seq > after_seq,
    )
    if before_seq is not None:
        query = query.where(Message.seq < before_seq)
    if hide is not None:
        # A retry does not show the model the answer it is replacing.
        query = query.where(
            ~(
                (Message.turn_id == hide)
                & (Message.role == "assistant")
                & Message.tool_calls.is_(None)
            )
        )
    return query.order_by(Message.seq)


def _window_rows(rows: Iterable[Row[Any]], counter: TokenCounter) -> list[WindowMessage]:
    return [
        _window_message(
            counter,
            *(m.seq, m.role, m.text, m.status, m.tool_calls, m.tool_call_id),
            *(m.token_count, m.token_counter, m.created_at.date().isoformat(), m.turn_id),
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
) -> WindowMessage:
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


def _window_start(
    session_id: SQLColumnExpression[str], summary_through: SQLColumnExpression[int]
) -> ColumnElement[int]:
    """Where loading starts: a little before the summary's end (0: none), within reach of the
    newest message."""
    last = (
        select(func.max(Message.seq))
        .where(Message.session_id == session_id)
        .correlate_except(Message)  # its own scan of the session, not the outer row
        .scalar_subquery()
    )
    floor = func.greatest(0, func.coalesce(last, 0) - WINDOW_REACH)
    return func.least(summary_through, floor)


def _window_statement(*, hiding: bool) -> Select[Any]:
    """`window_messages`' statement, bound by name: session_id, summary_through, hide."""
    session_id = bindparam("session_id", type_=String)
    start = _window_start(session_id, bindparam("summary_through", type_=Integer))
    hide = bindparam("hide", type_=String) if hiding else None
    return _messages(session_id=session_id, after_seq=start, hide=hide)


_WINDOW = _window_statement(hiding=False)
_WINDOW_HIDING = _window_statement(hiding=True)
