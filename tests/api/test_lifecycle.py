"""Every turn ends once, the way the user asked, against the real stack: a Stop accepted at
any moment ends the turn `cancelled`; a Stop that races the outbox sweep never lets the turn
come back; a paused tenant confirms and sends nothing; a confirm whose first delivery is lost
still reaches the turn at once; a retried hand-off or proposal writes one row.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
import pytest_asyncio
from sqlalchemy import func, select, update
from temporalio.client import (
    Client,
    Interceptor,
    OutboundInterceptor,
    StartWorkflowUpdateInput,
    WorkflowUpdateHandle,
)
from temporalio.testing import ActivityEnvironment

from parley.api.main import create_app
from parley.config import Settings
from parley.contracts import ExecuteToolInput, ResolveActionSignal, TurnState
from parley.dispatch.control import cancel_turn_workflow, deliver_decision
from parley.dispatch.outbox import Starts, sweep_once, sweep_tick
from parley.errors import TurnFinished
from parley.ids import tool_call_row_id
from parley.statuses import Decision
from parley.store import actions, locks, outbox, turns
from parley.store.db import Database, on_transaction_sent
from parley.store.identity import Identity
from parley.store.models import Action, Handoff, Message, ModelCall, ToolCall, Turn, TurnEvent
from tests.support.client import ParleyClient
from tests.support.orm import orm
from tests.support.stack import serve
from tests.support.toolkit import (
    counted_sessions,
    emails,
    eventually,
    post_unstarted,
    propose,
    wait_for_stored_state,
    wait_for_view_state,
)

ADMIN = "/v1/admin/tenants/northwind"
PRIYA = Identity(tenant_id="northwind", user_id="cust_2291", roles=())


@pytest_asyncio.fixture
async def admin(api_url: str, tokens: dict[str, str]) -> AsyncIterator[ParleyClient]:
    client = ParleyClient(api_url, tokens["admin"])
    yield client
    await client.http.post(f"{ADMIN}/resume")
    await client.aclose()


async def event_types(sessions: Database, turn_id: str) -> list[str]:
    async with orm(sessions) as db:
        rows = await db.scalars(
            select(TurnEvent.type).where(TurnEvent.turn_id == turn_id).order_by(TurnEvent.id)
        )
        return [str(t) for t in rows]


async def ended_cancelled(sessions: Database, turn_id: str) -> Message | None:
    """The turn's row is `cancelled` and its answer is stored `cancelled`."""
    await wait_for_stored_state(
        sessions, turn_id, {"cancelled", "completed", "failed", "expired"}, timeout=30
    )
    async with orm(sessions) as db:
        turn = await db.get(Turn, turn_id)
        assert turn is not None
        assert turn.state == "cancelled", turn.state
        message = await db.get(Message, turn.assistant_message_id or "")
    assert message is not None and message.status == "cancelled"
    return message


# --- 1. a Stop accepted at any moment before the first delta ends the turn cancelled ----------


# A turn that proposes (context, model, tool, confirmation), and a plain answer, whose
# screen, follow-ups and end share the turn's last workflow task.
ASKED = {"proposal": "Can you email me?", "answer": "Thanks, that helps."}


