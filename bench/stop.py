"""(k) Stop mid-answer: from the cancel POST to the `cancelled` event on the stream (issue 25,
acceptance 5: at most 300 ms p95 over 20 tries).

Each try opens a fresh session and attaches a text file whose one long sentence the demo model
quotes whole when asked about it (gateway/demo_files.py), so the answer streams for seconds at
the bench's token delay, long after the Stop. The bench reads the stream from the start, waits
for the first `delta`, POSTs the cancel and times until the `cancelled` event arrives on that
same stream: what the user sees after pressing Stop. The cancel's own answer is timed too. A
try whose answer ended before the Stop reached it (the cancel answers 409) is counted apart,
never timed.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from bench.runner import TURN_TIMEOUT_S, percentile
from bench.stack import log
from bench.throughput import fmt
from tests.support.sse import TERMINAL, iter_events

# About 500 tokens: 2.5 s of streaming at the default 5 ms per token.
LOG_TEXT = (
    "The trail log lists "
    + ", then ".join(f"camp {n} by the river bend" for n in range(1, 81))
    + ".\n"
).encode()
QUESTION = "What does the trail log list? (stop try {i})"


@dataclass
class Try:
    outcome: str  # "cancelled", "finished before the Stop", or what went wrong
    stopped_s: float | None = None  # cancel POST -> `cancelled` on the stream
    answered_s: float | None = None  # cancel POST -> its response


async def measure_stop(http: httpx.AsyncClient, *, tries: int) -> dict[str, Any]:
    log(f"(k) Stop mid-answer: {tries} tries")
    done = [await _timed_try(http, i) for i in range(tries)]
    stopped = [t.stopped_s * 1000 for t in done if t.stopped_s is not None]
    answered = [t.answered_s * 1000 for t in done if t.answered_s is not None]
    return {
        "tries": tries,
        "cancelled": len(stopped),
        "finished_first": sum(t.outcome == "finished before the Stop" for t in done),
        "cancel_to_cancelled_ms": _spread(stopped),
        "cancel_answered_ms": _spread(answered),
        "samples_ms": [round(v, 1) for v in stopped],
        "other_outcomes": [t.outcome for t in done if t.stopped_s is None][:5],
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": percentile(values, 0.5),
        "p95_ms": percentile(values, 0.95),
        "max_ms": max(values, default=float("nan")),
    }


async def _timed_try(http: httpx.AsyncClient, i: int) -> Try:
    try:
        async with asyncio.timeout(TURN_TIMEOUT_S):
            return await _try(http, i)
    except Exception as exc:  # counted and reported, never fatal to the run
        return Try(f"{type(exc).__name__}: {exc}")


async def _try(http: httpx.AsyncClient, i: int) -> Try:
    session_id = _ok(await http.post("/v1/sessions"), 201)["id"]
    upload = await http.post(
        f"/v1/sessions/{session_id}/files",
        files={"file": ("trail-log.txt", LOG_TEXT, "text/plain")},
    )
    file_id = _ok(upload, 201)["file_id"]
    message = {
        "client_message_id": uuid.uuid4().hex,
        "text": QUESTION.format(i=i),
        "expected_last_seq": None,
        "file_ids": [file_id],
    }
    posted = _ok(await http.post(f"/v1/sessions/{session_id}/messages", json=message), 202)
    async with http.stream("GET", posted["events_url"]) as response:
        first_delta = asyncio.Event()
        reader = asyncio.create_task(_ending(response, first_delta))
        await first_delta.wait()
        if reader.done():
            return Try(f"ended {reader.result()[0]} before a delta or the Stop")
        stop_at = time.perf_counter()
        cancel = await http.post(f"/v1/sessions/{session_id}/turns/{posted['turn_id']}/cancel")
        answered = time.perf_counter() - stop_at
        ending, ended_at = await reader
    if cancel.status_code == 409:
        return Try("finished before the Stop")
    if cancel.status_code != 202 or ending != "cancelled":
        return Try(f"cancel answered {cancel.status_code}, the stream ended {ending}")
    return Try("cancelled", ended_at - stop_at, answered)


def _ok(response: httpx.Response, status: int) -> dict[str, Any]:
    if response.status_code != status:
        raise RuntimeError(f"{response.request.url.path}: {response.status_code} {response.text}")
    body: dict[str, Any] = response.json()
    return body


async def _ending(response: httpx.Response, first_delta: asyncio.Event) -> tuple[str, float]:
    """Read the stream to its ending event: its type and the moment it arrived. The first
    `delta` (or an ending before any) sets `first_delta`."""
    try:
        async for event in iter_events(response):
            if event.type == "delta":
                first_delta.set()
            elif event.type in TERMINAL:
                return event.type, time.perf_counter()
        return "closed without an ending event", time.perf_counter()
    finally:
        first_delta.set()


def render_stop(results: dict[str, Any]) -> str:
    stopped, answered = results["cancel_to_cancelled_ms"], results["cancel_answered_ms"]
    lines = [
        "",
        f"(k) Stop mid-answer: cancel POST -> `cancelled` on the stream (ms), "
        f"{results['tries']} tries, each after the first `delta` of a long answer",
        f"  {'':<30}{'p50':>8}{'p95':>8}{'max':>8}",
        f"  {'cancel POST -> cancelled event':<30}{fmt(stopped['p50_ms']):>8}"
        f"{fmt(stopped['p95_ms']):>8}{fmt(stopped['max_ms']):>8}",
        f"  {'cancel POST -> its 202':<30}{fmt(answered['p50_ms']):>8}"
        f"{fmt(answered['p95_ms']):>8}{fmt(answered['max_ms']):>8}",
        f"  cancelled {results['cancelled']}/{results['tries']}; answer finished before the "
        f"Stop {results['finished_first']}",
    ]
    lines.extend(f"  other outcome: {outcome}" for outcome in results["other_outcomes"])
    return "\n".join(lines)
