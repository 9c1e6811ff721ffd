"""Export of a user's data through the public API (real PostgreSQL, Temporal, worker and demo
model): the archive holds every session, message, file, memory item, pinned fact, action and
rating the database holds for the user, and only theirs; another user cannot read it (404);
a link past its validity answers 410."""

from __future__ import annotations

import io
import json
import uuid
import zipfile
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest_asyncio
from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert

from parley.config import Settings
from parley.store.db import Database
from parley.store.identity import create_token
from parley.store.models import (
    Action,
    ChatSession,
    Feedback,
    Message,
    PinnedFactRow,
    SessionFile,
    User,
    UserMemoryItem,
)
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.stack import api_in_process
from tests.support.toolkit import eventually, reply

FILE_BYTES = b"order,item\nN-1001,tent\nN-1002,\xc3\xa9tui\n"


async def _new_user(sessions: Database) -> tuple[str, str]:
    user_id = f"exp_{uuid.uuid4().hex[:8]}"
    async with orm(sessions) as db:
        await db.execute(insert(User).values(tenant_id="northwind", id=user_id, display_name="Eve"))
        await db.commit()
    async with sessions() as db:
        token = await create_token(db, tenant_id="northwind", user_id=user_id)
        await db.commit()
    return user_id, token


@pytest_asyncio.fixture
async def eve(api_url: str, sessions: Database) -> AsyncIterator[ParleyClient]:
    """A user of her own, so the counts are hers alone whatever else the suite runs."""
    user_id, token = await _new_user(sessions)
    client = ParleyClient(api_url, token)
    client.user_id = user_id  # type: ignore[attr-defined]
    yield client
    await client.aclose()


async def _fill(eve: ParleyClient, sessions: Database) -> str:
    """Two sessions (one deleted), turns, an upload, a rating, a memory item, a pinned fact
    and a declined action; returns the upload's id."""
    first = await eve.new_session()
    _, events = await eve.turn(first, "Where is my order N-1001?")
    answer_id = events[-1].data["message"]["id"]
    assert reply(events)
    uploaded = await eve.http.post(
        f"/v1/sessions/{first}/files", files={"file": ("orders.csv", FILE_BYTES, "text/csv")}
    )
    assert uploaded.status_code == 201, uploaded.text
    rated = await eve.http.post(
        f"/v1/sessions/{first}/messages/{answer_id}/feedback",
        json={"rating": "down", "comment": "too slow"},
    )
    assert rated.status_code == 201, rated.text
    second = await eve.new_session()
    turn_id, _ = await eve.turn(second, "What is your returns policy?")
    user_id = eve.user_id  # type: ignore[attr-defined]
    async with orm(sessions) as db:
        db.add(
            UserMemoryItem(
                tenant_id="northwind",
                user_id=user_id,
                key="shoe_size",
                value="44",
                source=f"message:{answer_id}",
                expires_at=datetime.now(UTC) + timedelta(days=30),
            )
        )
        db.add(
            PinnedFactRow(session_id=first, key="name", value="Eve", source_seq=1, source="pattern")
        )
        db.add(
            Action(
                id=f"act_{uuid.uuid4().hex[:12]}",
                session_id=second,
                turn_id=turn_id,
                tenant_id="northwind",
                user_id=user_id,
                tool="send_email",
                args={"subject": "copy of my order"},
                args_hash="0" * 64,
                summary="Email the order summary",
                status="declined",
                expires_at=datetime.now(UTC),
            )
        )
        await db.commit()
    assert (await eve.http.delete(f"/v1/sessions/{second}")).status_code == 204
    return str(uploaded.json()["file_id"])


