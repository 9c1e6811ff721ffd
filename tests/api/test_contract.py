"""The session API's contract (api.md): auth, ownership, ordering and idempotency."""

from __future__ import annotations

import json
import uuid

import httpx
from sqlalchemy import func, select
from temporalio.client import Client

from parley.api.schemas import SessionDetail, TurnOut, TurnStarted
from parley.ids import workflow_id_for_turn
from parley.store.db import Database
from parley.store.models import Turn
from parley.wire import MessageView, event_data
from tests.support.client import ParleyClient
from tests.support.orm import orm


async def test_no_token_or_a_bad_token_is_401(api_url: str) -> None:
    async with httpx.AsyncClient(base_url=api_url) as anonymous:
        for headers in ({}, {"Authorization": "Bearer pk_not_a_real_token"}):
            response = await anonymous.post("/v1/sessions", headers=headers)
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "unauthenticated"
            response = await anonymous.get("/v1/sessions", headers=headers)
            assert response.status_code == 401


async def test_duplicate_post_returns_the_same_turn_without_a_second_workflow(
    priya: ParleyClient,
    sessions: Database,
    temporal_client: Client,
) -> None:
    session_id = await priya.new_session()
    key = uuid.uuid4().hex
    first = await priya.post(session_id, "Hello there", client_message_id=key)
    assert first.status_code == 202
    again = await priya.post(session_id, "Hello there", client_message_id=key)
    assert again.status_code == 200
    # The same turn and message; `state` is the turn's own, as it stands now.
    same = ("turn_id", "message", "events_url")
    assert {k: again.json()[k] for k in same} == {k: first.json()[k] for k in same}
    turn_id = first.json()["turn_id"]
    await priya.events(session_id, turn_id)  # let the turn finish
    after_done = await priya.post(session_id, "Hello there", client_message_id=key)
    assert after_done.status_code == 200 and after_done.json()["turn_id"] == turn_id

    async with orm(sessions) as db:
        turns = await db.scalar(select(func.count()).where(Turn.session_id == session_id))
    assert turns == 1
    workflows = [
        wf async for wf in temporal_client.list_workflows(f"ParleySessionId = '{session_id}'")
    ]
    assert [wf.id for wf in workflows] == [workflow_id_for_turn(turn_id)]
    messages = await priya.messages(session_id)
    assert [m["role"] for m in messages] == ["user", "assistant"]


async def test_same_key_with_other_text_is_422_and_stores_nothing(priya: ParleyClient) -> None:
    session_id = await priya.new_session()
    key = uuid.uuid4().hex
    first = await priya.post(session_id, "Hello there", client_message_id=key)
    await priya.events(session_id, first.json()["turn_id"])
    reused = await priya.post(session_id, "Cancel everything", client_message_id=key)
    assert reused.status_code == 422
    assert reused.json()["error"]["code"] == "idempotency_key_reused"
    texts = [m["text"] for m in await priya.messages(session_id) if m["role"] == "user"]
    assert texts == ["Hello there"]


async def test_stale_expected_last_seq_is_409_with_the_current_seq(priya: ParleyClient) -> None:
    session_id = await priya.new_session()
    first = await priya.post(session_id, "Hello", expected_last_seq=0)
    assert first.status_code == 202
    await priya.events(session_id, first.json()["turn_id"])
    stale = await priya.post(session_id, "Hello again", expected_last_seq=0)
    assert stale.status_code == 409
    assert stale.json()["error"]["code"] == "stale_view"
    assert stale.json()["error"]["last_seq"] == 2
    fresh = await priya.post(session_id, "Hello again", expected_last_seq=2)
    assert fresh.status_code == 202
    assert fresh.json()["message"]["seq"] == 3
    await priya.events(session_id, fresh.json()["turn_id"])


