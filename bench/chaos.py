"""(q) The chaos soak (issue 41, acceptance 4): mixed turns for minutes while one component is
killed (-9) every 20-30 s, then what was lost, repeated or missed.

It runs `parley dev` (what `make run` runs: its supervisor restarts whatever dies) in a data
folder of its own, not the bench's stack. N sessions each run turns in a cycle (a plain answer,
a tool lookup, an email proposal that the user confirms) until the time is up, while a killer
sends SIGKILL to the Temporal dev server, PostgreSQL, the API and the worker in turn, one every
20-30 s. The client behaves as a careful browser does: a POST is sent again with the same
`client_message_id` after a 503 (after its `Retry-After`) or a dropped connection, a stream is
reopened with `Last-Event-ID`, a confirmation is sent again until it is answered.

When the time is up the kills stop and every accepted turn gets `DRAIN_S` to end. Counted:

- accepted: messages answered 202; done, error, cancelled: the turn's terminal event as the
  client saw it; lost: accepted, and no terminal event by the end of the drain.
- duplicated answers: turns with more than one final answer stored, or more than one
  terminal event in the log or on the client's streams.
- duplicated emails: emails the demo ESP accepted beyond one per confirmed action, or for an
  action nobody confirmed (the ESP keeps one email per idempotency key, so a repeat would come
  under a key of its own).
- events missed in a replay: each turn's stream read again from 0 (as a reloaded page does)
  against the events stored for it; events missed live: stored events the live client, with
  all its reconnects, never got.
- 5xx other than 503: every answer the client got, streams included.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.stack import Child, free_port, log, spawn
from parley.config import Settings
from parley.launch.devstate import state_path
from parley.store.db import Database, connect, create_engine
from parley.store.event_log import read_log
from tests.support.sse import TERMINAL, Event, iter_events

# Issue 41's soak: a kill every 20-30 s, rotating over these (what `make run` supervises).
KILL_EVERY_S = (20.0, 30.0)
TARGETS = ("temporal", "postgres", "api", "worker")
# After the time is up, how long the accepted turns get to end (a kill just before the end
# takes up to ~10 s to repair, then the turn resumes).
DRAIN_S = 150.0
# The cycle each session runs: what is asked, and what the turn does.
TURNS = (
    ("plain", "Tell me about yourself, please."),
    ("tool", "Where is my order?"),
    ("email", "Can you email me the status of order 8472?"),
)
# Slow enough tokens that most kills land mid-answer.
TOKEN_DELAY_MS = 20
RETRY_PAUSE_S = 0.5
RESTING = "confirmation_required"


@dataclass
class Turn:
    kind: str
    session_id: str
    client_message_id: str
    turn_id: str | None = None
    refused: str | None = None  # why it never got its 202
    events: list[Event] = field(default_factory=list)
    repeated_events: int = 0  # an id the client had already received, sent again
    action_id: str | None = None
    confirmed: bool = False

    @property
    def url(self) -> str:
        return f"/v1/sessions/{self.session_id}/turns/{self.turn_id}/events"

    @property
    def end(self) -> str | None:
        ends = [e.type for e in self.events if e.type in TERMINAL]
        return ends[0] if ends else None


@dataclass
class Tally:
    """Every answer the client got, by status; the 5xx other than 503 spelled out."""

    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)
    dropped: int = 0  # requests or streams cut at the connection (the API killed)

    def note(self, method: str, path: str, response: httpx.Response, body: str = "") -> None:
        self.statuses[response.status_code] += 1
        if response.status_code >= 500 and response.status_code != 503:
            self.server_errors.append(f"{method} {path}: {response.status_code} {body[:200]}")


@dataclass
class Kill:
    target: str
    at_s: float  # since the soak began
    pid: int | None
    back_s: float | None = None  # until a new process of its kind runs


class DevRun:
    """`parley dev` in its own data folder, on free ports, guarded by the bench's watchman."""

    def __init__(self, folder: Path) -> None:
        self.data_dir = folder / "data"
        self.ports = {name: free_port() for name in ("api", "temporal", "ui", "backend", "metrics")}
        self.env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("DATABASE_URL", "TEMPORAL_ADDRESS", "PARLEY_NORTHWIND_URL")
        }
        self.env.update(
            PARLEY_DATA_DIR=str(self.data_dir),
            PARLEY_API_PORT=str(self.ports["api"]),
            PARLEY_DEV_TEMPORAL_PORT=str(self.ports["temporal"]),
            PARLEY_TEMPORAL_UI_PORT=str(self.ports["ui"]),
            PARLEY_NORTHWIND_PORT=str(self.ports["backend"]),
            PARLEY_WORKER_METRICS_PORT=str(self.ports["metrics"]),
            PARLEY_DEMO_TOKEN_DELAY_MS=str(TOKEN_DELAY_MS),
            # One user drives every session here; lift the per-user limits.
            PARLEY_MAX_STREAMS_PER_USER="1000",
            PARLEY_MAX_ACTIVE_TURNS_PER_USER="100000",
            PARLEY_USER_REQUESTS_PER_MINUTE="1000000",
            PARLEY_TENANT_REQUESTS_PER_MINUTE="1000000",
            PARLEY_MAX_SESSIONS_PER_USER_PER_DAY="1000000",
            PARLEY_USER_DAILY_MESSAGES="0",
            PYTHONUNBUFFERED="1",
        )
        self.child: Child | None = None

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.ports['api']}"

    @property
    def backend(self) -> str:
        return f"http://127.0.0.1:{self.ports['backend']}"

    async def start(self, timeout_s: float = 180.0) -> str:
        """Start it and wait for its banner; returns the token it prints for Priya."""
        self.child = spawn("chaos-dev", ["-m", "parley.launch.cli", "dev"], self.env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.child.check()
            for line in self.child.log_path.read_text(errors="replace").splitlines():
                if "Token for Priya" in line:
                    return line.rsplit(" ", 1)[-1]
            await asyncio.sleep(0.5)
        raise RuntimeError(f"parley dev printed no banner in {timeout_s:.0f}s")

    def database_url(self) -> str:
        settings = Settings(data_dir=self.data_dir)
        return str(json.loads(state_path(settings).read_text())["database_url"])

    async def stop(self) -> None:
        """Ctrl-C, as a user stops it; killed (its whole group) if it is still up after 90 s."""
        child = self.child
        if child is None or child.process.poll() is not None:
            return
        child.process.send_signal(signal.SIGINT)
        try:
            await asyncio.to_thread(child.process.wait, 90)
        except Exception:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.process.pid, signal.SIGKILL)
        child.log_file.close()

    def find(self, target: str) -> psutil.Process | None:
        """The live process of `target` now (PostgreSQL by its postmaster.pid)."""
        assert self.child is not None
        with contextlib.suppress(psutil.Error, OSError, ValueError):
            if target == "postgres":
                pid = int((self.data_dir / "pg" / "postmaster.pid").read_text().split("\n")[0])
                server = psutil.Process(pid)
                return server if server.status() != psutil.STATUS_ZOMBIE else None
            for child in psutil.Process(self.child.process.pid).children():
                with contextlib.suppress(psutil.Error):
                    command = child.cmdline()
                    ours = (
                        "start-dev" in command
                        if target == "temporal"
                        else (command[-1:] == [target])
                    )
                    if ours and child.status() != psutil.STATUS_ZOMBIE:
                        return child
        return None


