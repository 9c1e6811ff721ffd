"""Issue 30, acceptance 4: a specialist's answer survives an API crash.

The user answers the Returns specialist through an API process that is killed (`SIGKILL`,
by its fault-injection point `answer_committed`) after it committed the answer and before it
signalled the specialist. The worker's outbox sweep delivers the answer; the specialist takes
it once (one signal for that question in its history) and the conversation ends with one
return.

Real API and worker processes on their own task queue, a Northwind backend of this module's
own over HTTP; the rest of the conversation goes through an API in this process.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
import pytest_asyncio
from sqlalchemy import select
from temporalio.client import Client

from parley.config import Settings
from parley.contracts import ANSWER_INTERACTION_SIGNAL, InteractionAnswer
from parley.demo_backend.app import create_app as create_backend
from parley.dispatch.specialists import sweep_answers
from parley.ids import return_idempotency_key, specialist_workflow_id
from parley.store import interactions, posting
from parley.store import sessions as store_sessions
from parley.store.db import Database
from parley.store.identity import Identity
from parley.store.models import SpecialistAnswer
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.processes import Workers, read_until
from tests.support.sse import Event
from tests.support.stack import (
    LIFTED_LIMITS,
    free_port,
    own_queue,
    serve,
    serve_api,
    service_env,
    spawn,
)
from tests.support.toolkit import api_answers

# The sweep's grace and poll (1 s each in tests.processes.Workers) plus a worker start-up.
DELIVERY_S = 45


@pytest_asyncio.fixture(scope="module")
async def backend_url() -> AsyncIterator[str]:
    """A backend of this module's own: its returns touch no other test."""
    async with serve(create_backend()) as url:
        yield url


@pytest.fixture(scope="module")
def outbox_settings(settings: Settings, backend_url: str) -> Settings:
    return own_queue(settings, "answerbox", northwind_url=backend_url)


@pytest.fixture
def workers(outbox_settings: Settings) -> Iterator[Workers]:
    pool = Workers(outbox_settings)
    yield pool
    pool.stop_all()


@pytest.fixture
def crashing_api(outbox_settings: Settings) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """An API process that kills itself once it has committed a specialist's answer."""
    port = free_port()
    env = service_env(
        outbox_settings, PARLEY_API_PORT=str(port), PARLEY_FAULT_KILL_AT="answer_committed"
    )
    process = spawn(["-m", "parley.launch.cli", "api"], env)
    yield process, f"http://127.0.0.1:{port}"
    if process.poll() is None:
        process.kill()
    process.wait(10)


async def follow(client: ParleyClient, url: str, *, after: int, stop: str) -> list[Event]:
    return await asyncio.wait_for(read_until(client, url, after=after, stop=stop), DELIVERY_S)


def answer_body(text: str, value: str) -> dict[str, str]:
    return {"client_message_id": uuid.uuid4().hex, "text": text, "interaction_value": value}


async def test_an_answer_committed_by_an_api_killed_before_delivery_reaches_the_specialist_once(
    outbox_settings: Settings,
    crashing_api: tuple[subprocess.Popen[bytes], str],
    workers: Workers,
    tokens: dict[str, str],
    temporal_client: Client,
    sessions: Database,
    specialists_on: None,
) -> None:
    workers.start()
    crashing, crashing_url = crashing_api
    async with serve_api(outbox_settings) as api_url:
        client = ParleyClient(api_url, tokens["priya"])
        try:
            action_id, rma = await _conversation(
                client, crashing, crashing_url, tokens, temporal_client, sessions
            )
        finally:
            await client.aclose()
    async with httpx.AsyncClient(base_url=outbox_settings.northwind_url) as northwind:
        made: list[Any] = [
            r
            for r in (await northwind.get("/returns")).json()["returns"]
            if r["idempotency_key"] == return_idempotency_key(action_id=action_id)
        ]
    assert len(made) == 1 and (made[0]["item_id"], made[0]["reason"]) == ("8390-1", "damaged")
    assert made[0]["rma_id"] in rma