@pytest.mark.parametrize("delay_s", [0.0, 0.01, 0.03, 0.06, 0.1, 0.15, 0.2, 0.3, 0.5])
@pytest.mark.parametrize("asked", sorted(ASKED))
async def test_every_accepted_stop_ends_the_turn_cancelled(
    priya: ParleyClient,
    sessions: Database,
    northwind: httpx.AsyncClient,
    delay_s: float,
    asked: str,
) -> None:
    sid = await priya.new_session()
    await priya.turn(sid, "Where is my order?")
    posted = await priya.post(sid, ASKED[asked])
    turn_id = posted.json()["turn_id"]
    await asyncio.sleep(delay_s)  # the spread of moments under test, not a wait for anything
    stop = await priya.http.post(f"/v1/sessions/{sid}/turns/{turn_id}/cancel")
    async with orm(sessions) as db:
        reached = await db.get(Turn, turn_id)
    assert reached is not None
    if stop.status_code == 202:
        await ended_cancelled(sessions, turn_id)
        async with orm(sessions) as db:
            steps = await db.scalars(
                select(TurnEvent.data["state"].astext)
                .where(TurnEvent.turn_id == turn_id, TurnEvent.type == "state")
                .order_by(TurnEvent.id)
            )
            print(f"stop after {delay_s:.2f} s: 202, steps {list(steps)}")
        events = await priya.events(sid, turn_id)
        assert events[-1].type == "cancelled"
        assert "done" not in await event_types(sessions, turn_id)
        # No card is left to confirm, and nothing was sent for this turn.
        async with orm(sessions) as db:
            left = await db.scalars(select(Action).where(Action.turn_id == turn_id))
            for action in left:
                assert action.status != "pending"
                assert await emails(northwind, action_id=action.id) == []
    else:
        print(f"stop after {delay_s:.2f} s: {stop.status_code}")
        assert stop.status_code == 409, stop.text
        assert stop.json()["error"]["code"] == "turn_finished"
    ended = await event_types(sessions, turn_id)
    assert ended.count("followups") <= 1, ended  # never offered twice
    # Either way the session takes the next message.
    after = await priya.turn(sid, "Thanks")
    assert after[1][-1].type == "done"


async def test_a_stop_while_waiting_for_confirmation_ends_cancelled_and_sends_nothing(
    priya: ParleyClient, sessions: Database, northwind: httpx.AsyncClient
) -> None:
    sid = await priya.new_session()
    turn_id, _, action = await propose(priya, sid)
    stop = await priya.http.post(f"/v1/sessions/{sid}/turns/{turn_id}/cancel")
    assert stop.status_code == 202
    await ended_cancelled(sessions, turn_id)
    confirm = await priya.http.post(f"/v1/sessions/{sid}/actions/{action['id']}/confirm")
    assert confirm.status_code == 409
    assert await emails(northwind, action_id=action["id"]) == []
    again = await priya.http.post(f"/v1/sessions/{sid}/turns/{turn_id}/cancel")
    assert again.status_code == 409 and again.json()["error"]["code"] == "turn_finished"


# --- 2. races ---------------------------------------------------------------------------------


async def unstarted_turn(sessions: Database, priya: ParleyClient, text: str) -> str:
    """A committed turn whose workflow the API never started (it died after the commit)."""
    sid = await priya.new_session()
    await priya.turn(sid, "Where is my order?")
    async with sessions() as db:
        posted = await post_unstarted(db, owner=PRIYA, text=text, session_id=sid, for_sweep=True)
    assert posted.turn is not None
    return posted.turn.id


@pytest.mark.parametrize("order", ["cancel_first", "sweep_first", "together"])
async def test_a_stop_that_races_the_outbox_sweep_never_lets_the_turn_come_back(
    priya: ParleyClient,
    sessions: Database,
    temporal_client: Client,
    settings: Settings,
    order: str,
) -> None:
    turn_id = await unstarted_turn(sessions, priya, "Can you email me?")

    async def sweep() -> None:
        await sweep_once(
            temporal_client, sessions, task_queue=settings.task_queue, grace=timedelta(0)
        )

    async def stop() -> None:
        await cancel_turn_workflow(temporal_client, sessions, turn_id=turn_id)

    if order == "cancel_first":
        await stop()
        await sweep()
    elif order == "sweep_first":
        await sweep()
        await stop()
    else:
        await asyncio.gather(stop(), sweep())
    await ended_cancelled(sessions, turn_id)
    # Whatever the workflow did after the sweep started it, it has finished, and the turn
    # never showed a card nor answered.
    handle = temporal_client.get_workflow_handle(f"turn-{turn_id}")

    async def closed() -> bool:
        try:
            return (await handle.describe()).status.name != "RUNNING"
        except Exception:
            return True  # never started

    await eventually(closed, timeout=30, what="the turn's workflow closed")
    shown = await event_types(sessions, turn_id)
    assert "confirmation_required" not in shown and "done" not in shown
    async with orm(sessions) as db:
        assert (await db.get(Turn, turn_id)).state == "cancelled"  # type: ignore[union-attr]


