"""Limits hold across API processes: two real API processes share the counts in PostgreSQL.

The two APIs run with the deployment's default limits on a task queue no worker serves, so
every admitted turn stays running (`received`) for as long as the test needs it to. Each
test makes a tenant of its own, whose configuration sets the limit under test.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select, text

from parley.config import Limits, Settings
from parley.errors import DailyCapReached
from parley.store import limits
from parley.store.db import Database, Sent
from parley.store.identity import Identity, create_token
from parley.store.models import ChatSession, Message, Tenant, User
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.stack import api_in_process, free_port, own_queue, service_env, spawn
from tests.support.toolkit import api_answers, eventually

DEFAULTS = Settings(database_url="postgresql://unused")


@pytest.fixture(scope="module")
def two_apis(settings: Settings) -> Iterator[list[str]]:
    env = service_env(
        settings,
        PARLEY_TASK_QUEUE=f"limits-{uuid.uuid4().hex[:8]}",  # no worker: turns stay running
        # The deployment's defaults, not the shared stack's lifted ones.
        PARLEY_MAX_ACTIVE_TURNS_PER_USER=str(DEFAULTS.max_active_turns_per_user),
        PARLEY_USER_REQUESTS_PER_MINUTE=str(DEFAULTS.user_requests_per_minute),
        PARLEY_TENANT_REQUESTS_PER_MINUTE=str(DEFAULTS.tenant_requests_per_minute),
        PARLEY_MAX_SESSIONS_PER_USER_PER_DAY=str(DEFAULTS.max_sessions_per_user_per_day),
        PARLEY_USER_DAILY_MESSAGES=str(DEFAULTS.user_daily_messages),
        PARLEY_MAX_STREAMS_PER_USER="4",
    )
    processes: list[subprocess.Popen[bytes]] = []
    urls = []
    try:
        for _ in range(2):
            port = free_port()
            processes.append(
                spawn(
                    ["-m", "parley.launch.cli", "api", "--host", "127.0.0.1", "--port", str(port)],
                    env,
                )
            )
            urls.append(f"http://127.0.0.1:{port}")
        yield urls
    finally:
        for process in processes:
            process.terminate()
            process.wait(10)


@pytest.fixture
async def apis(two_apis: list[str]) -> list[str]:
    for url in two_apis:
        await api_answers(url, timeout=30)
    return two_apis


async def new_tenant(
    sessions: Database, config: dict[str, Any], users: int = 1
) -> tuple[str, list[str]]:
    """A tenant of the test's own with `config`, and tokens for its users."""
    tenant = f"lim_{uuid.uuid4().hex[:8]}"
    async with orm(sessions) as db:
        db.add(Tenant(id=tenant, name=tenant, config=config))
        await db.flush()
        for n in range(users):
            db.add(User(tenant_id=tenant, id=f"u{n}", display_name=f"User {n}"))
        await db.commit()
    async with sessions() as db:
        tokens = [await create_token(db, tenant_id=tenant, user_id=f"u{n}") for n in range(users)]
        await db.commit()
    return tenant, tokens


@pytest.fixture
async def clients() -> AsyncIterator[list[ParleyClient]]:
    made: list[ParleyClient] = []
    yield made
    for client in made:
        await client.aclose()


def on_both(apis: list[str], token: str, made: list[ParleyClient]) -> list[ParleyClient]:
    pair = [ParleyClient(url, token) for url in apis]
    made.extend(pair)
    return pair


async def stored_user_messages(sessions: Database, tenant: str) -> int:
    async with orm(sessions) as db:
        count = await db.scalar(
            select(func.count())
            .select_from(Message)
            .join(ChatSession, ChatSession.id == Message.session_id)
            .where(ChatSession.tenant_id == tenant, Message.role == "user")
        )
    return int(count or 0)


