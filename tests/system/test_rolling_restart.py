"""A rolling restart that nobody notices (issue 13, acceptance 2).

Twenty turns are in flight on one worker process: answers streaming, read tools held by the
backend, proposals waiting for the user's confirmation. The worker gets SIGTERM (what a deploy
sends) and a new one starts beside it. The draining worker finishes the steps it holds (its
graceful shutdown is long enough for a whole answer), the new one takes every later step.
Checked: every turn completes; each stream, one connection held across the restart, gets every
event in order with no reset; each tool ran once at the backend and each email was sent once.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import httpx
import pytest
import pytest_asyncio
from sqlalchemy import func, select

from parley.config import Settings
from parley.store.db import Database
from parley.store.models import ToolCall
from tests.support.client import ParleyClient, streamed_text
from tests.support.orm import orm
from tests.support.processes import Workers
from tests.support.sse import TERMINAL, Event, iter_events
from tests.support.stack import own_queue, serve_api
from tests.support.toolkit import emails, eventually

STREAMING, TOOLS, CONFIRMING = 8, 6, 6  # twenty turns in flight
HELD_TOOL_MS = 2500


@pytest.fixture(scope="module")
def rolling_settings(settings: Settings) -> Settings:
    return own_queue(
        settings,
        "rolling",
        # Answers long enough to be mid-stream at the SIGTERM; tool calls outlast the hold.
        demo_token_delay_ms=40,
        tool_timeout_s=10.0,
        max_streams_per_user=STREAMING + TOOLS + CONFIRMING,
    )


@pytest.fixture
def workers(rolling_settings: Settings) -> Iterator[Workers]:
    pool = Workers(rolling_settings)
    yield pool
    pool.stop_all()


@pytest_asyncio.fixture(scope="module")
async def rolling_api(rolling_settings: Settings, sessions: object) -> AsyncIterator[str]:
    async with serve_api(rolling_settings) as url:
        yield url


@dataclass
class Followed:
    """One turn's stream, read on one connection until it ends or rests on a confirmation."""

    kind: str
    session_id: str
    turn_id: str
    events: list[Event] = field(default_factory=list)
    task: asyncio.Task[None] | None = None

    def saw(self, type_: str, **data: str) -> bool:
        return any(
            e.type == type_ and all(e.data.get(k) == v for k, v in data.items())
            for e in self.events
        )

    def follow(self, client: ParleyClient) -> None:
        self.task = asyncio.create_task(self._read(client))

    async def _read(self, client: ParleyClient) -> None:
        url = f"/v1/sessions/{self.session_id}/turns/{self.turn_id}/events"
        after = self.events[-1].id if self.events else 0
        headers = {"Last-Event-ID": str(after)}
        async with client.http.stream("GET", url, headers=headers, timeout=120) as response:
            assert response.status_code == 200
            async for event in iter_events(response):
                self.events.append(event)
                if event.type in TERMINAL:
                    return


async def _start(client: ParleyClient, kind: str, text: str, session_id: str = "") -> Followed:
    session_id = session_id or await client.new_session()
    posted = await client.post(session_id, text)
    assert posted.status_code == 202, posted.text
    followed = Followed(kind, session_id, posted.json()["turn_id"])
    followed.follow(client)
    return followed


async def _proposal(client: ParleyClient) -> Followed:
    """A session whose second turn rests on an email proposal."""
    session_id = await client.new_session()
    _, events = await client.turn(session_id, "Where is my order?")
    assert events[-1].type == "done", [e.type for e in events]
    followed = await _start(client, "confirm", "Can you email me?", session_id)
    assert followed.task is not None
    await followed.task
    assert followed.events[-1].type == "confirmation_required", [e.type for e in followed.events]
    return followed


async def test_a_rolling_restart_with_twenty_turns_in_flight_loses_and_repeats_nothing(
    rolling_api: str,
    tokens: dict[str, str],
    workers: Workers,
    northwind: httpx.AsyncClient,
    sessions: Database,
) -> None:
    client = ParleyClient(rolling_api, tokens["priya"])
    old = workers.start()
    try:
        proposals = await asyncio.gather(*(_proposal(client) for _ in range(CONFIRMING)))
        await northwind.delete("/stats")
        await northwind.post("/faults", json={"latency_ms": HELD_TOOL_MS})
        in_flight = await asyncio.gather(
            *(
                _start(client, "stream", "Tell me about yourself, please.")
                for _ in range(STREAMING)
            ),
            *(_start(client, "tool", "Where is my order?") for _ in range(TOOLS)),
        )

        async def all_underway() -> bool:
            return all(
                f.saw("delta") if f.kind == "stream" else f.saw("tool", phase="start")
                for f in in_flight
            )

        await eventually(all_underway, timeout=30, what="every turn streaming or in its tool")
        old.send_signal(signal.SIGTERM)  # the deploy: drain the old worker...
        restarted_at = time.monotonic()
        workers.start()  # ...and start the new one beside it
        await northwind.delete("/faults")
        for proposal in proposals:  # the users confirm while the restart is under way
            action = proposal.events[-1].data["action"]
            confirmed = await client.http.post(
                f"/v1/sessions/{proposal.session_id}/actions/{action['id']}/confirm"
            )
            assert confirmed.status_code == 202, confirmed.text
            proposal.follow(client)

        everything = [*in_flight, *proposals]
        await asyncio.wait_for(
            asyncio.gather(*(f.task for f in everything if f.task is not None)), 90
        )
        print(
            f"\n{len(everything)} turns done {time.monotonic() - restarted_at:.1f} s after SIGTERM"
        )
        assert await asyncio.to_thread(old.wait, 60) == 0, "the old worker drained and exited"
    finally:
        await northwind.delete("/faults")
        await client.aclose()

    for followed in everything:
        kinds = [e.type for e in followed.events]
        assert kinds[-1] == "done", (followed.kind, kinds)
        assert [e.id for e in followed.events] == list(range(1, len(kinds) + 1)), followed.kind
        assert "reset" not in kinds, f"a {followed.kind} turn's stream was restarted"
        # What the client shows is the stored answer (a confirmed turn's answer follows
        # its proposal, so it is read from the confirmation on).
        rested = kinds.index("confirmation_required") + 1 if followed.kind == "confirm" else 0
        shown = streamed_text(followed.events[rested:])
        assert shown == followed.events[-1].data["message"]["text"], followed.kind

    # Each held tool ran once at the backend and stored one result; each email went once.
    stats = (await northwind.get("/stats")).json()["calls"]
    assert stats["list_orders"] == TOOLS
    assert stats["send_email"] == CONFIRMING
    async with orm(sessions) as db:
        for followed in in_flight:
            stored = await db.scalar(
                select(func.count()).where(ToolCall.turn_id == followed.turn_id)
            )
            assert stored == (1 if followed.kind == "tool" else 0)
    for proposal in proposals:
        action_id = proposal.events[
            [e.type for e in proposal.events].index("confirmation_required")
        ].data["action"]["id"]
        assert len(await emails(northwind, action_id=action_id)) == 1
