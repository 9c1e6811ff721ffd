"""What one context build costs the worker, in process: CPU milliseconds and statements.

The bench's stage table (h) times the build on the wall clock, beside everything else the
machine runs; this probe takes the build alone. It starts an embedded PostgreSQL of its own,
seeds the demo tenant (its knowledge library too, as the demo seed does), stores a session of
`--turns` minus one plain turns (ten by default) and posts the next, then builds that turn's
step-0 context `--builds` times with the real `ContextBuilder` (the worker's own wiring:
knowledge, no embedder), the turn put back in `received` between builds (on another engine,
not counted). It prints the process's CPU per build (`time.process_time`, so other processes
on a shared machine do not count; the database server's own CPU is not in it) and the
statements each build sent.

    .venv/bin/python -m bench.context_probe [--builds 200] [--turns 11] [--profile out.prof]
        [--dump out.json]

`--turns 1` to `--turns 5` probe what bench (a) measures: the first turns of a fresh session,
whose window holds the whole conversation (no recall search, nothing dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import cProfile
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from sqlalchemy import text

from parley.activities.context import ContextBuilder
from parley.activities.handover import Handover
from parley.activities.knowledge import KnowledgeSource
from parley.config import Settings
from parley.contracts import BuildContextInput
from parley.launch.knowledge import load_library, read_library
from parley.store.db import (
    Database,
    create_socket_checked_engine,
    on_statement_sent,
    on_transaction_sent,
)
from parley.store.embedded import EmbeddedPostgres
from parley.store.identity import Identity, seed_demo
from parley.store.migrate import upgrade
from parley.store.sessions import create_session
from parley.worker import build_northwind
from tests.support.orm import orm
from tests.support.toolkit import post_unstarted

OWNER = Identity(tenant_id="northwind", user_id="cust_2291", roles=("customer",))
# The probed turn's place in its session (the turns before it are stored finished).
TURNS = 11
ANSWER = (
    "I am the Northwind shop's assistant. I can look up your orders and refunds, explain our "
    "return policy, and email you a summary of an order once you confirm it."
)


async def seed(url: str, turns: int) -> str:
    """The demo seed, a session of `turns - 1` finished plain turns and a posted one; its
    id."""
    engine = create_socket_checked_engine(url)
    try:
        async with Database(engine)() as db:
            await seed_demo(db)
            await load_library(db, read_library())
            session_id = (await create_session(db, owner=OWNER)).id
            await db.commit()
        for i in range(turns):
            async with Database(engine)() as db:
                text_ = f"Tell me about yourself, please ({i})."
                posted = await post_unstarted(db, owner=OWNER, text=text_, session_id=session_id)
                assert posted.turn is not None  # no hand-off holds the probe's session
                turn_id = posted.turn.id
            if i == turns - 1:
                return turn_id
            async with orm(Database(engine)) as db:
                await db.execute(_FINISH, {"turn": turn_id, "session": session_id, "text": ANSWER})
                await db.commit()
    finally:
        await engine.dispose()
    raise AssertionError("unreachable")


# A finished plain turn: its answer stored with the session's next seq, the session free.
_FINISH = text("""
    WITH seq AS (
        UPDATE sessions SET last_seq = last_seq + 1, active_turn_id = NULL
        WHERE id = :session RETURNING last_seq
    ), answer AS (
        INSERT INTO messages (id, session_id, seq, role, turn_id, status, text)
        SELECT 'msg_' || md5(random()::text), :session, seq.last_seq, 'assistant', :turn,
            'complete', :text
        FROM seq RETURNING id
    )
    UPDATE turns SET state = 'completed', assistant_message_id = (SELECT id FROM answer)
    WHERE id = :turn
