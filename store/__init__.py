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
doorbell) and `listener` (its LISTEN connection), `locks` (the advisory locks that order a
user's or a session's writers), `traces` (the trace ledger), beside `identity`, `tenants` and
`slots`.

A user's data after the conversation (exports, retention, forgetting a message, erasure) is
one package, `lifecycle`.

Only this package imports SQLAlchemy or psycopg (tests/unit/test_layout.py), and within it
only `db` (the pool), `models` (the schema) and `migrate` (alembic) import SQLAlchemy. Every
statement is a named SQL string of the module that owns it, sent through a `store.db.Db`
(the transaction rule is written there once); its rows come back as frozen dataclasses, or
as a pydantic model where the contract has one (`parley.wire.MessageView`). Callers name a
unit of work `store.db.Db` and where units of work come from `store.db.Database`, and reach
the database through the functions here.
"""
