"""Context building: what the model is shown for one step of a turn.

The reference resolver runs first (activities/references.py; it may answer with a question
instead of the model). Then the prompt is packed to a token budget (the model's window minus
the output reserve) from blocks: standing instructions and tool schemas, pinned facts, the
rolling summary, the recent turns, messages recalled by full-text search, the state block and
the current message (parley/prompt.py shapes them, parley/context.py packs them). The request,
with what it cost and what was left out, is stored as a model call (`steps.insert_call`, with
the reference resolution at step 0, in one statement); only its id travels through history.

The build reads on a `Db` of its own, in autocommit: its first statement reads the turn and
every row its phases ask (store/context.py) and, at step 0, moves the turn to
`building_context` and shows that on the stream, before the slow parts; recall's search runs
on it too, and a plain step's model call is written on it, alone. What the build writes
besides (the resolver's slots, pinned facts, durable memory, a warning) goes through a
session that opens only then, and commits with the call.

The conversation's blocks (pinned facts, summary, recent turns, recall) share the
conversation budget, a ceiling whatever the rolling summary does: when the summary lags or
failed, the turns between its end and the recent window are folded here by code
(parley/fold.py) within the summary's budget, out of the window's share; they are never shown
by widening the window past the budget.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, date, datetime
from typing import Any

from parley.activities import consented_memory, tracing
from parley.activities.attachments import attached_file_blocks
from parley.activities.build_warnings import warn_dropped, warn_pending
from parley.activities.handover import Handover
from parley.activities.knowledge import KnowledgeSource, Searched, authorize
from parley.activities.mcp import McpTools
from parley.activities.northwind import NorthwindClient
from parley.activities.recall import (
    RecallQuery,
    cancel,
    recalled_by,
    sized,
    start_recall,
    window_and_recall,
    window_plan,
)
from parley.activities.references import References
from parley.activities.skills import SkillTools
from parley.activities.state_block import state_block
from parley.activities.step_request import pack_blocks, stored_request
from parley.activities.tool_offer import offered_tools
from parley.config import Settings
from parley.context import Block, Packed, WindowMessage
from parley.contracts import BuildContextInput, BuildContextResult, MessageStatus, TurnState
from parley.gateway.minilm import Embedder
from parley.memory import extract_facts, recall_terms
from parley.paths import AnswerPath, choose_path, path_block
from parley.periods import Period, named_period
from parley.prompt import (
    Budgets,
    Memory,
    current_blocks,
    history_blocks,
    instructions_block,
    memory_blocks,
    plan_window,
    split_current,
)
from parley.resolver import PENDING_CLARIFICATION, Slot
from parley.store import identity, steering, steps, turns, user_memory
from parley.store import memory as memory_store
from parley.store import sessions as session_store
from parley.store.context import (
    BuildRows,
    SessionFacts,
    TurnChanged,
    memory_read_again,
    read_for_build,
    session_memory,
    window_messages,
)
from parley.store.db import Database, Db, StoreError, connect
from parley.store.steps import CallRow
from parley.store.turns.reads import TurnFacts
from parley.tenancy import TenantConfig
from parley.tokens import TokenCounter, count_message, counter_for


class ContextBuilder:
    """Builds and stores the model request of a turn's step (the `build_context` activity)."""

    def __init__(
        self,
        *,
        sessions: Database,
        settings: Settings,
        northwind: NorthwindClient,
        embedder: Embedder | None = None,
        mcp: McpTools | None = None,
        skills: SkillTools | None = None,
        knowledge: KnowledgeSource | None = None,
        asked: Handover[str] | None = None,
    ) -> None:
        self._sessions = sessions
        # Where the first step's read of the user's message is handed to the input screen
        # started beside it (activities/screens.py); None: not handed over.
        self._asked = asked
        self._settings = settings
        self._references = References(northwind)
        # Recall by meaning as well as by words (activities/recall.py); None: words only.
        self._embedder = embedder
        self._mcp = mcp or McpTools(sessions=sessions, allowed=settings.mcp_allowlist)
        self._skills = skills or SkillTools(
            sessions=sessions, northwind=northwind, settings=settings
        )
        self._knowledge = knowledge

    async def build(self, inp: BuildContextInput) -> BuildContextResult:
        async with connect(self._sessions) as conn, self._sessions() as db:
            read = await self._read(conn, inp)
            tracing.owners_read(session_id=read.turn.session_id, tenant_id=read.turn.tenant_id)
            if self._asked is not None and inp.step == 0:
                self._asked.give(inp.turn_id, None if read.message is None else read.message.text)
            # A retry after a crash reuses the request it already packed, wherever the turn
            # has got to since: a plain turn's steps are recorded when its one workflow task
            # completes, so a worker that dies in it has the next one run them all again.
            if read.packed is not None:
                call_id, provider = read.packed
                return BuildContextResult(call_id, provider == "resolver")
            turn, facts, message = read.turn, read.facts, read.message
            pinned = await consented_memory.remember_validated(
                db, turn, self._settings, step=inp.step, message=message
            )
            current_slots = facts.slots  # as the resolver leaves them, at step 0
            if inp.step == 0:
                text = message.text if message is not None else ""
                resolved = await self._references.resolve(db, turn, facts, text)
                if isinstance(resolved, BuildContextResult):
                    return resolved
                # The rest of the build reads the resolution on the turn (the tool offer).
                current_slots, turn = resolved.slots, replace(turn, resolution=resolved.resolution)
            call = await self._pack_request(
                (conn, db),
                replace(read, turn=turn),
                inp.step,
                reanswer_of=inp.reanswer_of,
                current_slots=current_slots,
                pinned=pinned,
            )
            return BuildContextResult(call.id, steer_seq=_steer_of_turn(read))

    async def _read(self, conn: Db, inp: BuildContextInput) -> BuildRows:
        """The build's rows; at step 0 the turn enters `building_context` with the read. A
        read whose snapshot predates another build's move of the turn (a turn's early build
        racing its first step on another worker) is read again; a turn that changed otherwise
        refuses the build (`TurnChanged`: the step is retried)."""
        ages = self._settings.context_tool_result_age_turns
        first = inp.step == 0
        read = await read_for_build(conn, inp.turn_id, inp.step, move=first, recent_turns=ages)
        if not first or read.moved or read.packed is not None:
            return read
        if turns.may_move(read.turn, to=TurnState.building_context):
            read = await read_for_build(conn, inp.turn_id, 0, move=False, recent_turns=ages)
            if read.packed is None and turns.may_move(read.turn, to=TurnState.building_context):
                raise TurnChanged(f"turn {inp.turn_id} changed while its build read it")
        return read

    async def _pack_request(
        self,
        on: tuple[Db, Db],
        read: BuildRows,
        step: int,
        *,
        reanswer_of: str | None = None,
        current_slots: dict[str, Slot],
        pinned: bool = False,
    ) -> CallRow:
        """Store the step's model request: the packed blocks, the tools, the budget. `on`:
        the build's `Db` (its reads, a plain step's call) and its session (the writes)."""
        conn, db = on
        turn = read.turn
        tenant = TenantConfig.model_validate(read.tenant_config)
        model = tenant.model or self._settings.model
        counter = counter_for(model)
        budgets = self._budgets(tenant)
        # Knowledge is searched on a connection of its own while this one reads the rest.
        searching = self._search_knowledge(read, budgets, counter, current_slots)
        try:
            tools, withheld = await self._tools(db, read, tenant, reanswer=reanswer_of is not None)
            path = choose_path(tools, reanswer=reanswer_of is not None)  # parley/paths.py
            facts = await _pin_stated_facts(db, read, step=step, pinned=pinned)
            packed, plan = await self._assemble(
                on,
                turn,
                tenant,
                budgets,
                counter,
                tools,
                path,
                step=step,
                current_slots=current_slots,
                facts=facts,
                searching=searching,
                read=read,
            )
        finally:
            await _settle(searching)
        # Knowledge: what the prompt showed, by reference (finalize reads it for citations).
        knowledge = plan.pop("knowledge", None)
        if knowledge and not any(b.kind == "knowledge" for b in packed.kept):
            knowledge = {**knowledge, "sources": []}
        await warn_dropped(db, turn, packed.missing)
        await warn_pending(db, turn, pending=facts.importing and plan["recall"] != "skipped")
        request = stored_request(
            packed, plan, tools, budgets, counter, path, tenant, withheld, reanswer_of
        )
        request["knowledge"] = knowledge
        await _take_steer(db, read, step, request)
        return await self._store(
            on,
            turn_id=turn.id,
            step=step,
            provider=tenant.model_provider or self._settings.model_provider,
            model=model,
            request=request,
            resolution=turn.resolution if step == 0 else None,
        )

    async def _store(self, on: tuple[Db, Db], **call: Any) -> CallRow:
        """The step's model call, committed with what the build wrote before it through its
        session (slots, a warning); when it used none (a plain step), alone on the build's
        `Db`, in autocommit: no `BEGIN` and `COMMIT` round trips around it."""
        conn, db = on
        try:
            if db.in_transaction():
                written = await steps.insert_call(db, **call)
                await db.commit()
                return written
            return await steps.insert_call(conn, **call)
        except StoreError as exc:
            # Another build of the step stored it first (a turn's early build on the worker
            # that claimed it, racing a first step that runs on another): the first one
            # stored is the step's request, and a read is all this one costs, not a retry.
            if not steps.step_taken(exc):
                raise
            await db.rollback()
            stored = await steps.step_call(conn, turn_id=call["turn_id"], step=call["step"])
            if stored is None:
                raise
            return stored

    async def _tools(
        self, db: Db, read: BuildRows, tenant: TenantConfig, *, reanswer: bool
    ) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """The tools this turn can use, and why the others were left out (tool_offer.py)."""
        if reanswer:
            return [], {}
        facts = read.facts
        offer = await offered_tools(
            db,
            read.turn,
            tenant,
            message=read.message.text if read.message is not None else "",
            mcp=self._mcp,
            skills=self._skills,
            recent_turns=self._settings.context_tool_result_age_turns,
            facts=(facts.has_sets, facts.recently_used),
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

    # `facts` and `read`: None in bench/memory.py (read here); `searching`: knowledge's search.
    async def _assemble(
        self,
        on: tuple[Db, Db],
        turn: TurnFacts,
        tenant: TenantConfig,
        budgets: Budgets,
        counter: TokenCounter,
        tools: list[dict[str, Any]],
        path: AnswerPath,
        *,
        step: int,
        current_slots: dict[str, Slot],
        facts: SessionFacts | None = None,
        searching: asyncio.Task[Searched] | None = None,
        read: BuildRows | None = None,
    ) -> tuple[Packed, dict[str, Any]]:
        """Load memory and messages, size the budget, choose the window, recall, pack."""
        conn, db = on
        memory = await session_memory(db, turn, current_slots, facts)
        through = memory.summary.through_seq if memory.summary else None
        messages = await window_messages(db, turn, through, counter, facts)
        history, current = split_current(messages, turn.user_seq)
        question, terms = _question(current, memory)
        budgets = await sized(budgets, (self._settings, tenant), (db, turn, facts))

        hints = await consented_memory.hints(db, turn, counter, consent=_consent(facts))
        remembered = memory_blocks(counter, memory, budgets) + hints.blocks
        left = budgets.conversation - sum(b.tokens for b in remembered)
        whole = plan_window(history, memory, recent=left)
        asked = RecallQuery(terms, question, self._embedder, period=_period(question, current))
        query = await start_recall(conn, turn, whole, history, asked)
        try:  # the state block, files, window and recall, knowledge's passages
            state, files = await self._state_and_files(
                db, turn, step, current_slots, (counter, terms), read
            )
            window, folded, recalled, hits = await window_and_recall(
                conn, turn, history, memory, budgets, counter, left=left, whole=whole, query=query
            )
            knowledge, known = await self._passages(db, turn, searching, budgets, counter)
        finally:
            cancel(query)  # when a read above failed, nobody reads the embedding
        room = left - sum(b.tokens for b in folded.blocks)  # the window's, after the fold's
        blocks = [
            instructions_block(counter, system_prompt=self._system_prompt(tenant), tools=tools),
            *remembered,
            *folded.blocks,
            *history_blocks(counter, window, budgets, room=room),
            *recalled,
            *knowledge,
            *path_block(counter, path),
            *current_blocks(counter, current, state, budgets, terms=terms),
            *files,  # uploads
        ]
        packed = pack_blocks(blocks, budgets, counter, left_out=folded.left_out)
        plan = window_plan(window, through, recalled_by(query), hits, folded) | {
            user_memory.HINTED_KEYS: hints.shown(packed),
            "knowledge": known,
        }
        return packed, plan

    def _system_prompt(self, tenant: TenantConfig) -> str:
        persona = f"\n\n{tenant.persona}" if tenant.persona else ""
        return self._settings.system_prompt + persona

    async def _state_and_files(
        self,
        db: Db,
        turn: TurnFacts,
        step: int,
        current_slots: dict[str, Slot],
        counted: tuple[TokenCounter, list[str]],
        read: BuildRows | None,
    ) -> tuple[dict[str, Any], list[Block]]:
        """The state block, and the message's attached files as blocks (read only when the
        message names any). A turn's actions are proposed by its tools, which run after step
        0's model call: its state block reads none then. `counted`: the counter and the
        message's recall terms (the files' chunks are chosen by them)."""
        name = await _user_name(db, turn, read)
        state = await state_block(db, turn, current_slots, user_name=name, has_actions=step > 0)
        if read is not None and (read.message is None or not read.message.file_ids):
            return state, []
        counter, terms = counted
        return state, await attached_file_blocks(db, turn, counter, self._settings, terms)

    def _search_knowledge(
        self,
        read: BuildRows,
        budgets: Budgets,
        counter: TokenCounter,
        current_slots: dict[str, Slot],
    ) -> asyncio.Task[Searched] | None:
        """The tenant's knowledge search for this message, started (activities/knowledge.py);
        none without a message, nor for a paste too large to read whole (its question is
        about the pasted text), nor for a tenant without documents."""
        message, turn = read.message, read.turn
        if self._knowledge is None:
            return None
        if message is None or message.status == MessageStatus.retracted or not message.text:
            return None
        if _tokens(message, counter) > (budgets.window - budgets.reserve) // 2:
            return None
        authorize(turn, user_known=read.user_known, session_tenant=read.session_tenant)
        if not read.has_knowledge:
            return None
        search = self._knowledge.search(
            self._sessions,
            turn,
            message=message.text,
            slots={k: v.value for k, v in current_slots.items() if k != PENDING_CLARIFICATION},
        )
        return asyncio.create_task(search)

    async def _passages(
        self,
        db: Db,
        turn: TurnFacts,
        searching: asyncio.Task[Searched] | None,
        budgets: Budgets,
        counter: TokenCounter,
    ) -> tuple[list[Block], dict[str, Any] | None]:
        """The knowledge block from the search started at the build's beginning, awaited
        after recall's reads so that its round trip runs while theirs do."""
        if self._knowledge is None or searching is None:
            return [], None
        found = await searching
        return await self._knowledge.blocks(
            db, turn, found, counter=counter, budget=budgets.knowledge
        )


def _consent(facts: SessionFacts | None) -> bool | None:
    """The user's consent to durable memory as the build read it (None: not read)."""
    return None if facts is None else facts.consent


def _period(question: str, current: list[WindowMessage]) -> Period | None:
    """The period the question names, counted back from the day it was asked."""
    asked = current[0].created_at if current else ""
    today = date.fromisoformat(asked) if asked else datetime.now(UTC).date()
    return named_period(question, today)


def _question(current: list[WindowMessage], memory: Memory) -> tuple[str, list[str]]:
    """The current message's text and its recall terms (with the slots' referents)."""
    question = current[0].text if current else ""
    return question, recall_terms(question, slot_values=_slot_values(memory))


def _slot_values(memory: Memory) -> list[str]:
    """The session's slot values recall may search for beside the message's own words."""
    return [str(value) for value, _ in memory.slots.values() if isinstance(value, str | int)]


def _tokens(message: session_store.StoredMessage, counter: TokenCounter) -> int:
    """A stored message's tokens as the window counts them (store/memory.py)."""
    if message.token_count is not None and message.token_counter == counter.name:
        return message.token_count
    return count_message(counter, {"role": message.role, "content": message.text})


def _steer_of_turn(read: BuildRows) -> int | None:
    """The newest steer the step takes, when it steered this turn (after its message)."""
    seq = read.steer_seq
    return seq if steering.is_newer(seq, read.turn.user_seq) else None


async def _take_steer(db: Db, read: BuildRows, step: int, request: dict[str, Any]) -> None:
    """The steer this step takes (store/steering.py), in its request: its stream stops for
    a newer one, and the turn's ending refuses while one is newer than its last step's."""
    turn = read.turn
    request["steer_seq"] = read.steer_seq
    await steering.announce_steer(
        db,
        turn_id=turn.id,
        session_id=turn.session_id,
        user_seq=turn.user_seq,
        step=step,
        steer_seq=read.steer_seq,
    )


async def _settle(task: asyncio.Task[Any] | None) -> None:
    """A task the build started beside its own reads, once the build is done with it: when
    the build failed first, stopped and waited for, so its connection is back in the pool
    and its failure (if any) is not reported as never retrieved."""
    if task is None:
        return
    if not task.done():
        task.cancel()
        await asyncio.wait([task])
    if not task.cancelled():
        task.exception()


async def _user_name(db: Db, turn: TurnFacts, read: BuildRows | None) -> str | None:
    """The customer's name for the state block, as the build read it (None: read here)."""
    if read is not None:
        return read.user_name
    user = await identity.get_user(db, tenant_id=turn.tenant_id, user_id=turn.user_id)
    return user.display_name if user is not None else None


async def _pin_stated_facts(db: Db, read: BuildRows, *, step: int, pinned: bool) -> SessionFacts:
    """What the user's message states about them outright is pinned by code, at once (at
    step 0). The session's facts as read with the turn, their memory read again when this
    build pinned anything (`pinned`: durable memory's copies did)."""
    turn, message = read.turn, read.message if step == 0 else None
    if message is not None:
        stated = extract_facts(message.text, turn.user_seq)
        await memory_store.pin_facts(db, session_id=turn.session_id, facts=stated)
        pinned = pinned or bool(stated)
    return await memory_read_again(db, turn, read.facts) if pinned else read.facts
