"""The body limit holds before anything reads a body: against a real API process, a client
that declares 50 MB and sends a few KB gets 413 on every route, without a token, and twenty
such clients at once do not make the API process grow."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from collections.abc import AsyncIterator, Iterator

import httpx
import psutil
import pytest

from parley.config import Settings
from tests.support.stack import free_port, service_env, spawn
from tests.support.toolkit import api_answers

DECLARED = 50 * 1024 * 1024
SENT = 4 * 1024  # what the client sends of the declared body before waiting for an answer
# A regression that reads bodies would buffer what the 20 clients push (up to 2 MB each).
PUSH_LIMIT = 2 * 1024 * 1024
GROWTH_BOUND = 10 * 1024 * 1024


@pytest.fixture(scope="module")
def api_process(settings: Settings) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    process = spawn(
        ["-m", "parley.launch.cli", "api", "--host", "127.0.0.1", "--port", str(port)],
        service_env(settings),
    )
    try:
        yield f"127.0.0.1:{port}", process
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
async def api(api_process: tuple[str, subprocess.Popen[bytes]]) -> AsyncIterator[str]:
    address, process = api_process
    await api_answers(f"http://{address}", timeout=30, running=process)
    yield address


def head(method: str, path: str, address: str, **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {address}", "Content-Type: application/json"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def status_and_body(reader: asyncio.StreamReader) -> tuple[int, dict[str, object]]:
    header = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    status = int(header.split(b" ", 2)[1])
    length = next(
        int(line.split(b":", 1)[1])
        for line in header.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return status, json.loads(await asyncio.wait_for(reader.readexactly(length), 10))


async def routes(address: str) -> list[tuple[str, str]]:
    async with httpx.AsyncClient() as http:
        spec = (await http.get(f"http://{address}/openapi.json")).json()
    filled = {"{session_id}": "ses_x", "{turn_id}": "trn_x", "{action_id}": "act_x"}
    out = []
    for template, operations in spec["paths"].items():
        path = template.replace("{tenant_id}", "northwind")
        for placeholder, value in filled.items():
            path = path.replace(placeholder, value)
        out += [(method.upper(), path) for method in operations]
    return out


async def test_a_declared_50_mb_body_is_413_on_every_route_after_a_few_kb(api: str) -> None:
    host, port = api.split(":")
    answered = []
    for method, path in await routes(api):
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(head(method, path, api, Content_Length=str(DECLARED)) + b"x" * SENT)
            await writer.drain()
            status, body = await status_and_body(reader)
        finally:
            writer.close()
        assert status == 413, (method, path, body)
        assert body["error"]["code"] == "payload_too_large", body  # type: ignore[index]
        answered.append(f"{method} {path}")
    print(f"\n413 after {SENT} bytes on {len(answered)} routes")
    assert len(answered) >= 15


async def test_a_chunked_body_is_cut_off_at_the_limit(api: str, settings: Settings) -> None:
    host, port = api.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    chunk = b"x" * 16 * 1024
    try:
        path = "/v1/sessions/ses_x/messages"
        writer.write(head("POST", path, api, Transfer_Encoding="chunked"))
        sent = 0
        while sent <= settings.max_body_bytes:
            writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            await writer.drain()
            sent += len(chunk)
        status, body = await status_and_body(reader)
    finally:
        writer.close()
    assert status == 413, body
    assert body["error"]["code"] == "payload_too_large"  # type: ignore[index]


async def test_twenty_open_oversized_requests_do_not_grow_the_api(
    api: str, api_process: tuple[str, subprocess.Popen[bytes]]
) -> None:
    _, process = api_process
    rss = psutil.Process(process.pid).memory_info
    host, port = api.split(":")
    path = "/v1/sessions/ses_x/messages"
    before = rss().rss
    writers: list[asyncio.StreamWriter] = []

    async def oversized() -> int:
        reader, writer = await asyncio.open_connection(host, int(port))
        writers.append(writer)
        writer.write(head("POST", path, api, Content_Length=str(DECLARED)) + b"x" * SENT)
        answer = asyncio.ensure_future(status_and_body(reader))
        pushed = SENT
        # Keep pushing the body until the answer comes: a server that reads bodies would
        # hold all of it.
        with contextlib.suppress(ConnectionError):
            while pushed < PUSH_LIMIT:
                await asyncio.wait({answer}, timeout=0.02)
                if answer.done():
                    break
                writer.write(b"x" * 64 * 1024)
                await writer.drain()
                pushed += 64 * 1024
        status, _ = await answer
        return status

    peak = before

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, rss().rss)
            await asyncio.sleep(0.005)

    sampler = asyncio.ensure_future(sample())
    try:
        statuses = await asyncio.gather(*(oversized() for _ in range(20)))
        during = rss().rss  # all twenty answered, their sockets still open on our side
    finally:
        sampler.cancel()
        for writer in writers:
            writer.close()
    during = max(during, peak)
    growth = during - before
    print(
        f"\nAPI RSS {before / 2**20:.1f} MiB before, {during / 2**20:.1f} MiB with 20 open "
        f"50 MB requests (peak; growth {growth / 2**10:.0f} KiB)"
    )
    assert statuses == [413] * 20
    assert growth < GROWTH_BOUND
