"""Persistence: the PostgreSQL record (schema, migrations, repository functions, event log).

One module per concept of a conversation: `sessions` (sessions, messages, reads for the
API), `posting` (the POST pipeline: admission, classification, one write per kind; and
retry), `queue` (a message queued behind the running turn, and its promotion when that turn
ends), `turns` (a turn: the one function that moves its state, its progress and endings;
its parts `turns.birth`, a plain post's turn born with its message; `turns.reads`, the turn
as a step reads it; `turns.attempts`, a model call's attempt opened, and a reply asking for
tools stored; `turns.tool_calls`, a call's outcome; `turns.endings`, what an ending writes),
`turn_states` (the SQL of a state move and of a birth, and the check against the table),
`messages` (the message seq rule, and a turn's messages stored), `steps` (a turn's model
calls and the reads its steps make), `context` (what a context build reads, with its move
to `building_context`), `actions` (proposals and confirmations), `viewers` (who watches a
turn), `outbox` (the start outbox's queries), `events` (the per-turn event log and every
doorbell) and `listener` (its LISTEN connection), `traces` (the trace ledger), beside
`identity`, `tenants` and `slots`.

A user's data after the conversation (exports, retention, forgetting a message, erasure) is
one package, `lifecycle`.

Only this package imports SQLAlchemy or psycopg (tests/unit/test_layout.py). Callers name a
unit of work `store.db.Db` and its factory `store.db.SessionMaker`, and reach the database
through the functions here.

What a function here hands a caller outside this package is a typed row: a frozen
dataclass (read off an ORM object with `store.rows.typed_row`, or made by a `Conn`
statement), or a pydantic model where the contract has one (`parley.wire.MessageView`);
writes are named functions here. Only this package imports `store.models`: the API, the
worker's activities and the wiring never hold an ORM object (tests/unit/test_layout.py).

The worker's hot path (the context build's reads, recall and knowledge searches, a model
call's step, a tool call's step, the event appends, trace spans, finalize, the screens'
reads, follow-ups, the tool requests) runs in one leaner style: `store.db.Conn`, psycopg's
own connection taken from the same pool (`connect`, or `session_conn` inside a session's
transaction), named statements returning frozen dataclasses (`steps.CallRow`,
`turns.reads.TurnRow`, `turns.tool_calls.ToolCallRow`), autocommit unless `Conn.transaction`
groups them. So do the statements the API runs for every turn: the token lookup, the POST's
reads, counters and new-turn write (on the request's session, via `session_conn`), a
stream's lease, log reads and end, and the start mark. A write that must be whole on its own
(an attempt's opening, a reply's tool requests) is one statement, which in autocommit is its
own transaction: its caller commits it by running it, outside any unit of work. Statement
counts see both styles (`store.db.on_statement_sent`).

The transaction rule, kept by every module here: repository functions add, flush and lock,
but never commit or roll back. The caller that opened the unit of work commits it: an API
route with an explicit `await db.commit()` once its writes are done (a route that raises
leaves them to the rollback of its closing session), an activity at the end of its step
(`async with sessions.begin() as db`, or an explicit commit). An insert that may collide
with a duplicate runs inside a SAVEPOINT (`async with db.begin_nested()`), so a collision
undoes only itself. Events appended within a unit of work ring their NOTIFY at its commit,
which is when streams can read them.
"""