class Soak:
    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http
        self.tally = Tally()
        self.turns: list[Turn] = []
        self.sessions: list[str] = []

    async def call(
        self, method: str, path: str, *, deadline: float, json: Any = None
    ) -> httpx.Response | None:
        """The answer to the request, sent again after a 5xx or a dropped connection until
        it gets another answer or the deadline passes (None then)."""
        while time.monotonic() < deadline:
            try:
                response = await self.http.request(method, path, json=json)
            except httpx.HTTPError:
                self.tally.dropped += 1
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            self.tally.note(method, path, response, response.text)
            if response.status_code < 500:
                return response
            after = response.headers.get("Retry-After", "")
            await asyncio.sleep(min(float(after), 2.0) if after.isdigit() else RETRY_PAUSE_S)
        return None

    async def follow(
        self, turn: Turn, *, deadline: float, stop_at_rest: bool, into: list[Event] | None = None
    ) -> None:
        """Read the turn's stream into `into` (its live events by default) until a terminal
        event (or, with `stop_at_rest`, its confirmation request), reopening it after the
        last event received whenever it is cut or refused."""
        seen = turn.events if into is None else into
        while time.monotonic() < deadline:
            if seen and (seen[-1].type in TERMINAL or (stop_at_rest and seen[-1].type == RESTING)):
                return
            after = seen[-1].id if seen else 0
            try:
                # The server's pings keep an idle stream from timing out: the deadline does.
                async with (
                    asyncio.timeout(deadline - time.monotonic()),
                    self.http.stream(
                        "GET", turn.url, headers={"Last-Event-ID": str(after)}, timeout=60
                    ) as response,
                ):
                    if response.status_code != 200:
                        body = (await response.aread()).decode(errors="replace")
                        self.tally.note("GET", turn.url, response, body)
                        await asyncio.sleep(RETRY_PAUSE_S)
                        continue
                    self.tally.note("GET", turn.url, response)
                    async for event in iter_events(response):
                        if seen and event.id is not None and event.id <= (seen[-1].id or 0):
                            turn.repeated_events += 1
                            continue
                        seen.append(event)
                        if event.type in TERMINAL or (stop_at_rest and event.type == RESTING):
                            return
            except httpx.HTTPError:
                self.tally.dropped += 1
            except TimeoutError:
                return
            await asyncio.sleep(RETRY_PAUSE_S / 5)

    async def session(self, stop_at: float, deadline: float) -> None:
        """One user's conversation: the cycle of turns, one after another, until `stop_at`."""
        created = await self.call("POST", "/v1/sessions", deadline=stop_at)
        if created is None or created.status_code != 201:
            return
        session_id = str(created.json()["id"])
        self.sessions.append(session_id)
        number = 0
        while time.monotonic() < stop_at:
            kind, text = TURNS[number % len(TURNS)]
            number += 1
            turn = Turn(kind, session_id, uuid.uuid4().hex)
            self.turns.append(turn)
            posted = await self.call(
                "POST",
                f"/v1/sessions/{session_id}/messages",
                deadline=deadline,
                json={"client_message_id": turn.client_message_id, "text": text},
            )
            if posted is None or posted.status_code not in (200, 202):
                turn.refused = "no answer" if posted is None else f"{posted.status_code}"
                return
            turn.turn_id = str(posted.json()["turn_id"])
            await self.follow(turn, deadline=deadline, stop_at_rest=True)
            if turn.events and turn.events[-1].type == RESTING:
                await self.confirm(turn, deadline)
            if turn.end is None:
                return  # lost (or still running at the deadline): this session stops here

    async def confirm(self, turn: Turn, deadline: float) -> None:
        turn.action_id = str(turn.events[-1].data["action"]["id"])
        path = f"/v1/sessions/{turn.session_id}/actions/{turn.action_id}/confirm"
        answered = await self.call("POST", path, deadline=deadline)
        # A 409 after a send whose answer was lost: the first one went (and is delivered again).
        if answered is not None and answered.status_code in (202, 409):
            turn.confirmed = answered.status_code == 202 or (
                answered.json().get("error", {}).get("code") == "action_resolved"
            )
        await self.follow(turn, deadline=deadline, stop_at_rest=False)


