"""Reading the session stream in the API tests (docs/api.md, The session stream): its frames
up to a point, and a turn's events as it carried them, in the form a turn's own stream's are
compared in."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from tests.support.client import ParleyClient
from tests.support.sse import Event

SESSION_FRAMES = {"ready", "message", "turn", "branch_switched", "handoff", "session_deleted"}


async def read_until(
    frames: AsyncIterator[Event], last: Callable[[Event], bool], *, timeout: float = 30
) -> list[Event]:
    """Frames up to and including the first for which `last` holds (bounded)."""

    async def read() -> list[Event]:
        seen = []
        async for frame in frames:
            seen.append(frame)
            if last(frame):
                return seen
        raise AssertionError(f"the stream ended first: {[f.type for f in seen]}")

    return await asyncio.wait_for(read(), timeout)


def of_turn(frames: list[Event], turn_id: str) -> list[tuple[int, str, Any]]:
    """The turn's events as the session stream carried them: (id, type, data)."""
    return [
        (f.data["id"], f.type, f.data["data"])
        for f in frames
        if f.type not in SESSION_FRAMES and f.data["turn_id"] == turn_id
    ]


def as_sent(events: list[Event]) -> list[tuple[int, str, Any]]:
    """A turn stream's events in the same form."""
    return [(e.id, e.type, e.data) for e in events]


def done_of(turn_id: str) -> Callable[[Event], bool]:
    return lambda f: f.type == "done" and f.data["turn_id"] == turn_id


def posted(frames: list[Event]) -> list[str]:
    return [f.data["message"]["text"] for f in frames if f.type == "message"]


async def second_client(api_url: str, tokens: dict[str, str]) -> ParleyClient:
    return ParleyClient(api_url, tokens["priya"])
