"""Issue 41, acceptance 1: under `make run`, with an answer streaming, `kill -9` of the Temporal
dev server, then of PostgreSQL, then of PostgreSQL twice in a row (the second kill as soon as
the API is ready again). Each is started again by the supervisor within 10 s, with its
data; the turn ends once and the client's view equals the stored text; the next turn works;
no request in between got a 5xx other than 503; the API and the worker are the same
processes throughout (a dependency's restart takes nothing else down with it).

Runs `parley dev` (what `make run` runs) once for the module, on free ports with its own
data folder, as test_make_run.py does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import httpx
import psutil
import pytest

from tests.support.client import ParleyClient, is_ready, streamed_text
from tests.support.dev_run import DevRun, dev_running, port_is_open
from tests.support.processes import follow, read_until
from tests.support.sse import TERMINAL, Event
from tests.support.toolkit import eventually

# `parley dev` starts in the module's first test (its fixture): more than the default per-test
# limit on a loaded machine.
pytestmark = pytest.mark.timeout(600)

# The bound on the supervisor: the dependency is back (answering) within this.
BACK_WITHIN_S = 10.0
# And once PostgreSQL is back, the API is ready again within this, with no restart.
READY_WITHIN_S = 15.0
LONG_QUESTION = "Tell me about yourself, please."


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevRun]:
    with dev_running(tmp_path_factory.mktemp("dev-restarts")) as run:
        yield run


def temporal_server(dev: DevRun) -> psutil.Process | None:
    """The supervisor's live Temporal dev server child."""
    for child in psutil.Process(dev.process.pid).children():
        with contextlib.suppress(psutil.Error):
            if "start-dev" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                return child
    return None


def postmaster(dev: DevRun) -> psutil.Process | None:
    """The embedded PostgreSQL server now running on the run's data folder."""
    with contextlib.suppress(OSError, ValueError, psutil.Error):
        pid = int((dev.data_dir / "pg" / "postmaster.pid").read_text().split("\n", 1)[0])
        server = psutil.Process(pid)
        if server.is_running() and server.status() != psutil.STATUS_ZOMBIE:
            return server
    return None


@dataclass
class Watch:
    """What a client polling the API meanwhile was answered: every status, and every 503's
    headers and body (which must say when to come back, in the contract's error shape)."""

    statuses: list[int] = field(default_factory=list)
    unavailable: list[httpx.Response] = field(default_factory=list)

    def check(self) -> None:
        assert all(s < 500 or s == 503 for s in self.statuses), sorted(set(self.statuses))
        for answer in self.unavailable:
            assert answer.headers.get("Retry-After", "").isdigit(), answer.headers
            error = answer.json()["error"]
            assert error["code"] == "service_unavailable", error
            assert error["dependency"] == "database", error


@contextlib.asynccontextmanager
async def watching(client: ParleyClient, session_id: str) -> AsyncIterator[Watch]:
    """Poll the session's view and `/readyz` until the block ends."""
    watch = Watch()

    async def poll() -> None:
        while True:
            for path in (f"/v1/sessions/{session_id}", "/readyz"):
                try:
                    answer = await client.http.get(path, timeout=5)
                except httpx.HTTPError:
                    continue  # the API itself is never down here: a timeout under load
                watch.statuses.append(answer.status_code)
                if answer.status_code == 503 and path != "/readyz":
                    watch.unavailable.append(answer)
            await asyncio.sleep(0.1)

    poller = asyncio.create_task(poll())
    try:
        yield watch
    finally:
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller


def same_processes(dev: DevRun) -> tuple[int, list[int]]:
    return dev.child_pid("api"), sorted(w.pid for w in dev.workers())


async def the_turn_ends_once(
    client: ParleyClient, session_id: str, url: str, before: list[Event]
) -> None:
    """Read the rest of the stream (reconnecting as a browser does) and compare it with
    what is stored: one terminal event, the text as stored."""
    seen = list(before)
    await follow(client, url, seen, timeout=180)
    ids = [e.id for e in seen]
    assert ids == sorted(set(ids)), "an event was received twice or out of order"
    kinds = [e.type for e in seen]
    assert sum(kind in TERMINAL for kind in kinds) == 1, kinds
    assert kinds[-1] in {"done", "error"}, kinds
    stored = [m for m in await client.messages(session_id) if m["role"] == "assistant"]
    if kinds[-1] == "done":
        final = seen[-1].data["message"]["text"]
        assert streamed_text(seen) == final
        assert [m["text"] for m in stored] == [final]
    else:
        assert seen[-1].data["code"], seen[-1].data  # a reason the client can act on
        assert len(stored) <= 1


async def next_turn_works(client: ParleyClient, session_id: str) -> None:
    _, events = await client.turn(session_id, "Where is my order?")
    assert events[-1].type == "done", [(e.type, e.data) for e in events[-3:]]


