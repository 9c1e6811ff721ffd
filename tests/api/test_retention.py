"""Retention through the real purge workflow, worker, PostgreSQL and Temporal: with every
period at one day and the purge's clock moved a day forward, what is older goes (each kind
with its copies), what is newer stays, a second run deletes nothing, the metric counts by
table; and the daily schedule exists with the configured spec."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import REGISTRY
from sqlalchemy import func, select, text
from sqlalchemy.dialects.postgresql import insert
from temporalio.client import Client, ScheduleActionStartWorkflow, ScheduleSpec

from parley.config import Settings
from parley.data_contracts import PURGE_SCHEDULE_ID, PURGE_WORKFLOW, PurgeInput, PurgeResult
from parley.dispatch.retention import ensure_purge_schedule
from parley.store.db import Database
from parley.store.identity import create_token
from parley.store.models import (
    Feedback,
    Message,
    ModelCall,
    PinnedFactRow,
    SessionFile,
    Tenant,
    TraceSpan,
    Turn,
    TurnEvent,
    User,
    UserMemoryItem,
)
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.toolkit import eventually

ONE_DAY = {"messages_days": 1, "prompts_days": 1, "summaries_days": 1, "memory_days": 1}


async def _tenant(sessions: Database) -> tuple[str, str]:
    """A tenant of this test's own (so nothing else is purged), with one user's token."""
    tenant_id = f"ret_{uuid.uuid4().hex[:8]}"
    async with orm(sessions) as db:
        db.add(Tenant(id=tenant_id, name="Retention test", config={"retention": ONE_DAY}))
        await db.flush()
        await db.execute(insert(User).values(tenant_id=tenant_id, id="cust_1", display_name="R"))
        await db.commit()
    async with sessions() as db:
        token = await create_token(db, tenant_id=tenant_id, user_id="cust_1")
        await db.commit()
    return tenant_id, token


async def _conversation(client: ParleyClient, sessions: Database, tenant_id: str, tag: str) -> str:
    """A session with a finished turn (its trace written), an upload, a rating, a pinned fact
    and a memory item; returns the session's id."""
    session_id = await client.new_session()
    turn_id, events = await client.turn(session_id, f"Where is my order N-1001? ({tag})")
    assert events[-1].type == "done"
    answer_id = events[-1].data["message"]["id"]
    upload = await client.http.post(
        f"/v1/sessions/{session_id}/files", files={"file": (f"{tag}.txt", b"notes", "text/plain")}
    )
    assert upload.status_code == 201, upload.text
    rated = await client.http.post(
        f"/v1/sessions/{session_id}/messages/{answer_id}/feedback", json={"rating": "up"}
    )
    assert rated.status_code == 201, rated.text

    async def traced() -> bool:
        async with orm(sessions) as db:
            names = set(
                await db.scalars(select(TraceSpan.name).where(TraceSpan.turn_id == turn_id))
            )
        return "finish_turn" in names

    await eventually(traced, timeout=15, what="the turn's last span is written")
    async with orm(sessions) as db:
        db.add(
            PinnedFactRow(session_id=session_id, key=tag, value=tag, source_seq=1, source="pattern")
        )
        db.add(
            UserMemoryItem(
                tenant_id=tenant_id,
                user_id="cust_1",
                key=tag,
                value=tag,
                source=f"message:{answer_id}",
                expires_at=datetime.now(UTC) + timedelta(days=30),
            )
        )
        await db.commit()
    return session_id


