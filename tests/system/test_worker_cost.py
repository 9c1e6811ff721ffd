"""What a plain turn costs the worker in statements to PostgreSQL, from the context build to
the rolling summary's start. Each statement is a round trip and some of the worker's CPU (the
bench reports that CPU per turn); this keeps the count from creeping back. The streamed
deltas' appends and the trace spans' writes are left out: how many there are depends on how
the answer's tokens fall into frames and spans into batches, not on the turn's shape."""

from __future__ import annotations

from temporalio.client import Client

from parley.config import Settings
from parley.gateway.demo import DemoModel
from parley.ids import workflow_id_for_turn
from parley.resolver import ACTIVE_ORDER
from parley.store import slots
from tests.support.client import ParleyClient
from tests.support.counting import TURN_ALONE, Counted
from tests.support.toolkit import own_stack

# The context build (the turn with the rows it reads and the session's
# facts: slots, consent, the tool offer's facts, summary and pinned facts, the window, and its move
# to `building_context` with the move's event, in one statement; result sets (only in a session
# that has stored one), the stored request with the resolver's note; knowledge on a connection of
# its own; the turn's session and tenant for the log lines come with the build's read, and so
# does the user's message the input screen beside it screens: activities/handover.py); the model
# call's opening (one statement, in autocommit: the turn locked and checked with the call, the
# step entered with its state event, the attempt counted); the answer; one read for the output
# screen and follow-ups; finalize (the turn locked with its call, the answer as a message with its
# seq in one statement, then the session released, a pending action superseded and the turn's
# state, answer and events in one statement, which also reads the backlog's token counts for the
# summary's check, so the check reads nothing of its own). A state move that is announced is
# written by its event's append (not counted, below). Counted on 2026-12-02: 10 before
# finalize's last statement read the summary's backlog for its check, 11 before the input
# screen took the message the build read instead of reading it again, 14 before the model
# call's opening became one statement, the tail read the turn once for the screen and the
# follow-ups, and the log lines' owners came with the build's read instead of a lookup.
# Counted on 2026-12-01: 35
# before the slots were read once, the summary's check became one statement, a message's seq
# stopped needing a read first, the moves rode on their events, and the build and the model call
# read their turn with the rows they need; 25 before knowledge was searched beside the build
# instead of in a savepoint of its transaction, 23 before the build read the session's facts with
# its turn, 20 before a session without result sets stopped reading them, 19 before the summary
# and pinned facts came with the turn, 18 before the window came with the turn too, 17 before
# finalize took the message's seq in its insert and wrote the turn's ending with its events, 15
# before the build wrote the reference resolution with its model call, in one statement.
# 10 since 2026-12-06: the turn's end reads what the tenant's hand-off policy looks at (the
# session's state and config, outages in a row, retractions) in one unlocked statement; a
# next step is to read it with finalize's close-out.
STATEMENTS_PER_PLAIN_TURN = 10
STATEMENTS_TO_START = 2
# Units of work: the turn's start (the claim with its mark) and its ending (finalize).
TRANSACTIONS_PER_PLAIN_TURN = 2


async def test_a_plain_turn_costs_the_worker_a_fixed_number_of_statements(
    settings: Settings,
    temporal_client: Client,
    tokens: dict[str, str],
    counted: Counted,
) -> None:
    worker_sessions, sent = counted.sessions, counted.sent
    model = DemoModel(token_delay_s=0)
    async with own_stack(
        temporal_client, settings, worker_sessions, model, prefix="cost", **TURN_ALONE
    ) as stack:
        client = ParleyClient(stack.url, tokens["marco"])
        try:
            session_id = await client.new_session()
            sent.clear()
            counted.transactions.clear()
            turn_id, events = await client.turn(session_id, "Tell me about yourself, please.")
            assert events[-1].type == "done"
            # The turn's steps after `done` (the summary's start) are part of its cost.
            await temporal_client.get_workflow_handle(workflow_id_for_turn(turn_id)).result()
        finally:
            await client.aclose()
    counted_here = counted.counted()
    print(f"a plain turn: {len(counted_here)} statements")
    assert len(counted_here) <= STATEMENTS_PER_PLAIN_TURN, "\n".join(counted_here)
    # Only what writes opens a transaction: a read-only step reads in autocommit, with no
    # `BEGIN` round trip before it and no `ROLLBACK` after (which also drops the
    # connection's prepared statements). Counted on 2026-12-07: 3, the hand-off policy's read
    # at the turn's end in a transaction it rolled back, before it read in autocommit.
    print(f"a plain turn: {counted.transactions}")
    assert "ROLLBACK" not in counted.transactions, counted.transactions
    assert counted.transactions.count("BEGIN") <= TRANSACTIONS_PER_PLAIN_TURN
    # Its start, counted apart since the worker that hears a post's ring starts the turn: the
    # claim (with the turn it starts) and the start mark, which the API sent before.
    assert len(counted.starts()) <= STATEMENTS_TO_START, "\n".join(counted.starts())


# A turn whose model asks for one tool ("where is my order?": `list_open_orders`; the customer
# has one open order, which becomes the conversation's active order): the plain turn's steps,
# the second model call's, and the tool's own step (the turn locked with the call and the
# tenant's configuration; the outcome, its `tool` message with its seq and the active order in
# one statement; the step's state and the call's start and end ride on event appends). The
# first call's reply is stored in one statement: its outcome, the tool-calling message with its
# seq and the pending tool calls. Counted on 2026-12-02: 36 while the tool's step went through
# SQLAlchemy's unit of work (11 statements of its own, 2 now), 35 with the context build on
# `Db`, 27 before the model calls' openings and the reply asking for tools became one
# statement each, the tail read the turn once and the log lines' owners came with the build's
# read; 20 before the input screen took the user's message the build read, 19 before
# finalize's last statement read the summary's backlog for its check.
# 19 since 2026-12-06: the hand-off policy's read, as for the plain turn.
STATEMENTS_PER_TOOL_TURN = 19


async def test_a_tool_turn_costs_the_worker_a_fixed_number_of_statements(
    settings: Settings,
    temporal_client: Client,
    tokens: dict[str, str],
    counted: Counted,
) -> None:
    worker_sessions, sent = counted.sessions, counted.sent
    model = DemoModel(token_delay_s=0)
    async with own_stack(
        temporal_client, settings, worker_sessions, model, prefix="tcost", **TURN_ALONE
    ) as stack:
        client = ParleyClient(stack.url, tokens["marco"])
        try:
            session_id = await client.new_session()
            sent.clear()
            turn_id, events = await client.turn(session_id, "Where is my order?")
            assert events[-1].type == "done"
            tools = [e.data for e in events if e.type == "tool"]
            assert [(t["name"], t["phase"]) for t in tools] == [
                ("list_open_orders", "start"),
                ("list_open_orders", "end"),
            ]
            assert "8555" in events[-1].data["message"]["text"]
            await temporal_client.get_workflow_handle(workflow_id_for_turn(turn_id)).result()
        finally:
            await client.aclose()
    counted_here = counted.counted()
    print(f"a tool turn: {len(counted_here)} statements")
    assert len(counted_here) <= STATEMENTS_PER_TOOL_TURN, "\n".join(counted_here)
    # The one order found is what "it" means from now on.
    async with worker_sessions() as db:
        active = (await slots.get_slots(db, session_id=session_id))[ACTIVE_ORDER]
    assert (active.value, active.source) == ("8555", "tool:list_open_orders")