async def test_a_second_message_while_a_turn_runs_is_queued_and_a_third_is_409(
    priya: ParleyClient,
) -> None:
    session_id = await priya.new_session()
    first = await priya.post(session_id, "Tell me everything about my orders")
    key = uuid.uuid4().hex
    queued = await priya.post(session_id, "Are you there?", client_message_id=key)
    assert queued.status_code == 202
    assert queued.json()["state"] == "queued"
    assert queued.json()["message"]["seq"] == 0  # not in the conversation yet
    queued_id = queued.json()["turn_id"]
    assert queued_id != first.json()["turn_id"]
    busy = await priya.post(session_id, "Hello?")
    assert busy.status_code == 409
    error = busy.json()["error"]
    assert error["code"] == "turn_in_progress"
    assert error["active_turn_id"] == first.json()["turn_id"]
    # The same queued message again is its turn, still queued.
    again = await priya.post(session_id, "Are you there?", client_message_id=key)
    assert again.status_code == 200
    assert again.json()["turn_id"] == queued_id and again.json()["state"] == "queued"

    # Dropped (the page's Stop, asked to drop it too): it ends and never joins the chat.
    dropped = await priya.http.post(f"/v1/sessions/{session_id}/turns/{queued_id}/cancel")
    assert dropped.status_code == 202
    assert dropped.json()["turn"]["state"] == "cancelled"
    events = await priya.events(session_id, queued_id)
    assert [e.type for e in events] == ["state", "state", "cancelled"]
    assert [e.data.get("state") for e in events[:2]] == ["queued", "cancelled"]
    assert events[-1].data["message"]["text"] == "Are you there?"
    again = await priya.http.post(f"/v1/sessions/{session_id}/turns/{queued_id}/cancel")
    assert again.status_code == 409

    await priya.events(session_id, first.json()["turn_id"])
    texts = [m["text"] for m in await priya.messages(session_id) if m["role"] == "user"]
    assert texts == ["Tell me everything about my orders"]
    # Once the turn is done the session takes the next message.
    assert (await priya.post(session_id, "Are you there?")).status_code == 202


async def test_another_users_session_turn_and_stream_look_missing(
    priya: ParleyClient, marco: ParleyClient, api_url: str, tokens: dict[str, str]
) -> None:
    session_id = await priya.new_session()
    turn_id, _ = await priya.turn(session_id, "Hello there")
    ines = ParleyClient(api_url, tokens["ines"])  # another tenant altogether
    try:
        for intruder in (marco, ines):
            for path in (
                f"/v1/sessions/{session_id}",
                f"/v1/sessions/{session_id}/messages",
                f"/v1/sessions/{session_id}/turns/{turn_id}",
                f"/v1/sessions/{session_id}/turns/{turn_id}/events",
            ):
                theirs = await intruder.http.get(path)
                missing = await intruder.http.get(path.replace(session_id, "ses_missing"))
                assert theirs.status_code == 404, path
                assert theirs.json() == missing.json(), path
            post = await intruder.post(session_id, "Show me Priya's orders")
            assert post.status_code == 404
        listed = (await marco.http.get("/v1/sessions")).json()["sessions"]
        assert session_id not in {s["id"] for s in listed}
    finally:
        await ines.aclose()
    assert len(await priya.messages(session_id)) == 2


async def test_invalid_bodies_are_422_invalid_request_naming_the_field(
    priya: ParleyClient,
) -> None:
    session_id = await priya.new_session()
    cases = [
        ({"client_message_id": "", "text": "hi"}, "client_message_id"),
        ({"client_message_id": "x" * 65, "text": "hi"}, "client_message_id"),
        ({"client_message_id": "k1", "text": ""}, "text"),
        ({"client_message_id": "k2", "text": "x" * 8001}, "text"),
        ({"text": "hi"}, "client_message_id"),
        ({"client_message_id": "k3", "text": "nul \u0000 inside"}, "text"),
    ]
    for body, field in cases:
        response = await priya.http.post(f"/v1/sessions/{session_id}/messages", json=body)
        assert response.status_code == 422, body
        error = response.json()["error"]
        assert error["code"] == "invalid_request"
        assert error["field"] == field
    assert await priya.messages(session_id) == []