async def _counts(sessions: Database, user_id: str) -> dict[str, int]:
    """What the database holds for the user, by the manifest's kinds."""
    owned = select(ChatSession.id).where(
        ChatSession.tenant_id == "northwind", ChatSession.user_id == user_id
    )
    async with orm(sessions) as db:

        async def count(model: Any, *where: Any) -> int:
            return int(await db.scalar(select(func.count()).select_from(model).where(*where)) or 0)

        return {
            "sessions": await count(ChatSession, ChatSession.id.in_(owned)),
            "messages": await count(Message, Message.session_id.in_(owned)),
            "files": await count(SessionFile, SessionFile.session_id.in_(owned)),
            "memory_items": await count(
                UserMemoryItem,
                UserMemoryItem.tenant_id == "northwind",
                UserMemoryItem.user_id == user_id,
            ),
            "pinned_facts": await count(PinnedFactRow, PinnedFactRow.session_id.in_(owned)),
            "feedback": await count(Feedback, Feedback.session_id.in_(owned)),
            "actions": await count(Action, Action.session_id.in_(owned)),
        }


async def _ready(client: ParleyClient, status_url: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        response = await client.http.get(status_url)
        assert response.status_code == 200, response.text
        body = dict(response.json())
        assert body["state"] != "failed", body
        return body if body["state"] == "ready" else None

    return await eventually(probe, timeout=30, what="the export is ready")


async def test_the_archive_holds_everything_the_database_holds_for_the_user(
    eve: ParleyClient, marco: ParleyClient, sessions: Database
) -> None:
    file_id = await _fill(eve, sessions)
    user_id = eve.user_id  # type: ignore[attr-defined]
    expected = await _counts(sessions, user_id)
    assert expected["messages"] >= 4 and expected["files"] == 1 and expected["feedback"] == 1

    asked = await eve.http.get("/v1/me/export")
    assert asked.status_code == 202, asked.text
    export = asked.json()
    status = await _ready(eve, export["status_url"])
    again = await eve.http.get("/v1/me/export")  # a second ask this soon: the same export
    assert again.status_code == 202 and again.json()["id"] == export["id"]
    assert status["sessions_done"] == status["sessions_total"] == expected["sessions"]
    assert status["counts"] == expected

    download = await eve.http.get(export["archive_url"])
    assert download.status_code == 200, download.text
    assert download.headers["content-type"] == "application/zip"
    archive = zipfile.ZipFile(io.BytesIO(download.content))
    manifest = json.loads(archive.read("manifest.json"))
    assert manifest["user_id"] == user_id and manifest["counts"] == expected
    folders = [json.loads(archive.read(each["path"])) for each in manifest["sessions"]]
    async with orm(sessions) as db:
        stored = {
            (m.id, m.text, m.status)
            for m in await db.scalars(
                select(Message).join(ChatSession).where(ChatSession.user_id == user_id)
            )
        }
    archived = {(m["id"], m["text"], m["status"]) for f in folders for m in f["messages"]}
    assert archived == stored
    [described] = [f for folder in folders for f in folder["files"]]
    assert described["id"] == file_id and archive.read(described["path"]) == FILE_BYTES
    assert [a["status"] for folder in folders for a in folder["actions"]] == ["declined"]
    memory = json.loads(archive.read("memory.json"))
    assert [(i["key"], i["value"]) for i in memory["items"]] == [("shoe_size", "44")]
    assert memory["items"][0]["source_message"]["seq"] >= 1

    for url in (export["status_url"], export["archive_url"]):
        other = await marco.http.get(url)
        assert other.status_code == 404, other.text
        assert other.json()["error"]["code"] == "not_found"


async def test_an_expired_link_answers_410(
    settings: Settings, worker: object, sessions: Database
) -> None:
    _, token = await _new_user(sessions)
    brief = settings.model_copy(update={"export_link_ttl_s": 1.0})
    async with api_in_process(brief, token) as (_, client):
        asked = await client.http.get("/v1/me/export")
        assert asked.status_code == 202, asked.text
        export = asked.json()

        async def expired() -> bool:
            response = await client.http.get(export["archive_url"])
            assert response.status_code in (200, 409, 410), response.text
            return response.status_code == 410

        await eventually(expired, timeout=15, what="the archive link expires")
        for url in (export["status_url"], export["archive_url"]):
            gone = await client.http.get(url)
            assert gone.status_code == 410
            assert gone.json()["error"]["code"] == "export_expired"
