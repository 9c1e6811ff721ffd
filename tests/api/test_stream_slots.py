"""A stream's slot (its lease against the per-user limit of open streams) is given back
however the stream ends, even when it never got to send a byte."""

from __future__ import annotations

import asyncio
import contextlib

from sqlalchemy import text
from starlette.types import Message

from parley.config import Settings
from parley.store.db import Database
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.stack import api_in_process
from tests.support.toolkit import eventually


async def leases(sessions: Database) -> set[str]:
    async with orm(sessions) as db:
        return set(await db.scalars(text("SELECT id FROM stream_leases")))


async def test_a_stream_whose_headers_never_went_out_gives_its_slot_back(
    settings: Settings, tokens: dict[str, str], sessions: Database
) -> None:
    # No worker is needed: the turn need not move for its stream's slot to be taken.
    async with api_in_process(settings, tokens["marco"]) as (app, client):
        session_id = await client.new_session()
        events_url = (await client.post(session_id, "Hello")).json()["events_url"]
        before = await leases(sessions)

        # The connection is gone by the time the answer's headers are written: the server's
        # send fails, so the stream's generator never starts.
        async def send(message: Message) -> None:
            raise OSError("the client hung up")

        async def receive() -> Message:
            await asyncio.Event().wait()  # no disconnect message: only the failed send ends it
            raise AssertionError("unreachable")

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": events_url,
            "raw_path": events_url.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [
                (b"host", b"parley.test"),
                (b"authorization", f"Bearer {tokens['marco']}".encode()),
            ],
            "client": ("127.0.0.1", 40000),
            "server": ("127.0.0.1", 80),
        }
        with contextlib.suppress(Exception):
            await app(scope, receive, send)

        async def given_back() -> bool:
            return await leases(sessions) == before

        await eventually(given_back, timeout=10, what="the stream's lease is dropped")


async def test_a_stream_of_someone_elses_turn_is_not_found_and_takes_no_slot(
    settings: Settings, tokens: dict[str, str], sessions: Database
) -> None:
    """The stream's owner check and its slot go to the database together (one round trip):
    a turn that is not the caller's is a 404, and the slot its second statement may have
    taken is not kept."""
    async with api_in_process(settings, tokens["marco"]) as (app, client):
        session_id = await client.new_session()
        events_url = (await client.post(session_id, "Hello")).json()["events_url"]
        before = await leases(sessions)
        other = ParleyClient(str(client.http.base_url), tokens["priya"])
        try:
            response = await other.http.get(events_url)
        finally:
            await other.aclose()
        assert response.status_code == 404, response.text
        assert await leases(sessions) == before
