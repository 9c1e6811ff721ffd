"""A small test client for the session API that speaks the contract of api.md."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx

from parley.tls import httpx_verified
from tests.support.sse import TERMINAL, Event, iter_events


class ParleyClient:
    def __init__(self, base_url: str, token: str | None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.AsyncClient(
            base_url=base_url, headers=headers, timeout=30, verify=httpx_verified()
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def new_session(self) -> str:
        response = await self.http.post("/v1/sessions")
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    async def post(
        self,
        session_id: str,
        text: str,
        *,
        client_message_id: str | None = None,
        expected_last_seq: int | None = None,
        mode: str | None = None,
    ) -> httpx.Response:
        body = {
            "client_message_id": client_message_id or uuid.uuid4().hex,
            "text": text,
            "expected_last_seq": expected_last_seq,
        }
        if mode is not None:
            body["mode"] = mode
        return await self.http.post(f"/v1/sessions/{session_id}/messages", json=body)

    async def events(
        self,
        session_id: str,
        turn_id: str,
        *,
        last_event_id: int | None = None,
        stop_after: int | None = None,
        base_url: str | None = None,
    ) -> list[Event]:
        """Read the stream until a terminal event (or `stop_after` events, then hang up)."""
        headers = {"Last-Event-ID": str(last_event_id)} if last_event_id is not None else {}
        url = f"/v1/sessions/{session_id}/turns/{turn_id}/events"
        if base_url is not None:
            url = base_url + url
        received: list[Event] = []
        async with self.http.stream("GET", url, headers=headers, timeout=60) as response:
            assert response.status_code == 200, await response.aread()
            async for event in iter_events(response):
                received.append(event)
                if event.type in TERMINAL:
                    break
                if stop_after is not None and len(received) >= stop_after:
                    break
        return received

    @contextlib.asynccontextmanager
    async def session_stream(
        self, session_id: str, *, last_event_id: str | None = None
    ) -> AsyncIterator[AsyncIterator[Event]]:
        """The session stream's frames, as they come (api.md, The session stream)."""
        headers = {"Last-Event-ID": last_event_id} if last_event_id is not None else {}
        url = f"/v1/sessions/{session_id}/stream"
        async with self.http.stream("GET", url, headers=headers, timeout=60) as response:
            assert response.status_code == 200, await response.aread()
            yield iter_events(response)

    async def turn(self, session_id: str, text: str) -> tuple[str, list[Event]]:
        """Post a message and follow its stream to the end."""
        response = await self.post(session_id, text)
        assert response.status_code == 202, response.text
        turn_id = response.json()["turn_id"]
        return turn_id, await self.events(session_id, turn_id)

    async def session_view(self, session_id: str) -> dict[str, Any]:
        response = await self.http.get(f"/v1/sessions/{session_id}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    async def turn_view(self, session_id: str, turn_id: str) -> dict[str, Any]:
        response = await self.http.get(f"/v1/sessions/{session_id}/turns/{turn_id}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    async def messages(self, session_id: str, after_seq: int = 0) -> list[dict[str, Any]]:
        response = await self.http.get(
            f"/v1/sessions/{session_id}/messages", params={"after_seq": after_seq}
        )
        assert response.status_code == 200, response.text
        return list(response.json()["messages"])


def streamed_text(events: list[Event]) -> str:
    """What a client shows after applying deltas and resets in order."""
    text = ""
    for event in events:
        if event.type == "delta":
            text += event.data["text"]
        elif event.type == "reset":
            text = ""
    return text


async def is_ready(client: ParleyClient) -> bool:
    """Whether `/readyz` answers 200 now; a request that fails (the API busy, a connection
    reset while a dependency restarts) is a no, for a caller polling until it is yes."""
    try:
        return (await client.http.get("/readyz", timeout=5)).status_code == 200
    except httpx.HTTPError:
        return False
