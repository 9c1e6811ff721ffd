"""(d) Time from POST to `done` with and without rolling summaries, interleaved in one run.

A customer reads an answer before typing the next message, so each turn is followed by a
reading pause (`--reading-pause-s`, awaited). Two sessions run the same script, one with the
tenant's summaries on and one with them off; their turns alternate, and which row goes first
alternates by round, so a change in the machine's load falls on both rows alike. The switch
is the tenant's and a summary run reads it when it begins (activities/memory.py), so before
the switch is flipped for the other row the bench waits for the last turn's workflow to close
and then for its session's summary workflow, if the turn started or signalled it
(`start_summary` asks only when there is work: messages to embed or enough past the window to
fold; the "without" row and short sessions start none): every summary run saw the switch of
its own row.

Each row reports p50 and p95 and the summaries written in its session while it ran: the
"with" row provably had summaries running (each folds the turns that left the window while
the customer was reading); the "without" row writes none.
"""

from __future__ import annotations

import asyncio
import statistics
from typing import Any

from sqlalchemy import func, select, update
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from bench.runner import ParleyTarget, run_turn
from parley.config import Settings
from parley.ids import summary_workflow_id, workflow_id_for_turn
from parley.store.db import Database
from parley.store.models import ConversationSummary, Tenant
from tests.support.client import ParleyClient
from tests.support.orm import orm

ROWS = ("summaries_on", "summaries_off")


async def set_summaries(db_sessions: Database, on: bool) -> None:
    async with orm(db_sessions) as db:
        tenant = await db.get(Tenant, "northwind")
        assert tenant is not None
        config = dict(tenant.config or {})
        config["summaries"] = on
        await db.execute(update(Tenant).where(Tenant.id == "northwind").values(config=config))
        await db.commit()


async def _summaries(db_sessions: Database, sid: str) -> int:
    async with orm(db_sessions) as db:
        count = await db.scalar(
            select(func.count())
            .select_from(ConversationSummary)
            .where(ConversationSummary.session_id == sid)
        )
        return int(count or 0)


async def _summary_closed(temporal: Client, turn_id: str, session_id: str) -> None:
    """Wait for the turn's workflow to close (its last step, `start_summary`, runs after
    `done`), then for its session's summary workflow, which that step started or signalled
    (one per session at a time: the result follows it through continue-as-new). Once the
    turn's workflow has closed, a session without one never had a summary run."""
    await temporal.get_workflow_handle(workflow_id_for_turn(turn_id)).result()
    summary = temporal.get_workflow_handle(summary_workflow_id(session_id=session_id))
    try:
        await summary.describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return
        raise
    await summary.result()


async def time_to_done(
    client: ParleyClient,
    db_sessions: Database,
    settings: Settings,
    script: list[str],
    *,
    turns: int,
    pause_s: float,
) -> dict[str, Any]:
    temporal = await Client.connect(
        settings.temporal_address, namespace=settings.temporal_namespace
    )
    target = ParleyTarget(client.http)
    sessions = {row: await client.new_session() for row in ROWS}
    times: dict[str, list[float]] = {row: [] for row in ROWS}
    # What the answer's own length explains: the first delta comes before the answer streams,
    # and the demo model streams at a fixed pace per token.
    first: dict[str, list[float]] = {row: [] for row in ROWS}
    chars: dict[str, list[int]] = {row: [] for row in ROWS}
    for i in range(turns):
        for row in ROWS if i % 2 == 0 else ROWS[::-1]:
            await set_summaries(db_sessions, row == "summaries_on")
            turn = await run_turn(target, sessions[row], script[i % len(script)])
            if not turn.ok or turn.total_s is None or target.last_turn_id is None:
                raise RuntimeError(f"{row} turn {i + 1} failed: {turn.error}")
            times[row].append(turn.total_s * 1000)
            first[row].append((turn.first_delta_s or 0.0) * 1000)
            chars[row].append(turn.chars)
            await asyncio.sleep(pause_s)  # the customer reads the answer
            await _summary_closed(temporal, target.last_turn_id, sessions[row])
    await set_summaries(db_sessions, True)
    return {
        "reading_pause_s": pause_s,
        "rows": {
            row: {
                "times_ms": times[row],
                "first_delta_ms": first[row],
                "answer_chars": chars[row],
                "summaries_written": await _summaries(db_sessions, sessions[row]),
            }
            for row in ROWS
        },
    }


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def render_done(d: dict[str, Any]) -> list[str]:
    if not d.get("rows"):
        return []
    lines = [
        f"(d) Time from POST to `done` (ms), summaries on and off interleaved in one run, "
        f"{d['reading_pause_s']:g} s reading pause after each answer",
        f"  {'':<14}{'p50':>8}{'p95':>8}{'mean':>8}{'turns':>7}{'summaries written':>19}"
        f"{'first delta p50':>17}{'answer chars':>14}",
    ]
    for row, r in d["rows"].items():
        t = r["times_ms"]
        lines.append(
            f"  {row:<14}{statistics.median(t):>8.1f}{_p95(t):>8.1f}{statistics.fmean(t):>8.1f}"
            f"{len(t):>7}{r['summaries_written']:>19}"
            f"{statistics.median(r['first_delta_ms']):>17.1f}{statistics.fmean(r['answer_chars']):>14.0f}"
        )
    on, off = (statistics.median(d["rows"][row]["times_ms"]) for row in ROWS)
    lines.append(f"  p50 on / off: {on / off:.2f}x")
    return lines
