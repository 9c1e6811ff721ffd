"""Issue 28, acceptance 1, and a deleted session erased after its grace period.

A customer plants canary words everywhere Parley copies what a user says (messages and
their vectors, prompts, the event log, pinned facts, a consented preference, a paste, an
uploaded file, a confirmed email, the rolling summary); another customer of the same tenant
talks too. After `DELETE /v1/me` and the erasure's end, the catalogue-wide scan
(tests/support/canary.py) finds none of the first customer's canaries and no row naming
them, the other customer's rows are byte-identical, and the receipt counts exactly the rows
that went, table by table.

Its own worker and API (grace 0, a summary that folds early) and a backend of its own that
knows the two customers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
import pytest_asyncio
from sqlalchemy import select, text
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from parley.config import Settings
from parley.erasure import subject_hash
from parley.gateway.demo import DemoModel
from parley.ids import workflow_id_for_turn
from parley.store.db import Database
from parley.store.models import ChatSession, ConversationSummary, Erasure
from tests.support.canary import scan, table_fingerprints
from tests.support.client import ParleyClient
from tests.support.erasure import (
    Customer_,
    add_user,
    backend_with,
    converse,
    done_turn,
    new_customers,
    receipt,
)
from tests.support.orm import orm
from tests.support.toolkit import Stack, eventually, own_stack, wait_for_stored_state

ERASED, KEPT, SESSIONS_OWNER = new_customers(3)
# Tables the first customer's canaries must reach before the erasure (so the scan can fail).
# The event log holds the demo model's words, not the user's: its rows are counted below.
EXPECTED_PLACES = {
    "messages",
    "model_calls",
    "files",
    "pinned_facts",
    "conversation_summaries",
}


@pytest_asyncio.fixture(scope="module")
async def stack(
    temporal_client: Client, settings: Settings, sessions: Database
) -> AsyncIterator[Stack[DemoModel]]:
    async with (
        backend_with([ERASED, KEPT, SESSIONS_OWNER]) as backend_url,
        own_stack(
            temporal_client,
            settings,
            sessions,
            DemoModel(token_delay_s=0),
            prefix="erase",
            northwind_url=backend_url,
            session_erase_grace_s=0.0,
            # A small window and an eager summary: the canaries are folded after a few turns.
            context_conversation_tokens=300,
            context_summary_tokens=500,
            summary_min_new_tokens=1,
            summary_start_delay_ms=0,
        ) as running,
    ):
        yield running


async def client_for(stack: Stack[DemoModel], sessions: Database, who: Customer_) -> ParleyClient:
    return ParleyClient(stack.url, await add_user(sessions, who))


async def summary_with(sessions: Database, sid: str, needle: str, temporal: Client) -> None:
    """Wait until the session's summary folded `needle` and its summary run has ended."""

    async def folded() -> bool:
        async with orm(sessions) as db:
            lines = await db.scalars(
                select(ConversationSummary.lines).where(ConversationSummary.session_id == sid)
            )
            return any(needle in str(version) for version in lines)

    await eventually(folded, timeout=60, what="the summary folds the canary", every=0.2)
    await quiet_summary(temporal, sid)


async def quiet_summary(temporal: Client, sid: str) -> None:
    """Wait for the session's summary workflow to close, so its rows stop changing."""
    handle = temporal.get_workflow_handle(f"summary-{sid}")

    async def closed() -> bool:
        try:
            return (await handle.describe()).status != WorkflowExecutionStatus.RUNNING
        except RPCError as exc:
            return exc.status == RPCStatusCode.NOT_FOUND

    await eventually(closed, timeout=60, what="the summary run ends", every=0.2)


async def receipts_finished_since(
    sessions: Database, *, since: datetime, but: str
) -> dict[str, int]:
    """The rows other erasures than `but` deleted (their receipts' counts, table by table)
    since the snapshot taken at `since`."""
    async with orm(sessions) as db:
        rows = await db.execute(
            text(
                "SELECT counts FROM erasures "
                "WHERE id <> :but AND status = 'done' AND finished_at >= :since"
            ),
            {"but": but, "since": since},
        )
        found: dict[str, int] = {}
        for (counts,) in rows:
            for table, n in counts.items():
                found[table] = found.get(table, 0) + n
    return found