def refusal(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


async def test_running_turns_per_user_are_counted_across_processes(
    apis: list[str], sessions: Database, clients: list[ParleyClient]
) -> None:
    tenant, (token,) = await new_tenant(sessions, {})
    a, b = on_both(apis, token, clients)
    sids = [await a.new_session() for _ in range(DEFAULTS.max_active_turns_per_user + 1)]
    answers = [
        await (a if n % 2 else b).post(sid, "Where is my order?") for n, sid in enumerate(sids)
    ]
    assert [r.status_code for r in answers[:-1]] == [202] * DEFAULTS.max_active_turns_per_user
    assert refusal(answers[-1]) == (429, "too_many_active_turns")
    assert int(answers[-1].headers["Retry-After"]) >= 1
    assert await stored_user_messages(sessions, tenant) == DEFAULTS.max_active_turns_per_user


async def test_running_turns_per_user_hold_under_12_concurrent_posts(
    apis: list[str], sessions: Database, clients: list[ParleyClient]
) -> None:
    """The user's admission lock (taken with the post's duplicate check, store/posting.py)
    orders concurrent posts in two processes: no two see room for the same last turn."""
    running = 4
    config = {"max_active_turns_per_user": running, "user_requests_per_minute": 100}
    tenant, (token,) = await new_tenant(sessions, config)
    a, b = on_both(apis, token, clients)
    sids = [await a.new_session() for _ in range(12)]
    answers = await asyncio.gather(
        *((a if n % 2 else b).post(sid, "Where is my order?") for n, sid in enumerate(sids))
    )
    assert sorted(r.status_code for r in answers).count(202) == running
    assert [refusal(r) for r in answers if r.status_code != 202] == [
        (429, "too_many_active_turns")
    ] * (12 - running)
    assert await stored_user_messages(sessions, tenant) == running


async def test_posts_per_minute_answer_429_with_retry_after_across_processes(
    apis: list[str], sessions: Database, clients: list[ParleyClient]
) -> None:
    per_minute = 5
    config = {"user_requests_per_minute": per_minute, "max_active_turns_per_user": 50}
    tenant, (token,) = await new_tenant(sessions, config)
    a, b = on_both(apis, token, clients)
    sids = [await a.new_session() for _ in range(2 * per_minute + 1)]
    # Windows are clock minutes: if one ends during the test, the count starts again, so
    # post until refused and count what was admitted in the refusal's minute.
    for n, sid in enumerate(sids):
        answer = await (a if n % 2 else b).post(sid, "Hello")
        if answer.status_code != 202:
            break
    assert refusal(answer) == (429, "rate_limited"), answer.text
    # Retry-After counts down to the end of the refusal's clock minute: with the answer's own
    # Date (second resolution, the server caches it for up to a second), the two add up to a
    # whole minute, give or take the few seconds between the count and the answer.
    retry_after = int(answer.headers["Retry-After"])
    answered_at = parsedate_to_datetime(answer.headers["Date"])
    off_by = (retry_after + answered_at.second) % 60
    assert min(off_by, 60 - off_by) <= 3, (retry_after, answered_at)
    async with orm(sessions) as db:
        same_minute = await db.scalar(
            select(func.count())
            .select_from(Message)
            .join(ChatSession, ChatSession.id == Message.session_id)
            .where(
                ChatSession.tenant_id == tenant,
                func.date_trunc("minute", Message.created_at)
                == func.date_trunc("minute", func.now()),
            )
        )
    assert same_minute == per_minute


async def test_the_daily_cap_per_user_holds_under_20_concurrent_posts(
    apis: list[str], sessions: Database, clients: list[ParleyClient]
) -> None:
    cap = 7
    config = {"user_daily_cap": cap, "max_active_turns_per_user": 50}
    config["user_requests_per_minute"] = 100
    tenant, (token,) = await new_tenant(sessions, config)
    a, b = on_both(apis, token, clients)
    sids = [await a.new_session() for _ in range(20)]
    answers = await asyncio.gather(
        *((a if n % 2 else b).post(sid, "Where is my order?") for n, sid in enumerate(sids))
    )
    statuses = sorted(r.status_code for r in answers)
    print(f"\n20 concurrent posts, daily cap {cap}: {statuses.count(202)} admitted")
    assert statuses.count(202) == cap
    assert [refusal(r) for r in answers if r.status_code != 202] == [(429, "daily_cap_reached")] * (
        20 - cap
    )
    assert await stored_user_messages(sessions, tenant) == cap


async def test_a_paused_tenant_is_refused_by_every_process_at_once(
    apis: list[str], sessions: Database, clients: list[ParleyClient]
) -> None:
    tenant, (token,) = await new_tenant(sessions, {})
    a, b = on_both(apis, token, clients)
    sid = await a.new_session()
    async with orm(sessions) as db:
        row = await db.get(Tenant, tenant)
        assert row is not None
        row.paused = True
        await db.commit()
    for client in (a, b):
        assert refusal(await client.post(sid, "Hello")) == (403, "agent_paused")
    assert await stored_user_messages(sessions, tenant) == 0


async def test_open_streams_per_user_are_counted_across_processes(
    apis: list[str], sessions: Database, clients: list[ParleyClient]
) -> None:
    _, (token,) = await new_tenant(sessions, {})
    a, b = on_both(apis, token, clients)
    sid = await a.new_session()
    posted = await a.post(sid, "Hello")
    url = posted.json()["events_url"]
    limit = 4
    async with HeldStreams() as open_streams:
        for n in range(limit):
            response = await open_streams((a if n % 2 else b).http, url)
            assert response.status_code == 200
        over = await b.http.get(url)
        assert refusal(over) == (429, "rate_limited")
        await open_streams.close_one()

        async def admitted_again() -> bool:
            response = await open_streams(a.http, url)
            return response.status_code == 200

        await eventually(admitted_again, timeout=10, what="a closed stream frees its slot")


class HeldStreams:
    """Streams held open until the block ends."""

    def __init__(self) -> None:
        self._open: list[Any] = []

    async def __aenter__(self) -> HeldStreams:
        return self

    async def __call__(self, http: httpx.AsyncClient, url: str) -> httpx.Response:
        context = http.stream("GET", url, timeout=30)
        response = await context.__aenter__()
        if response.status_code == 200:
            self._open.append(context)
        else:
            await response.aread()
            await context.__aexit__(None, None, None)
        return response

    async def close_one(self) -> None:
        await self._open.pop().__aexit__(None, None, None)

    async def __aexit__(self, *_: object) -> None:
        while self._open:
            await self.close_one()


async def test_a_counting_error_lets_the_post_through_and_is_logged(
    sessions: Database, caplog: pytest.LogCaptureFixture
) -> None:
    tenant, _ = await new_tenant(sessions, {"user_daily_cap": 1})
    owner = Identity(tenant_id=tenant, user_id="u0", roles=())
    async with sessions() as db:
        # The counters' table is gone for this transaction only (DDL is transactional).
        await db.run("ALTER TABLE usage_counters RENAME TO usage_counters_away", {})
        with caplog.at_level(logging.WARNING, logger="parley.store.limits"):
            for _ in range(3):  # over the cap of 1: nothing could be counted
                await limits.admit_turn(db, owner=owner, limits=Limits())
        await db.rollback()
    assert "letting it through" in caplog.text


async def test_a_counting_error_still_makes_the_write_sent_with_the_counts_once(
    sessions: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """A new turn's post counts and writes in one round trip (`take_all_then`); when the
    counting fails, the write (which did not run behind the failed count) is made on its own,
    once, and the post goes through."""
    tenant, _ = await new_tenant(sessions, {"user_daily_cap": 1})
    owner = Identity(tenant_id=tenant, user_id="u0", roles=())
    async with sessions() as db:
        await db.run("CREATE TEMPORARY TABLE written (n int) ON COMMIT DROP", {})
        await db.run("ALTER TABLE usage_counters RENAME TO usage_counters_away", {})
        admitted = await limits.admission(
            await limits.send_running(db, owner=owner, limits=Limits()), owner, Limits()
        )

        async def write() -> Sent[_N]:
            return await db.send("INSERT INTO written VALUES (7) RETURNING n", {}, _N)

        with caplog.at_level(logging.WARNING, logger="parley.store.limits"):
            made = await limits.take_all_then(db, admitted.takes, write)
        assert await made.row() == _N(7)
        assert await db.value("SELECT count(*) FROM written", {}) == 1
        await db.rollback()
    assert "letting it through" in caplog.text


async def test_a_refused_count_undoes_the_write_sent_with_it(sessions: Database) -> None:
    """The write rides with the counts; a refusal raises after it ran, and the rolled-back
    transaction takes it away: nothing of a refused post is stored."""
    tenant, _ = await new_tenant(sessions, {"user_daily_cap": 1})
    owner = Identity(tenant_id=tenant, user_id="u0", roles=())
    async with sessions() as db:
        await limits.admit_turn(db, owner=owner, limits=Limits())  # the day's one message
        await db.commit()
    async with sessions() as db:
        await db.run("CREATE TEMPORARY TABLE written (n int)", {})
        await db.commit()
        admitted = await limits.admission(
            await limits.send_running(db, owner=owner, limits=Limits()), owner, Limits()
        )

        async def write() -> Sent[_N]:
            return await db.send("INSERT INTO written VALUES (7) RETURNING n", {}, _N)

        with pytest.raises(DailyCapReached):
            await limits.take_all_then(db, admitted.takes, write)
        await db.rollback()
        assert await db.value("SELECT count(*) FROM written", {}) == 0


@dataclass(frozen=True)
class _N:
    n: int


def test_retry_after_rounds_up_to_the_end_of_the_window_and_is_never_zero() -> None:
    minute = datetime(2026, 10, 28, 9, 41, tzinfo=UTC)
    end = minute + timedelta(minutes=1)
    assert limits.seconds_until(minute, end) == 60
    assert limits.seconds_until(minute + timedelta(seconds=0.2), end) == 60  # 59.8 s left: wait 60
    assert limits.seconds_until(minute + timedelta(seconds=59), end) == 1
    assert limits.seconds_until(minute + timedelta(seconds=59.9), end) == 1
    assert limits.seconds_until(end, end) == 1  # the window just ended: still not 0
    assert limits.seconds_until(minute, minute + timedelta(days=1)) == 86_400


async def day_count(sessions: Database, tenant: str) -> int:
    """The user's messages counted against the daily cap today (u0 of `tenant`)."""
    async with orm(sessions) as db:
        used = await db.scalar(
            text(
                "SELECT used FROM usage_counters WHERE scope = 'day_user' AND subject = :s"
                " AND window_start = date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
            ),
            {"s": f"{tenant}/u0"},
        )
    return int(used or 0)


async def test_a_request_that_fails_validation_costs_nothing(
    settings: Settings, sessions: Database
) -> None:
    per_minute = 3
    config = {"user_requests_per_minute": per_minute, "user_daily_cap": per_minute}
    tenant, (token,) = await new_tenant(sessions, config)
    # One API, on a task queue no worker serves (the turns it admits stay running).
    async with api_in_process(own_queue(settings, "free"), token) as (_, client):
        sids = [await client.new_session() for _ in range(per_minute + 1)]
        # More bad requests than the limits allow: each refused for what it gets wrong.
        for _ in range(2):
            assert await bad_posts(client, sids[0]) == BAD_ANSWERS
        # None of them counted: the whole budget is still there for good ones.
        for sid in sids[:per_minute]:
            good = await client.post(sid, "Where is my order?")
            assert good.status_code == 202, good.text
        # At the limit, a bad request is still told what is wrong with it, as is a retry of
        # a turn that is still running.
        assert await bad_posts(client, sids[-1]) == BAD_ANSWERS
        running = f"/v1/sessions/{sids[-2]}/turns/{good.json()['turn_id']}/retry"
        assert refusal(await client.http.post(running)) == (409, "turn_not_retryable")
        assert refusal(await client.post(sids[-1], "Hello")) in {
            (429, "rate_limited"),
            (429, "daily_cap_reached"),
        }
    assert await day_count(sessions, tenant) == per_minute
    assert await stored_user_messages(sessions, tenant) == per_minute


# A request body each, and the answer it gets.
BAD_POSTS: list[dict[str, Any]] = [
    {"text": "Look at this", "file_ids": ["fil_nosuchfile"]},  # an unknown file
    {"text": "Look at this", "file_ids": ["fil_nosuchfile", "fil_other"]},
    {"text": "x" * (DEFAULTS.max_message_chars + 1)},  # over the deployment's length
    {"text": "Hello", "expected_last_seq": 7},  # the session has no message 7
]
BAD_ANSWERS = [
    (422, "invalid_request"),
    (422, "invalid_request"),
    (422, "invalid_request"),
    (409, "stale_view"),
]


async def bad_posts(client: ParleyClient, sid: str) -> list[tuple[int, str]]:
    answers = []
    for body in BAD_POSTS:
        response = await client.http.post(
            f"/v1/sessions/{sid}/messages", json={"client_message_id": uuid.uuid4().hex, **body}
        )
        answers.append(refusal(response))
    return answers
