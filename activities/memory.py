"""The rolling summary's activity: fold what left the recent window into the summary.

`start_summary` runs at the end of the turn workflow, after the answer is stored; when there
is work, it starts the session's summary workflow or signals the one under way, whose step,
once per pass, is `summarize`. The summarizer is a
model call through the gateway (the demo model answers with an extractive summary; real
providers get a prompt asking for JSON, in their structured-output mode where they have one).
An answer that does not validate gets one repair attempt (the answer sent back with what was
wrong); then, or when the provider refuses the request, the code summarizer writes the lines
(parley/fold.py): a bad answer is never retried with the same prompt (Temporal's retries are
for transport errors) and never stops the summary. After such a version the session's next
runs do not ask the model again until every `summary_model_retry_every`-th run (a model that
answered the schema with prose twice will do so again: two requests of the transcript each
run for nothing). The row says who wrote it (`written_by`),
and so does a metric. Nothing is written until the lines are checked, and then in one
transaction: a crash anywhere before the commit leaves the stored summary where it was, and
the next run covers the gap.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy

from parley.activities import indexing, ledger
from parley.activities.budgets import reserve_worst_case, summary_hold_id
from parley.activities.indexing import by_stored_counts, recall_may_search, smallest_window
from parley.activities.metrics import SUMMARIES, record_usage
from parley.activities.recall import embed_pending
from parley.config import Settings
from parley.context import WindowMessage
from parley.contracts import SUMMARY_DUE_SIGNAL, SUMMARY_WORKFLOW, SummarizeInput, SummarizeResult
from parley.costs import Usage
from parley.fold import FALLBACK, ask_the_model, fold
from parley.gateway.base import Finish, ModelRequest, OutputSchema, TextDelta, ToolCallRequest
from parley.gateway.errors import ProviderFatal
from parley.gateway.minilm import Embedder
from parley.gateway.registry import ProviderPool
from parley.ids import summary_workflow_id
from parley.memory import (
    SUMMARY_SCHEMA,
    SUMMARY_SCHEMA_NAME,
    PinnedFact,
    SummaryLine,
    cap_lines,
    parse_summary,
    repair_request,
    summary_request,
)
from parley.redaction import redact_messages
from parley.store import costs, summaries, user_memory
from parley.store import memory as memory_store
from parley.store import sessions as session_store
from parley.store.db import Database, StoreError, connect
from parley.store.lifecycle import forget
from parley.tenancy import TenantConfig
from parley.tokens import counter_for
from parley.window import choose_window, group_turns

log = logging.getLogger(__name__)

# The metric's outcome for a version the code wrote without asking the model (it failed on
# the session's latest versions; parley/fold.py `ask_the_model`).
SKIPPED = "fallback_unasked"


@dataclass(frozen=True)
class _Job:
    session_id: str
    provider: str
    model: str
    base: int  # the stored summary's end (0: none yet)
    through: int  # the last seq this run folds in
    transcript: list[dict[str, Any]]
    ask_model: bool = True  # False: the model failed lately; the code writes (`_write`)
    redact: bool = False  # the tenant's `redact_model_input` (parley/redaction.py)
    prices: dict[str, Any] | None = None  # the tenant's own (parley/costs.py)
    budgets: dict[str, Any] | None = None  # the tenant's (activities/budgets.py)
    owner: tuple[str, str] | None = None  # the session's tenant and user


class MemoryActivities:
    def __init__(
        self,
        *,
        sessions: Database,
        providers: ProviderPool,
        settings: Settings,
        client: Client | None = None,
        embedder: Embedder | None = None,
    ) -> None:
        self._sessions = sessions
        self._providers = providers
        self._settings = settings
        self._client = client
        self._embedder = embedder

    def attach(self, client: Client) -> None:
        """The Temporal client `start_summary` starts summary workflows with."""
        self._client = client

    @activity.defn(name="start_summary")
    async def start_summary(self, inp: SummarizeInput) -> None:
        """`start_when_due`, the backlog read here. (One parameter: an activity's arguments
        are decoded by their types only when there are as many as its parameters.)"""
        await self.start_when_due(inp)

    async def start_when_due(
        self, inp: SummarizeInput, backlog: summaries.Backlog | None = None
    ) -> None:
        """Ask the session's summary workflow for a pass after a finished turn, when there is
        work: enough past the recent window to fold (the turn's messages are embedded for
        recall without a pass: `_index`). Most turns have none, and a pass that would only
        find that out costs the server and the worker more than this check. One call starts
        the workflow (on this worker's queue, after the configured idle delay) or, when a run
        is under way, signals it for one more pass, so a session has at most one run at a
        time; a retried start asks again, which at most costs a pass that finds nothing to do.

        The delay is the server's: it holds the run's first task back, unless another turn's
        start arrives meanwhile, which dispatches it at once (that turn has finished too, so
        the session is idle again).

        `backlog`: the session's backlog as the turn's ending read it with its last statement
        (None: read here)."""
        assert self._client is not None, "the worker builds this with its Temporal client"
        if backlog is None:
            async with connect(self._sessions) as conn:  # one read, in autocommit
                backlog = await summaries.summary_backlog(conn, session_id=inp.session_id)
        self._index(inp.session_id, backlog)
        if not await self._needs_a_pass(inp.session_id, backlog):
            return
        await self._client.start_workflow(
            SUMMARY_WORKFLOW,
            inp,
            id=summary_workflow_id(session_id=inp.session_id),
            task_queue=activity.info().task_queue,
            # Signal-with-start: a running run takes the signal (one more pass), a closed
            # one is followed by a new run.
            start_signal=SUMMARY_DUE_SIGNAL,
            start_signal_args=[inp],
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            start_delay=timedelta(milliseconds=self._settings.summary_start_delay_ms) or None,
        )

    @activity.defn(name="summarize")
    async def summarize(self, inp: SummarizeInput) -> SummarizeResult:
        await self.embed_messages(inp.session_id)
        job = await self._plan(inp.session_id)
        if isinstance(job, int):
            return SummarizeResult(job)
        if not await self._held(job):
            return SummarizeResult(job.base)  # nothing folded: a later pass asks again
        written = await self._write(job)
        lines, facts, usage = written.lines, written.facts, written.usage
        await self._bill(job, usage)
        async with self._sessions() as db:
            await summaries.lock_session_memory(db, session_id=job.session_id)
            latest = await memory_store.latest_summary(db, session_id=job.session_id)
            if latest is not None and latest.through_seq >= job.through:
                return SummarizeResult(latest.through_seq)  # a concurrent run got there first
            seqs = [int(item["seq"]) for item in job.transcript]
            if await forget.forgotten_meanwhile(db, session_id=job.session_id, seqs=seqs):
                return SummarizeResult(job.base)  # the next pass folds what remains
            earlier = latest.lines if latest is not None else []
            since = latest.through_seq if latest is not None else 0
            folded = {int(item["seq"]) for item in job.transcript}
            if since:  # what the earlier version folded, carried forward with its lines
                folded.update(
                    await summaries.folded_by(db, session_id=job.session_id, through_seq=since)
                )
            counter = counter_for(job.model)
            merged = cap_lines(
                [*earlier, *(line for line in lines if line.seq > since)],
                max_tokens=self._settings.context_summary_tokens,
                count=counter.count,
            )
            await summaries.save_summary(
                db,
                session_id=job.session_id,
                through_seq=job.through,
                lines=merged,
                token_count=sum(counter.count(line.text) for line in merged),
                provider=job.provider,
                model=job.model,
                written_by=written.by,
                usage=usage,
                memory_keys=await user_memory.hinted_keys(  # provenance (store/user_memory.py)
                    db, session_id=job.session_id, through_seq=job.through
                ),
                folded_seqs=sorted(folded),
            )
            await memory_store.pin_facts(db, session_id=job.session_id, facts=facts)
            await db.commit()
        SUMMARIES.labels(job.provider, job.model, written.outcome).inc()
        return SummarizeResult(job.through, summarized=True)

    async def _held(self, job: _Job) -> bool:
        """Whether the run may ask the model, held to the budgets of the session's tenant and
        user as a turn's call is (activities/budgets.py): its worst case reserved, once per
        run's reach. A budget that cannot take it skips the run; its messages stay unfolded
        for a later pass. Counting fails open; a run the code writes costs nothing."""
        if not job.budgets or job.owner is None or not job.ask_model:
            return True
        request = {"messages": summary_request(job.transcript), "max_output_tokens": 1500}
        try:
            async with connect(self._sessions) as conn:
                refused = await reserve_worst_case(
                    conn,
                    hold_id=summary_hold_id(job.session_id, job.through),
                    owner=job.owner,
                    config_budgets=job.budgets,
                    prices=job.prices,
                    provider=job.provider,
                    model=job.model,
                    request=request,
                )
        except StoreError:
            log.warning("budget reservation failed for session %s; going ahead", job.session_id)
            return True
        if refused:
            log.info("summary of session %s skipped: %s", job.session_id, refused[0].key)
        return not refused

    async def _bill(self, job: _Job, usage: dict[str, int]) -> None:
        """The run's model calls (an answer and its repair, as one) in the ledger, once per
        run's reach (a retried run is billed once), whether or not its version is stored;
        a run the model did not answer costs nothing. Its reservation settles to the cost."""
        if Usage.reported(usage) is None:
            if job.budgets:
                async with connect(self._sessions) as conn:
                    hold = summary_hold_id(job.session_id, job.through)
                    await ledger.settle(conn, hold, None, job.budgets)
            return
        entry = ledger.priced(
            provider=job.provider,
            model=job.model,
            usage=usage,
            prompt={},
            output="",
            prices=job.prices,
        )
        key = costs.summary_key(job.session_id, job.through)
        async with connect(self._sessions) as conn:
            session_id = job.session_id
            if await costs.record_session_call(conn, key=key, session_id=session_id, entry=entry):
                ledger.count(entry, "summary")
            hold = summary_hold_id(job.session_id, job.through)
            await ledger.settle(conn, hold, entry, job.budgets)

    async def _write(self, job: _Job) -> _Written:
        """The summary's lines: the model's answer if it validates, else its answer to one
        repair prompt, else the code summarizer's. Transport errors propagate (Temporal
        retries the run); a provider's refusal (a 400: say, no structured-output mode) and a
        bad answer do not: retrying either would only ask the same again."""
        messages = summary_request(job.transcript)
        usage: dict[str, int] = {}
        if not job.ask_model:  # it could not write the last version(s): not asked this time
            lines, facts = fold(job.transcript)
            return _Written(lines, facts, usage, FALLBACK, SKIPPED)
        for outcome in ("model", "repaired"):
            try:
                answer, used = await self._ask(job, messages)
            except ProviderFatal as exc:
                log.warning("the summarizer refused (%s); the code summarizer writes", exc.code)
                break
            usage = {k: usage.get(k, 0) + used.get(k, 0) for k in {*usage, *used}}
            try:
                lines, facts = parse_summary(answer, job.transcript)
            except ValueError as exc:
                log.info("the summarizer's answer is not usable (%s)", exc)
                messages = repair_request(job.transcript, answer, str(exc))
                continue
            return _Written(lines, facts, usage, job.model, outcome)
        lines, facts = fold(job.transcript)
        return _Written(lines, facts, usage, FALLBACK, FALLBACK)

    async def _needs_a_pass(self, session_id: str, backlog: summaries.Backlog | None) -> bool:
        """Whether a pass has enough to fold."""
        due = self._due_by_stored_counts(backlog)
        if due is not None:
            return due
        return not isinstance(await self._plan(session_id), int)

    def _index(self, session_id: str, backlog: summaries.Backlog | None) -> None:
        """Ask this process's indexer to embed the session's new messages, when recall may
        search the session (activities/indexing.py), without a pass: a pass started only to
        embed a turn's messages cost more than the embedding."""
        if self._embedder is not None and recall_may_search(backlog, self._settings):
            indexing.ask(self._sessions, self._embedder, session_id=session_id)

    def _due_by_stored_counts(self, backlog: summaries.Backlog | None) -> bool | None:
        """Whether `_plan` would find work, decided as it decides but from the messages'
        stored token counts, read in one statement that reads no text (most turns have no
        work, and reading and counting the whole backlog to learn that was most of this step).
        None when a count is missing or made by another counter (or the session is gone): then
        only `_plan` can tell."""
        if backlog is None:
            return None
        tenant = TenantConfig.model_validate(backlog.tenant_config)
        if tenant.summaries is False:
            return False
        messages = by_stored_counts(backlog, self._settings, tenant)
        if messages is None:
            return None
        return bool(self._to_fold(messages, tenant))

    async def embed_messages(self, session_id: str) -> int:
        """Index the session's new messages for recall by meaning (activities/recall.py), off
        the turn's path: what the indexer left (a worker that stopped), before a pass folds.
        Best effort: a failure here never stops the summary."""
        if self._embedder is None:
            return 0
        try:
            return await embed_pending(self._sessions, self._embedder, session_id=session_id)
        except Exception:  # recall falls back to full-text for these messages
            log.exception("embedding the messages of %s failed", session_id)
            return 0

    async def _plan(self, session_id: str) -> _Job | int:
        """What to fold in: messages after the summary's end and before the window the next
        turn will show. Returns the current end instead when there is not enough yet."""
        # Only reads, in autocommit: no `BEGIN`, and no `ROLLBACK` (which drops the
        # connection's prepared statements); each read takes its own snapshot either way.
        async with connect(self._sessions) as db:
            # The session and its tenant's configuration in one round trip.
            session = await session_store.with_tenant(db, session_id=session_id)
            assert session is not None
            tenant = TenantConfig.model_validate(session.tenant_config)
            latest = await memory_store.latest_summary(db, session_id=session_id)
            base = latest.through_seq if latest is not None else 0
            if tenant.summaries is False:
                return base
            fallbacks = await summaries.fallbacks_in_a_row(db, session_id=session_id)
            model = tenant.model or self._settings.model
            counter = counter_for(model)
            messages = await memory_store.session_messages(
                db, session_id=session_id, after_seq=base, hide_answers_of=None, counter=counter
            )
        folded = self._to_fold(messages, tenant)
        if not folded:
            return base
        return _Job(
            session_id,
            tenant.model_provider or self._settings.model_provider,
            model,
            base,
            folded[-1].seq,
            [_transcript_item(m) for m in folded],
            ask_the_model(fallbacks, self._settings.summary_model_retry_every),
            bool(tenant.redact_model_input),
            session.tenant_config.get("prices"),
            session.tenant_config.get("budgets"),
            (session.tenant_id, session.user_id),
        )

    def _to_fold(self, messages: list[WindowMessage], tenant: TenantConfig) -> list[WindowMessage]:
        """The oldest messages the summary should fold in now: those before the window the
        next turn will show, when there are enough of them; empty when there is nothing to do."""
        if not messages:
            return []
        # The window the smallest budget shows (folding a little early only makes the
        # summary and recall blocks overlap).
        recent = smallest_window(self._settings, tenant)
        # The window the next turn shows by its budget alone (not widened: this run is what
        # will let it start there).
        window = choose_window(
            group_turns(messages), recent_tokens=recent, summary_through=messages[-1].seq
        )
        if window.from_seq is None:
            return []
        cap = (tenant.context_window_tokens or self._settings.context_window_tokens) // 2
        folded = _take([m for m in messages if m.seq < window.from_seq], max_tokens=cap)
        if sum(m.tokens for m in folded) < self._settings.summary_min_new_tokens:
            return []
        return folded

    async def _ask(self, job: _Job, messages: list[dict[str, Any]]) -> tuple[str, dict[str, int]]:
        """The summarizer's model call, through the gateway like any other, in the provider's
        structured-output mode: the answer is the text, or the arguments of the call to the
        schema's tool (Anthropic's mode)."""
        provider = self._providers.get(job.provider)
        request = ModelRequest(
            model=job.model,
            messages=redact_messages(messages) if job.redact else messages,
            max_output_tokens=1500,
            output_schema=SUMMARY_OUTPUT,
        )
        parts: list[str] = []
        usage: dict[str, int] = {}
        async for event in provider.stream(request):
            if isinstance(event, TextDelta):
                parts.append(event.text)
            elif isinstance(event, ToolCallRequest) and event.name == SUMMARY_SCHEMA_NAME:
                parts = [event.arguments]  # the structured answer, whatever text came first
            elif isinstance(event, Finish):
                usage = dict(event.usage)
        record_usage(job.provider, job.model, usage)  # beside the turns' calls, answered or not
        return "".join(parts), usage


