"""The session stream (issue 42, acceptance 5): two clients of one user on one session.

Client A posts and reads its turn's own stream; client B only holds the session stream
(`GET /v1/sessions/{sid}/stream`) and must see A's message and every event of the turn with
the ids and payloads A saw, resume with its last id without missing or repeating anything
(a turn that started and ended while it was away included), see a card confirmed by A turn
`confirmed`, and see the session's deletion. Another user's session stream is missing (404).
"""

from __future__ import annotations

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
from tests.support.toolkit import propose, types


async def test_the_other_client_sees_the_message_and_every_event_with_the_turn_streams_ids(
    priya: ParleyClient, api_url: str, tokens: dict[str, str]
) -> None:
    sid = await priya.new_session()
    other = await second_client(api_url, tokens)
    try:
        async with other.session_stream(sid) as frames:
            ready = await anext(frames)
            assert (ready.type, ready.data) == ("ready", {"session_id": sid, "turns": []})
            turn_id, events = await priya.turn(sid, "Where is my order?")
            seen = await read_until(frames, done_of(turn_id))
    finally:
        await other.aclose()
    assert posted(seen) == ["Where is my order?"]
    message = next(f for f in seen if f.type == "message")
    assert message.data["message"]["turn_id"] == turn_id and message.data["message"]["seq"] == 1
    assert seen.index(message) < min(i for i, f in enumerate(seen) if f.type == "state")
    assert "delta" in types(events) and events[-1].type == "done"
    assert of_turn(seen, turn_id) == as_sent(events)


async def test_a_reconnect_with_the_last_id_misses_nothing_and_repeats_nothing(
    priya: ParleyClient, api_url: str, tokens: dict[str, str]
) -> None:
    sid = await priya.new_session()
    other = await second_client(api_url, tokens)
    try:
        async with other.session_stream(sid) as frames:
            await anext(frames)  # ready
            first = await priya.post(sid, "Where is my order?")
            first_turn = first.json()["turn_id"]
            # B hangs up inside the first turn: after its message and two of its events.
            before = await read_until(frames, lambda f: len(of_turn([f], first_turn)) > 0)
            before += await read_until(frames, lambda f: True)
        assert before[-1].type not in SESSION_FRAMES
        first_events = await priya.events(sid, first_turn)
        # While B is away, A's next turn starts and ends.
        second_turn, second_events = await priya.turn(sid, "What about the refund?")
        async with other.session_stream(sid, last_event_id=before[-1].cursor) as frames:
            after = await read_until(frames, done_of(second_turn))
    finally:
        await other.aclose()
    assert after[0].type == "ready"
    seen = before + after[1:]
    assert posted(seen) == ["Where is my order?", "What about the refund?"]
    assert of_turn(seen, first_turn) == as_sent(first_events)
    assert of_turn(seen, second_turn) == as_sent(second_events)


async def test_a_card_confirmed_by_one_client_is_confirmed_on_the_others_stream(
    priya: ParleyClient, api_url: str, tokens: dict[str, str]
) -> None:
    sid = await priya.new_session()
    other = await second_client(api_url, tokens)
    try:
        async with other.session_stream(sid) as frames:
            await anext(frames)
            turn_id, events, action = await propose(priya, sid)
            waiting = await read_until(frames, lambda f: f.type == "confirmation_required")
            assert of_turn(waiting, turn_id) == as_sent(events)
            confirmed = await priya.http.post(f"/v1/sessions/{sid}/actions/{action['id']}/confirm")
            assert confirmed.status_code == 202, confirmed.text
            rest = await read_until(frames, done_of(turn_id))
    finally:
        await other.aclose()
    resolved = [f for f in rest if f.type == "confirmation_resolved"]
    assert [f.data["data"]["action"]["status"] for f in resolved] == ["confirmed"]
    assert resolved[0].data["data"]["action"]["id"] == action["id"]
    # The turn's own stream, resumed after the card, says the same with the same ids.
    after_card = await priya.events(sid, turn_id, last_event_id=events[-1].id)
    assert of_turn(rest, turn_id) == as_sent(after_card)


async def test_a_deleted_session_ends_its_stream(
    priya: ParleyClient, api_url: str, tokens: dict[str, str]
) -> None:
    sid = await priya.new_session()
    other = await second_client(api_url, tokens)
    try:
        async with other.session_stream(sid) as frames:
            await anext(frames)
            assert (await priya.http.delete(f"/v1/sessions/{sid}")).status_code == 204
            seen = [frame async for frame in frames]
        assert [f.type for f in seen] == ["session_deleted"]
        assert (await other.http.get(f"/v1/sessions/{sid}/stream")).status_code == 404
    finally:
        await other.aclose()


async def test_another_users_session_stream_is_missing_and_a_cursor_names_only_own_turns(
    priya: ParleyClient, marco: ParleyClient
) -> None:
    sid = await priya.new_session()
    priyas_turn, _ = await priya.turn(sid, "Hello there")
    theirs = await marco.http.get(f"/v1/sessions/{sid}/stream")
    missing = await marco.http.get("/v1/sessions/ses_missing/stream")
    assert theirs.status_code == 404 and theirs.json() == missing.json()
    assert theirs.json()["error"]["code"] == "not_found"
    # Marco's own session, with a cursor naming Priya's turn: her events never reach him.
    own = await marco.new_session()
    async with marco.session_stream(own, last_event_id=f"0.{priyas_turn}.0") as frames:
        ready = await anext(frames)
    assert ready.data == {"session_id": own, "turns": []}
    bad = await marco.http.get(f"/v1/sessions/{own}/stream", headers={"Last-Event-ID": "x"})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request"


async def test_a_version_regenerated_or_switched_elsewhere_is_told_to_the_other_client(
    priya: ParleyClient, api_url: str, tokens: dict[str, str]
) -> None:
    sid = await priya.new_session()
    first_turn, _ = await priya.turn(sid, "Where is my order?")
    other = await second_client(api_url, tokens)
    try:
        async with other.session_stream(sid) as frames:
            await anext(frames)
            again = await priya.http.post(f"/v1/sessions/{sid}/turns/{first_turn}/regenerate")
            assert again.status_code == 202, again.text
            second_turn = again.json()["turn_id"]
            regenerated = await read_until(frames, lambda f: f.type == "branch_switched")
            await read_until(frames, done_of(second_turn))
            shown = await priya.messages(sid)  # the new answer, version 2 of 2
            answer = next(m for m in shown if m["role"] == "assistant")
            back = await priya.http.post(f"/v1/sessions/{sid}/messages/{answer['id']}/versions/1")
            assert back.status_code == 200, back.text
            switched = await read_until(frames, lambda f: f.type == "branch_switched")
    finally:
        await other.aclose()
    announced = [f for f in regenerated if f.type == "turn"]
    assert [f.data["turn_id"] for f in announced] == [second_turn]
    assert regenerated[-1].data["branch"] != switched[-1].data["branch"]
    assert [f.type for f in switched] == ["branch_switched"]
