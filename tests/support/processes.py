"""Helpers for tests that run Parley as real processes (workers killed with SIGKILL) or take its
services away (a database or Temporal outage, a restart) and follow a turn through it."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
from temporalio.client import Client

from parley.config import Settings
from parley.launch.dev import temporal_dev_server_command
from parley.store.db import Database
from parley.store.events import OUTBOX_CHANNEL, OutboxRing, ring
from tests.support.client import ParleyClient
from tests.support.sse import TERMINAL, Event, iter_events
from tests.support.stack import service_env
from tests.support.toolkit import eventually
from tests.support.zygote import Forked, fork_worker, warm_zygote

# A question whose demo answer streams long enough for an outage or a restart to cut it.
QUESTION = "Tell me about yourself, please."


class Workers:
    def __init__(self, settings: Settings) -> None:
        self.env = service_env(settings, PARLEY_OUTBOX_GRACE_S="1", PARLEY_OUTBOX_POLL_S="1")
        self.processes: list[Forked] = []
        warm_zygote()  # its imports run while the test sets up, not in its first start

    def start(self) -> Forked:
        process = fork_worker(self.env)
        self.processes.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait(10)


class TemporalServer:
    """A Temporal dev server of a test module's own, on a fixed port and database file (as
    `make run` starts it), so a restart finds its history: killed or stopped, and started
    again on the same file."""

    def __init__(self, settings: Settings, db_file: Path) -> None:
        self.command = temporal_dev_server_command(settings, db_file)
        self.address = settings.temporal_address
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    async def connect(self) -> Client:
        """A client, once the server answers."""

        async def connected() -> Client | None:
            try:
                return await Client.connect(self.address)
            except RuntimeError:
                return None

        return await eventually(
            connected, timeout=60, what="the Temporal dev server answers", every=0.2
        )


async def ring_until(
    sessions: Database,
    settings: Settings,
    turn_id: str,
    done: Callable[[], Awaitable[bool]],
    *,
    what: str,
) -> None:
    """Ring the outbox for a posted turn, as its post did, until `done()`. A worker just
    started listens a moment after it polls: a post in between rang for nobody, and a worker
    whose sweep waits long (as a test sets it) would leave that turn where it is."""
    payload = OutboxRing(
        turn_id,
        settings.task_queue,
        settings.confirmation_timeout_s,
        fallback=settings.has_fallback_model,
    ).payload()

    async def answered() -> bool:
        if await done():
            return True
        async with sessions() as db:
            await ring(db, channel=OUTBOX_CHANNEL, payload=payload)
            await db.commit()
        return False

    await eventually(answered, timeout=60, what=what, every=0.3)


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
