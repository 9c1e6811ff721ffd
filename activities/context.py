"""Context building: what the model is shown for one step of a turn.

The reference resolver runs first (it may answer with a question instead of the model). Then
the prompt is packed to a token budget (the model's window minus the output reserve) from
blocks: standing instructions and tool schemas, pinned facts, the rolling summary, the recent
turns, messages recalled by full-text search, the state block and the current message
(parley/prompt.py shapes them, parley/context.py packs them). The request, with what it cost
and what was left out, is stored as a `ModelCall`; only its id travels through history.

The conversation's blocks (pinned facts, summary, recent turns, recall) share the
conversation budget, a ceiling whatever the rolling summary does: when the summary lags or
failed, the turns between its end and the recent window are folded here by code
(parley/fold.py) within the summary's budget, out of the window's share; they are never shown
by widening the window past the budget.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.exceptions import ApplicationError

from activities import consented_memory
from activities.attachments import attached_file_blocks
from activities.context_rows import packed_before, session_memory, turn_with_rows, window_messages
from activities.knowledge import KnowledgeSource
from activities.mcp import McpTools
from activities.northwind import BackendError, NorthwindClient
from activities.recall import RecallQuery, recall_hits
from activities.result_sets import resolve_result_sets
from activities.skills import SkillTools
from activities.state_block import state_block
from activities.tool_offer import offered_tools
from gateway.minilm import Embedder
from parley.config import Settings
from parley.context import Block, Packed, Share, WindowMessage, input_budget, pack
from parley.contracts import BuildContextInput, BuildContextResult, EventType, TurnState
from parley.errors import ContextTooLarge
from parley.ids import message_id_for_call, new_id, prompt_cache_key
from parley.memory import extract_facts, recall_terms
from parley.paths import AnswerPath, choose_path, effort_for, path_block
from parley.prompt import (
    CONVERSATION_KINDS,
    Budgets,
    Fold,
    Memory,
    RecallHit,
    current_blocks,
    describe,
    fold_block,
    history_blocks,
    instructions_block,
    memory_blocks,
    plan_window,
    recall_block,
    split_current,
    stable_prefix,
)
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
from parley.tokens import TokenCounter, count_message, counter_for
from parley.window import Window, turn_tokens
from parley.wire import ClarificationData, DeltaData, Option, WarningData
from store import memory as memory_store
from store import slots, tenants, turns, user_memory
from store.events import append_event, append_events
from store.models import Message, ModelCall, Turn, TurnEvent

# The warning a turn emits when the packer left something out.
CONTEXT_TRIMMED = "context_trimmed"


class ContextBuilder:
    """Builds and stores the model request of a turn's step (the `build_context` activity)."""

    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        settings: Settings,
        northwind: NorthwindClient,
        embedder: Embedder | None = None,
        mcp: McpTools | None = None,
        skills: SkillTools | None = None,
        knowledge: KnowledgeSource | None = None,
    ) -> None:
        self._sessions = sessions
        self._settings = settings
        self._northwind = northwind
        # Recall by meaning as well as by words (activities/recall.py); None: words only.
        self._embedder = embedder
        self._mcp = mcp or McpTools(sessions=sessions)
        self._skills = skills or SkillTools(
            sessions=sessions, northwind=northwind, settings=settings
        )
        self._knowledge = knowledge

    async def build(self, inp: BuildContextInput) -> BuildContextResult:
        async with self._sessions() as db:
            # The turn (locked when the build enters its state) and the rows every phase
            # reads, held for the whole build (activities/context_rows.py), in one statement.
            turn, held = await turn_with_rows(db, inp.turn_id, inp.step, lock=inp.step == 0)
            # A retry after a crash reuses the request it already packed, wherever the turn
            # has got to since: a plain turn's steps are recorded when its one workflow task
            # completes, so a worker that dies in it has the next one run them all again.
            existing = await packed_before(db, turn, inp.step, held)
            if existing is not None:
                return BuildContextResult(existing.id, existing.provider == "resolver")
            if inp.step == 0:
                await turns.advance_locked(db, turn, to=TurnState.building_context)
                await db.commit()  # the stream shows the step before it runs
            await consented_memory.remember_validated(db, turn, self._settings, step=inp.step)
            current_slots = None  # read by the packing, unless the resolver has them
            if inp.step == 0:
                resolved = await self._resolve_references(db, turn)
                if isinstance(resolved, BuildContextResult):
                    return resolved
                current_slots = resolved
            call = await self._pack_request(
                db, turn, inp.step, reanswer_of=inp.reanswer_of, current_slots=current_slots
            )
            await db.commit()
            del held
            return BuildContextResult(call.id)

    async def _pack_request(
        self,
        db: AsyncSession,
        turn: Turn,
        step: int,
        *,
        reanswer_of: str | None = None,
        current_slots: dict[str, Slot] | None = None,
    ) -> ModelCall:
        """Store the step's model request: the packed blocks, the tools, the budget."""
        tenant = await tenants.tenant_config(db, tenant_id=turn.tenant_id)
        model = tenant.model or self._settings.model
        counter = counter_for(model)
        budgets = self._budgets(tenant)
        tools, withheld = await self._tools(db, turn, tenant, reanswer=reanswer_of is not None)
        path = choose_path(tools, reanswer=reanswer_of is not None)  # parley/paths.py
        if step == 0:
            await _pin_stated_facts(db, turn)
        if current_slots is None:
            current_slots = await slots.get_slots(db, session_id=turn.session_id)
        packed, plan = await self._assemble(
            db, turn, tenant, budgets, counter, tools, path, step=step, current_slots=current_slots
        )
        # Knowledge: what the prompt showed, by reference (finalize reads it for citations).
        knowledge = plan.pop("knowledge", None)
        if knowledge and not any(b.kind == "knowledge" for b in packed.kept):
            knowledge = {**knowledge, "sources": []}
        if packed.missing:
            await _warn_dropped(db, turn, packed.missing)
        call = ModelCall(
            id=new_id("mc"),
            turn_id=turn.id,
            step=step,
            provider=tenant.model_provider or self._settings.model_provider,
            model=model,
            request={
                "messages": packed.messages,
                "tools": tools,
                "max_output_tokens": budgets.reserve,
                "reasoning_effort": effort_for(path, tenant.reasoning_effort),
                "path": path.value,
                "reanswer_of": reanswer_of,
                "cache_key": prompt_cache_key(stable_prefix=stable_prefix(packed.messages, tools)),
                "knowledge": knowledge,
                "budget": {
                    "window": budgets.window,
                    "reserve": budgets.reserve,
                    "input_budget": packed.budget,
                    "prompt_tokens": packed.used,
                    "counter": counter.name,
                    "blocks": describe(packed.kept),
                    "dropped": packed.missing,
                    "tools_withheld": withheld,
                    **plan,
                },
            },
        )
        db.add(call)
        return call

    async def _tools(
        self, db: AsyncSession, turn: Turn, tenant: TenantConfig, *, reanswer: bool
    ) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """The tools this turn can use, and why the others were left out (tool_offer.py)."""
        if reanswer:
            return [], {}
        offer = await offered_tools(
            db,
            turn,
            tenant,
            mcp=self._mcp,
            skills=self._skills,
            recent_turns=self._settings.context_tool_result_age_turns,
        )
        return offer.tools, offer.withheld

    def _budgets(self, tenant: TenantConfig) -> Budgets:
        s = self._settings
        return Budgets(
            window=tenant.context_window_tokens or s.context_window_tokens,
            reserve=tenant.output_reserve_tokens or s.output_reserve_tokens,
            conversation=tenant.context_conversation_tokens or s.context_conversation_tokens,
            summary=s.context_summary_tokens,
            recall=s.context_recall_tokens,
            tool_age_turns=s.context_tool_result_age_turns,
            message_max=s.context_message_max_tokens,
            paste_chunk=s.context_paste_chunk_tokens,
            knowledge=s.knowledge_tokens,
        )

    async def _assemble(
        self,
        db: AsyncSession,
        turn: Turn,
        tenant: TenantConfig,
        budgets: Budgets,
        counter: TokenCounter,
        tools: list[dict[str, Any]],
        path: AnswerPath,
        *,
        step: int,
        current_slots: dict[str, Slot],
    ) -> tuple[Packed, dict[str, Any]]:
        """Load memory and messages, choose the window, recall, shape the blocks, pack."""
        memory = await session_memory(db, turn, current_slots)
        through = memory.summary.through_seq if memory.summary else None
        messages = await window_messages(db, turn, through, counter)
        history, current = split_current(messages, turn.user_seq)
        hints = await consented_memory.hints(db, turn, counter)  # durable memory, consented
        remembered = memory_blocks(counter, memory, budgets) + hints.blocks
        left = budgets.conversation - sum(b.tokens for b in remembered)
        terms = recall_terms(
            current[0].text if current else "",
            slot_values=[str(v) for v, _ in memory.slots.values() if isinstance(v, str | int)],
        )
        query = RecallQuery(terms, current[0].text if current else "", self._embedder)
        window, folded, recalled, hits = await _window_and_recall(
            db, turn, history, memory, budgets, counter, left=left, query=query
        )
        fold_tokens = sum(b.tokens for b in folded.blocks)
        knowledge, known = await self._passages(db, turn, current, memory, budgets, counter)
        system_prompt = self._settings.system_prompt + (
            f"\n\n{tenant.persona}" if tenant.persona else ""
        )
        # A turn's actions are proposed by its tools, which run after step 0's model call.
        state = await state_block(db, turn, current_slots, has_actions=step > 0)
        blocks = [
            instructions_block(counter, system_prompt=system_prompt, tools=tools),
            *remembered,
            *folded.blocks,
            *history_blocks(counter, window, budgets, room=left - fold_tokens),
            *recalled,
            *knowledge,
            *path_block(counter, path),
            *current_blocks(counter, current, state, budgets, terms=terms),
            *await attached_file_blocks(db, turn, counter, self._settings, terms),  # uploads
        ]
        packed = _pack(blocks, budgets, counter, left_out=folded.left_out)
        plan = {
            "window_from_seq": window.from_seq,
            "summary_through_seq": through,
            # The turns between the summary and the window, condensed by code (None: none).
            "folded": {
                "from_seq": folded.from_seq,
                "through_seq": folded.through_seq,
                "lines": folded.lines,
            }
            if folded.from_seq is not None
            else None,
            "recalled_seqs": sorted(h.seq for h in hits),
            user_memory.HINTED_KEYS: hints.shown(packed),
            "knowledge": known,
        }
        return packed, plan

    async def _passages(
        self,
        db: AsyncSession,
        turn: Turn,
        current: list[WindowMessage],
        memory: Memory,
        budgets: Budgets,
        counter: TokenCounter,
    ) -> tuple[list[Block], dict[str, Any] | None]:
        """The tenant's knowledge passages for this message (activities/knowledge.py); not
        for a paste too large to read whole: its question is about the pasted text."""
        if self._knowledge is None or not current:
            return [], None
        if current[0].tokens > (budgets.window - budgets.reserve) // 2:
            return [], None
        return await self._knowledge.blocks(
            db,
            turn,
            message=current[0].text,
            slots={k: v for k, (v, _) in memory.slots.items()},
            counter=counter,
            budget=budgets.knowledge,
        )

    async def _resolve_references(
        self, db: AsyncSession, turn: Turn
    ) -> BuildContextResult | dict[str, Slot]:
        """Run the reference resolver; if it must ask, answer with the question (no model).
        Otherwise return the session's slots as the resolver left them (the packing reads
        them from here, not from the store again)."""
        # Result sets first ("those", "just the ones over $500"); orders when they pass.
        current = await slots.get_slots(db, session_id=turn.session_id)  # read once, below
        sets = await resolve_result_sets(db, turn, self._northwind, current)
        if sets.kind == "none":
            resolution = await self._resolution(db, turn, current)
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
        turn.resolution = {
            "kind": resolution.kind,
            "order_id": resolution.order_id,
            "entity_type": resolution.entity_type,
            "assumption": resolution.assumption,
            **({"result_set": sets.as_state()} if sets.as_state() else {}),
        }
        if clarification is None:
            await db.commit()
            return slots.after_writes(current, writes=writes, clears=clears)
        call = await _ask(db, turn, clarification)
        await db.commit()
        return BuildContextResult(call.id, clarification=True)

    async def _resolution(
        self, db: AsyncSession, turn: Turn, current: dict[str, Slot]
    ) -> Resolution:
        """What the user's message refers to; the customer's records are fetched only when the
        slots alone cannot tell."""
        user_message = await db.get(Message, turn.user_message_id)
        assert user_message is not None
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


