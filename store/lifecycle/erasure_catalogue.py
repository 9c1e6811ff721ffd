"""The erasure catalogue: every table that can hold a user's rows, how to find them, and the
batched delete both scopes share (a whole user, or one deleted session).

Each entry says which of a table's rows belong to the subject, for a user and for a session
(None: the table has none at that scope). A row belongs to a session when it hangs off the
session or one of its turns; to a user when it hangs off one of their sessions or names the
user. The order is the order of deletion: rows that others point at (messages, turns,
sessions, the user) go after the rows pointing at them, so no batch trips a foreign key and
no `ON DELETE CASCADE` deletes rows behind the receipt's back.

`tests/api/test_erasure.py` reads PostgreSQL's own catalogue and fails when a table is
neither here nor in `NOT_PERSONAL`, so a new table has to be placed before it ships. Nothing
here commits (see `store`).
"""

from __future__ import annotations

from dataclasses import dataclass

from parley.contracts import TERMINAL_TURN_STATES
from parley.erasure import ErasureScope
from parley.store.db import Db

# Tables that hold no user's rows: the tenant's own, knowledge documents (written by
# operators), the tenant's budget approvals (its month; `decided_by` names the operator who
# decided, as a record of the decision), the schema's version, and the receipts themselves.
NOT_PERSONAL = frozenset(
    {
        "tenants",
        "knowledge_documents",
        "knowledge_chunks",
        "budget_approvals",
        "alembic_version",
        "erasures",
    }
)

# The subject's sessions and turns, as subqueries (bound: `tenant`, `user`, `session`).
_SESSIONS = {
    ErasureScope.user: (
        "SELECT id FROM sessions WHERE tenant_id = %(tenant)s AND user_id = %(user)s"
    ),
    ErasureScope.session: (
        "SELECT id FROM sessions"
        " WHERE id = %(session)s AND tenant_id = %(tenant)s AND user_id = %(user)s"
    ),
}
_BY_SESSION = "session_id IN ({sessions})"
_BY_TURN = "turn_id IN (SELECT id FROM turns WHERE session_id IN ({sessions}))"
_BY_USER = "tenant_id = %(tenant)s AND user_id = %(user)s"
_BY_CASE = "handoff_id IN (SELECT id FROM handoffs WHERE session_id IN ({sessions}))"
# A memory item remembers the event that wrote it: "message:<id>" or "action:<id>".
_SOURCED_IN_SESSION = (
    "tenant_id = %(tenant)s AND user_id = %(user)s AND ("
    " source IN (SELECT 'message:' || id FROM messages WHERE session_id IN ({sessions}))"
    " OR source IN (SELECT 'action:' || id FROM actions WHERE session_id IN ({sessions})))"
)


@dataclass(frozen=True)
class Entry:
    table: str
    user: str | None
    session: str | None

    def where(self, scope: ErasureScope) -> str | None:
        clause = self.user if scope is ErasureScope.user else self.session
        return clause.format(sessions=_SESSIONS[scope]) if clause is not None else None


CATALOGUE: tuple[Entry, ...] = (
    # First, while the messages and actions they name still exist: a session's memory items
    # (their copies in the user's other sessions go with them, see `erase_sourced_memory`).
    Entry("user_memory", _BY_USER, _SOURCED_IN_SESSION),
    Entry("queued_messages", _BY_SESSION, _BY_SESSION),  # a message waiting for its turn
    Entry("turn_events", _BY_TURN, _BY_TURN),
    Entry("session_events", _BY_SESSION, _BY_SESSION),  # ids only: what the session stream read
    Entry("trace_spans", _BY_TURN, _BY_TURN),
    Entry("specialist_answers", _BY_TURN, _BY_TURN),
    Entry("tool_calls", _BY_TURN, _BY_TURN),
    Entry("result_sets", _BY_SESSION, _BY_SESSION),
    Entry("feedback", f"{_BY_SESSION} OR ({_BY_USER})", _BY_SESSION),
    Entry("actions", f"{_BY_SESSION} OR ({_BY_USER})", _BY_SESSION),
    # A hand-off's event log (the conversation's messages with a person) and its notes.
    Entry("handoff_events", _BY_CASE, _BY_CASE),
    # Their payloads quote the case; a user's budget notice names the user (`subject`).
    Entry(
        "webhook_deliveries",
        f"{_BY_SESSION} OR (tenant_id = %(tenant)s"
        " AND payload ->> 'subject' = 'user:' || %(tenant)s || '/' || %(user)s)",
        _BY_SESSION,
    ),
    Entry("handoff_notes", _BY_CASE, _BY_CASE),
    Entry("handoffs", _BY_SESSION, _BY_SESSION),
    Entry("message_embeddings", _BY_SESSION, _BY_SESSION),  # only where pgvector is
    Entry("imports", _BY_SESSION, _BY_SESSION),  # the requests that imported messages
    Entry("files", f"{_BY_SESSION} OR ({_BY_USER})", _BY_SESSION),
    Entry("slots", _BY_SESSION, _BY_SESSION),
    Entry("pinned_facts", _BY_SESSION, _BY_SESSION),
    Entry("conversation_summaries", _BY_SESSION, _BY_SESSION),
    Entry("branches", _BY_SESSION, _BY_SESSION),  # a session's versions (store/branches.py)
    Entry("model_calls", _BY_TURN, _BY_TURN),
    # The cost ledger names the session and the user; tenants' totals lose the erased rows.
    Entry("model_costs", f"{_BY_SESSION} OR ({_BY_USER})", _BY_SESSION),
    Entry("messages", _BY_SESSION, _BY_SESSION),
    Entry("turns", f"{_BY_SESSION} OR ({_BY_USER})", _BY_SESSION),
    Entry("sessions", "id IN ({sessions})", "id IN ({sessions})"),
    Entry("memory_consents", _BY_USER, None),
    Entry("stream_leases", _BY_USER, None),
    # The rate counters name their user as "<tenant>/<user>" (store/limits.py).
    Entry("usage_counters", "subject = %(tenant)s || '/' || %(user)s", None),
    # A user's budget periods, "user:<tenant>/<user>" (store/costs.py); the tenant's stay.
    Entry("budget_spend", "subject = 'user:' || %(tenant)s || '/' || %(user)s", None),
    Entry("budget_holds", "subject = 'user:' || %(tenant)s || '/' || %(user)s", None),
    Entry("budget_notices", "subject = 'user:' || %(tenant)s || '/' || %(user)s", None),
    # An export archive holds every session of its user, so a deleted session takes the
    # user's archives with it (asking again writes one without it).
    Entry("exports", _BY_USER, _BY_USER),
    Entry("api_tokens", _BY_USER, None),
    Entry("users", "tenant_id = %(tenant)s AND id = %(user)s", None),
)
_ENTRIES = {entry.table: entry for entry in CATALOGUE}


