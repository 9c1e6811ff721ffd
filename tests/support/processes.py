"""Helpers for tests that run Parley as real processes (workers killed with SIGKILL) or take its
services away (a database or Temporal outage, a restart) and follow a turn through it."""

from __future__ import annotations

import asyncio
import subprocess
import time

import httpx

from parley.config import Settings
from tests.support.client import ParleyClient
from tests.support.sse import TERMINAL, Event, iter_events
from tests.support.stack import service_env, spawn

# A question whose demo answer streams long enough for an outage or a restart to cut it.
QUESTION = "Tell me about yourself, please."


class Workers:
    def __init__(self, settings: Settings) -> None:
        self.env = service_env(settings, PARLEY_OUTBOX_GRACE_S="1", PARLEY_OUTBOX_POLL_S="1")
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        process = spawn(["worker.py"], self.env)
        self.processes.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait(10)


async def read_until(client: ParleyClient, url: str, *, after: int, stop: str) -> list[Event]:
    """Read events after `after` until one of type `stop` (or a terminal event) arrives."""
    received: list[Event] = []
    headers = {"Last-Event-ID": str(after)}
    async with client.http.stream("GET", url, headers=headers, timeout=90) as response:
        async for event in iter_events(response):
            received.append(event)
            if event.type == stop or event.type in TERMINAL:
                break
    return received


async def follow(client: ParleyClient, url: str, seen: list[Event], *, timeout: float) -> None:
    """Read the turn's stream into `seen` until a terminal event, reconnecting with the last
    id whenever the API drops the stream or cannot serve it (its database is away)."""
    deadline = time.monotonic() + timeout
    while not (seen and seen[-1].type in TERMINAL):
        assert time.monotonic() < deadline, f"no terminal event; last {seen[-3:]}"
        headers = {"Last-Event-ID": str(seen[-1].id)} if seen else {}
        try:
            async with client.http.stream("GET", url, headers=headers, timeout=30) as response:
                if response.status_code == 200:
                    async for event in iter_events(response):
                        seen.append(event)
                        if event.type in TERMINAL:
                            return
        except httpx.HTTPError:
            pass  # dropped mid-stream: reconnect after the last event received
        await asyncio.sleep(0.2)
