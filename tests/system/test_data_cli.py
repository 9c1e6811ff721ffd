"""`parley export` and `parley purge` as an operator runs them: real processes against the
session's database and Temporal, served by the session's worker."""

from __future__ import annotations

import io
import uuid
import zipfile
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert

from parley.archive import read_manifest
from parley.config import Settings
from parley.store.db import Database
from parley.store.identity import create_token
from parley.store.models import ChatSession, Message, User
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.stack import run_cli


async def test_export_writes_the_users_archive_to_a_file_and_to_stdout(
    settings: Settings, api_url: str, sessions: Database, tmp_path: Path
) -> None:
    user_id = f"cli_{uuid.uuid4().hex[:8]}"
    async with orm(sessions) as db:
        await db.execute(insert(User).values(tenant_id="northwind", id=user_id, display_name="C"))
        await db.commit()
    async with sessions() as db:
        token = await create_token(db, tenant_id="northwind", user_id=user_id)
        await db.commit()
    client = ParleyClient(api_url, token)
    try:
        session_id = await client.new_session()
        await client.turn(session_id, "Where is my order N-1001?")
    finally:
        await client.aclose()
    async with orm(sessions) as db:
        stored = await db.scalar(
            select(func.count())
            .select_from(Message)
            .join(ChatSession)
            .where(ChatSession.user_id == user_id)
        )

    out = tmp_path / "export.zip"
    written = await run_cli(
        settings, "export", "--tenant", "northwind", "--user", user_id, "--out", str(out)
    )
    assert written.returncode == 0, written.stderr.decode()
    manifest = read_manifest(out.read_bytes())
    assert manifest["user_id"] == user_id
    assert manifest["counts"]["sessions"] == 1 and manifest["counts"]["messages"] == stored

    piped = await run_cli(settings, "export", "--tenant", "northwind", "--user", user_id)
    assert piped.returncode == 0, piped.stderr.decode()
    assert zipfile.ZipFile(io.BytesIO(piped.stdout)).testzip() is None
    assert read_manifest(piped.stdout)["counts"] == manifest["counts"]


async def test_export_of_an_unknown_user_fails_clearly(settings: Settings) -> None:
    result = await run_cli(settings, "export", "--tenant", "northwind", "--user", "nobody")
    assert result.returncode != 0
    assert b"unknown user" in result.stderr


async def test_purge_runs_now_for_one_tenant(settings: Settings, api_url: str) -> None:
    # Southwind keeps everything (no periods): only its expired exports could go.
    result = await run_cli(settings, "purge", "--tenant", "southwind")
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().splitlines() == ["exports: 0"]
