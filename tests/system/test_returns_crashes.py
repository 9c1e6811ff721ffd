"""Issue 17, acceptance 2: a worker killed with SIGKILL while the Returns specialist waits
for the user, and again while it runs a tool (the return-window check, held open by the
backend's `latency_ms`): new workers finish the conversation, with one return.

Real worker processes on their own task queue, a real API in this process, a Northwind
backend of this module's own over HTTP.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from parley.config import Settings
from parley.demo_backend.app import create_app as create_backend
from parley.ids import return_idempotency_key
from tests.support.client import ParleyClient
from tests.support.processes import Workers, read_until
from tests.support.sse import Event
from tests.support.stack import own_queue, serve, serve_api
from tests.support.zygote import Forked

# A ~5 s heartbeat or sticky-queue timeout for the killed worker's work, plus a start-up.
RECOVERY_S = 45


@pytest_asyncio.fixture(scope="module")
async def backend_url() -> AsyncIterator[str]:
    """A backend of this module's own: its faults and returns touch no other test."""
    async with serve(create_backend()) as url:
        yield url


@pytest.fixture(scope="module")
def crash_settings(settings: Settings, backend_url: str) -> Settings:
    return own_queue(settings, "returncrash", tool_timeout_s=10.0, northwind_url=backend_url)


@pytest.fixture
def workers(crash_settings: Settings) -> Iterator[Workers]:
    pool = Workers(crash_settings)
    yield pool
    pool.stop_all()


@pytest_asyncio.fixture(scope="module")
async def crash_api(crash_settings: Settings, sessions: object) -> AsyncIterator[str]:
    async with serve_api(crash_settings) as url:
        yield url


def kill(process: Forked) -> None:
    assert process.poll() is None, "the worker died before the test killed it"
    process.send_signal(signal.SIGKILL)
    process.wait(10)


async def follow(client: ParleyClient, url: str, *, after: int, stop: str) -> list[Event]:
    return await asyncio.wait_for(read_until(client, url, after=after, stop=stop), RECOVERY_S)


async def answer(client: ParleyClient, sid: str, text: str, value: str) -> str:
    body = {"client_message_id": uuid.uuid4().hex, "text": text, "interaction_value": value}
    posted = await client.http.post(f"/v1/sessions/{sid}/messages", json=body)
    assert posted.status_code == 202, posted.text
    return str(posted.json()["turn_id"])


async def test_worker_killed_while_the_specialist_waits_and_while_it_runs_a_tool(
    crash_api: str,
    crash_settings: Settings,
    tokens: dict[str, str],
    workers: Workers,
    specialists_on: None,
) -> None:
    client = ParleyClient(crash_api, tokens["priya"])
    northwind = httpx.AsyncClient(base_url=crash_settings.northwind_url)
    try:
        await _conversation_with_kills(client, northwind, workers)
    finally:
        await northwind.delete("/faults")
        await northwind.aclose()
        await client.aclose()


async def _conversation_with_kills(
    client: ParleyClient, northwind: httpx.AsyncClient, workers: Workers
) -> None:
    first = workers.start()
    sid = await client.new_session()
    posted = await client.post(sid, "I want to return something from order 8390.")
    assert posted.status_code == 202, posted.text
    turn_id = posted.json()["turn_id"]
    url = f"/v1/sessions/{sid}/turns/{turn_id}/events"
    events = await follow(client, url, after=0, stop="interaction")
    assert events[-1].type == "interaction", [e.type for e in events]

    # 1. Killed while the specialist waits for the user; the answer is kept by Temporal.
    kill(first)
    assert await answer(client, sid, "Trail Runner shoes, size 8", "8390-1") == turn_id
    second = workers.start()
    events += await follow(client, url, after=events[-1].id or 0, stop="interaction")
    assert events[-1].data["question"] == "Why are you returning it?"

    # 2. Killed while the return-window check runs (the backend holds its answer).
    faults = await northwind.post("/faults", json={"latency_ms": 20_000})
    assert faults.status_code == 200, faults.text
    assert await answer(client, sid, "Damaged", "damaged") == turn_id
    events += await follow(client, url, after=events[-1].id or 0, stop="tool")
    assert events[-1].data["name"] == "check_return_eligibility", events[-1].data
    assert events[-1].data["phase"] == "start"
    kill(second)
    await northwind.delete("/faults")
    workers.start()
    events += await follow(client, url, after=events[-1].id or 0, stop="confirmation_required")
    assert events[-1].type == "confirmation_required", [e.type for e in events]
    action = events[-1].data["action"]

    confirmed = await client.http.post(f"/v1/sessions/{sid}/actions/{action['id']}/confirm")
    assert confirmed.status_code == 202, confirmed.text
    events += await follow(client, url, after=events[-1].id or 0, stop="done")
    assert events[-1].type == "done", [e.type for e in events]
    assert [e.id for e in events] == list(range(1, len(events) + 1))
    kinds = [e.type for e in events]
    assert kinds.count("interaction") == 2
    assert [e.data["phase"] for e in events if e.type == "subagent"] == ["start", "end"]

    key = return_idempotency_key(action_id=action["id"])
    made: list[Any] = [
        r
        for r in (await northwind.get("/returns")).json()["returns"]
        if r["idempotency_key"] == key
    ]
    assert len(made) == 1 and (made[0]["item_id"], made[0]["reason"]) == ("8390-1", "damaged")
    assert made[0]["rma_id"] in events[-1].data["message"]["text"]