async def test_a_paused_tenant_confirms_nothing_and_the_action_stays_pending(
    priya: ParleyClient, admin: ParleyClient, northwind: httpx.AsyncClient
) -> None:
    sid = await priya.new_session()
    turn_id, _, action = await propose(priya, sid)
    assert (await admin.http.post(f"{ADMIN}/pause")).status_code == 200
    for verb in ("confirm", "decline"):
        refused = await priya.http.post(f"/v1/sessions/{sid}/actions/{action['id']}/{verb}")
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "agent_paused"
    view = await priya.turn_view(sid, turn_id)
    assert view["pending_action"]["status"] == "pending"
    assert await emails(northwind, action_id=action["id"]) == []
    await admin.http.post(f"{ADMIN}/resume")
    confirmed = await priya.http.post(f"/v1/sessions/{sid}/actions/{action['id']}/confirm")
    assert confirmed.status_code == 202
    await wait_for_view_state(priya, sid, turn_id, "completed", timeout=30)
    assert len(await emails(northwind, action_id=action["id"])) == 1


async def test_a_pause_after_the_confirm_sends_nothing_and_ends_the_turn_agent_paused(
    priya: ParleyClient,
    admin: ParleyClient,
    sessions: Database,
    temporal_client: Client,
    northwind: httpx.AsyncClient,
) -> None:
    sid = await priya.new_session()
    turn_id, events, action = await propose(priya, sid)
    # The confirm was stored just before the pause; its delivery arrives after it.
    async with sessions() as db:
        await actions.resolve_action(
            db, action_id=action["id"], session_id=sid, owner=PRIYA, decision=Decision.confirmed
        )
        await db.commit()
    assert (await admin.http.post(f"{ADMIN}/pause")).status_code == 200
    taken = await deliver_decision(
        temporal_client, turn_id=turn_id, decision=ResolveActionSignal(action["id"], "confirmed")
    )
    assert taken
    rest = await asyncio.wait_for(priya.events(sid, turn_id, last_event_id=events[-1].id), 30)
    assert rest[-1].type == "error"
    assert rest[-1].data["code"] == "agent_paused" and rest[-1].data["retryable"] is True
    assert await emails(northwind, action_id=action["id"]) == []


class LoseUpdates(Interceptor):
    """A Temporal client whose Update deliveries fail while `losing` is set (the first
    `lose_first` of them, or all until told otherwise)."""

    def __init__(self, lose_first: int) -> None:
        self.lose_first = lose_first
        self.lost = 0
        self.losing = True

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _Losing(next, self)


class _Losing(OutboundInterceptor):
    def __init__(self, next: OutboundInterceptor, owner: LoseUpdates) -> None:
        super().__init__(next)
        self._owner = owner

    async def start_workflow_update(
        self, input: StartWorkflowUpdateInput
    ) -> WorkflowUpdateHandle[Any]:
        owner = self._owner
        if owner.losing and (owner.lose_first == 0 or owner.lost < owner.lose_first):
            owner.lost += 1
            raise ConnectionError("delivery lost on purpose")
        return await super().start_workflow_update(input)


@pytest_asyncio.fixture
async def lossy_api(settings: Settings, worker: Any) -> AsyncIterator[tuple[str, LoseUpdates]]:
    losing = LoseUpdates(lose_first=1)
    async with serve(create_app(settings, temporal_interceptors=[losing])) as url:
        yield url, losing


