"""Issue 45, acceptance 6: the worker that claims a posted turn dies, and the turn still ends
once.

A new turn's post rings the workers' outbox at its commit; one worker claims the turn's start
and starts its workflow eagerly on its own client (dispatch/outbox.py `start_rung`). Here
that worker is a real process that kills itself (`SIGKILL`, `PARLEY_FAULT_KILL_AT`) right
after the claim; once the turn's first context build, begun beside the start
(activities/early_build.py), has moved the turn to `building_context` and stored its request,
before the start is asked for; or right after the start (its first workflow task handed to
it, the start not yet marked). A second worker then takes the turn: its sweep starts it
(attaching to the workflow already started, in the last case, whose task another worker picks
up once the dead one's times out), and its first step reads the request the dead worker
stored instead of building another. The turn ends `completed` with one answer, from one
workflow run.

The crashing worker's own sweep waits far longer than the test, so only a ring starts a turn
there; the test rings the outbox again until that worker is dead (it may not be listening
yet when the post rings).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from parley.config import Settings
from parley.ids import workflow_id_for_turn
from parley.store.db import Database
from tests.support.client import ParleyClient
from tests.support.processes import Workers, ring_until
from tests.support.stack import own_queue, serve_api, service_env
from tests.support.toolkit import stored_state
from tests.support.zygote import Forked, fork_worker

QUESTION = "Tell me about yourself, please."


@pytest.fixture
def claim_settings(settings: Settings) -> Settings:
    return own_queue(settings, "claim")


@pytest.fixture
def workers(claim_settings: Settings) -> Iterator[Workers]:
    pool = Workers(claim_settings)
    yield pool
    pool.stop_all()


def crashing_worker(settings: Settings, point: str) -> Forked:
    """A worker that kills itself at `point` of a ring's start; its sweep never runs in time."""
    env = service_env(
        settings,
        PARLEY_FAULT_KILL_AT=point,
        PARLEY_OUTBOX_GRACE_S="3600",
        PARLEY_OUTBOX_POLL_S="3600",
    )
    return fork_worker(env)


@pytest.mark.parametrize("point", ["turn_claimed", "context_built", "turn_started"])
async def test_a_turn_whose_claiming_worker_dies_still_ends_once(
    point: str,
    claim_settings: Settings,
    workers: Workers,
    tokens: dict[str, str],
    temporal_client: Client,
    sessions: Database,
) -> None:
    crashing = crashing_worker(claim_settings, point)
    try:
        async with serve_api(claim_settings) as api_url:
            client = ParleyClient(api_url, tokens["priya"])
            try:
                session_id = await client.new_session()
                posted = await client.post(session_id, QUESTION)
                assert posted.status_code == 202, posted.text
                turn_id = posted.json()["turn_id"]
                await ring_until(
                    sessions, claim_settings, turn_id, dead(crashing), what="the claimer dies"
                )
                left = await stored_state(sessions, turn_id)
                stored = await _first_request(sessions, turn_id)
                workers.start()  # a worker that lives: its sweep (1 s grace) takes the turn
                events = await asyncio.wait_for(client.events(session_id, turn_id), 90)
                messages = await client.messages(session_id)
            finally:
                await client.aclose()
    finally:
        if crashing.poll() is None:
            crashing.kill()
        crashing.wait(10)
    assert crashing.returncode == -9, "the worker was to die at its fault point"
    answered = await _first_request(sessions, turn_id)
    if point == "context_built":
        # The dead worker's build moved the turn and stored the first step's request; the
        # step that ran read and answered that one.
        assert left == "building_context" and stored is not None
        assert answered == stored
    assert [e.type for e in events].count("done") == 1, [e.type for e in events]
    assert events[-1].type == "done"
    answers = [m for m in messages if m["role"] == "assistant"]
    assert len(answers) == 1, messages
    # One workflow, started once (the sweep's second start attached to it, if it had begun).
    handle = temporal_client.get_workflow_handle(workflow_id_for_turn(turn_id))
    history = [e.event_type async for e in handle.fetch_history_events()]
    assert history.count(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED) == 1
    assert history[-1] == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED


async def _first_request(sessions: Database, turn_id: str) -> str | None:
    """The id of the first step's stored request, or None."""
    async with sessions() as db:
        found = await db.value(_FIRST_REQUEST, {"turn_id": turn_id})
    return None if found is None else str(found)


_FIRST_REQUEST = "SELECT id FROM model_calls WHERE turn_id = %(turn_id)s AND step = 0"


def dead(worker: Forked) -> Callable[[], Awaitable[bool]]:
    async def ended() -> bool:
        return worker.poll() is not None

    return ended
