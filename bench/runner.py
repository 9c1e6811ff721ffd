"""Workloads: sequential turns for time-to-first-delta, concurrent clients for throughput.

Parley and the baseline differ only in how a turn's event stream is opened (`Target`); the
timing, the SSE reading and the bookkeeping are one code path for both.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.support.sse import TERMINAL, iter_events

TURN_TIMEOUT_S = 60.0


class Target:
    """How to reach one system: open a conversation, open one turn's event stream."""

    name: str

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def new_conversation(self) -> str:
        raise NotImplementedError

    def open_turn(
        self, conversation: str, text: str
    ) -> AbstractAsyncContextManager[httpx.Response]:
        raise NotImplementedError


class ParleyTarget(Target):
    """POST the message (202 with `events_url`), then GET the event stream."""

    name = "parley"
    last_turn_id: str | None = None

    async def new_conversation(self) -> str:
        response = await self.http.post("/v1/sessions")
        if response.status_code != 201:
            raise RuntimeError(f"POST /v1/sessions: {response.status_code} {response.text}")
        return str(response.json()["id"])

    @asynccontextmanager
    async def open_turn(self, conversation: str, text: str) -> AsyncIterator[httpx.Response]:
        posted = await self.http.post(
            f"/v1/sessions/{conversation}/messages",
            json={"client_message_id": uuid.uuid4().hex, "text": text, "expected_last_seq": None},
        )
        if posted.status_code != 202:
            raise RuntimeError(f"POST messages: {posted.status_code} {posted.text}")
        self.last_turn_id = str(posted.json()["turn_id"])
        async with self.http.stream("GET", posted.json()["events_url"]) as response:
            yield response


class BaselineTarget(Target):
    """One POST whose response is the event stream."""

    name = "baseline"

    async def new_conversation(self) -> str:
        return ""

    @asynccontextmanager
    async def open_turn(self, conversation: str, text: str) -> AsyncIterator[httpx.Response]:
        body = {"client_message_id": uuid.uuid4().hex, "text": text, "expected_last_seq": None}
        async with self.http.stream("POST", "/v1/stream", json=body) as response:
            yield response


@dataclass
class Turn:
    ok: bool
    first_delta_s: float | None = None
    total_s: float | None = None
    deltas: int = 0
    chars: int = 0
    error: str | None = None
    # Events the client never saw: gaps in the event ids (Parley numbers a turn's events from
    # 1 without gaps; the baseline too), plus one for an answer whose `done` text is not the
    # text its deltas spelled out.
    lost: int = 0


async def run_turn(target: Target, conversation: str, text: str) -> Turn:
    """Time one turn from the start of the POST to the first `delta` and to the terminal event."""
    start = time.perf_counter()
    turn = Turn(ok=False)
    try:
        async with asyncio.timeout(TURN_TIMEOUT_S):
            async with target.open_turn(conversation, text) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise RuntimeError(f"stream: {response.status_code} {response.text}")
                await _read_turn(response, turn, start)
    except Exception as exc:  # counted and reported, never fatal to the run
        turn.error = f"{type(exc).__name__}: {exc}"
    return turn


async def _read_turn(response: httpx.Response, turn: Turn, start: float) -> None:
    last_id = 0
    texts: dict[str, list[str]] = {}  # message id -> its deltas since its last reset
    async for event in iter_events(response):
        if event.id is not None:
            turn.lost += max(0, event.id - last_id - 1)
            last_id = event.id
        if event.type == "delta":
            if turn.first_delta_s is None:
                turn.first_delta_s = time.perf_counter() - start
            turn.deltas += 1
            turn.chars += len(event.data["text"])
            texts.setdefault(event.data["message_id"], []).append(event.data["text"])
        elif event.type == "reset":
            texts.pop(event.data.get("message_id", ""), None)
        elif event.type in TERMINAL:
            turn.total_s = time.perf_counter() - start
            turn.ok = event.type == "done" and turn.first_delta_s is not None
            if not turn.ok:
                turn.error = f"terminal {event.type}: {event.data}"
            else:
                message = event.data["message"]
                turn.lost += "".join(texts.get(message["id"], [])) != message["text"]
            return
    turn.error = "stream closed without a terminal event"


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (the 'inclusive' method)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": percentile(values, 0.50) * 1000,
        "p95_ms": percentile(values, 0.95) * 1000,
        "mean_ms": (statistics.fmean(values) * 1000) if values else math.nan,
        "min_ms": (min(values) * 1000) if values else math.nan,
        "max_ms": (max(values) * 1000) if values else math.nan,
    }


@dataclass
class Phase:
    turns: list[Turn] = field(default_factory=list)
    wall_s: float = 0.0

    def report(self) -> dict[str, Any]:
        good = [t for t in self.turns if t.ok]
        errors = [t.error for t in self.turns if not t.ok]
        out: dict[str, Any] = {
            "turns": len(self.turns),
            "ok": len(good),
            "failed": len(errors),
            "first_delta": summarize([t.first_delta_s for t in good if t.first_delta_s]),
            "full_turn": summarize([t.total_s for t in good if t.total_s]),
            "delta_events_per_turn": statistics.fmean([t.deltas for t in good]) if good else 0,
            "chars_per_turn": statistics.fmean([t.chars for t in good]) if good else 0,
            "events_lost": sum(t.lost for t in self.turns),
        }
        if self.wall_s:
            out["wall_s"] = self.wall_s
            out["turns_per_s"] = len(good) / self.wall_s
        if errors:
            out["first_errors"] = errors[:5]
        return out


def turn_text(i: int) -> str:
    """A plain answer: no tool."""
    return f"Tell me about yourself, please (benchmark turn {i})."


def tool_text(i: int) -> str:
    """A tool turn: the demo model looks the orders up (one read tool), then answers."""
    return f"Where are my orders? (benchmark turn {i})"


async def sequential(
    targets: list[Target],
    turns: int,
    turns_per_session: int,
    check: Callable[[], None],
) -> dict[str, Phase]:
    """`turns` sequential turns per target, interleaved turn by turn so drift hits both alike;
    a fresh conversation every `turns_per_session` turns (created outside the timing)."""
    phases = {target.name: Phase() for target in targets}
    conversations = {target.name: "" for target in targets}
    for i in range(turns):
        if i % turns_per_session == 0:
            check()
            for target in targets:
                conversations[target.name] = await target.new_conversation()
        for target in targets:
            turn = await run_turn(target, conversations[target.name], turn_text(i))
            phases[target.name].turns.append(turn)
    return phases


async def concurrent(
    target: Target,
    clients: int,
    turns_per_client: int,
    check: Callable[[], None],
    text: Callable[[int], str] = turn_text,
) -> Phase:
    """`clients` conversations at once, each running `turns_per_client` turns back to back
    (post, stream to the terminal event, next). Conversations are created before the clock."""
    check()
    conversations = await asyncio.gather(*(target.new_conversation() for _ in range(clients)))
    phase = Phase()

    async def client(conversation: str, c: int) -> None:
        for i in range(turns_per_client):
            phase.turns.append(await run_turn(target, conversation, text(c * 1000 + i)))

    start = time.perf_counter()
    await asyncio.gather(*(client(conv, c) for c, conv in enumerate(conversations)))
    phase.wall_s = time.perf_counter() - start
    return phase


async def timed(label: str, work: Awaitable[Any], log: Callable[[str], None]) -> Any:
    start = time.perf_counter()
    result = await work
    log(f"{label}: {time.perf_counter() - start:.1f}s")
    return result