async def test_a_confirm_whose_first_delivery_is_lost_is_sent_at_once(
    lossy_api: tuple[str, LoseUpdates],
    tokens: dict[str, str],
    northwind: httpx.AsyncClient,
) -> None:
    url, losing = lossy_api
    client = ParleyClient(url, tokens["priya"])
    try:
        sid = await client.new_session()
        turn_id, events, action = await propose(client, sid)
        clicked = time.monotonic()
        confirm = await client.http.post(f"/v1/sessions/{sid}/actions/{action['id']}/confirm")
        assert confirm.status_code == 202
        assert losing.lost == 1
        sent = await eventually(
            lambda: emails(northwind, action_id=action["id"]),
            timeout=10,
            what="the confirmed email sent",
        )
        print(f"email accepted {time.monotonic() - clicked:.2f} s after the confirm")
        assert len(sent) == 1
    finally:
        await client.aclose()


async def test_two_confirms_after_a_lost_delivery_send_once_at_the_second(
    lossy_api: tuple[str, LoseUpdates],
    tokens: dict[str, str],
    northwind: httpx.AsyncClient,
) -> None:
    url, losing = lossy_api
    losing.lose_first = 0  # every delivery of the first confirm is lost
    client = ParleyClient(url, tokens["priya"])
    try:
        sid = await client.new_session()
        turn_id, _, action = await propose(client, sid)
        first = await client.http.post(f"/v1/sessions/{sid}/actions/{action['id']}/confirm")
        assert first.status_code == 202
        assert await emails(northwind, action_id=action["id"]) == []
        losing.losing = False
        second = await client.http.post(f"/v1/sessions/{sid}/actions/{action['id']}/confirm")
        assert second.status_code == 409 and second.json()["error"]["code"] == "action_resolved"
        sent = await eventually(
            lambda: emails(northwind, action_id=action["id"]),
            timeout=10,
            what="the confirmed email sent after the second confirm",
        )
        assert len(sent) == 1
        await wait_for_view_state(client, sid, turn_id, "completed", timeout=30)
        assert len(await emails(northwind, action_id=action["id"])) == 1
    finally:
        await client.aclose()


# --- 4. a retried tool call writes its row once ------------------------------------------------


async def pending_call(
    sessions: Database,
    turn_id: str,
    name: str,
    arguments: dict[str, Any],
    *,
    position: int,
    provider_call_id: str,
) -> str:
    """A tool call the model asked for in `turn_id` (a turn at its tool step), not yet run."""
    async with orm(sessions) as db:
        model_call = ModelCall(
            id=f"mc_{turn_id[-12:]}{position}",
            turn_id=turn_id,
            step=position,
            provider="demo",
            model="demo-1",
            request={"messages": []},
        )
        db.add(model_call)
        await db.flush()
        row_id = tool_call_row_id(model_call_id=model_call.id, position=0)
        db.add(
            ToolCall(
                id=row_id,
                turn_id=turn_id,
                model_call_id=model_call.id,
                provider_call_id=provider_call_id,
                name=name,
                arguments=arguments,
                args_hash="h",
                status="pending",
            )
        )
        await db.commit()
        return row_id


async def turn_at_its_tool_step(sessions: Database, priya: ParleyClient) -> str:
    turn_id = await unstarted_turn(sessions, priya, "Could a representative help me?")
    async with sessions() as db:
        for state in (TurnState.building_context, TurnState.calling_model):
            await turns.move_turn(db, turn_id=turn_id, to=state)
        await db.commit()
    return turn_id