""")
_REQUEST = text("SELECT request FROM model_calls WHERE turn_id = :turn AND step = 0")
# The turn as it was posted: no model call, no event after the first, in `received`.
_RESET = (
    text("DELETE FROM model_calls WHERE turn_id = :turn"),
    text("DELETE FROM turn_events WHERE turn_id = :turn AND id > 1"),
    text(
        "UPDATE turns SET state = 'received', last_event_id = 1, resolution = NULL WHERE id = :turn"
    ),
)


async def probe(
    url: str, turn_id: str, builds: int, profile: Path | None, dump: Path | None, *, turns: int
) -> None:
    settings = Settings(database_url=url, knowledge_passages=3)
    engine = create_socket_checked_engine(url)
    resets = create_socket_checked_engine(url, pool_size=1)
    sent: list[str] = []
    on_statement_sent(engine, lambda sql: sent.append(sql.strip().split("\n")[0][:70]))
    # A transaction costs round trips more (psycopg's BEGIN, and the COMMIT or ROLLBACK); the
    # engine's `begin` event, listened to before, never fires for a `Db`'s statements.
    on_transaction_sent(engine, sent.append)
    cpu: list[float] = []
    wall: list[float] = []  # the round trips' waits too (noisy on a shared machine)
    counts: list[int] = []
    profiler = cProfile.Profile(time.process_time) if profile else None
    try:
        async with httpx.AsyncClient() as http:
            builder = ContextBuilder(
                sessions=Database(engine),
                settings=settings,
                northwind=build_northwind(settings, http),
                knowledge=KnowledgeSource(passages=settings.knowledge_passages),
                asked=Handover(),  # as the worker: step 0 hands the message to the screen
            )
            for i in range(builds + 5):
                async with resets.begin() as conn:
                    for statement in _RESET:
                        await conn.execute(statement, {"turn": turn_id})
                sent.clear()
                if profiler and i >= 5:
                    profiler.enable()
                started, began = time.process_time(), time.perf_counter()
                await builder.build(BuildContextInput(turn_id=turn_id, step=0))
                spent, took = time.process_time() - started, time.perf_counter() - began
                if profiler and i >= 5:
                    profiler.disable()
                if i >= 5:  # the first builds fill the caches (statements, the pool)
                    cpu.append(spent * 1000)
                    wall.append(took * 1000)
                    counts.append(len(sent))
                last = list(sent)
            if dump is not None:  # the last build's stored request, to compare two versions
                async with resets.connect() as conn:
                    stored = await conn.scalar(_REQUEST, {"turn": turn_id})
                dump.write_text(json.dumps(stored, indent=1, sort_keys=True))
    finally:
        await engine.dispose()
        await resets.dispose()
    if profiler and profile:
        profiler.dump_stats(profile)
    print(f"builds: {len(cpu)} of turn {turns} of its session")
    # The low decile too: on a shared machine, contention inflates even a process's own CPU.
    low = statistics.quantiles(cpu, n=10)[0]
    print(f"CPU ms per build: p50 {statistics.median(cpu):.2f}, p10 {low:.2f}")
    print(f"wall ms per build: p50 {statistics.median(wall):.2f}")
    print(f"round trips per build: {statistics.median(counts):.0f} (statements, BEGIN, COMMIT)")
    for line in last:
        print(f"  {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builds", type=int, default=200)
    parser.add_argument(
        "--turns", type=int, default=TURNS, help="the probed turn's place in its session (1: new)"
    )
    parser.add_argument("--profile", type=Path, default=None, help="cProfile's stats, CPU time")
    parser.add_argument("--dump", type=Path, default=None, help="the last stored request (JSON)")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="context-probe-")
    # Registered before the server starts, so it runs after the server's own exit handler
    # (handlers run last first), which leaves a lock file behind in the folder.
    atexit.register(shutil.rmtree, tmp, True)
    pg = EmbeddedPostgres(Path(tmp) / "data")
    url = pg.start()
    try:
        upgrade(url)
        turn_id = asyncio.run(seed(url, args.turns))
        asyncio.run(probe(url, turn_id, args.builds, args.profile, args.dump, turns=args.turns))
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