@dataclass(frozen=True)
class Subject:
    """Whose rows: the ids the catalogue's clauses bind."""

    scope: ErasureScope
    tenant_id: str
    user_id: str
    session_id: str | None = None

    @property
    def params(self) -> dict[str, str | None]:
        return {"tenant": self.tenant_id, "user": self.user_id, "session": self.session_id}


async def tables_for(db: Db, *, scope: ErasureScope) -> list[str]:
    """The catalogue's tables at this scope that exist in this database, in order."""
    present = {row.tablename for row in await db.rows(_TABLES, {}, _Table)}
    return [e.table for e in CATALOGUE if e.where(scope) is not None and e.table in present]


@dataclass(frozen=True)
class _Table:
    tablename: str


_TABLES = "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"


async def delete_batch(db: Db, *, subject: Subject, table: str, limit: int) -> int:
    """Delete up to `limit` of the subject's rows of `table`; how many went. Idempotent: it
    deletes what is still there, so a batch after a crash picks up where the last commit
    left off."""
    where = _ENTRIES[table].where(subject.scope)
    if where is None:
        return 0
    # The table name comes from the catalogue above, never from a caller's text.
    statement = (
        f"DELETE FROM {table} WHERE ctid = ANY(ARRAY("
        f"SELECT ctid FROM {table} WHERE {where} LIMIT %(limit)s))"
    )
    return await db.run(statement, {**subject.params, "limit": limit})


async def erase_sourced_memory_copies(db: Db, *, subject: Subject) -> dict[str, int]:
    """Before a session's memory items go: the copies made from them in the user's other
    sessions (pinned facts written with an item, summary versions that folded its hints),
    which the summary workflow rebuilds from the messages. Counted by table."""
    where = _ENTRIES["user_memory"].where(subject.scope)
    keys = f"SELECT key FROM user_memory WHERE {where}"
    owned = _SESSIONS[ErasureScope.user]
    facts = await db.run(
        f"DELETE FROM pinned_facts WHERE session_id IN ({owned}) AND memory_key IN ({keys})",
        subject.params,
    )
    summaries = await db.run(
        f"DELETE FROM conversation_summaries WHERE session_id IN ({owned})"
        f" AND memory_keys ?| ARRAY({keys})",
        subject.params,
    )
    return {"pinned_facts": facts, "conversation_summaries": summaries}


async def remaining(db: Db, *, subject: Subject, tables: list[str]) -> dict[str, int]:
    """The subject's rows still in each table (only those with any)."""
    left: dict[str, int] = {}
    for table in tables:
        where = _ENTRIES[table].where(subject.scope)
        if where is None:
            continue
        count = await db.value(f"SELECT count(*) FROM {table} WHERE {where}", subject.params)
        if count:
            left[table] = int(count)
    return left


@dataclass(frozen=True)
class _Owner:
    id: str
    session_id: str


async def workflow_owners(
    db: Db, *, subject: Subject, after: str, limit: int
) -> list[tuple[str, str]]:
    """(turn id, session id) of the subject's turns after `after`, in id order: the ids
    their workflows were started under (a page at a time)."""
    statement = (
        f"SELECT id, session_id FROM turns WHERE ({_ENTRIES['turns'].where(subject.scope)})"
        " AND id > %(after)s ORDER BY id LIMIT %(limit)s"
    )
    rows = await db.rows(statement, {**subject.params, "after": after, "limit": limit}, _Owner)
    return [(row.id, row.session_id) for row in rows]


async def unfinished_turns(db: Db, *, subject: Subject) -> list[str]:
    """The subject's turns that have not ended."""
    statement = (
        f"SELECT id FROM turns WHERE ({_ENTRIES['turns'].where(subject.scope)})"
        " AND state <> ALL(%(ended)s::text[])"
    )
    rows = await db.rows(statement, {**subject.params, "ended": sorted(TERMINAL_TURN_STATES)}, _Id)
    return [row.id for row in rows]


@dataclass(frozen=True)
class _Id:
    id: str