def _pack(
    blocks: list[Block], budgets: Budgets, counter: TokenCounter, *, left_out: list[str]
) -> Packed:
    """Pack to the model's window minus the output reserve, the conversation's blocks within
    the conversation budget; a required block that cannot fit fails the turn (not retried:
    the same conversation would not fit the next time either)."""
    budget = input_budget(window=budgets.window, reserve=budgets.reserve, exact=counter.exact)
    try:
        return pack(
            blocks,
            budget=budget,
            count_note=lambda note: count_message(counter, {"role": "system", "content": note}),
            share=Share(CONVERSATION_KINDS, budgets.conversation),
            left_out=left_out,
        )
    except ContextTooLarge as exc:
        raise ApplicationError(exc.message, type=exc.code, non_retryable=True) from None


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


async def _window_and_recall(
    db: AsyncSession,
    turn: Turn,
    history: list[list[WindowMessage]],
    memory: Memory,
    budgets: Budgets,
    counter: TokenCounter,
    *,
    left: int,
    query: RecallQuery,
) -> tuple[Window, Fold, list[Block], list[RecallHit]]:
    """The recent window, the folded gap and the recalled lines, sharing what the memory
    blocks left.

    First with the recall budget held back. A gap between the summary and that window (the
    summary lags, or failed) is folded by code within the summary's budget, taken from the
    window's share (the window then starts a little later, and its first turns join the
    fold). Then the recent turns take what the recalled lines left over (never fewer turns,
    so recall only loses lines the window now shows, and the fold only turns it now shows)."""
    first = plan_window(history, memory, recent=left - budgets.recall)
    folded = fold_block(counter, first, memory, max_tokens=budgets.summary)
    fold_tokens = sum(b.tokens for b in folded.blocks)
    if fold_tokens:  # the fold's share comes out of the window's, not recall's
        first = plan_window(history, memory, recent=left - budgets.recall - fold_tokens)
        folded = fold_block(counter, first, memory, max_tokens=budgets.summary)
        fold_tokens = sum(b.tokens for b in folded.blocks)
    # Recall gets its budget, or what the window and the fold leave when the window's one
    # turn is over its share.
    room = left - sum(turn_tokens(t) for t in first.turns) - fold_tokens
    recall_budgets = replace(budgets, recall=max(0, min(budgets.recall, room)))
    hits = await recall_hits(
        db,
        query,
        session_id=turn.session_id,
        before_seq=first.from_seq or turn.user_seq,
        # As many candidates as the recall budget could show (about 40 tokens a line).
        limit=max(8, budgets.recall // 40),
    )
    recalled = recall_block(counter, hits, recall_budgets)
    taken = fold_tokens + sum(b.tokens for b in recalled)
    window = plan_window(history, memory, recent=left - taken)
    if window.from_seq is not None and window.from_seq != first.from_seq:
        hits = [h for h in hits if h.seq < window.from_seq]
        recalled = recall_block(counter, hits, recall_budgets)
        if folded.from_seq is not None:  # the same share, for what is still left between
            folded = fold_block(counter, window, memory, max_tokens=fold_tokens)
    return window, folded, recalled, hits


async def _pin_stated_facts(db: AsyncSession, turn: Turn) -> None:
    """What the user's message states about them outright is pinned by code, at once."""
    message = await db.get(Message, turn.user_message_id)
    if message is not None:
        facts = extract_facts(message.text, turn.user_seq)
        await memory_store.pin_facts(db, session_id=turn.session_id, facts=facts)


async def _warn_dropped(db: AsyncSession, turn: Turn, missing: list[str]) -> None:
    """A drop is never silent: the stream says what the answer could not take into account
    (once per turn; the prompt itself carries the packer's note)."""
    earlier = await db.scalar(
        select(TurnEvent.id).where(
            TurnEvent.turn_id == turn.id,
            TurnEvent.type == EventType.warning,
            TurnEvent.data["code"].astext == CONTEXT_TRIMMED,
        )
    )
    if earlier is not None:
        return
    await append_event(
        db,
        turn_id=turn.id,
        type=EventType.warning,
        data=WarningData(
            code=CONTEXT_TRIMMED,
            message="Not everything fit in this answer's context; left out: "
            + "; ".join(missing)
            + ".",
        ),
    )
