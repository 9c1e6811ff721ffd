"""A strict client-side reader of `text/event-stream`.

The tests use it to check the raw wire format and the benchmarks use it to time streams, so
both read Parley (and the bench baseline) through the same client path.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

TERMINAL = frozenset({"done", "error", "cancelled"})


@dataclass
class Event:
    id: int | None  # a turn stream's id; None on the session stream (see `cursor`)
    type: str
    data: Any
    cursor: str | None = None  # the `id` line as sent (the session stream's cursor)


async def iter_events(response: httpx.Response) -> AsyncIterator[Event]:
    event_id: int | None = None
    cursor: str | None = None
    event_type = "message"
    data: list[str] = []
    async for line in response.aiter_lines():
        if line == "":
            if data:
                yield Event(event_id, event_type, json.loads("\n".join(data)), cursor)
            event_id, cursor, event_type, data = None, None, "message", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "id":
            cursor = value
            event_id = int(value) if value.isdigit() else None
        elif field == "event":
            event_type = value
        elif field == "data":
            data.append(value)
