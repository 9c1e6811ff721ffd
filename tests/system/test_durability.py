"""Crashes: a worker killed with SIGKILL mid-stream, an API that dies before starting a turn.

These run real worker processes (not in-process workers) on their own task queue, so a
`kill -9` is exactly what an SRE's restart or an OOM kill does.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from sqlalchemy import func, select

from parley.config import Settings
from parley.store import posting
from parley.store.db import Database
from parley.store.identity import Identity
from parley.store.models import Message, ModelCall, ModelCost
from tests.support.client import ParleyClient, streamed_text
from tests.support.orm import orm
from tests.support.processes import Workers, read_until
from tests.support.sse import Event, iter_events
from tests.support.stack import LIFTED_LIMITS, own_queue, serve_api

PRIYA = Identity(tenant_id="northwind", user_id="cust_2291", roles=())


@pytest.fixture(scope="module")
def crash_settings(settings: Settings) -> Settings:
    # Slow tokens so there is time to kill the worker while the answer streams.
    return own_queue(settings, "crash", demo_token_delay_ms=60)


@pytest.fixture
def workers(crash_settings: Settings) -> Iterator[Workers]:
    pool = Workers(crash_settings)
    yield pool
    pool.stop_all()


@pytest_asyncio.fixture(scope="module")
async def crash_api(crash_settings: Settings, sessions: object) -> AsyncIterator[str]:
    async with serve_api(crash_settings) as url:
        yield url


async def test_worker_killed_mid_stream_resumes_with_reset_and_stores_one_answer(
    crash_api: str,
    tokens: dict[str, str],
    workers: Workers,
    sessions: Database,
) -> None:
    client = ParleyClient(crash_api, tokens["priya"])
    try:
        first_worker = workers.start()
        session_id = await client.new_session()
        posted = await client.post(session_id, "Tell me about yourself, please.")
        assert posted.status_code == 202
        url = posted.json()["events_url"]

        before = await read_until(client, url, after=0, stop="delta")
        assert before[-1].type == "delta", [e.type for e in before]
        first_worker.send_signal(signal.SIGKILL)
        first_worker.wait(10)
        partial = streamed_text(before)

        workers.start()
        after = await read_until(client, url, after=before[-1].id or 0, stop="done")
        events = before + after
        assert [e.id for e in events] == list(range(1, len(events) + 1))
        assert events[-1].type == "done", [e.type for e in events]
        kinds = [e.type for e in events]
        assert "reset" in kinds
        reset_at = kinds.index("reset")
        assert "delta" in kinds[:reset_at] and "delta" in kinds[reset_at:]

        final = events[-1].data["message"]
        # The client applying deltas and the reset in order shows the whole answer once.
        assert streamed_text(events) == final["text"]
        assert len(partial) < len(final["text"])
        assert final["text"].count("I can look up") == 1

        async with orm(sessions) as db:
            stored = (
                await db.scalars(
                    select(Message).where(
                        Message.session_id == session_id, Message.role == "assistant"
                    )
                )
            ).all()
            calls = (
                await db.scalars(
                    select(ModelCall).where(ModelCall.turn_id == posted.json()["turn_id"])
                )
            ).all()
            billed = (
                await db.scalars(select(ModelCost).where(ModelCost.session_id == session_id))
            ).all()
        assert [m.text for m in stored] == [final["text"]]
        assert [c.attempts for c in calls] == [2]
        # Billed once, for the attempt that answered: the ledger's row is the call's.
        assert [(b.key, b.turn_id) for b in billed] == [(f"call:{calls[0].id}", calls[0].turn_id)]
        assert calls[0].usage is not None
        assert billed[0].output_tokens == calls[0].usage["output_tokens"] > 0
        assert billed[0].cost_usd is not None and billed[0].cost_usd > 0
    finally:
        await client.aclose()


async def test_a_turn_the_api_never_started_is_started_by_the_outbox_within_30s(
    crash_api: str,
    tokens: dict[str, str],
    workers: Workers,
    sessions: Database,
) -> None:
    workers.start()
    client = ParleyClient(crash_api, tokens["priya"])
    try:
        session_id = await client.new_session()
        # Exactly what the API commits before it would start the workflow; then it "dies".
        async with sessions() as db:
            posted = await posting.post_user_message(
                db,
                owner=PRIYA,
                session_id=session_id,
                client_message_id=uuid.uuid4().hex,
                text="Is anyone there?",
                expected_last_seq=None,
                limits=LIFTED_LIMITS,
            )
            await db.commit()
        started = time.monotonic()
        url = f"/v1/sessions/{session_id}/turns/{posted.turn.id}/events"
        events = await asyncio.wait_for(read_until(client, url, after=0, stop="done"), 30)
        assert events[-1].type == "done"
        assert time.monotonic() - started < 30
        async with orm(sessions) as db:
            count = await db.scalar(
                select(func.count()).where(
                    Message.session_id == session_id, Message.role == "assistant"
                )
            )
        assert count == 1
    finally:
        await client.aclose()


async def test_worker_killed_once_the_context_is_built_answers_once(
    crash_api: str,
    tokens: dict[str, str],
    workers: Workers,
    sessions: Database,
) -> None:
    """The step boundary after context building: the kill lands as the model step starts
    (its `calling_model` state is the stream's signal), before or around its first token."""
    client = ParleyClient(crash_api, tokens["priya"])
    try:
        first_worker = workers.start()
        session_id = await client.new_session()
        posted = await client.post(session_id, "Tell me about yourself, please.")
        url = posted.json()["events_url"]
        before: list[Event] = []
        async with client.http.stream("GET", url, timeout=90) as response:
            async for event in iter_events(response):
                before.append(event)
                if event.type == "state" and event.data["state"] == "calling_model":
                    break
        assert before[-1].type == "state", [e.type for e in before]
        first_worker.send_signal(signal.SIGKILL)
        first_worker.wait(10)

        workers.start()
        after = await read_until(client, url, after=before[-1].id or 0, stop="done")
        events = before + after
        assert [e.id for e in events] == list(range(1, len(events) + 1))
        assert events[-1].type == "done", [e.type for e in events]
        assert [e.type for e in events].count("done") == 1
        final = events[-1].data["message"]
        assert streamed_text(events) == final["text"]
        assert final["text"].count("I can look up") == 1
        async with orm(sessions) as db:
            stored = (
                await db.scalars(
                    select(Message.text).where(
                        Message.session_id == session_id, Message.role == "assistant"
                    )
                )
            ).all()
        assert list(stored) == [final["text"]]
    finally:
        await client.aclose()
