"""Erasure on the shared stack: the catalogue covers every table, the routes keep the
contract (`DELETE /v1/me` answers 202 and revokes at once; the status link needs no token
and names nobody), and an operator erases a user with `parley erase`, then finds the
receipt with `parley erasure receipt` (the proof an erasure happened)."""

from __future__ import annotations

import json

import httpx
from sqlalchemy import text

from parley.config import Settings
from parley.store.db import Database
from parley.store.lifecycle.erasure_catalogue import CATALOGUE, NOT_PERSONAL
from tests.support.client import ParleyClient
from tests.support.erasure import TENANT, add_user, new_customers, receipt
from tests.support.orm import orm
from tests.support.stack import parley_cli


async def test_every_table_is_in_the_erasure_catalogue_or_holds_no_user_rows(
    sessions: Database,
) -> None:
    async with orm(sessions) as db:
        tables = set(
            await db.scalars(
                text("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
            )
        )
    placed = {entry.table for entry in CATALOGUE} | NOT_PERSONAL
    assert tables - placed == set(), "place these tables in store/lifecycle/erasure_catalogue.py"


async def test_delete_me_answers_202_revokes_at_once_and_the_link_shows_the_receipt(
    api_url: str, sessions: Database
) -> None:
    [who] = new_customers(1)
    client = ParleyClient(api_url, await add_user(sessions, who))
    try:
        sid = await client.new_session()
        started = await client.http.delete("/v1/me")
        assert started.status_code == 202, started.text
        body = started.json()
        assert set(body) == {"erasure_id", "status", "status_url"}
        assert body["status"] == "requested"
        again = await client.http.delete("/v1/me")
        assert again.status_code == 401 and again.json()["error"]["code"] == "unauthenticated"
        done = await receipt(client, body["status_url"], timeout=60)
    finally:
        await client.aclose()
    assert done["scope"] == "user" and done["finished_at"] >= done["started_at"]
    assert done["counts"]["sessions"] == 1 and done["counts"]["users"] == 1
    assert done["counts"]["api_tokens"] == 1 and done["total"] == sum(done["counts"].values())
    assert who.user_id not in json.dumps(done) and sid not in json.dumps(done)


async def test_an_unknown_erasure_is_404_in_the_error_shape(api_url: str) -> None:
    async with httpx.AsyncClient(base_url=api_url) as anonymous:
        response = await anonymous.get("/v1/erasures/era_missing")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


async def test_an_operator_erases_a_user_and_later_finds_the_receipt(
    api_url: str, settings: Settings, sessions: Database
) -> None:
    [who] = new_customers(1)
    client = ParleyClient(api_url, await add_user(sessions, who))
    try:
        await client.turn(await client.new_session(), f"Hello there, {who.canaries['msg']}")
        printed = json.loads(
            await parley_cli(settings, "erase", "--tenant", TENANT, "--user", who.user_id)
        )
        assert (await client.http.get("/v1/sessions")).status_code == 401
    finally:
        await client.aclose()
    assert printed["status"] == "done" and printed["counts"]["messages"] >= 2
    assert who.user_id not in json.dumps(printed)
    found = json.loads(
        await parley_cli(settings, "erasure", "receipt", "--tenant", TENANT, "--user", who.user_id)
    )
    assert found == [printed]
    shown = json.loads(await parley_cli(settings, "erasure", "show", printed["erasure_id"]))
    assert shown == printed