async def no_other_erasure_running(sessions: Database, *, but: str = "") -> None:
    """Until no erasure but `but` is under way. One that is (another test's deleted session,
    its grace ended) deletes rows before its receipt counts them: a suite run saw a session
    and its hand-off go that no finished receipt named yet."""

    async def settled() -> bool:
        async with orm(sessions) as db:
            running = await db.scalar(
                text("SELECT count(*) FROM erasures WHERE status = 'running' AND id <> :but"),
                {"but": but},
            )
        return running == 0

    await eventually(settled, timeout=120, what="the other erasures are done", every=0.1)


@pytest.mark.timeout(300)
async def test_erasing_a_user_leaves_no_canary_and_no_row_and_touches_nobody_else(
    stack: Stack[DemoModel],
    sessions: Database,
    database_url: str,
    temporal_client: Client,
) -> None:
    erased = await client_for(stack, sessions, ERASED)
    kept = await client_for(stack, sessions, KEPT)
    try:
        erased_sid = await converse(erased, ERASED)
        kept_sid = await converse(kept, KEPT, turns=1)
        await summary_with(sessions, erased_sid, ERASED.canaries["msg"], temporal_client)
        await quiet_summary(temporal_client, kept_sid)

        needles = [*ERASED.canaries.values(), ERASED.user_id]
        before = await scan(database_url, needles)
        kept_before = await scan(database_url, KEPT.canaries.values())
        places = {place.split(".")[0] for found in before.values() for place in found}
        assert EXPECTED_PLACES <= places, before
        assert all(before[c] for c in ERASED.canaries.values()), before
        await no_other_erasure_running(sessions)  # none straddles the snapshot
        snapshot_at = datetime.now(UTC)
        prints = await table_fingerprints(database_url)

        started = await erased.http.delete("/v1/me")
        assert started.status_code == 202, started.text
        body = started.json()
        assert body["status_url"] == f"/v1/erasures/{body['erasure_id']}"
        assert (await erased.http.get("/v1/sessions")).status_code == 401  # revoked at once
        done = await receipt(erased, body["status_url"], timeout=120)
        await no_other_erasure_running(sessions, but=body["erasure_id"])
    finally:
        await erased.aclose()
        await kept.aclose()

    after = await scan(database_url, needles)
    assert after == {needle: {} for needle in needles}, after
    assert await scan(database_url, KEPT.canaries.values()) == kept_before
    # Every row that went is on the receipt, table by table, and nothing else went.
    prints_after = await table_fingerprints(database_url)
    gone = {t: len(rows - prints_after.get(t, set())) for t, rows in prints.items()}
    # Another test's deleted session may be erased when its grace ends, in between: its rows
    # went by its own receipt. Nothing went that no receipt names.
    others = await receipts_finished_since(sessions, since=snapshot_at, but=body["erasure_id"])
    expected = dict(done["counts"])
    for table, n in others.items():
        expected[table] = expected.get(table, 0) + n
    assert {t: n for t, n in gone.items() if n} == expected
    assert done["total"] == sum(done["counts"].values())
    for place in {p for found in before.values() for p in found}:
        table = place.split(".")[0]
        most = max(found.get(place, 0) for found in before.values())
        assert done["counts"].get(table, 0) >= most, (place, done["counts"])
    async with orm(sessions) as db:
        row = await db.get(Erasure, body["erasure_id"])
        assert row is not None and row.user_id is None and row.session_id is None
        assert row.subject_hash == subject_hash(
            stack.settings.erasure_receipt_key, "northwind", ERASED.user_id
        )
        mine = await db.scalar(select(ChatSession).where(ChatSession.user_id == KEPT.user_id))
        assert mine is not None and mine.id == kept_sid


