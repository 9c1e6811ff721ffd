"""What a confirmed email costs the worker in statements to PostgreSQL: the turn that proposes
it (the card), the user's confirm and the send, to the turn's end. The proposal, the card,
the send's reads and its outcome are the actions' statements (store/actions.py); this keeps
their count from creeping back. As in test_worker_cost.py, the streamed deltas' appends and
the trace spans' writes are left out (how many there are depends on how tokens fall into
frames and spans into batches)."""

from __future__ import annotations

from temporalio.client import Client

from parley.config import Settings
from parley.gateway.demo import DemoModel
from parley.ids import workflow_id_for_turn
from tests.support.client import ParleyClient
from tests.support.counting import TURN_ALONE, Counted
from tests.support.toolkit import own_stack

# Counted on 2026-12-02: 62 with the actions as ORM objects (the card's turn loaded and
# mutated, the send reading its turn and its tenant apart), 54 with them as typed rows on
# `Db` (the proposal one statement with its turn's lock, the card's move riding on its
# events, the send reading the action with its tenant's switch), 53 with the context build on
# `Db`, 46 with the proposing tool call's step on `Db` too (its turn, call and tenant in
# one read, its outcome in one statement), 39 with each model call's opening one statement, the
# reply that asks for the proposal stored in one, and the tail reading its turn once; 38 with
# the log lines' owners coming with the context build's read; 37 with the input screen taking
# the user's message the build read; 36 with finalize's last statement reading the summary's
# backlog for its check.
# 37 since 2026-12-06: each turn's end reads what the tenant's hand-off policy looks at.
STATEMENTS_PER_CONFIRMED_EMAIL = 37


async def test_a_confirmed_email_costs_the_worker_a_fixed_number_of_statements(
    settings: Settings,
    temporal_client: Client,
    tokens: dict[str, str],
    counted: Counted,
) -> None:
    worker_sessions, sent = counted.sessions, counted.sent
    model = DemoModel(token_delay_s=0)
    async with own_stack(
        temporal_client, settings, worker_sessions, model, prefix="card", **TURN_ALONE
    ) as stack:
        client = ParleyClient(stack.url, tokens["priya"])
        try:
            session_id = await client.new_session()
            looked_id, looked_up = await client.turn(session_id, "Where is my order?")
            assert looked_up[-1].type == "done"
            # Its steps after `done` (the summary's start) are not the card's cost.
            await temporal_client.get_workflow_handle(workflow_id_for_turn(looked_id)).result()
            sent.clear()
            turn_id, shown = await client.turn(session_id, "Can you email me?")
            assert shown[-1].type == "confirmation_required"
            action_id = shown[-1].data["action"]["id"]
            url = f"/v1/sessions/{session_id}/actions/{action_id}/confirm"
            assert (await client.http.post(url)).status_code == 202
            rest = await client.events(session_id, turn_id, last_event_id=shown[-1].id)
            assert rest[-1].type == "done"
            assert any(e.type == "tool" and e.data["name"] == "send_email" for e in rest)
            await temporal_client.get_workflow_handle(workflow_id_for_turn(turn_id)).result()
        finally:
            await client.aclose()
    counted_here = counted.counted()
    print(f"\nstatements for a confirmed email: {len(counted_here)}")
    assert len(counted_here) <= STATEMENTS_PER_CONFIRMED_EMAIL, "\n".join(counted_here)
