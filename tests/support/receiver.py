"""A webhook receiver on a local port, as a team's own service would be: it answers 500 to
its first `fails` requests, then 200, and keeps each idempotency key's body once."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


@dataclass
class Receiver:
    """The team's endpoint: answers 500 to its first `fails` requests, then 200, and keeps
    each idempotency key's body once (what a receiver that dedupes would act on)."""

    fails: int = 0
    requests: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    kept: dict[str, bytes] = field(default_factory=dict)
    heard: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()  # the request line
        headers: dict[str, str] = {}
        while (line := (await reader.readline()).decode().strip()) != "":
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        self.requests.append((headers, body))
        status = 500 if len(self.requests) <= self.fails else 200
        if status == 200:
            self.kept.setdefault(headers["idempotency-key"], body)
        self.heard.set()
        writer.write(
            f"HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()
        )
        await writer.drain()
        writer.close()

    def events(self) -> list[str]:
        return [json.loads(body)["event"] for body in self.kept.values()]


@contextlib.asynccontextmanager
async def listening(receiver: Receiver) -> AsyncIterator[tuple[Receiver, int]]:
    """The receiver serving on a free local port, with that port."""
    server = await asyncio.start_server(receiver.handle, "127.0.0.1", 0)
    try:
        yield receiver, server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()