async def test_session_view_shows_the_active_turn_then_none(priya: ParleyClient) -> None:
    session_id = await priya.new_session()
    posted = await priya.post(session_id, "Hello there")
    view = await priya.session_view(session_id)
    assert view["active_turn"]["id"] == posted.json()["turn_id"]
    assert view["last_seq"] == 1
    await priya.events(session_id, posted.json()["turn_id"])
    view = await priya.session_view(session_id)
    assert view["active_turn"] is None and view["last_seq"] == 2
    turn = (
        await priya.http.get(f"/v1/sessions/{session_id}/turns/{posted.json()['turn_id']}")
    ).json()
    assert turn["state"] == "completed"
    assert turn["assistant_message_id"] is not None
    later = await priya.messages(session_id, after_seq=1)
    assert [m["seq"] for m in later] == [2]


async def test_health_readiness_metrics_and_openapi(api_url: str) -> None:
    async with httpx.AsyncClient(base_url=api_url) as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        ready = await http.get("/readyz")
        assert ready.status_code == 200 and ready.json()["ready"] is True
        assert "parley_messages_posted_total" in (await http.get("/metrics")).text
        paths = (await http.get("/openapi.json")).json()["paths"]
        assert "/v1/sessions/{session_id}/messages" in paths
        assert "/v1/sessions/{session_id}/turns/{turn_id}/events" in paths


async def test_bodies_and_events_match_the_wire_models(priya: ParleyClient) -> None:
    session_id = await priya.new_session()
    posted = await priya.post(session_id, "Hello there")
    started = TurnStarted.model_validate(posted.json())
    assert posted.json() == started.model_dump(mode="json")  # nothing dropped, nothing added
    events = await priya.events(session_id, started.turn_id)
    assert [
        event_data(e.type, e.data).model_dump(mode="json", exclude_unset=True) for e in events
    ] == [e.data for e in events]
    session = (await priya.http.get(f"/v1/sessions/{session_id}")).json()
    assert session == SessionDetail.model_validate(session).model_dump(mode="json")
    turn = (await priya.http.get(f"/v1/sessions/{session_id}/turns/{started.turn_id}")).json()
    assert turn == TurnOut.model_validate(turn).model_dump(mode="json")
    for message in await priya.messages(session_id):
        assert message == MessageView.model_validate(message).model_dump(mode="json")


async def test_every_route_documents_its_errors_in_the_error_shape(api_url: str) -> None:
    async with httpx.AsyncClient(base_url=api_url) as http:
        spec = (await http.get("/openapi.json")).json()
    error_ref = {"$ref": "#/components/schemas/ErrorOut"}
    for path, operations in spec["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for method, operation in operations.items():
            answers = operation["responses"]
            # Every route answers a bad request with 422; a route that takes a token also
            # lists 401 (tests/api/test_ownership.py says which take none).
            for status in ("401", "422") if "401" in answers else ("422",):
                assert answers[status]["content"]["application/json"]["schema"] == error_ref, (
                    method,
                    path,
                    status,
                )
            if "{" in path:
                assert "404" in answers, (method, path)
    stream = spec["paths"]["/v1/sessions/{session_id}/turns/{turn_id}/events"]["get"]
    assert list(stream["responses"]["200"]["content"]) == ["text/event-stream"]


async def test_a_tool_message_shows_its_tool_never_its_raw_result(priya: ParleyClient) -> None:
    sid = await priya.new_session()
    _, events = await priya.turn(sid, "Where is my order?")
    assert events[-1].type == "done"
    [tool] = [m for m in await priya.messages(sid) if m["role"] == "tool"]
    assert tool["tool"] == {"name": "list_open_orders", "label": tool["text"], "status": "ok"}
    # The backend's payload (order numbers, carriers, notes) is the model's, not the view's.
    assert "8472" not in json.dumps(tool) and "result" not in json.dumps(tool)
    assert set(tool) == {
        "id",
        "seq",
        "role",
        "turn_id",
        "status",
        "text",
        "tool_call_id",
        "tool",
        "created_at",
    }
