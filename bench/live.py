"""(r) Every tab live: a card confirmed by client A, seen by client B (issue 42, acceptance 5:
within 1 s), beside the same event on A's own turn stream in the same run.

Each try opens a session in which the demo model proposes an email (the reference
conversation: "Where is my order?", then "Can you email me?"), so its second turn rests on a
card. Client B (a second HTTP client of the same user) holds the session stream
(`GET /v1/sessions/{sid}/stream`) and has read up to the card; client A holds its turn's own
stream resumed after the card, as the page does once it has answered it (the baseline: the
path the confirming tab already had). Then A POSTs the confirm, and both times are taken from
just before that POST to `confirmation_resolved` on each stream. A try that goes wrong is
counted apart, never timed.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from bench.runner import TURN_TIMEOUT_S, percentile
from bench.stack import log
from bench.throughput import fmt
from tests.support.sse import TERMINAL, Event, iter_events

WITHIN_S = 1.0  # the acceptance's bound for B


@dataclass
class Try:
    outcome: str  # "confirmed", or what went wrong
    other_client_s: float | None = None  # confirm POST -> `confirmation_resolved` on B
    own_stream_s: float | None = None  # confirm POST -> the same on A's turn stream


async def measure_live(http: httpx.AsyncClient, *, tries: int) -> dict[str, Any]:
    log(f"(r) every tab live: {tries} confirms seen by a second client")
    other = httpx.AsyncClient(base_url=http.base_url, headers=http.headers, timeout=30)
    try:
        done = [await _timed_try(http, other) for _ in range(tries)]
    finally:
        await other.aclose()
    seen = [t.other_client_s * 1000 for t in done if t.other_client_s is not None]
    own = [t.own_stream_s * 1000 for t in done if t.own_stream_s is not None]
    return {
        "tries": tries,
        "confirmed": len(seen),
        "other_client_ms": _spread(seen),
        "own_stream_ms": _spread(own),
        "within_1s": sum(v <= WITHIN_S * 1000 for v in seen),
        "samples_ms": [round(v, 1) for v in seen],
        "other_outcomes": [t.outcome for t in done if t.other_client_s is None][:5],
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": percentile(values, 0.5),
        "p95_ms": percentile(values, 0.95),
        "max_ms": max(values, default=float("nan")),
    }


async def _timed_try(http: httpx.AsyncClient, other: httpx.AsyncClient) -> Try:
    try:
        async with asyncio.timeout(TURN_TIMEOUT_S):
            return await _try(http, other)
    except Exception as exc:  # counted and reported, never fatal to the run
        return Try(f"{type(exc).__name__}: {exc}")


async def _try(http: httpx.AsyncClient, other: httpx.AsyncClient) -> Try:
    sid = _ok(await http.post("/v1/sessions"), 201)["id"]
    async with other.stream("GET", f"/v1/sessions/{sid}/stream") as live:
        frames = iter_events(live)
        await _until(frames, "ready", one_turn=False)
        await _turn(http, sid, "Where is my order?", "done")
        turn_id, card = await _turn(http, sid, "Can you email me?", "confirmation_required")
        await _until(frames, "confirmation_required", one_turn=False)
        events = f"/v1/sessions/{sid}/turns/{turn_id}/events"
        headers = {"Last-Event-ID": str(card.id)}
        async with http.stream("GET", events, headers=headers) as own:
            own_seen = asyncio.create_task(_seen(iter_events(own)))
            other_seen = asyncio.create_task(_seen(frames, one_turn=False))
            await asyncio.sleep(0)  # both readers wait on their streams before the POST
            confirm_at = time.perf_counter()
            action_id = card.data["action"]["id"]
            confirmed = await http.post(f"/v1/sessions/{sid}/actions/{action_id}/confirm")
            if confirmed.status_code != 202:
                own_seen.cancel()
                other_seen.cancel()
                return Try(f"the confirm answered {confirmed.status_code}")
            other_at, own_at = await asyncio.gather(other_seen, own_seen)
    return Try("confirmed", other_at - confirm_at, own_at - confirm_at)


async def _turn(http: httpx.AsyncClient, sid: str, text: str, until: str) -> tuple[str, Event]:
    """Post `text` and read its turn's stream to `until`: the turn and that event."""
    body = {"client_message_id": uuid.uuid4().hex, "text": text, "expected_last_seq": None}
    posted = _ok(await http.post(f"/v1/sessions/{sid}/messages", json=body), 202)
    async with http.stream("GET", posted["events_url"]) as response:
        return str(posted["turn_id"]), await _until(iter_events(response), until)


async def _until(frames: AsyncIterator[Event], kind: str, *, one_turn: bool = True) -> Event:
    """The first frame of `kind`; on a turn's stream (`one_turn`), a terminal event first is
    an error, while the session stream goes on past each turn's end."""
    async for frame in frames:
        if frame.type == kind:
            return frame
        if one_turn and frame.type in TERMINAL:
            raise RuntimeError(f"the stream ended with {frame.type} before {kind}")
    raise RuntimeError(f"the stream closed before {kind}")


async def _seen(frames: AsyncIterator[Event], *, one_turn: bool = True) -> float:
    """When `confirmation_resolved` arrived."""
    await _until(frames, "confirmation_resolved", one_turn=one_turn)
    return time.perf_counter()


def _ok(response: httpx.Response, status: int) -> dict[str, Any]:
    if response.status_code != status:
        raise RuntimeError(f"{response.request.url.path}: {response.status_code} {response.text}")
    body: dict[str, Any] = response.json()
    return body


def render_live(results: dict[str, Any]) -> str:
    other, own = results["other_client_ms"], results["own_stream_ms"]
    lines = [
        "",
        f"(r) Every tab live: confirm POST by client A -> `confirmation_resolved` (ms), "
        f"{results['tries']} tries",
        f"  {'':<34}{'p50':>8}{'p95':>8}{'max':>8}",
        f"  {'client B, session stream':<34}{fmt(other['p50_ms']):>8}"
        f"{fmt(other['p95_ms']):>8}{fmt(other['max_ms']):>8}",
        f"  {'baseline: A, its own turn stream':<34}{fmt(own['p50_ms']):>8}"
        f"{fmt(own['p95_ms']):>8}{fmt(own['max_ms']):>8}",
        f"  seen by B within {WITHIN_S:g} s: {results['within_1s']}/{results['confirmed']}"
        f" (confirmed {results['confirmed']}/{results['tries']})",
    ]
    lines.extend(f"  other outcome: {outcome}" for outcome in results["other_outcomes"])
    return "\n".join(lines)
