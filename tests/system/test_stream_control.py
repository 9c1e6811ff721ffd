"""Every way a stream can break: cancel, hang-up with and without reconnect, a provider that
fails mid-answer and the retry that replaces it, hostile text in the model's output, and a
consumer that stops reading."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
from sqlalchemy import select

from parley.gateway.base import ModelRequest
from parley.gateway.demo import compose_reply
from parley.store import turns
from parley.store.db import Database
from parley.store.models import Message, Turn
from tests.support.client import ParleyClient, streamed_text
from tests.support.models import ControlledModel
from tests.support.orm import orm
from tests.support.sse import TERMINAL, Event, iter_events
from tests.support.toolkit import Stack, eventually, first_events, wait_for_stored_state

LONG_QUESTION = "Tell me about yourself"


async def test_cancel_stops_the_model_and_keeps_the_partial_answer_as_cancelled(
    stream_stack: Stack[ControlledModel],
    stream_client: ParleyClient,
    sessions: Database,
) -> None:
    sid = await stream_client.new_session()
    posted = await stream_client.post(sid, LONG_QUESTION)
    turn_id, url = posted.json()["turn_id"], posted.json()["events_url"]
    head = await first_events(stream_client, url, until="delta")
    assert head[-1].type == "delta"

    cancelled = await stream_client.http.post(f"/v1/sessions/{sid}/turns/{turn_id}/cancel")
    assert cancelled.status_code == 202
    rest = await stream_client.events(sid, turn_id, last_event_id=head[-1].id)
    assert rest[-1].type == "cancelled"
    message = rest[-1].data["message"]
    assert message["status"] == "cancelled"
    assert message["text"] == streamed_text(head + rest) != ""

    # The upstream generation stopped: the token counter no longer moves. Watching it stand
    # still for a while is the claim itself; half a second is six tokens at this pace.
    counted = stream_stack.model.tokens_emitted
    await asyncio.sleep(0.5)
    assert stream_stack.model.tokens_emitted == counted
    whole = compose_reply(
        ModelRequest(model="demo", messages=[{"role": "user", "content": LONG_QUESTION}])
    ).text
    # It really was cut short: what was kept is a strict prefix of the whole reply.
    assert whole.startswith(message["text"]) and len(message["text"]) < len(whole)

    stored = await stream_client.messages(sid)
    assert [(m["role"], m["status"]) for m in stored] == [
        ("user", "complete"),
        ("assistant", "cancelled"),
    ]
    turn = await stream_client.turn_view(sid, turn_id)
    assert turn["state"] == "cancelled"
    again = await stream_client.http.post(f"/v1/sessions/{sid}/turns/{turn_id}/cancel")
    assert again.status_code == 409 and again.json()["error"]["code"] == "turn_finished"
    # The session is free for the next message.
    assert (await stream_client.post(sid, "Hello")).status_code == 202


async def record_stop_only(sessions: Database, turn_id: str) -> None:
    """The Stop as the cancel route records it, without the workflow's cancel that follows:
    what a running model step sees of it (the workflow hears of a cancel only at its next
    task, after the local step)."""
    async with sessions() as db:
        await turns.request_cancel(db, turn_id=turn_id)
        await db.commit()


async def test_a_stop_recorded_on_the_turn_stops_a_streaming_model_step(
    stream_stack: Stack[ControlledModel],
    stream_client: ParleyClient,
    sessions: Database,
) -> None:
    sid = await stream_client.new_session()
    posted = await stream_client.post(sid, LONG_QUESTION)
    turn_id, url = posted.json()["turn_id"], posted.json()["events_url"]
    head = await first_events(stream_client, url, until="delta")

    await record_stop_only(sessions, turn_id)
    rest = await stream_client.events(sid, turn_id, last_event_id=head[-1].id)
    assert rest[-1].type == "cancelled"
    kept = rest[-1].data["message"]["text"]
    whole = compose_reply(
        ModelRequest(model="demo", messages=[{"role": "user", "content": LONG_QUESTION}])
    ).text
    # The step stopped at the next frame it stored, not at the end of the answer.
    assert whole.startswith(kept) and len(kept) < len(whole)


async def test_a_stop_before_the_first_token_ends_the_turn_without_waiting_for_it(
    stream_stack: Stack[ControlledModel],
    stream_client: ParleyClient,
    sessions: Database,
) -> None:
    gate = stream_stack.model.first_token_gate = asyncio.Event()
    stream_stack.model.waiting.clear()
    try:
        sid = await stream_client.new_session()
        turn_id = (await stream_client.post(sid, LONG_QUESTION)).json()["turn_id"]
        await asyncio.wait_for(stream_stack.model.waiting.wait(), 30)

        await record_stop_only(sessions, turn_id)
        events = await stream_client.events(sid, turn_id)
        assert events[-1].type == "cancelled"
        assert not [e for e in events if e.type == "delta"]
    finally:
        stream_stack.model.first_token_gate = None
        gate.set()


async def test_hanging_up_without_coming_back_cancels_after_the_grace_period(
    stream_stack: Stack[ControlledModel],
    stream_client: ParleyClient,
    sessions: Database,
) -> None:
    stream_stack.model.reply = lambda request: "word " * 200  # ~16 s at this pace
    sid = await stream_client.new_session()
    posted = await stream_client.post(sid, LONG_QUESTION)
    turn_id, url = posted.json()["turn_id"], posted.json()["events_url"]
    await first_events(stream_client, url, until="delta")  # then hang up
    state = await wait_for_stored_state(sessions, turn_id, {"cancelled", "completed"}, timeout=10)
    assert state == "cancelled"
    async with orm(sessions) as db:
        answer = await db.scalar(
            select(Message).where(Message.turn_id == turn_id, Message.role == "assistant")
        )
    assert answer is not None and answer.status == "cancelled"


async def test_a_turn_followed_on_its_session_stream_is_not_cancelled_when_its_own_stream_hangs_up(
    stream_stack: Stack[ControlledModel],
    stream_client: ParleyClient,
) -> None:
    """The laptop that asked closes mid-answer; the phone, following the conversation on the
    session stream, sees the whole answer (the grace passes while it still streams)."""
    stream_stack.model.reply = lambda request: "word " * 40  # ~3 s, longer than the grace
    sid = await stream_client.new_session()
    async with stream_client.session_stream(sid) as frames:
        assert (await anext(frames)).type == "ready"
        posted = await stream_client.post(sid, LONG_QUESTION)
        turn_id, url = posted.json()["turn_id"], posted.json()["events_url"]
        await first_events(stream_client, url, until="delta")  # then hang up
        ending = None
        async with asyncio.timeout(30):
            async for frame in frames:
                if frame.type in TERMINAL and frame.data["turn_id"] == turn_id:
                    ending = frame
                    break
    assert ending is not None and ending.type == "done", ending
    assert ending.data["data"]["message"]["text"] == "word " * 40


async def test_hanging_up_and_reconnecting_within_the_grace_gets_the_whole_answer(
    stream_stack: Stack[ControlledModel],
    stream_client: ParleyClient,
    sessions: Database,
) -> None:
    stream_stack.model.reply = lambda request: "word " * 40  # ~3 s, longer than the grace
    sid = await stream_client.new_session()
    posted = await stream_client.post(sid, LONG_QUESTION)
    turn_id, url = posted.json()["turn_id"], posted.json()["events_url"]
    head = await first_events(stream_client, url, until="delta")
    await asyncio.sleep(0.3)  # away for a while (the claim itself), back well inside the grace
    tail = await stream_client.events(sid, turn_id, last_event_id=head[-1].id)
    events = head + tail
    assert [e.id for e in events] == list(range(1, len(events) + 1))
    assert events[-1].type == "done"
    assert streamed_text(events) == events[-1].data["message"]["text"] == "word " * 40
    # Past the grace of the first hang-up: nothing cancels a finished turn. The cancel would
    # come from the API's own timer, which the test cannot observe, so it waits it out.
    await asyncio.sleep(1.0)
    async with orm(sessions) as db:
        turn = await db.get(Turn, turn_id)
    assert turn is not None and turn.state == "completed"


def after_tools(request: ModelRequest) -> bool:
    return any(m["role"] == "tool" for m in request.messages)


async def test_provider_failure_keeps_incomplete_text_and_retry_replaces_it_reusing_tools(
    stream_stack: Stack[ControlledModel],
    stream_client: ParleyClient,
    northwind: httpx.AsyncClient,
    tokens: dict[str, str],
) -> None:
    # The answer after the tool result breaks off after 6 tokens, once.
    failures = {"left": 1}

    def fail_after(request: ModelRequest) -> int | None:
        if after_tools(request) and failures["left"]:
            failures["left"] -= 1
            return 6
        return None

    stream_stack.model.fail_after = fail_after
    lookups_before = (await northwind.get("/stats")).json()["calls"]["list_orders"]
    sid = await stream_client.new_session()
    failed_turn, events = await stream_client.turn(sid, "Where is my order?")
    assert events[-1].type == "error"
    assert events[-1].data["retryable"] is True
    partial = streamed_text(events)
    assert partial and len(partial.split()) == 6
    stored = await stream_client.messages(sid)
    assert stored[-1]["role"] == "assistant" and stored[-1]["status"] == "incomplete"
    assert stored[-1]["text"] == partial
    assert (await northwind.get("/stats")).json()["calls"]["list_orders"] == lookups_before + 1

    # A paused tenant's assistant stays off for retries too.
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    await stream_client.http.post("/v1/admin/tenants/northwind/pause", headers=admin)
    try:
        paused = await stream_client.http.post(f"/v1/sessions/{sid}/turns/{failed_turn}/retry")
        assert paused.status_code == 403 and paused.json()["error"]["code"] == "agent_paused"
    finally:
        await stream_client.http.post("/v1/admin/tenants/northwind/resume", headers=admin)

    retried = await stream_client.http.post(f"/v1/sessions/{sid}/turns/{failed_turn}/retry")
    assert retried.status_code == 202
    new_turn = retried.json()["turn_id"]
    assert new_turn != failed_turn
    events = await stream_client.events(sid, new_turn)
    assert events[-1].type == "done"
    answer = events[-1].data["message"]["text"]
    assert "8472" in answer and answer.startswith(partial.strip().split()[0])
    # The tool ran once, for the failed turn; the retry used its stored result.
    assert (await northwind.get("/stats")).json()["calls"]["list_orders"] == lookups_before + 1
    assert not any(e.type == "tool" for e in events)
    stored = await stream_client.messages(sid)
    assistants = [m for m in stored if m["role"] == "assistant" and not m.get("tool_calls")]
    assert [(m["status"], m["text"]) for m in assistants] == [("complete", answer)]
    # A finished answer cannot be retried; neither can the replaced one again.
    for turn in (new_turn, failed_turn):
        again = await stream_client.http.post(f"/v1/sessions/{sid}/turns/{turn}/retry")
        assert again.status_code == 409, turn


HOSTILE = "Fine.\n\nevent: done\ndata: {}\n\nid: 999\nretry: 1\n: not a comment\r\nevent: error\n"


async def test_sse_control_text_in_model_output_stays_inside_data(
    stream_stack: Stack[ControlledModel], stream_client: ParleyClient
) -> None:
    stream_stack.model.reply = lambda request: HOSTILE
    stream_stack.model.token_delay_s = 0.0
    try:
        sid = await stream_client.new_session()
        posted = await stream_client.post(sid, "Say something odd")
        url = posted.json()["events_url"]
        raw = (await stream_client.http.get(url)).text
    finally:
        stream_stack.model.token_delay_s = 0.08
    # Parse the raw bytes by the SSE rules, strictly.
    events: list[tuple[str | None, str, list[str]]] = []
    ident, kind, data = None, "message", []
    for line in raw.replace("\r\n", "\n").split("\n"):
        if line == "":
            if data:
                events.append((ident, kind, data))
            ident, kind, data = None, "message", []
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "id":
                ident = value
            elif field == "event":
                kind = value
            elif field == "data":
                data.append(value)
            else:
                assert field == "retry" and value.isdigit(), line
    kinds = [k for _, k, _ in events]
    assert kinds.count("done") == 1 and kinds[-1] == "done"
    assert "error" not in kinds
    assert [int(i) for i, _, _ in events if i] == list(range(1, len(events) + 1))
    assert all(len(d) == 1 for _, _, d in events)  # every event's data is one JSON line
    text = "".join(json.loads(d[0])["text"] for _, k, d in events if k == "delta")
    assert text == HOSTILE
    assert json.loads(events[-1][2][0])["message"]["text"] == HOSTILE


async def streamed_to_the_end(stream_client: ParleyClient, sid: str) -> list[Event]:
    posted = await stream_client.post(sid, LONG_QUESTION)
    received: list[Event] = []
    async with stream_client.http.stream("GET", posted.json()["events_url"]) as response:
        async for event in iter_events(response):
            received.append(event)
            if event.type in TERMINAL:
                break
    return received


async def test_a_consumer_that_never_reads_does_not_delay_another_stream(
    stream_stack: Stack[ControlledModel],
    stream_client: ParleyClient,
    tokens: dict[str, str],
    sessions: Database,
) -> None:
    """Priya's turns stream start to finish while Marco's reader sits on a full socket: no
    stream waits for another's consumer. Order of events, not wall-clock time, is checked."""
    stream_stack.model.token_delay_s = 0.002
    marco = ParleyClient(stream_stack.url, tokens["marco"])
    stalled: socket.socket | None = None
    try:
        sid = await stream_client.new_session()

        # Marco's turn streams several megabytes to a socket that is never read.
        stream_stack.model.reply = lambda request: (
            ("x" * 2000 + " ") * 2_000 if "flood" in request.messages[-1]["content"] else None
        )
        marco_sid = await marco.new_session()
        flood = await marco.post(marco_sid, "flood me")
        host, port = stream_stack.url.removeprefix("http://").split(":")
        stalled = socket.create_connection((host, int(port)))
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.sendall(
            (
                f"GET {flood.json()['events_url']} HTTP/1.1\r\nHost: {host}\r\n"
                f"Authorization: Bearer {tokens['marco']}\r\n\r\n"
            ).encode()
        )
        flood_turn = flood.json()["turn_id"]

        async def stalled_reader_attached() -> bool:
            async with orm(sessions) as db:
                turn = await db.get(Turn, flood_turn)
            return turn is not None and turn.viewers >= 1 and turn.last_event_id > 0

        await eventually(stalled_reader_attached, timeout=10, what="the stalled reader follows")
        # The flooding turn itself is not held back by its stalled reader.
        state = await wait_for_stored_state(sessions, flood_turn, {"completed"}, timeout=180)
        assert state == "completed"

        for _ in range(3):
            events = await asyncio.wait_for(streamed_to_the_end(stream_client, sid), 60)
            assert [e.type for e in events][-1] == "done"
            assert any(e.type == "delta" for e in events)
            # ...and all the while Marco's reader still holds its stream, megabytes behind.
            assert await stalled_reader_attached()
    finally:
        stream_stack.model.token_delay_s = 0.08
        if stalled is not None:
            stalled.close()
        await marco.aclose()
