"""The AI SDK chat endpoint (api/routes/ai_sdk.py) through HTTP: the UI message stream's
frames, the resend that starts nothing, the approval that confirms, the resume."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx

from tests.support.client import ParleyClient
from tests.support.toolkit import emails


async def chat(client: ParleyClient, body: dict[str, Any]) -> tuple[httpx.Response, list[Any]]:
    chunks: list[Any] = []
    async with client.http.stream("POST", "/v1/ai-sdk/chat", json=body, timeout=60) as response:
        if response.status_code != 200:
            await response.aread()
            return response, chunks
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                payload = line.removeprefix("data: ")
                chunks.append(payload if payload == "[DONE]" else json.loads(payload))
    return response, chunks


def user(text: str, message_id: str | None = None) -> dict[str, Any]:
    return {
        "id": message_id or uuid.uuid4().hex[:16],
        "role": "user",
        "parts": [{"type": "text", "text": text}],
    }


def text_of(chunks: list[Any]) -> str:
    return "".join(c["delta"] for c in chunks if isinstance(c, dict) and c["type"] == "text-delta")


def body(session_id: str, *messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"id": session_id, "messages": list(messages), "trigger": "submit-message", **extra}


async def test_an_answer_is_one_ui_message_ending_with_done(priya: ParleyClient) -> None:
    sid = await priya.new_session()
    response, chunks = await chat(priya, body(sid, user("Where is my order?")))
    assert response.status_code == 200
    assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
    assert response.headers["content-type"].startswith("text/event-stream")
    assert chunks[-1] == "[DONE]"
    assert [c["type"] for c in chunks[:2]] == ["start", "start-step"]
    assert chunks[-2] == {"type": "finish", "finishReason": "stop"}
    stored = [m for m in await priya.messages(sid) if m["role"] == "assistant" and m["text"]]
    assert text_of(chunks) == stored[-1]["text"]


async def test_a_declined_approval_sends_nothing_and_the_answer_goes_on(
    priya: ParleyClient, northwind: httpx.AsyncClient
) -> None:
    sid = await priya.new_session()
    await chat(priya, body(sid, user("Where is my order?")))
    _, asked = await chat(priya, body(sid, user("Can you email me?")))
    request = next(c for c in asked if c != "[DONE]" and c["type"] == "tool-approval-request")
    assert asked[-2] == {"type": "finish", "finishReason": "tool-calls"}
    turn_id = asked[0]["messageId"]
    answered = {
        "id": turn_id,
        "role": "assistant",
        "parts": [
            {
                "type": "dynamic-tool",
                "toolName": "send_email",
                "toolCallId": request["toolCallId"],
                "state": "approval-responded",
                "input": {},
                "approval": {"id": request["approvalId"], "approved": False},
            }
        ],
    }
    response, rest = await chat(priya, body(sid, answered, messageId=turn_id))
    assert response.status_code == 200
    kinds = [c["type"] for c in rest[:-1]]
    assert kinds[0] == "start" and "tool-approval-request" not in kinds  # only what is new
    assert {"type": "tool-output-denied", "toolCallId": request["toolCallId"]} in rest
    assert rest[-2] == {"type": "finish", "finishReason": "stop"}
    assert await emails(northwind, action_id=request["approvalId"]) == []
    turn = (await priya.http.get(f"/v1/sessions/{sid}/turns/{turn_id}")).json()
    assert turn["state"] == "completed"


async def test_a_chat_must_be_a_session_of_the_caller(
    priya: ParleyClient, marco: ParleyClient
) -> None:
    theirs = await marco.new_session()
    response, _ = await chat(priya, body(theirs, user("Hello")))
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    response, _ = await chat(priya, body("ses_unknown", user("Hello")))
    assert response.status_code == 404
    resumed = await priya.http.get(f"/v1/ai-sdk/chat/{theirs}/stream")
    assert resumed.status_code == 404
    assert await marco.messages(theirs) == []


async def test_what_parley_cannot_answer_is_a_clear_422(priya: ParleyClient) -> None:
    sid = await priya.new_session()
    again = body(sid, user("Hello"), trigger="regenerate-message")
    response, _ = await chat(priya, again)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_request"
    assert "trigger" in response.text
    bare = {"id": "x1", "role": "assistant", "parts": [{"type": "text", "text": "Hi"}]}
    response, _ = await chat(priya, body(sid, bare))
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "messages"
    empty = {
        "id": "u1",
        "role": "user",
        "parts": [{"type": "file", "url": "x", "mediaType": "a/b"}],
    }
    response, _ = await chat(priya, body(sid, empty))
    assert response.status_code == 422
    assert await priya.messages(sid) == []


async def test_a_resume_with_nothing_running_is_204(priya: ParleyClient) -> None:
    sid = await priya.new_session()
    assert (await priya.http.get(f"/v1/ai-sdk/chat/{sid}/stream")).status_code == 204
    await chat(priya, body(sid, user("Where is my order?")))
    assert (await priya.http.get(f"/v1/ai-sdk/chat/{sid}/stream")).status_code == 204