async def kill_rotation(
    dev: DevRun, started: float, stop_at: float, rng: random.Random
) -> list[Kill]:
    """One SIGKILL every 20-30 s until `stop_at`, rotating over `TARGETS`; each kill's time
    until a new process of its kind runs (the supervisor's repair) is timed meanwhile."""
    kills: list[Kill] = []
    timers: list[asyncio.Task[None]] = []
    number = 0
    next_at = time.monotonic() + rng.uniform(*KILL_EVERY_S)
    while next_at < stop_at:
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        target = TARGETS[number % len(TARGETS)]
        number += 1
        victim = dev.find(target)
        kill = Kill(target, round(time.monotonic() - started, 1), victim and victim.pid)
        kills.append(kill)
        if victim is not None:
            with contextlib.suppress(psutil.Error):
                victim.kill()
            killed_at = time.monotonic()
            log(f"(q) t={kill.at_s:.0f}s: kill -9 {target} (pid {victim.pid})")
            timers.append(asyncio.create_task(_time_repair(dev, kill, victim.pid, killed_at)))
        next_at += rng.uniform(*KILL_EVERY_S)
    await asyncio.gather(*timers)
    return kills


async def _time_repair(dev: DevRun, kill: Kill, old_pid: int, killed_at: float) -> None:
    while time.monotonic() - killed_at < 60:
        found = dev.find(kill.target)
        if found is not None and found.pid != old_pid:
            kill.back_s = round(time.monotonic() - killed_at, 1)
            return
        await asyncio.sleep(0.2)


