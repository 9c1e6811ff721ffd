"""The reference resolver's step of a context build: what the user's message points at ("it",
"that order", "just the ones over $500"), from the session's slots and, only when they
cannot tell, the customer's records; a question back to the user when it stays ambiguous.

Its slot writes and the resolution are left in the build's transaction: they commit with the
packed request (activities/context.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parley.activities.northwind import BackendError, NorthwindClient
from parley.activities.result_sets import resolve_result_sets
from parley.contracts import BuildContextResult, EventType, WarningCode
from parley.ids import message_id_for_call
from parley.resolver import (
    PENDING_CLARIFICATION,
    Clarification,
    Entity,
    NeedsCandidates,
    Resolution,
    Slot,
    resolve,
)
from parley.statuses import FinishReason
from parley.store import slots, steps
from parley.store.context import SessionFacts
from parley.store.db import Db
from parley.store.events import append_event, append_events
from parley.store.steps import CallRow
from parley.store.turns.reads import TurnFacts
from parley.wire import ClarificationData, DeltaData, Option, WarningData


@dataclass(frozen=True)
class Resolved:
    """The resolver's outcome when it need not ask: the session's slots as it leaves them,
    and what it made of the message (stored with the step's model call)."""

    slots: dict[str, Slot]
    resolution: dict[str, Any]


class References:
    def __init__(self, northwind: NorthwindClient) -> None:
        self._northwind = northwind

    async def resolve(
        self, db: Db, turn: TurnFacts, facts: SessionFacts, message: str
    ) -> BuildContextResult | Resolved:
        """Run the reference resolver; if it must ask, answer with the question (no model).
        Otherwise return the session's slots as the resolver left them (the packing reads
        them from here, not from the store again) and the resolution; both commit
        with the packed request, so a build retried after a crash resolves from the same
        slots as the attempt that died (and costs no commit of its own)."""
        # Result sets first ("those", "just the ones over $500"); orders when they pass.
        current = facts.slots
        sets = await resolve_result_sets(
            db, turn, self._northwind, current, message=message, has_sets=facts.has_sets
        )
        if sets.kind == "none":
            resolution = await self._resolution(db, turn, current, message)
        else:
            pending = PENDING_CLARIFICATION in current
            resolution = Resolution("none", slot_clears=(PENDING_CLARIFICATION,) if pending else ())
        clarification = resolution.clarification or sets.clarification
        writes = dict(resolution.slot_writes)
        if resolution.clarification is not None:
            writes[PENDING_CLARIFICATION] = Slot(
                resolution.clarification.as_slot_value(), "resolver", turn.user_seq
            )
        elif sets.clarification is not None:
            writes[PENDING_CLARIFICATION] = Slot(
                sets.pending_slot_value(), "resolver", turn.user_seq
            )
        clears = tuple(c for c in resolution.slot_clears if c not in writes)
        await slots.write_slots(db, session_id=turn.session_id, writes=writes, clears=clears)
        made = {
            "kind": resolution.kind,
            "order_id": resolution.order_id,
            "entity_type": resolution.entity_type,
            "assumption": resolution.assumption,
            **({"result_set": sets.as_state()} if sets.as_state() else {}),
        }
        if clarification is None:
            return Resolved(slots.after_writes(current, writes=writes, clears=clears), made)
        call = await _ask(db, turn, clarification, made)
        await db.commit()
        return BuildContextResult(call.id, clarification=True)

    async def _resolution(
        self, db: Db, turn: TurnFacts, current: dict[str, Slot], message: str
    ) -> Resolution:
        """What the user's message refers to; the customer's records are fetched only when the
        slots alone cannot tell."""
        try:
            return resolve(message, slots=current, user_seq=turn.user_seq)
        except NeedsCandidates:
            return resolve(
                message,
                slots=current,
                user_seq=turn.user_seq,
                entities=await self._known_entities(db, turn),
            )

    async def _known_entities(self, db: Db, turn: TurnFacts) -> list[Entity]:
        """The customer's orders and refunds, as candidates for the resolver."""
        try:
            orders = await self._northwind.list_orders(
                turn.tenant_id, turn.user_id, open_only=False
            )
            refunds = await self._northwind.list_refunds(turn.tenant_id, turn.user_id)
        except BackendError:
            await append_event(
                db,
                turn_id=turn.id,
                type=EventType.warning,
                data=WarningData(
                    code=WarningCode.tool_unavailable,
                    message="The order system did not answer; I could not check your orders.",
                ),
            )
            return []
        return [Entity("order", str(o["order_id"]), str(o["order_id"])) for o in orders] + [
            Entity("refund", str(r["refund_id"]), str(r["order_id"])) for r in refunds
        ]


async def _ask(
    db: Db, turn: TurnFacts, clarification: Clarification, resolution: dict[str, Any]
) -> CallRow:
    """Store the resolver's question as the step's answer (a call no model made), with the
    resolution, and show it."""
    question = clarification.question
    call = await steps.insert_call(
        db,
        turn_id=turn.id,
        step=0,
        provider="resolver",
        model="reference-resolver",
        request={"resolution": resolution},
        response_text=question,
        finish_reason=FinishReason.clarification,
        resolution=resolution,
    )
    options = [Option(label=o.label, value=o.value) for o in clarification.options]
    await append_events(
        db,
        turn_id=turn.id,
        events=[
            (EventType.clarification, ClarificationData(question=question, options=options)),
            (EventType.delta, DeltaData(message_id=message_id_for_call(call.id), text=question)),
        ],
    )
    return call