@pytest.mark.timeout(240)
async def test_a_deleted_session_is_erased_with_what_came_from_it_and_nothing_else(
    stack: Stack[DemoModel],
    sessions: Database,
    database_url: str,
    temporal_client: Client,
) -> None:
    owner = await client_for(stack, sessions, SESSIONS_OWNER)
    try:
        doomed = await converse(owner, SESSIONS_OWNER)
        await summary_with(sessions, doomed, SESSIONS_OWNER.canaries["msg"], temporal_client)
        other = await owner.new_session()
        await done_turn(owner, other, f"Where is my order {SESSIONS_OWNER.order_id}? canarystays")
        await quiet_summary(temporal_client, other)
        remembered = (await owner.http.get("/v1/memory")).json()["items"]
        assert [item["key"] for item in remembered] == ["contact_channel"]
        other_before = await scan(database_url, ["canarystays"])
        assert other_before["canarystays"]

        assert (await owner.http.delete(f"/v1/sessions/{doomed}")).status_code == 204

        async def erased() -> bool:
            async with orm(sessions) as db:
                return await db.get(ChatSession, doomed) is None

        await eventually(erased, timeout=120, what="the deleted session is erased", every=0.2)
        async with orm(sessions) as db:
            receipt_row = await db.scalar(
                select(Erasure).where(
                    Erasure.subject_hash
                    == subject_hash(
                        stack.settings.erasure_receipt_key,
                        "northwind",
                        SESSIONS_OWNER.user_id,
                        doomed,
                    )
                )
            )
        assert receipt_row is not None

        async def finished() -> bool:
            async with orm(sessions) as db:
                row = await db.get(Erasure, receipt_row.id)
                return row is not None and row.status == "done"

        await eventually(finished, timeout=60, what="the session's receipt is closed", every=0.2)
        found = await scan(database_url, SESSIONS_OWNER.canaries.values())
        assert found == {c: {} for c in SESSIONS_OWNER.canaries.values()}, found
        # The memory item that session's message wrote went with it; the user and their
        # other session stay.
        assert (await owner.http.get("/v1/memory")).json()["items"] == []
        assert await scan(database_url, ["canarystays"]) == other_before
        assert (await owner.http.get(f"/v1/sessions/{other}")).status_code == 200
    finally:
        await owner.aclose()


@pytest.mark.timeout(300)
async def test_a_turn_running_when_its_user_is_erased_is_stopped_and_its_workflow_deleted(
    temporal_client: Client, settings: Settings, sessions: Database
) -> None:
    [who] = new_customers(1)
    # A slow model: the answer is still streaming when the erasure starts.
    async with own_stack(
        temporal_client, settings, sessions, DemoModel(token_delay_s=0.3), prefix="erasebusy"
    ) as busy:
        client = ParleyClient(busy.url, await add_user(sessions, who))
        try:
            sid = await client.new_session()
            posted = await client.post(sid, "Tell me about yourself, please.")
            turn_id = posted.json()["turn_id"]
            await wait_for_stored_state(sessions, turn_id, ["calling_model"], timeout=30)
            workflow = temporal_client.get_workflow_handle(workflow_id_for_turn(turn_id))
            assert (await workflow.describe()).status == WorkflowExecutionStatus.RUNNING
            started = await client.http.delete("/v1/me")
            assert started.status_code == 202, started.text
            done = await receipt(client, started.json()["status_url"], timeout=90)
        finally:
            await client.aclose()
    assert done["counts"]["turns"] == 1 and done["counts"]["users"] == 1

    async def deleted() -> bool:
        """The server deletes an execution (and then its visibility record) in the background,
        once its queues have recorded the execution's close (every second on the tests' dev
        server, tests/conftest.py)."""
        try:
            seen.append((await workflow.describe()).status)
        except RPCError as exc:
            assert exc.status == RPCStatusCode.NOT_FOUND
            query = f"ParleySessionId = '{sid}'"
            return [w async for w in temporal_client.list_workflows(query)] == []
        return False

    seen: list[object] = []
    try:
        await eventually(deleted, timeout=120, what="the turn's workflow is deleted", every=0.2)
    except AssertionError:
        raise AssertionError(f"still there: {seen[-3:]}") from None
    async with orm(sessions) as db:
        assert await db.get(ChatSession, sid) is None
