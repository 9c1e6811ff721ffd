"""Helpers for tests that run Parley as real processes (workers killed with SIGKILL)."""

from __future__ import annotations

import subprocess

from parley.config import Settings
from tests.client import ParleyClient
from tests.conftest import service_env, spawn
from tests.sse import TERMINAL, Event, iter_events


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
