"""A posted turn's first context build begins beside its workflow's start, on the worker that
claimed the turn (activities/early_build.py), on the shared stack (real PostgreSQL, Temporal,
worker and API): the trace shows the build before the opening step, which built nothing of
its own, for a posted turn and for a queued one promoted when the turn before it ended (its
ring is claimed as a post's is); a turn whose claimer moved it to `building_context` and died
before the start is still started by the outbox sweep, and answered once."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import httpx
from sqlalchemy import select
from temporalio.client import Client

from parley.activities.context import ContextBuilder
from parley.config import Settings
from parley.contracts import BuildContextInput
from parley.dispatch.outbox import sweep_once
from parley.store.context import read_for_build
from parley.store.db import Database, connect
from parley.store.identity import Identity
from parley.store.models import Message, ModelCall, TraceSpan, Turn
from parley.worker import build_northwind
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.toolkit import eventually, post_unstarted, wait_for_stored_state

PRIYA = Identity(tenant_id="northwind", user_id="cust_2291", roles=())
PLAIN = "Thanks, that helps."  # one model step, no tools


async def unstarted_turn(sessions: Database, sid: str) -> str:
    """A plain turn committed without a ring: nobody claims it, nothing starts it."""
    async with sessions() as db:
        posted = await post_unstarted(db, owner=PRIYA, text=PLAIN, session_id=sid, for_sweep=True)
    assert posted.turn is not None
    return posted.turn.id


async def spans_of(sessions: Database, turn_id: str) -> list[TraceSpan]:
    """The turn's spans once its opening step's and its build's are written (the ledger
    writes them a moment after the step)."""
    found: list[TraceSpan] = []

    async def written() -> bool:
        async with orm(sessions) as db:
            rows = await db.scalars(select(TraceSpan).where(TraceSpan.turn_id == turn_id))
            found[:] = list(rows)
        return {"open_step", "build_context"} <= {s.name for s in found}

    await eventually(written, timeout=20, what="the turn's spans")
    return found


async def test_a_posted_turn_s_build_runs_before_its_first_step_which_builds_nothing(
    priya: ParleyClient, sessions: Database
) -> None:
    sid = await priya.new_session()
    turn_id, events = await priya.turn(sid, PLAIN)
    assert events[-1].type == "done", events
    spans = await spans_of(sessions, turn_id)
    builds = [s for s in spans if s.name == "build_context"]
    opening = next(s for s in spans if s.name == "open_step")
    assert len(builds) == 1, [(s.name, s.started_at) for s in spans]
    # Begun beside the start, before the workflow's first step ran; a step that built for
    # itself would show its build inside the step.
    assert builds[0].started_at < opening.started_at
    states = [e.data["state"] for e in events if e.type == "state"]
    assert states == ["received", "building_context", "calling_model", "completed"], states


async def test_a_promoted_turn_is_claimed_and_built_beside_its_start_too(
    priya: ParleyClient, sessions: Database
) -> None:
    sid = await priya.new_session()
    await priya.post(sid, "Tell me everything about my orders")
    queued = await priya.post(sid, PLAIN)
    assert queued.json()["state"] == "queued"
    turn_id = queued.json()["turn_id"]
    events = await asyncio.wait_for(priya.events(sid, turn_id), 60)
    assert events[-1].type == "done", events
    spans = await spans_of(sessions, turn_id)
    builds = [s for s in spans if s.name == "build_context"]
    opening = next(s for s in spans if s.name == "open_step")
    assert len(builds) == 1 and builds[0].started_at < opening.started_at


async def test_a_turn_whose_claimer_began_its_build_and_died_is_started_by_the_sweep(
    priya: ParleyClient, sessions: Database, temporal_client: Client, settings: Settings
) -> None:
    turn_id = await unstarted_turn(sessions, await priya.new_session())
    # What an early build does first (its read moves the turn), then its worker is gone.
    async with connect(sessions) as conn:
        read = await read_for_build(conn, turn_id, 0, move=True, recent_turns=3)
    assert read.moved
    started = await sweep_once(
        temporal_client, sessions, task_queue=settings.task_queue, grace=timedelta(0)
    )
    assert started >= 1
    await wait_for_stored_state(sessions, turn_id, {"completed"}, timeout=30)
    async with orm(sessions) as db:
        turn = await db.get(Turn, turn_id)
        assert turn is not None and turn.workflow_started_at is not None
        answers = list(
            await db.scalars(
                select(Message).where(Message.turn_id == turn_id, Message.role == "assistant")
            )
        )
        calls = list(await db.scalars(select(ModelCall).where(ModelCall.turn_id == turn_id)))
    assert len(answers) == 1 and answers[0].status == "complete"
    assert len(calls) == 1  # built once: by the step, the early build having stored nothing


async def test_two_builds_of_one_step_store_one_request_and_both_answer_with_it(
    priya: ParleyClient, sessions: Database, settings: Settings
) -> None:
    """The early build on the claiming worker and a first step on another (its eager start
    refused) may build the same step at once: the second finds the first's request, a read,
    where it used to fail its attempt on the step's unique call and wait for a retry."""
    turn_id = await unstarted_turn(sessions, await priya.new_session())
    async with httpx.AsyncClient() as http:
        northwind = build_northwind(settings, http, time.monotonic)
        builders = [
            ContextBuilder(sessions=sessions, settings=settings, northwind=northwind)
            for _ in range(2)
        ]
        built = await asyncio.gather(*(b.build(BuildContextInput(turn_id)) for b in builders))
    assert built[0].model_call_id == built[1].model_call_id
    async with orm(sessions) as db:
        calls = list(await db.scalars(select(ModelCall.id).where(ModelCall.turn_id == turn_id)))
    assert calls == [built[0].model_call_id]