async def measure_chaos(*, sessions: int, duration_s: float, seed: int = 41) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="parley-chaos-"))
    dev = DevRun(folder)
    log(f"(q) chaos soak: parley dev in {folder}, {sessions} sessions for {duration_s:.0f}s")
    try:
        token = await dev.start()
        async with httpx.AsyncClient(
            base_url=dev.api,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(30.0),
            limits=httpx.Limits(max_connections=4 * sessions + 10),
        ) as http:
            soak = Soak(http)
            started = time.monotonic()
            stop_at = started + duration_s
            deadline = stop_at + DRAIN_S
            killer = asyncio.create_task(kill_rotation(dev, started, stop_at, random.Random(seed)))
            await asyncio.gather(*(soak.session(stop_at, deadline) for _ in range(sessions)))
            kills = await killer
            ran_s = time.monotonic() - started
            log(f"(q) soak over after {ran_s:.0f}s; replaying every turn and counting")
            figures = await _count(soak, dev, kills)
            figures["ran_s"] = round(ran_s, 1)
            figures["settings"] = {
                "sessions": sessions,
                "duration_s": duration_s,
                "kill_every_s": list(KILL_EVERY_S),
                "token_delay_ms": TOKEN_DELAY_MS,
                "seed": seed,
            }
            return figures
    finally:
        await dev.stop()
        shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class _Answers:
    turn_id: str
    answers: int


# Final answers stored per turn: the assistant's messages that are not a tool request, not
# replaced by a retry's answer (a confirmed turn has two: the proposal, then the outcome).
_FINAL_ANSWERS = """
    SELECT turn_id, count(*) AS answers FROM messages
    WHERE turn_id = ANY(%(turns)s) AND role = 'assistant' AND tool_calls IS NULL
      AND replaced_by IS NULL
    GROUP BY turn_id
"""


async def _count(soak: Soak, dev: DevRun, kills: list[Kill]) -> dict[str, Any]:
    accepted = [t for t in soak.turns if t.turn_id is not None]
    ends = Counter(t.end or "lost" for t in accepted)
    errors = Counter(
        str(next(e for e in t.events if e.type == "error").data.get("code"))
        for t in accepted
        if t.end == "error"
    )
    engine = create_engine(dev.database_url(), pool_size=4)
    database = Database(engine)
    try:
        stored = await _gathered(
            [lambda t=t: _stored(database, t) for t in accepted]  # type: ignore[misc]
        )
        async with connect(database) as db:
            rows = await db.rows(_FINAL_ANSWERS, {"turns": [t.turn_id for t in accepted]}, _Answers)
    finally:
        await engine.dispose()
    answers = {row.turn_id: row.answers for row in rows}
    replays = await _gathered([lambda t=t: _replay(soak, t) for t in accepted])  # type: ignore[misc]

    missed_replay = missed_live = duplicated = 0
    duplicates: list[str] = []
    misses: list[str] = []
    for turn, log_events, replayed in zip(accepted, stored, replays, strict=True):
        stored_ids = {e.id: e.type for e in log_events}
        replay_ids = {e.id: e.type for e in replayed}
        differ = sorted(
            {i for i, kind in stored_ids.items() if replay_ids.get(i) != kind}
            | (set(replay_ids) - set(stored_ids))
        )
        missed_replay += len(differ)
        if differ:
            shown = ", ".join(
                f"{i} {stored_ids.get(i, '-')}/{replay_ids.get(i, '-')}" for i in differ[:6]
            )
            misses.append(
                f"{turn.kind} {turn.turn_id}: stored/replayed {shown}; "
                f"replay ended at {replayed[-1].id if replayed else None}"
            )
        last_live = max((e.id or 0 for e in turn.events), default=0)
        live_ids = {e.id for e in turn.events}
        missed_live += sum(1 for i in stored_ids if i <= last_live and i not in live_ids)
        kinds = Counter(stored_ids.values())
        terminal_stored = sum(n for kind, n in kinds.items() if kind in TERMINAL)
        terminal_live = sum(e.type in TERMINAL for e in turn.events)
        # A confirmed turn answers twice: its proposal, then what came of it.
        expected = 1 + min(kinds["confirmation_resolved"], 1)
        if (
            max(terminal_stored, terminal_live, kinds["confirmation_resolved"]) > 1
            or answers.get(turn.turn_id or "", 0) > expected
        ):
            duplicated += 1
            duplicates.append(f"{turn.kind} {turn.turn_id}")

    async with httpx.AsyncClient(base_url=dev.backend, timeout=30) as backend:
        emails = (await backend.get("/emails")).json()["emails"]
        sends = (await backend.get("/stats")).json()["calls"].get("send_email")
    confirmed = {f"parley-{t.action_id}" for t in accepted if t.confirmed}
    keys = Counter(e["idempotency_key"] for e in emails)
    duplicated_emails = sum(n - 1 for n in keys.values()) + sum(
        1 for key in keys if key not in confirmed
    )
    return {
        "turns_started": len(soak.turns),
        "accepted": len(accepted),
        "refused": [t.refused for t in soak.turns if t.refused],
        "by_kind": dict(Counter(t.kind for t in accepted)),
        "done": ends["done"],
        "error": ends["error"],
        "error_codes": dict(errors),
        "cancelled": ends["cancelled"],
        "lost": ends["lost"],
        # Where each lost turn stopped, as its stream last showed it.
        "lost_turns": [
            f"{t.kind} {t.turn_id} after {t.events[-1].type if t.events else 'nothing'}"
            + (" (confirmed)" if t.confirmed else "")
            for t in accepted
            if t.end is None
        ][:10],
        "duplicated_answers": duplicated,
        "duplicated_turns": duplicates[:10],
        "repeated_events_live": sum(t.repeated_events for t in accepted),
        "confirmed": len(confirmed),
        "emails": len(emails),
        "send_email_calls": sends,
        "emails_missing": len(confirmed - set(keys)),
        "duplicated_emails": duplicated_emails,
        "events_stored": sum(len(s) for s in stored),
        "events_missed_replay": missed_replay,
        "events_missed_live": missed_live,
        "missed_samples": misses[:10],
        "statuses": {str(k): v for k, v in sorted(soak.tally.statuses.items())},
        "unavailable_503": soak.tally.statuses[503],
        "server_errors_non_503": len(soak.tally.server_errors),
        "server_error_samples": soak.tally.server_errors[:10],
        "dropped_connections": soak.tally.dropped,
        "kills": [vars(k) for k in kills],
    }


