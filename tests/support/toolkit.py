"""What many test modules need, written once: waiting for a condition with a deadline, reading
a finished reply, the emails the Northwind service accepted, waiting for a turn's state (as
stored, or as the API shows it), a worker plus API on a task queue of their own, and an engine
whose statements are recorded.

Waits poll with a deadline and fail with a message that says what never happened, so a slow
machine costs time, not a red run, and a real failure still says what went wrong.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import httpx
from sqlalchemy import select, update
from temporalio.client import Client

from parley.config import Settings
from parley.gateway.base import ModelProvider
from parley.screens import Screen
from parley.store import outbox, posting
from parley.store.db import Database, Db, create_socket_checked_engine, on_statement_sent
from parley.store.identity import Identity
from parley.store.models import ChatSession, Message, ModelCall, Turn
from parley.store.posting import PostedMessage
from parley.store.sessions import create_session
from parley.tls import httpx_verified
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.sse import TERMINAL, Event, iter_events
from tests.support.stack import LIFTED_LIMITS, own_queue, running_worker, serve_api

T = TypeVar("T")
ModelT = TypeVar("ModelT", bound=ModelProvider)


async def eventually(
    probe: Callable[[], Awaitable[T | None]], *, timeout: float, what: str, every: float = 0.05
) -> T:
    """Call `probe` until it returns something truthy and return that; after `timeout`
    seconds fail with `what` (the condition that never came true) and the last answer."""
    deadline = time.monotonic() + timeout
    while True:
        answer = await probe()
        if answer:
            return answer
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s (last seen: {answer!r})")
        await asyncio.sleep(every)


async def api_answers(
    url: str, *, timeout: float, running: subprocess.Popen[bytes] | None = None
) -> None:
    """Wait until the API at `url` answers `/healthz` (and, given its process, fail at once
    should that exit). One client for every poll: a client made per poll built a TLS context
    each time, about 45 ms of CPU, every 50 ms."""
    async with httpx.AsyncClient(timeout=1, verify=httpx_verified()) as http:

        async def healthy() -> bool:
            assert running is None or running.poll() is None, f"the API at {url} exited"
            try:
                return (await http.get(f"{url}/healthz")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(healthy, timeout=timeout, what=f"the API at {url} answering /healthz")


# --- replies and emails -----------------------------------------------------------------------

# The verified address of the seeded customer Priya: the only one her emails may go to.
PRIYA_EMAIL = "priya@example.com"


def reply(events: list[Event]) -> str:
    """The text of a turn that ended with `done`."""
    assert events and events[-1].type == "done", [(e.type, e.data) for e in events[-3:]]
    return str(events[-1].data["message"]["text"])


async def returns_made(northwind: httpx.AsyncClient) -> list[dict[str, Any]]:
    """Every return the Northwind backend created (`RMA-` ids), oldest first."""
    return list((await northwind.get("/returns")).json()["returns"])


async def emails(northwind: httpx.AsyncClient, *, action_id: str | None = None) -> list[Any]:
    """What the Northwind email service accepted; with `action_id`, only that action's emails
    (other tests share the backend, so counts are taken per action where they can be)."""
    response = await northwind.get("/emails")
    assert response.status_code == 200, response.text
    accepted = list(response.json()["emails"])
    if action_id is None:
        return accepted
    key = f"parley-{action_id}"
    return [e for e in accepted if e["idempotency_key"] == key]


# --- a turn's state: the stored row, or the API's view ----------------------------------------


async def stored_state(sessions: Database, turn_id: str) -> str:
    """The turn's row's state now."""
    async with orm(sessions) as db:
        turn = await db.get(Turn, turn_id)
    assert turn is not None, f"no turn {turn_id}"
    return str(turn.state)


async def wait_for_stored_state(
    sessions: Database,
    turn_id: str,
    states: Iterable[str],
    *,
    timeout: float,
) -> str:
    """Wait until the turn's row is in one of `states`; returns the state it reached."""
    wanted = set(states)
    seen: list[str] = []

    async def reached() -> str | None:
        seen.append(await stored_state(sessions, turn_id))
        return seen[-1] if seen[-1] in wanted else None

    try:
        return await eventually(reached, timeout=timeout, what=f"turn {turn_id} in {wanted}")
    except AssertionError:
        raise AssertionError(f"turn stayed {seen[-1]} (wanted one of {sorted(wanted)})") from None


async def wait_for_view_state(
    client: ParleyClient, session_id: str, turn_id: str, state: str, *, timeout: float
) -> dict[str, Any]:
    """Wait until the API's view of the turn shows `state`; returns that view."""

    async def view_in_state() -> dict[str, Any] | None:
        view = await client.turn_view(session_id, turn_id)
        return view if view["state"] == state else None

    return await eventually(view_in_state, timeout=timeout, what=f"turn {turn_id} {state}")


# --- a worker and an API of a module's own ----------------------------------------------------


