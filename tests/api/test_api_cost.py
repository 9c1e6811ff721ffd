"""What a turn costs the API in statements to PostgreSQL: one POST and one event stream
followed to `done`. Each statement is a round trip and a few hundred microseconds of the
API's CPU (the bench reports that CPU per turn); this keeps the count from creeping back."""

from __future__ import annotations

from sqlalchemy import text

from parley.config import Settings
from parley.gateway.demo import DemoModel
from parley.store.db import Database, on_statement_sent, on_transaction_sent
from tests.support.orm import orm
from tests.support.stack import api_in_process
from tests.support.toolkit import eventually

# POST: the token; the session's lock, the earlier post and the session's turns with the
# user's lock, and the running turns with the tenant, sent together; the counters (in a
# savepoint) with the message, its turn and `received` event (and the outbox's ring), sent
# together. Stream: the token, the turn with the user's stream lock and the lease sent
# together, the first read with the viewer, the lease's end. Statements sent together
# (`Db.together`) count as one: one round trip. 14 before the POST sent its statements
# together, 9 before the worker that starts the turn marked its start instead of the API
# (2026-12-06), 8 before the stream's lock and lease went in one round trip (2026-12-07).
STATEMENTS_PER_TURN = 7
TRANSACTIONS_PER_TURN = 2

# A new turn's POST in round trips to PostgreSQL before its answer: the token (with the unit
# of work's `BEGIN`), the session's lock with the reads it orders (the earlier post, the
# user's lock with the session's turns, the running turns with the tenant), the counts with
# the message and its turn, the commit (which no statement hook sees: added here). No call to
# Temporal: the commit rings the workers' outbox, and one of them starts the turn. Counted on
# 2026-12-06: 10 (BEGIN and COMMIT included) before the statements that do not wait on each
# other's answers were sent together, and a start call and a start mark after them.
ROUND_TRIPS_PER_POST = 4
MARK = "UPDATE turns SET workflow_started_at"


async def test_a_turn_costs_the_api_a_fixed_number_of_statements(
    settings: Settings,
    worker: DemoModel,
    tokens: dict[str, str],
    sessions: Database,
) -> None:
    async with api_in_process(settings, tokens["marco"]) as (app, client):
        session_id = await client.new_session()
        sent: list[str] = []

        def count(statement: str) -> None:
            sent.append(statement.strip().split("\n")[0][:80])

        # Through SQLAlchemy or on psycopg's connection from the same pool (`store.db.Db`).
        stops = [on_statement_sent(engine, count) for engine in app.state.engines]
        transactions: list[str] = []
        stops += [on_transaction_sent(engine, transactions.append) for engine in app.state.engines]
        turn_id, events = await client.turn(session_id, "Tell me about yourself, please.")
        assert events[-1].type == "done"

        async def let_go() -> bool:  # the stream's end drops its lease and its viewer
            async with orm(sessions) as db:
                viewers = await db.scalar(
                    text("SELECT viewers FROM turns WHERE id = :id"), {"id": turn_id}
                )
            return viewers == 0

        await eventually(let_go, timeout=30, what="the stream lets its turn go")
        for stop in stops:
            stop()
    assert len(sent) <= STATEMENTS_PER_TURN, "\n".join(sent)
    # The POST's unit of work and the stream's lease; nothing rolled back (a rollback also
    # drops the connection's prepared statements: store/db.py).
    print(f"a turn in the API: {transactions}")
    assert transactions == ["BEGIN", "COMMIT"] * TRANSACTIONS_PER_TURN, transactions


async def test_a_new_turns_post_takes_a_fixed_number_of_round_trips(
    settings: Settings,
    worker: DemoModel,
    tokens: dict[str, str],
    sessions: Database,
) -> None:
    async with api_in_process(settings, tokens["marco"]) as (app, client):
        session_id = await client.new_session()
        sent: list[str] = []

        def count(statement: str) -> None:
            sent.append(statement.strip().split("\n")[0][:80])

        stops = [on_statement_sent(engine, count) for engine in app.state.engines]
        try:
            posted = await client.post(session_id, "Tell me about yourself, please.")
            assert posted.status_code == 202, posted.text
            turn_id = posted.json()["turn_id"]

            async def started() -> bool:  # the worker that starts it marks it
                async with orm(sessions) as db:
                    at = await db.scalar(
                        text("SELECT workflow_started_at FROM turns WHERE id = :id"),
                        {"id": turn_id},
                    )
                return at is not None

            await eventually(started, timeout=30, what="the turn is marked started")
        finally:
            for stop in stops:
                stop()
    answered = [s for s in sent if not s.startswith(MARK)] + ["COMMIT"]
    print(f"a new turn's POST: {len(answered)} round trips")
    assert len(answered) <= ROUND_TRIPS_PER_POST, "\n".join(answered)