async def _gathered(jobs: list[Callable[[], Awaitable[Any]]], width: int = 8) -> list[Any]:
    """Each job's result, in order, at most `width` at a time."""
    gate = asyncio.Semaphore(width)

    async def one(job: Callable[[], Awaitable[Any]]) -> Any:
        async with gate:
            return await job()

    return await asyncio.gather(*(one(job) for job in jobs))


async def _stored(database: Database, turn: Turn) -> list[Any]:
    async with connect(database) as db:
        return (await read_log(db, turn_id=turn.turn_id or "", after=0, limit=100_000)).events


async def _replay(soak: Soak, turn: Turn) -> list[Event]:
    """The turn's stream from its start, as a reloaded page reads it, to its terminal event
    (a lost turn's, for a few seconds: its stored events are in the log already)."""
    replayed: list[Event] = []
    patience_s = 60.0 if turn.end is not None else 5.0
    await soak.follow(
        turn, deadline=time.monotonic() + patience_s, stop_at_rest=False, into=replayed
    )
    return replayed


def render_chaos(figures: dict[str, Any]) -> str:
    kills = figures["kills"]
    backs = [k["back_s"] for k in kills if k["back_s"] is not None]
    by_target = Counter(k["target"] for k in kills)
    s = figures["settings"]
    lines = [
        "",
        f"(q) chaos soak: {s['sessions']} sessions, {s['duration_s']:.0f} s, a kill -9 every "
        f"{s['kill_every_s'][0]:.0f}-{s['kill_every_s'][1]:.0f} s "
        f"({', '.join(f'{t} x{n}' for t, n in by_target.items())}; "
        f"back within {max(backs, default=0):.1f} s at most)",
        f"  turns accepted            {figures['accepted']}  ({figures['by_kind']})",
        f"  done                      {figures['done']}",
        f"  ended with error          {figures['error']}  {figures['error_codes'] or ''}",
        f"  cancelled                 {figures['cancelled']}",
        f"  lost                      {figures['lost']}",
        f"  duplicated answers        {figures['duplicated_answers']}",
        f"  emails: confirmed {figures['confirmed']}, sent {figures['emails']} "
        f"({figures['send_email_calls']} send calls), missing {figures['emails_missing']}",
        f"  duplicated emails         {figures['duplicated_emails']}",
        f"  events missed in a replay {figures['events_missed_replay']} "
        f"(of {figures['events_stored']} stored; missed live {figures['events_missed_live']})",
        f"  5xx other than 503        {figures['server_errors_non_503']}  "
        f"(503s {figures['unavailable_503']}, dropped connections "
        f"{figures['dropped_connections']})",
    ]
    if figures["refused"]:
        lines.append(
            f"  never accepted            {len(figures['refused'])} {figures['refused'][:5]}"
        )
    for turn in figures["lost_turns"]:
        lines.append(f"    lost: {turn}")
    for sample in figures["missed_samples"]:
        lines.append(f"    missed: {sample}")
    for turn in figures["duplicated_turns"]:
        lines.append(f"    duplicated: {turn}")
    for sample in figures["server_error_samples"]:
        lines.append(f"    {sample}")
    return "\n".join(lines)