async def run_twice(
    sessions: Database, tools: Any, turn_id: str, call_id: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the call, then again as a retry after a crash before its result was stored."""
    env = ActivityEnvironment()
    inp = ExecuteToolInput(turn_id, call_id)
    await env.run(tools.execute_tool, inp)
    async with orm(sessions) as db:
        first = (await db.get(ToolCall, call_id)).result  # type: ignore[union-attr]
        await db.execute(update(ToolCall).where(ToolCall.id == call_id).values(status="pending"))
        await db.commit()
    await env.run(tools.execute_tool, inp)
    async with orm(sessions) as db:
        second = (await db.get(ToolCall, call_id, populate_existing=True)).result  # type: ignore[union-attr]
    return first, second


@pytest_asyncio.fixture
async def tool_activities(settings: Settings, sessions: Database) -> AsyncIterator[Any]:
    from parley.activities.tools import ToolActivities
    from parley.worker import build_northwind

    async with httpx.AsyncClient() as http:
        northwind = build_northwind(settings, http, time.monotonic)
        yield ToolActivities(sessions=sessions, northwind=northwind, settings=settings)


async def test_a_retried_handoff_and_a_retried_proposal_create_one_row_each(
    priya: ParleyClient, sessions: Database, tool_activities: Any
) -> None:
    turn_id = await turn_at_its_tool_step(sessions, priya)
    anthropic_id = "toolu_01" + "X" * 22  # 30 characters, like Anthropic's
    handoff_call = await pending_call(
        sessions,
        turn_id,
        "handoff_to_human",
        {"reason": "wants a person"},
        position=1,
        provider_call_id=anthropic_id,
    )
    first, second = await run_twice(sessions, tool_activities, turn_id, handoff_call)
    assert "error" not in first, first
    assert first["handoff_id"] == second["handoff_id"]
    proposal_call = await pending_call(
        sessions,
        turn_id,
        "propose_email",
        {"order_id": "8472", "template": "order_status_summary"},
        position=2,
        provider_call_id=anthropic_id,  # the same provider id in another call of the turn
    )
    first, second = await run_twice(sessions, tool_activities, turn_id, proposal_call)
    assert "error" not in first, first
    assert first["action_id"] == second["action_id"]
    async with orm(sessions) as db:
        handoffs = await db.scalar(
            select(func.count()).select_from(Handoff).where(Handoff.turn_id == turn_id)
        )
        proposals = await db.scalar(
            select(func.count()).select_from(Action).where(Action.turn_id == turn_id)
        )
    assert (handoffs, proposals) == (1, 1)
    await cancel_turn_workflow_quietly(sessions, turn_id)


async def cancel_turn_workflow_quietly(sessions: Database, turn_id: str) -> None:
    """End the hand-made turn so its session is free again."""
    async with sessions() as db:
        await outbox.end_unstarted_turn(db, turn_id=turn_id, state=TurnState.cancelled)
        await db.commit()


def test_turn_finished_is_the_refusal_of_a_late_stop() -> None:
    assert TurnFinished.code == "turn_finished"


async def test_one_worker_sweeps_at_a_time_and_the_next_tick_covers_a_skipped_one(
    priya: ParleyClient, sessions: Database, temporal_client: Client, settings: Settings
) -> None:
    turn_id = await unstarted_turn(sessions, priya, "Where is my order now?")
    starts = Starts(temporal_client, sessions, settings.task_queue)
    # Another worker's sweep is running: this worker's tick starts nothing.
    async with locks.if_free(sessions, locks.OUTBOX_SWEEP) as theirs:
        assert theirs
        assert await sweep_tick(starts, grace=timedelta(0)) is False
        async with orm(sessions) as db:
            turn = await db.get(Turn, turn_id)
        assert turn is not None and turn.state == TurnState.received
    # Theirs ended (it would have started the turn; here nobody did): the next tick does.
    assert await sweep_tick(starts, grace=timedelta(0)) is True
    await wait_for_stored_state(sessions, turn_id, [TurnState.completed], timeout=60)


async def test_a_sweep_tick_leaves_the_pooled_connections_prepared_statements(
    database_url: str, temporal_client: Client, settings: Settings
) -> None:
    """A tick reads in autocommit and ends its lock's transaction with a commit, never a
    `ROLLBACK`: psycopg's rollback drops the connection's prepared statements, and a tick
    every two seconds did that to the worker's connections, whose hot statements (the
    context build's read, the ending's) were then parsed and planned again on every turn."""
    async with counted_sessions(database_url) as (counted, _):
        transactions: list[str] = []
        on_transaction_sent(counted.engine, transactions.append)
        starts = Starts(temporal_client, counted, settings.task_queue)
        assert await sweep_tick(starts, grace=timedelta(hours=1)) is True
    assert transactions and "ROLLBACK" not in transactions, transactions