@dataclass
class Stack(Generic[ModelT]):
    settings: Settings
    model: ModelT
    url: str


@asynccontextmanager
async def own_stack(
    temporal_client: Client,
    settings: Settings,
    sessions: Database,
    provider: ModelT,
    /,
    *,
    prefix: str,
    screens: tuple[Screen, Screen] | None = None,
    fallback: ModelProvider | None = None,
    **update: Any,
) -> AsyncIterator[Stack[ModelT]]:
    """A worker running `provider` and an API, both on a task queue of their own (so only this
    worker serves their turns), with `update` applied to the session's settings (positional
    parameters, so a setting may be called `model`)."""
    own = own_queue(settings, prefix, **update)
    async with (
        running_worker(
            temporal_client, own, sessions, provider, screens=screens, fallback=fallback
        ),
        serve_api(own) as url,
    ):
        yield Stack(own, provider, url)


async def model_calls(sessions: Database, turn_id: str) -> list[ModelCall]:
    """A turn's model calls (each with the request it stored), in step order."""
    async with orm(sessions) as db:
        rows = await db.scalars(
            select(ModelCall).where(ModelCall.turn_id == turn_id).order_by(ModelCall.step)
        )
        return list(rows)


def confirmations(events: list[Event]) -> list[dict[str, Any]]:
    return [e.data["action"] for e in events if e.type == "confirmation_required"]


# --- a turn resting on a confirmation card ---------------------------------------------------


def types(events: list[Event]) -> list[str]:
    return [e.type for e in events]


async def propose(client: ParleyClient, sid: str) -> tuple[str, list[Event], dict[str, Any]]:
    """Make the assistant propose an email, as in the reference conversation; the turn
    rests awaiting confirmation. Returns (turn id, its events so far, the streamed action)."""
    _, first = await client.turn(sid, "Where is my order?")
    assert first[-1].type == "done", types(first)
    posted = await client.post(sid, "Can you email me?")
    assert posted.status_code == 202, posted.text
    turn_id = str(posted.json()["turn_id"])
    events = await client.events(sid, turn_id)
    assert events[-1].type == "confirmation_required", types(events)
    action = dict(events[-1].data["action"])
    assert action["tool"] == "send_email" and action["status"] == "pending"
    assert action["id"].startswith("act_")
    return turn_id, events, action


async def first_events(client: ParleyClient, url: str, *, until: str) -> list[Event]:
    received: list[Event] = []
    async with client.http.stream("GET", url) as response:
        async for event in iter_events(response):
            received.append(event)
            if event.type == until or event.type in TERMINAL:
                break
    return received


async def store_history(sessions: Database, sid: str, said: Iterable[tuple[str, str]]) -> None:
    """Write a conversation straight into a session, as if its turns had run: (role, text)
    pairs from seq 1, complete; a `tool` line answers call `call_1`."""
    lines = list(said)
    async with orm(sessions) as db:
        for seq, (role, text) in enumerate(lines, start=1):
            extra = {"tool_call_id": "call_1"} if role == "tool" else {}
            db.add(
                Message(
                    id=f"msg_{uuid.uuid4().hex[:20]}",
                    session_id=sid,
                    seq=seq,
                    role=role,
                    status="complete",
                    text=text,
                    **extra,
                )
            )
        await db.execute(
            update(ChatSession).where(ChatSession.id == sid).values(last_seq=len(lines))
        )
        await db.commit()


@asynccontextmanager
async def counted_sessions(
    database_url: str,
) -> AsyncIterator[tuple[Database, list[str]]]:
    """Sessions on an engine of their own, every statement it sends recorded (stripped), for
    a test that asserts what a step costs in round trips."""
    engine = create_socket_checked_engine(database_url)
    sent: list[str] = []
    stop = on_statement_sent(engine, lambda statement: sent.append(statement.strip()))
    try:
        yield Database(engine), sent
    finally:
        stop()
        await engine.dispose()


async def post_unstarted(
    db: Db, *, owner: Identity, text: str, session_id: str | None = None, for_sweep: bool = False
) -> PostedMessage:
    """A message posted through the POST pipeline (in a new session of `owner`'s unless one
    is named) whose turn no workflow runs: its start outbox row is marked started, so the
    worker's sweep leaves the turn to the test; `for_sweep`, left unstarted and unrung (as
    when the API or the claiming worker died), for the outbox sweep. Committed."""
    if session_id is None:
        session_id = (await create_session(db, owner=owner)).id
    posted = await posting.post_user_message(
        db,
        owner=owner,
        session_id=session_id,
        client_message_id=uuid.uuid4().hex,
        text=text,
        expected_last_seq=None,
        limits=LIFTED_LIMITS,
    )
    assert posted.turn is not None  # no hand-off holds a test's session
    if not for_sweep:
        await outbox.mark_workflow_started(db, turn_id=posted.turn.id)
    await db.commit()
    return posted