async def _held(sessions: Database, session_id: str) -> dict[str, int]:
    """The session's rows, by the table the purge names them."""
    turns = select(Turn.id).where(Turn.session_id == session_id)
    async with orm(sessions) as db:

        async def count(model: Any, *where: Any) -> int:
            return int(await db.scalar(select(func.count()).select_from(model).where(*where)) or 0)

        memory_key = await db.scalar(
            select(PinnedFactRow.key).where(PinnedFactRow.session_id == session_id)
        )
        return {
            "messages": await count(Message, Message.session_id == session_id),
            "feedback": await count(Feedback, Feedback.session_id == session_id),
            "turn_events": await count(TurnEvent, TurnEvent.turn_id.in_(turns)),
            "files": await count(SessionFile, SessionFile.session_id == session_id),
            "model_calls": await count(ModelCall, ModelCall.turn_id.in_(turns)),
            "trace_spans": await count(TraceSpan, TraceSpan.turn_id.in_(turns)),
            "pinned_facts": await count(PinnedFactRow, PinnedFactRow.session_id == session_id),
            "user_memory": await count(UserMemoryItem, UserMemoryItem.key == memory_key)
            if memory_key
            else 0,
        }


def _purged_metric(table: str) -> float:
    value = REGISTRY.get_sample_value("parley_retention_rows_purged_total", {"table": table})
    return value or 0.0


async def test_a_purge_a_day_later_deletes_the_older_rows_and_keeps_the_newer(
    api_url: str,
    settings: Settings,
    temporal_client: Client,
    sessions: Database,
) -> None:
    tenant_id, token = await _tenant(sessions)
    client = ParleyClient(api_url, token)
    try:
        older = await _conversation(client, sessions, tenant_id, "older")
        async with orm(sessions) as db:
            between = await db.scalar(text("SELECT clock_timestamp()"))
        newer = await _conversation(client, sessions, tenant_id, "newer")
    finally:
        await client.aclose()
    before_old, before_new = await _held(sessions, older), await _held(sessions, newer)
    assert all(before_old.values()), before_old
    metric_before = _purged_metric("messages")

    async def purge() -> dict[str, int]:
        result = await temporal_client.execute_workflow(
            PURGE_WORKFLOW,
            # A day after `between`: the older conversation is past every period, the newer not.
            PurgeInput(
                now=(between + timedelta(days=1)).isoformat(), tenant_id=tenant_id, batch_size=2
            ),
            id=f"purge-test-{uuid.uuid4().hex[:8]}",
            task_queue=settings.task_queue,
            result_type=PurgeResult,
        )
        return result.purged

    purged = await purge()
    assert await _held(sessions, older) == dict.fromkeys(before_old, 0)
    assert await _held(sessions, newer) == before_new
    for table, count in before_old.items():
        assert purged[table] == count, (table, purged)
    assert _purged_metric("messages") - metric_before == before_old["messages"]
    again = await purge()
    assert not any(again.values()), again
    assert await _held(sessions, newer) == before_new


def _daily_at(spec: ScheduleSpec) -> tuple[int, int]:
    """(hour, minute) of a daily spec, however the server restates the cron line."""
    [calendar] = spec.calendars
    assert [(r.start, r.end) for r in calendar.day_of_month] == [(1, 31)]
    [hour], [minute] = calendar.hour, calendar.minute
    assert hour.start == hour.end and minute.start == minute.end
    return hour.start, minute.start


async def test_the_daily_schedule_is_created_once_and_follows_the_settings(
    settings: Settings, temporal_client: Client
) -> None:
    handle = temporal_client.get_schedule_handle(PURGE_SCHEDULE_ID)
    await ensure_purge_schedule(
        temporal_client, settings.model_copy(update={"retention_purge_cron": "15 4 * * *"})
    )
    assert _daily_at((await handle.describe()).schedule.spec) == (4, 15)
    await ensure_purge_schedule(temporal_client, settings)  # the next worker's start: updated
    await ensure_purge_schedule(temporal_client, settings)  # and again: nothing changes
    described = await handle.describe()
    assert _daily_at(described.schedule.spec) == (3, 30)  # PARLEY_RETENTION_PURGE_CRON's default
    action = described.schedule.action
    assert isinstance(action, ScheduleActionStartWorkflow)
    assert action.workflow == PURGE_WORKFLOW
    assert action.task_queue == settings.task_queue
