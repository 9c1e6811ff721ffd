"""Erasure reaches a hand-off (issue 43, acceptance 6): a customer who spoke with a person
(their message to the person, the person's reply, an internal note about them, a webhook
delivery quoting their case) is erased, and the catalogue-wide scan finds none of their
canaries; the receipt counts the case's rows. An internal note never reaches the customer's
export (acceptance 3)."""

from __future__ import annotations

import io
import json
import uuid
import zipfile

from parley.config import Settings
from parley.store import handoffs, webhooks
from parley.store.db import Database
from parley.store.identity import create_token
from tests.support.canary import scan
from tests.support.client import ParleyClient
from tests.support.erasure import add_user, done_turn, new_customers, receipt
from tests.support.toolkit import eventually

[CUSTOMER] = new_customers(1)


async def test_erasure_takes_the_human_part_and_the_export_never_had_the_notes(
    api_url: str, sessions: Database, settings: Settings
) -> None:
    word = (
        f"canary{uuid.uuid4().hex[:10]}"  # lowercase letters and digits (tests/support/canary.py)
    )
    said, reply, noted = f"{word}said", f"{word}reply", f"{word}note"
    customer = ParleyClient(api_url, await add_user(sessions, CUSTOMER))
    async with sessions() as db:
        agent = ParleyClient(
            api_url, await create_token(db, tenant_id="northwind", user_id="agent_lee")
        )
        await db.commit()
    try:
        sid = await customer.new_session()
        await done_turn(customer, sid, f"Could a representative help me with {word}")
        case = (await customer.http.get(f"/v1/sessions/{sid}/handoff")).json()
        url = f"/v1/handoffs/{case['id']}"
        assert (await agent.http.post(url + "/claim")).status_code == 200
        assert (await agent.http.post(url + "/messages", json={"text": reply})).status_code == 201
        assert (await customer.post(sid, said)).status_code == 202
        assert (await agent.http.post(url + "/notes", json={"text": noted})).status_code == 201
        async with sessions() as db:  # as a delivery to the team's tools records it
            row = await handoffs.get_case(db, handoff_id=case["id"])
            assert row is not None
            await webhooks.record(
                db,
                delivery_id=f"whk_{row.id}_new",
                tenant_id=row.tenant_id,
                session_id=row.session_id,
                handoff_id=row.id,
                event="new",
                url="https://hooks.example.com/parley",
                payload={"reason": row.reason, "summary": row.summary},
            )
            await db.commit()

        # The export holds the conversation, never the note.
        archive = await _export(customer)
        assert reply in archive and said in archive and noted not in archive

        placed = await scan(settings.database_url or "", [word])
        assert {"handoffs.reason", "handoff_notes.text", "webhook_deliveries.payload"} <= set(
            placed[word]
        ), placed
        erasing = await customer.http.delete("/v1/me")
        assert erasing.status_code == 202, erasing.text
        done = await receipt(customer, erasing.json()["status_url"], timeout=60)
    finally:
        await customer.aclose()
        await agent.aclose()
    assert await scan(settings.database_url or "", [word]) == {word: {}}
    counts = done["counts"]
    assert counts["handoffs"] == 1 and counts["handoff_notes"] == 1
    assert counts["webhook_deliveries"] == 1 and counts["handoff_events"] >= 3


async def _export(client: ParleyClient) -> str:
    """The caller's export archive, every file of it as one text."""
    asked = await client.http.get("/v1/me/export")
    assert asked.status_code == 202, asked.text
    status_url = asked.json()["status_url"]

    async def ready() -> bool:
        return (await client.http.get(status_url)).json()["state"] == "ready"

    await eventually(ready, timeout=60, what="the export is written", every=0.2)
    zipped = await client.http.get(asked.json()["archive_url"])
    assert zipped.status_code == 200
    with zipfile.ZipFile(io.BytesIO(zipped.content)) as archive:
        return json.dumps([archive.read(name).decode() for name in archive.namelist()])
