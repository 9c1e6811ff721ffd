"""The event stream: replay from Last-Event-ID, live follow, any API process serves it."""

from __future__ import annotations

import asyncio

import pytest

from parley.config import Settings
from tests.support.client import ParleyClient, streamed_text
from tests.support.stack import free_port, service_env, spawn
from tests.support.toolkit import api_answers


def assert_gap_free(ids: list[int | None], start: int) -> None:
    assert ids == list(range(start, start + len(ids)))


async def test_a_full_stream_has_monotonic_ids_states_and_one_terminal_event(
    priya: ParleyClient,
) -> None:
    session_id = await priya.new_session()
    _, events = await priya.turn(session_id, "Hello there")
    assert_gap_free([e.id for e in events], 1)
    states = [e.data["state"] for e in events if e.type == "state"]
    assert states == ["received", "building_context", "calling_model", "completed"]
    assert [e.type for e in events].count("done") == 1 and events[-1].type == "done"
    assert len([e for e in events if e.type == "delta"]) >= 2
    assert streamed_text(events) == events[-1].data["message"]["text"]


@pytest.mark.parametrize("k", [1, 3, 5])
async def test_reconnect_with_last_event_id_yields_exactly_the_rest(
    priya: ParleyClient, k: int
) -> None:
    session_id = await priya.new_session()
    posted = await priya.post(session_id, "Hello there")
    turn_id = posted.json()["turn_id"]
    # Drop the connection after event k while the answer is still streaming...
    head = await priya.events(session_id, turn_id, stop_after=k)
    assert [e.id for e in head] == list(range(1, k + 1))
    # ...and come back with the last id seen.
    tail = await priya.events(session_id, turn_id, last_event_id=k)
    assert_gap_free([e.id for e in tail], k + 1)
    assert tail[-1].type == "done"
    whole = await priya.events(session_id, turn_id)
    assert [(e.id, e.type, e.data) for e in head + tail] == [(e.id, e.type, e.data) for e in whole]


async def test_after_query_parameter_replays_like_last_event_id(priya: ParleyClient) -> None:
    session_id = await priya.new_session()
    turn_id, whole = await priya.turn(session_id, "Hello")
    response = await priya.http.get(
        f"/v1/sessions/{session_id}/turns/{turn_id}/events", params={"after": 2}
    )
    ids = [int(line[4:]) for line in response.text.splitlines() if line.startswith("id: ")]
    assert ids == [e.id for e in whole][2:]


async def test_a_second_api_process_serves_the_same_live_stream(
    priya: ParleyClient, settings: Settings
) -> None:
    port = free_port()
    other = spawn(["-m", "parley.launch.cli", "api", "--port", str(port)], service_env(settings))
    other_url = f"http://127.0.0.1:{port}"
    try:
        await api_answers(other_url, timeout=30)
        session_id = await priya.new_session()
        posted = await priya.post(session_id, "Hello there")
        turn_id = posted.json()["turn_id"]
        here, there = await asyncio.gather(
            priya.events(session_id, turn_id),
            priya.events(session_id, turn_id, base_url=other_url),
        )
        assert [(e.id, e.type, e.data) for e in there] == [(e.id, e.type, e.data) for e in here]
        assert there[-1].type == "done"
    finally:
        other.terminate()
        other.wait(10)


async def test_resuming_at_the_end_of_a_finished_turn_closes_at_once(priya: ParleyClient) -> None:
    session_id = await priya.new_session()
    turn_id, whole = await priya.turn(session_id, "Hello")
    last = whole[-1].id
    assert last is not None
    response = await asyncio.wait_for(
        priya.http.get(
            f"/v1/sessions/{session_id}/turns/{turn_id}/events",
            headers={"Last-Event-ID": str(last)},
        ),
        timeout=5,
    )
    assert response.status_code == 200
    assert [line for line in response.text.splitlines() if line.startswith("id:")] == []