SUMMARY_OUTPUT = OutputSchema(
    SUMMARY_SCHEMA_NAME,
    SUMMARY_SCHEMA,
    "The running summary of the conversation: lines with their source seq, and the facts the "
    "user stated about themselves.",
)


@dataclass(frozen=True)
class _Written:
    """A summary's lines and facts, what asking for them cost, who wrote them (the model's
    name or `fallback`) and how (`model`, `repaired`, `fallback` or `fallback_unasked`: the
    metric's outcome)."""

    lines: list[SummaryLine]
    facts: list[PinnedFact]
    usage: dict[str, int]
    by: str
    outcome: str


def _take(messages: list[WindowMessage], *, max_tokens: int) -> list[WindowMessage]:
    """The oldest messages within `max_tokens` (at least one): a long backlog is folded in a
    few runs rather than in one request too large for the model."""
    taken: list[WindowMessage] = []
    used = 0
    for m in messages:
        if taken and used + m.tokens > max_tokens:
            break
        taken.append(m)
        used += m.tokens
    return taken


def _transcript_item(m: WindowMessage) -> dict[str, Any]:
    item: dict[str, Any] = {"seq": m.seq, "role": m.role, "text": m.text}
    if m.tool_calls:
        item["tool_calls"] = [c.get("name") for c in m.tool_calls]
    return item
