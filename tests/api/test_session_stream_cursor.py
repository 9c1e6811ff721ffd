"""The session stream's first connection takes up where the transcript stopped (docs/api.md,
The session stream, Opening a conversation).

Client B reads the transcript (`GET .../messages`), and before it connects the stream, client
A's next message is posted and its turn runs to the end. Connected with the transcript's
`cursor`, B's stream brings that message and every event of its turn, each once and in
order; connected without one (what a page did before), they are missing. A turn still open at
the read (resting on a card) comes whole from its first event. A cursor from long before
replays everything since; one ahead of the session is read as none (nothing after it is
skipped), and text that is not a cursor is refused. A cursor naming a turn whose events the
retention purge deleted lets that turn go at its first read, as the turn's own stream ends.
"""

from __future__ import annotations

import asyncio
from typing import Any

from parley.store.db import Database
from tests.support.client import ParleyClient
from tests.support.session_stream import (
    SESSION_FRAMES,
    as_sent,
    done_of,
    of_turn,
    posted,
    read_until,
    second_client,
)
from tests.support.toolkit import propose


async def transcript(client: ParleyClient, sid: str) -> dict[str, Any]:
    response = await client.http.get(f"/v1/sessions/{sid}/messages")
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_a_stream_opened_with_the_transcripts_cursor_brings_what_came_after_the_read(
    priya: ParleyClient, api_url: str, tokens: dict[str, str]
) -> None:
    sid = await priya.new_session()
    await priya.turn(sid, "Where is my order?")
    other = await second_client(api_url, tokens)
    try:
        read = await transcript(other, sid)
        assert [m["text"] for m in read["messages"] if m["role"] == "user"] == [
            "Where is my order?"
        ]
        # Between B's read and B's stream: A's message, and its whole turn.
        between, between_events = await priya.turn(sid, "What about the refund?")
        assert between_events[-1].type == "done"

        # Without a cursor (the page's old way) the stream starts from its connection.
        async with other.session_stream(sid) as frames:
            await anext(frames)  # ready
            later, later_events = await priya.turn(sid, "Thanks, that helps")
            from_now = await read_until(frames, done_of(later))
        assert posted(from_now) == ["Thanks, that helps"]
        assert of_turn(from_now, between) == []

        async with other.session_stream(sid, last_event_id=read["cursor"]) as frames:
            ready = await anext(frames)
            resumed = await read_until(frames, done_of(later))
    finally:
        await other.aclose()
    assert ready.type == "ready" and ready.cursor == read["cursor"]
    assert posted(resumed) == ["What about the refund?", "Thanks, that helps"]
    # Every event of each turn, once, in the order and with the ids its own stream has.
    assert of_turn(resumed, between) == as_sent(between_events)
    assert of_turn(resumed, later) == as_sent(later_events)
    message = next(f for f in resumed if f.type == "message")
    first_of_turn = next(f for f in resumed if f.type not in SESSION_FRAMES)
    assert message.data["message"]["turn_id"] == between == first_of_turn.data["turn_id"]
    assert resumed.index(message) < resumed.index(first_of_turn)
    # Nothing the transcript already showed comes again.
    shown = {m["id"] for m in read["messages"]}
    assert not shown & {f.data["message"]["id"] for f in resumed if f.type == "message"}


async def test_a_turn_open_at_the_read_comes_whole_from_its_first_event(
    priya: ParleyClient, api_url: str, tokens: dict[str, str]
) -> None:
    sid = await priya.new_session()
    turn_id, events, action = await propose(priya, sid)  # it rests on its card
    other = await second_client(api_url, tokens)
    try:
        read = await transcript(other, sid)
        assert read["cursor"].endswith(f".{turn_id}.0")
        # Confirmed by A before B connects: the turn goes on and ends.
        confirmed = await priya.http.post(f"/v1/sessions/{sid}/actions/{action['id']}/confirm")
        assert confirmed.status_code == 202, confirmed.text
        after_card = await priya.events(sid, turn_id, last_event_id=events[-1].id)
        assert after_card[-1].type == "done"
        async with other.session_stream(sid, last_event_id=read["cursor"]) as frames:
            ready = await anext(frames)
            resumed = await read_until(frames, done_of(turn_id))
    finally:
        await other.aclose()
    assert ready.data == {"session_id": sid, "turns": [turn_id]}
    assert posted(resumed) == []  # its message was in the transcript
    assert of_turn(resumed, turn_id) == as_sent(events) + as_sent(after_card)


async def test_an_old_cursor_replays_everything_since_and_one_ahead_skips_nothing(
    priya: ParleyClient, api_url: str, tokens: dict[str, str]
) -> None:
    sid = await priya.new_session()
    first, _ = await priya.turn(sid, "Where is my order?")
    second, _ = await priya.turn(sid, "What about the refund?")
    other = await second_client(api_url, tokens)
    try:
        # The cursor of an empty transcript, long before: both turns, whole.
        async with other.session_stream(sid, last_event_id="0") as frames:
            await anext(frames)
            since = await read_until(frames, done_of(second))
        assert posted(since) == ["Where is my order?", "What about the refund?"]
        assert of_turn(since, first)[-1][1] == "done"

        # A cursor ahead of this session (another session's, say) is read as none: the next
        # message is not skipped while the session's counter catches up with it.
        async with other.session_stream(sid, last_event_id="999.tr_elsewhere.5") as frames:
            ready = await anext(frames)
            third, _ = await priya.turn(sid, "Thanks, that helps")
            ahead = await read_until(frames, done_of(third))
        assert ready.data == {"session_id": sid, "turns": []}
        assert posted(ahead) == ["Thanks, that helps"]

        for bad in ("1.", "1..0", "-1", "1.tr x.0"):
            refused = await other.http.get(
                f"/v1/sessions/{sid}/stream", headers={"Last-Event-ID": bad}
            )
            assert refused.status_code == 422, (bad, refused.text)
            assert refused.json()["error"]["code"] == "invalid_request"
    finally:
        await other.aclose()


async def test_a_turn_whose_events_were_purged_is_let_go_by_both_streams(
    priya: ParleyClient, api_url: str, tokens: dict[str, str], sessions: Database
) -> None:
    sid = await priya.new_session()
    first, events = await priya.turn(sid, "Where is my order?")
    assert events[-1].type == "done"
    # What the retention purge does to an ended turn past its period: its events go, the
    # turn stays.
    async with sessions() as db:
        await db.run("DELETE FROM turn_events WHERE turn_id = %(turn_id)s", {"turn_id": first})
        await db.commit()
    # The turn's own stream, resumed from before the purge, ends at once (it waited for
    # events that never come before).
    assert await asyncio.wait_for(priya.events(sid, first, last_event_id=1), 20) == []

    other = await second_client(api_url, tokens)
    try:
        session_event = (await transcript(other, sid))["cursor"]
        # A cursor from while the turn ran, naming it at its first event.
        async with other.session_stream(sid, last_event_id=f"{session_event}.{first}.1") as frames:
            ready = await anext(frames)
            second, _ = await priya.turn(sid, "What about the refund?")
            later = await read_until(frames, done_of(second))
    finally:
        await other.aclose()
    assert ready.data == {"session_id": sid, "turns": [first]}
    assert posted(later) == ["What about the refund?"]
    # Its first read let the purged turn go: no later frame's cursor names it.
    assert later and all(first not in (frame.cursor or "") for frame in later)
