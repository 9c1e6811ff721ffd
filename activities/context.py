"""Context building: what the model is shown for one step of a turn.

The reference resolver runs first (it may answer with a question instead of the model), then
the window of recent messages, the state block and the tenant's model settings are packed
into a stored `ModelCall` request; only its id travels through the workflow's history.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from activities.northwind import BackendError, NorthwindClient
from parley.config import Settings
from parley.context import WindowMessage, pack_context
from parley.contracts import BuildContextInput, BuildContextResult, EventType, TurnState
from parley.ids import message_id_for_call, new_id, prompt_cache_key
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
from parley.tenancy import TenantConfig
from parley.tools import model_tools
from parley.wire import ClarificationData, DeltaData, Option, WarningData
from store import slots, tenants, turns
from store.events import append_event, append_events
from store.models import Action, Message, ModelCall, Turn, User


class ContextBuilder:
    """Builds and stores the model request of a turn's step (the `build_context` activity)."""

    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        settings: Settings,
        northwind: NorthwindClient,
    ) -> None:
        self._sessions = sessions
        self._settings = settings
        self._northwind = northwind

    async def build(self, inp: BuildContextInput) -> BuildContextResult:
        async with self._sessions() as db:
            if inp.step == 0:
                await turns.advance_turn(db, turn_id=inp.turn_id, to=TurnState.building_context)
                await db.commit()  # the stream shows the step before it runs
            turn = await db.get(Turn, inp.turn_id)
            assert turn is not None
            # A retry after a crash reuses the request it already packed.
            existing = await db.scalar(
                select(ModelCall).where(ModelCall.turn_id == turn.id, ModelCall.step == inp.step)
            )
            if existing is not None:
                return BuildContextResult(existing.id, existing.provider == "resolver")
            if inp.step == 0:
                clarification = await self._resolve_references(db, turn)
                if clarification is not None:
                    return clarification
            call = await self._pack_request(db, turn, inp.step)
            await db.commit()
            return BuildContextResult(call.id)

    async def _pack_request(self, db: AsyncSession, turn: Turn, step: int) -> ModelCall:
        """Store the step's model request: instructions, window, state block, tools."""
        tenant = await tenants.tenant_config(db, tenant_id=turn.tenant_id)
        window_size = tenant.context_window_messages or self._settings.context_window_messages
        messages = pack_context(
            system_prompt=self._settings.system_prompt
            + (f"\n\n{tenant.persona}" if tenant.persona else ""),
            window=await _window(db, turn, window_size),
            max_messages=window_size,
            state=await _state(db, turn),
        )
        call = ModelCall(
            id=new_id("mc"),
            turn_id=turn.id,
            step=step,
            provider=tenant.model_provider or self._settings.model_provider,
            model=tenant.model or self._settings.model,
            request={
                "messages": messages,
                "tools": _offered_tools(tenant),
                "max_output_tokens": tenant.output_reserve_tokens or 1024,
                "reasoning_effort": tenant.reasoning_effort,
                "cache_key": prompt_cache_key(tenant_id=turn.tenant_id),
            },
        )
        db.add(call)
        return call

    async def _resolve_references(self, db: AsyncSession, turn: Turn) -> BuildContextResult | None:
        """Run the reference resolver; if it must ask, answer with the question (no model)."""
        resolution = await self._resolution(db, turn)
        writes = dict(resolution.slot_writes)
        if resolution.clarification is not None:
            writes[PENDING_CLARIFICATION] = Slot(
                resolution.clarification.as_slot_value(), "resolver", turn.user_seq
            )
        clears = tuple(c for c in resolution.slot_clears if c not in writes)
        await slots.write_slots(db, session_id=turn.session_id, writes=writes, clears=clears)
        turn.resolution = {
            "kind": resolution.kind,
            "order_id": resolution.order_id,
            "entity_type": resolution.entity_type,
            "assumption": resolution.assumption,
        }
        if resolution.clarification is None:
            await db.commit()
            return None
        call = await _ask(db, turn, resolution.clarification)
        await db.commit()
        return BuildContextResult(call.id, clarification=True)

    async def _resolution(self, db: AsyncSession, turn: Turn) -> Resolution:
        """What the user's message refers to; the customer's records are fetched only when the
        slots alone cannot tell."""
        user_message = await db.get(Message, turn.user_message_id)
        assert user_message is not None
        current = await slots.get_slots(db, session_id=turn.session_id)
        try:
            return resolve(user_message.text, slots=current, user_seq=turn.user_seq)
        except NeedsCandidates:
            return resolve(
                user_message.text,
                slots=current,
                user_seq=turn.user_seq,
                entities=await self._known_entities(db, turn),
            )

    async def _known_entities(self, db: AsyncSession, turn: Turn) -> list[Entity]:
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
                    code="tool_unavailable",
                    message="The order system did not answer; I could not check your orders.",
                ),
            )
            return []
        return [Entity("order", str(o["order_id"]), str(o["order_id"])) for o in orders] + [
            Entity("refund", str(r["refund_id"]), str(r["order_id"])) for r in refunds
        ]


async def _ask(db: AsyncSession, turn: Turn, clarification: Clarification) -> ModelCall:
    """Store the resolver's question as the step's answer (a call no model made) and show it."""
    question = clarification.question
    call = ModelCall(
        id=new_id("mc"),
        turn_id=turn.id,
        step=0,
        provider="resolver",
        model="reference-resolver",
        request={"resolution": turn.resolution},
        response_text=question,
        finish_reason=FinishReason.clarification,
    )
    db.add(call)
    await db.flush()
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


async def _window(db: AsyncSession, turn: Turn, size: int) -> list[WindowMessage]:
    """The session's latest `size` messages, newest first, as the packer reads them."""
    hidden = [turn.retry_of] if turn.retry_of else []
    rows = await db.scalars(
        select(Message)
        .where(
            Message.session_id == turn.session_id,
            Message.replaced_by.is_(None),
            # A retry does not show the model the answer it is replacing.
            ~(
                Message.turn_id.in_(hidden)
                & (Message.role == "assistant")
                & Message.tool_calls.is_(None)
            ),
        )
        .order_by(Message.seq.desc())
        .limit(size)
    )
    return [
        WindowMessage(m.seq, m.role, m.text, m.status, m.tool_calls, m.tool_call_id) for m in rows
    ]


async def _state(db: AsyncSession, turn: Turn) -> dict[str, Any]:
    """The state block: facts the server knows, for the model to read (not obey)."""
    user = await db.get(User, (turn.tenant_id, turn.user_id))
    current = await slots.get_slots(db, session_id=turn.session_id)
    action = await db.scalar(
        select(Action).where(Action.turn_id == turn.id).order_by(Action.created_at.desc())
    )
    return {
        "customer": {"name": user.display_name if user else None},
        "slots": slots.slots_view({k: v for k, v in current.items() if k != PENDING_CLARIFICATION}),
        "resolution": turn.resolution or {},
        "action": None
        if action is None
        else {
            "id": action.id,
            "tool": action.tool,
            "status": action.status,
            "order_id": action.args.get("order_id"),
            "summary": f"the status summary for order {action.args.get('order_id')}",
            "recipient_masked": action.recipient_masked,
            "outcome": action.outcome,
        },
    }


def _offered_tools(tenant: TenantConfig) -> list[dict[str, Any]]:
    """The tool schemas this tenant lets the model see."""
    return [t for t in model_tools() if tenant.offered(t["name"])]
