"""The chaos soak's client (bench/chaos.py) against a scripted API: a stream refused with 503,
cut mid-way and answered 500 is reopened after its last event until its terminal one, the
500 is counted; a stream kept open by pings alone ends at the soak's deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx

from bench.chaos import Soak, Turn


def _frame(event_id: int, kind: str) -> bytes:
    return f'id: {event_id}\nevent: {kind}\ndata: {{"n": {event_id}}}\n\n'.encode()


async def _cut_after(event_id: int) -> AsyncIterator[bytes]:
    yield _frame(event_id, "delta")
    raise httpx.ReadError("the API was killed")


async def _rest(after: int) -> AsyncIterator[bytes]:
    yield _frame(after + 1, "delta")
    yield _frame(after + 2, "done")


async def _pings() -> AsyncIterator[bytes]:
    while True:
        yield b": ping\n\n"
        await asyncio.sleep(0.02)


def _turn() -> Turn:
    return Turn("plain", "ses_1", "m1", turn_id="trn_1")


async def test_a_stream_cut_and_refused_is_reopened_after_its_last_event() -> None:
    asked: list[str] = []
    answers = iter(
        [
            lambda: httpx.Response(503, headers={"Retry-After": "0"}, text="{}"),
            lambda: httpx.Response(200, content=_cut_after(1)),
            lambda: httpx.Response(500, text="Internal Server Error"),
            lambda: httpx.Response(200, content=_rest(1)),
        ]
    )

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.headers["Last-Event-ID"])
        return next(answers)()

    async with httpx.AsyncClient(
        transport=httpx.MockTransport(handler), base_url="http://api"
    ) as http:
        soak = Soak(http)
        turn = _turn()
        await soak.follow(turn, deadline=time.monotonic() + 10, stop_at_rest=False)

    assert [e.id for e in turn.events] == [1, 2, 3]
    assert turn.end == "done"
    assert asked == ["0", "0", "1", "1"]
    assert soak.tally.statuses[503] == 1 and soak.tally.dropped == 1
    assert len(soak.tally.server_errors) == 1  # the 500, not the 503


async def test_a_stream_kept_open_by_pings_ends_at_the_deadline() -> None:
    async with httpx.AsyncClient(
        transport=httpx.MockTransport(lambda _: httpx.Response(200, content=_pings())),
        base_url="http://api",
    ) as http:
        turn = _turn()
        started = time.monotonic()
        await Soak(http).follow(turn, deadline=started + 0.3, stop_at_rest=False)
    assert time.monotonic() - started < 2
    assert turn.end is None  # counted lost, not waited on forever