async def _conversation(
    client: ParleyClient,
    crashing: subprocess.Popen[bytes],
    crashing_url: str,
    tokens: dict[str, str],
    temporal_client: Client,
    sessions: Database,
) -> tuple[str, str]:
    """The conversation, the item's answer through the crashing API; the action's id and the
    closing words."""
    sid = await client.new_session()
    posted = await client.post(sid, "I want to return something from order 8390.")
    assert posted.status_code == 202, posted.text
    turn_id = posted.json()["turn_id"]
    url = f"/v1/sessions/{sid}/turns/{turn_id}/events"
    events = await follow(client, url, after=0, stop="interaction")
    assert events[-1].type == "interaction", [e.type for e in events]
    asked = events[-1].data["interaction_id"]

    # The answer goes to the API process that dies between its commit and its signal.
    await api_answers(crashing_url, timeout=60)
    headers = {"Authorization": f"Bearer {tokens['priya']}"}
    async with httpx.AsyncClient(base_url=crashing_url, headers=headers) as http:
        with pytest.raises(httpx.TransportError):
            await http.post(
                f"/v1/sessions/{sid}/messages",
                json=answer_body("Trail Runner shoes, size 8", "8390-1"),
            )
    assert crashing.wait(10) == -signal.SIGKILL
    async with orm(sessions) as db:
        stored = (
            await db.scalars(select(SpecialistAnswer).where(SpecialistAnswer.turn_id == turn_id))
        ).all()
    assert [(a.interaction_id, a.value) for a in stored] == [(asked, "8390-1")]

    # The worker's sweep delivers it: the specialist asks its next question.
    events += await follow(client, url, after=events[-1].id or 0, stop="interaction")
    assert events[-1].data["question"] == "Why are you returning it?", events[-1].data
    reason = await client.http.post(
        f"/v1/sessions/{sid}/messages", json=answer_body("Damaged", "damaged")
    )
    assert reason.status_code == 202, reason.text
    events += await follow(client, url, after=events[-1].id or 0, stop="confirmation_required")
    assert events[-1].type == "confirmation_required", [e.type for e in events]
    action = events[-1].data["action"]
    confirmed = await client.http.post(f"/v1/sessions/{sid}/actions/{action['id']}/confirm")
    assert confirmed.status_code == 202, confirmed.text
    events += await follow(client, url, after=events[-1].id or 0, stop="done")
    assert events[-1].type == "done", [e.type for e in events]
    assert [e.id for e in events] == list(range(1, len(events) + 1))
    assert [e.type for e in events].count("interaction") == 2

    # Each question's answer reached the specialist exactly once, and both rows are settled.
    signalled = await _answer_signals(temporal_client, turn_id)
    assert signalled == Counter({asked: 1, events_question_id(events): 1}), signalled
    async with orm(sessions) as db:
        undelivered = await db.scalars(
            select(SpecialistAnswer.id).where(
                SpecialistAnswer.turn_id == turn_id, SpecialistAnswer.delivered_at.is_(None)
            )
        )
        assert undelivered.all() == []
    return str(action["id"]), str(events[-1].data["message"]["text"])


def events_question_id(events: list[Event]) -> str:
    return str([e for e in events if e.type == "interaction"][-1].data["interaction_id"])


async def _answer_signals(temporal_client: Client, turn_id: str) -> Counter[str]:
    """How many answer signals the specialist's history holds, per question."""
    handle = temporal_client.get_workflow_handle(specialist_workflow_id(turn_id=turn_id))
    history = await handle.fetch_history()
    counted: Counter[str] = Counter()
    for event in history.events:
        if not event.HasField("workflow_execution_signaled_event_attributes"):
            continue
        attrs = event.workflow_execution_signaled_event_attributes
        if attrs.signal_name == ANSWER_INTERACTION_SIGNAL:
            payload: dict[str, Any] = json.loads(attrs.input.payloads[0].data)
            counted[payload["interaction_id"]] += 1
    return counted


async def test_an_undelivered_answer_whose_specialist_has_ended_is_settled_not_retried(
    sessions: Database, temporal_client: Client
) -> None:
    """The sweep signals a specialist that no longer runs (its wait ran out, its turn was
    stopped): nobody takes the answer, and the row is marked so it is not tried forever."""
    priya = Identity(tenant_id="northwind", user_id="cust_2291", roles=())
    async with sessions() as db:
        chat = await store_sessions.create_session(db, owner=priya)
        posted = await posting.post_user_message(
            db,
            owner=priya,
            session_id=chat.id,
            client_message_id=uuid.uuid4().hex,
            text="I want to return something from order 8390.",
            expected_last_seq=None,
            limits=LIFTED_LIMITS,
        )
        answer = InteractionAnswer(f"{posted.turn.id}:ask:1", "8390-1")
        row = await interactions.record_answer(db, turn_id=posted.turn.id, answer=answer)
        await db.commit()

    swept = await sweep_answers(temporal_client, sessions, grace=timedelta(0))
    assert swept >= 1
    async with orm(sessions) as db:
        delivered = await db.scalar(
            select(SpecialistAnswer.delivered_at).where(SpecialistAnswer.id == row.id)
        )
    assert delivered is not None
    assert await sweep_answers(temporal_client, sessions, grace=timedelta(0)) == 0