async def start_streaming(client: ParleyClient) -> tuple[str, str, list[Event]]:
    session_id = await client.new_session()
    posted = await client.post(session_id, LONG_QUESTION)
    assert posted.status_code == 202, posted.text
    url = posted.json()["events_url"]
    before = await read_until(client, url, after=0, stop="delta")
    assert before[-1].type == "delta", [e.type for e in before]
    return session_id, url, before


async def test_temporal_killed_mid_answer_is_restarted_and_the_turn_ends_once(
    dev: DevRun,
) -> None:
    processes = same_processes(dev)
    client = ParleyClient(dev.api, dev.priya_token)
    try:
        session_id, url, before = await start_streaming(client)
        async with watching(client, session_id) as watch:
            victim = temporal_server(dev)
            assert victim is not None
            victim.kill()  # `kill -9`
            killed_at = time.monotonic()

            async def back() -> bool:
                server = temporal_server(dev)
                return (
                    server is not None
                    and server.pid != victim.pid
                    and port_is_open(dev.ports["temporal"])
                )

            await eventually(back, timeout=BACK_WITHIN_S, what="Temporal answering again")
            print(f"\nTemporal answering {time.monotonic() - killed_at:.1f} s after kill -9")
            await the_turn_ends_once(client, session_id, url, before)
            await next_turn_works(client, session_id)
        watch.check()
        assert same_processes(dev) == processes, "the API or a worker was restarted too"
        assert "temporal (pid" in dev.log.read_text(), "no log line about the restart"
    finally:
        await client.aclose()


async def kill_postgres(dev: DevRun) -> float:
    """`kill -9` of the server now running (its backends follow it); wait until the
    supervisor has started a new one. Returns when it was killed."""
    victim = postmaster(dev)
    assert victim is not None
    victim.kill()
    killed_at = time.monotonic()

    async def back() -> psutil.Process | None:
        server = postmaster(dev)
        return server if server is not None and server.pid != victim.pid else None

    await eventually(back, timeout=BACK_WITHIN_S, what="PostgreSQL running again")
    print(f"\nPostgreSQL back {time.monotonic() - killed_at:.1f} s after kill -9")
    return killed_at


async def ready_again(client: ParleyClient) -> None:
    back_at = time.monotonic()

    async def ready() -> bool:
        return await is_ready(client)

    await eventually(ready, timeout=READY_WITHIN_S, what="/readyz 200 again")
    print(f"/readyz 200 {time.monotonic() - back_at:.1f} s after PostgreSQL was back")


async def test_postgres_killed_mid_answer_is_restarted_and_the_turn_ends_once(
    dev: DevRun,
) -> None:
    processes = same_processes(dev)
    client = ParleyClient(dev.api, dev.priya_token)
    try:
        session_id, url, before = await start_streaming(client)
        async with watching(client, session_id) as watch:
            await kill_postgres(dev)
            await ready_again(client)
            await the_turn_ends_once(client, session_id, url, before)
            await next_turn_works(client, session_id)
        watch.check()
        print(f"{len(watch.unavailable)} answers 503 (Retry-After) while it was away")
        assert same_processes(dev) == processes, "the API or a worker was restarted too"
        assert "PostgreSQL (pid" in dev.log.read_text(), "no log line about the restart"
    finally:
        await client.aclose()


async def test_postgres_killed_twice_in_a_row_mid_answer(dev: DevRun) -> None:
    """The second kill lands as the stack has just recovered from the first (the API ready
    again, the turn about to resume): the pools and listeners reconnect twice, and the
    turn still ends once."""
    processes = same_processes(dev)
    client = ParleyClient(dev.api, dev.priya_token)
    try:
        session_id, url, before = await start_streaming(client)
        async with watching(client, session_id) as watch:
            await kill_postgres(dev)
            await ready_again(client)
            await kill_postgres(dev)
            await ready_again(client)
            await the_turn_ends_once(client, session_id, url, before)
            await next_turn_works(client, session_id)
        watch.check()
        print(f"{len(watch.unavailable)} answers 503 (Retry-After) while it was away")
        assert same_processes(dev) == processes, "the API or a worker was restarted too"
    finally:
        await client.aclose()


def test_ctrl_c_still_stops_everything(dev: DevRun) -> None:
    dev.process.send_signal(signal.SIGINT)
    try:
        dev.process.wait(60)
    finally:
        if dev.process.poll() is None:
            os.killpg(dev.process.pid, signal.SIGKILL)
    assert dev.process.returncode == 0, dev.story()
    assert postmaster(dev) is None, "the restarted PostgreSQL outlived the run"
    for port in dev.ports.values():
        assert not port_is_open(port), f"port {port} still open after Ctrl-C"
