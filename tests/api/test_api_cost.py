"""What a turn costs the API in statements to PostgreSQL: one POST and one event stream
followed to `done`. Each statement is a round trip and a few hundred microseconds of the
API's CPU (the bench reports that CPU per turn); this keeps the count from creeping back."""

from __future__ import annotations

from sqlalchemy import text

from parley.config import Settings
from parley.gateway.demo import DemoModel
from parley.store.db import Database, on_statement_sent
from tests.support.orm import orm
from tests.support.stack import api_in_process
from tests.support.toolkit import eventually

# POST: the token, the session's lock, the earlier post and the session's turns with the
# user's lock, the running turns with the tenant, the counters (in a savepoint: two more), the
# message with its turn and `received` event, the start mark. Stream: the token, the turn
# with the user's stream lock, the lease, the first read with the viewer, the lease's end.
STATEMENTS_PER_TURN = 14


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
