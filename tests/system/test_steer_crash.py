"""A steer survives the worker: kill -9 of the worker right after a message steered the
running answer, and the turn still takes it, once (issue 42, acceptance 4).

A real worker process on a task queue of its own, the demo model at 120 ms a token."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from sqlalchemy import func, select

from parley.config import Settings
from parley.statuses import FinishReason
from parley.store.db import Database
from parley.store.models import Message, Turn
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.processes import QUESTION, Workers, read_until
from tests.support.stack import own_queue, serve_api
from tests.support.toolkit import model_calls

STEER = "Never mind that: when does the Seattle store open?"


@pytest.fixture(scope="module")
def steer_crash_settings(settings: Settings) -> Settings:
    return own_queue(settings, "steercrash", demo_token_delay_ms=120)


@pytest.fixture
def workers(steer_crash_settings: Settings) -> Iterator[Workers]:
    pool = Workers(steer_crash_settings)
    yield pool
    pool.stop_all()


@pytest_asyncio.fixture(scope="module")
async def steer_api(steer_crash_settings: Settings, sessions: object) -> AsyncIterator[str]:
    async with serve_api(steer_crash_settings) as url:
        yield url


async def test_a_worker_killed_right_after_a_steer_still_takes_it_once(
    steer_api: str, tokens: dict[str, str], workers: Workers, sessions: Database
) -> None:
    client = ParleyClient(steer_api, tokens["priya"])
    try:
        first_worker = workers.start()
        sid = await client.new_session()
        posted = (await client.post(sid, QUESTION)).json()
        turn_id, url = posted["turn_id"], posted["events_url"]
        before = await read_until(client, url, after=0, stop="delta")
        assert before[-1].type == "delta", [e.type for e in before]
        steered = await client.post(sid, STEER, mode="steer")
        assert steered.status_code == 202 and steered.json()["steered"] is True
        first_worker.send_signal(signal.SIGKILL)
        first_worker.wait(10)

        workers.start()
        after = await read_until(client, url, after=before[-1].id or 0, stop="done")
        events = before + after
        assert [e.id for e in events] == list(range(1, len(events) + 1))
        assert events[-1].type == "done", [e.type for e in events]
        # Taken once: one announcement, one answer, and the steer in its model call only.
        [taken] = [e for e in events if e.type == "steered"]
        assert taken.data["message_id"] == steered.json()["message"]["id"]
        final = events[-1].data["message"]
        calls = await model_calls(sessions, turn_id)
        assert [c.finish_reason for c in calls] == [FinishReason.steered, FinishReason.stop]
        said = [str(m.get("content")) for m in calls[-1].request["messages"]]
        assert sum(STEER in text for text in said) == 1
        assert not any(STEER in str(m.get("content")) for m in calls[0].request["messages"])
        assert final["id"] != taken.data["superseded_message_id"]

        async with orm(sessions) as db:
            turns = await db.scalar(select(func.count()).where(Turn.session_id == sid))
            stored = (
                await db.execute(
                    select(Message.role, Message.text)
                    .where(Message.session_id == sid)
                    .order_by(Message.seq)
                )
            ).all()
        assert turns == 1
        assert [tuple(row) for row in stored] == [
            ("user", QUESTION),
            ("user", STEER),
            ("assistant", final["text"]),
        ]
    finally:
        await client.aclose()
