"""The Temporal server killed and started again mid-turn: a dev server of this module's own,
persisting to a file (as `make run` starts it), killed with SIGKILL while an answer streams
and started again on the same file and port. The turn completes once: one assistant message,
the whole answer on the stream with nothing repeated or missing (a `reset` followed by the
whole answer is allowed: a heartbeat timeout may have retried the model call meanwhile).

The session's PostgreSQL and Northwind backend serve it; the worker and the API are the
module's own, pointed at this server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from sqlalchemy import select

from parley.config import Settings
from parley.gateway.demo import DemoModel
from parley.store.db import Database
from parley.store.models import Message, Turn
from tests.support.client import ParleyClient, streamed_text
from tests.support.orm import orm
from tests.support.processes import QUESTION, TemporalServer, follow
from tests.support.sse import Event
from tests.support.stack import free_port, own_queue, running_worker, serve_api
from tests.support.toolkit import eventually


@pytest.fixture(scope="module")
def chaos_settings(settings: Settings) -> Settings:
    return own_queue(
        settings,
        "chaos",
        temporal_address=f"127.0.0.1:{free_port()}",
        temporal_ui_port=free_port(),
        demo_token_delay_ms=40,
    )


@pytest.fixture(scope="module")
def temporal_server(
    chaos_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TemporalServer]:
    server = TemporalServer(chaos_settings, tmp_path_factory.mktemp("temporal") / "dev.db")
    server.start()
    yield server
    server.stop()


@pytest_asyncio.fixture(scope="module")
async def chaos_api(
    temporal_server: TemporalServer,
    chaos_settings: Settings,
    sessions: Database,
) -> AsyncIterator[str]:
    client = await temporal_server.connect()
    model = DemoModel(token_delay_s=chaos_settings.demo_token_delay_ms / 1000)
    async with (
        running_worker(client, chaos_settings, sessions, model),
        serve_api(chaos_settings) as url,
    ):
        yield url


async def test_temporal_restart_mid_answer_completes_the_turn_once(
    chaos_api: str,
    temporal_server: TemporalServer,
    chaos_settings: Settings,
    tokens: dict[str, str],
    sessions: Database,
) -> None:
    client = ParleyClient(chaos_api, tokens["priya"])
    try:
        # The same question before the restart: the answer the user must end up seeing.
        _, control = await client.turn(await client.new_session(), QUESTION)
        assert control[-1].type == "done", [(e.type, e.data) for e in control[-3:]]
        expected = control[-1].data["message"]["text"]

        session_id = await client.new_session()
        posted = await client.post(session_id, QUESTION)
        assert posted.status_code == 202, posted.text
        turn_id, url = posted.json()["turn_id"], posted.json()["events_url"]
        seen: list[Event] = []
        reader = asyncio.create_task(follow(client, url, seen, timeout=120))

        async def streaming() -> bool:
            assert not reader.done(), [e.type for e in seen]
            return any(e.type == "delta" for e in seen)

        await eventually(streaming, timeout=30, what="the answer started streaming")
        await asyncio.to_thread(temporal_server.kill)
        before_kill = len(seen)
        temporal_server.start()
        await reader

        # The kill came mid-answer: text streamed after it.
        assert any(e.type == "delta" for e in seen[before_kill:]), [e.type for e in seen]

        assert seen[-1].type == "done", [(e.type, e.data) for e in seen[-3:]]
        ids = [e.id for e in seen]
        assert ids == sorted(set(ids)), "an event was received twice or out of order"
        assert streamed_text(seen) == expected == seen[-1].data["message"]["text"]
        async with orm(sessions) as db:
            answers = list(
                await db.scalars(
                    select(Message.text).where(
                        Message.turn_id == turn_id,
                        Message.role == "assistant",
                        Message.replaced_by.is_(None),
                    )
                )
            )
            turn = await db.get(Turn, turn_id)
        assert answers == [expected]
        assert turn is not None and turn.state == "completed"

        # The restarted server runs new turns too.
        _, after = await client.turn(session_id, QUESTION)
        assert after[-1].type == "done", [(e.type, e.data) for e in after[-3:]]
    finally:
        await client.aclose()
