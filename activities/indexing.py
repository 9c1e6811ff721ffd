"""A session's messages indexed for recall by meaning after a turn: when, and by whom.

When: only once recall may search them (`recall_may_search`). Recall searches nothing while
the window holds the whole conversation (activities/recall.py `holds_everything`), so a short
chat's messages get no vectors at all; once it runs, a question that reaches back gives it
nearly all the budget and it searches every message but the last turn's. So the rule is by
session, not by message: none while the conversation from its first message fits half the
smallest window a turn shows, all of them once it does not. The half is the margin: recall
runs only past the whole window, so they are embedded at least a turn (of up to half a
window) before any search reads them.

By whom: the worker process itself, right after the turn's tail step asks (`ask`): the
sessions asked for are taken a round at a time, a few at once, so that their texts share the
encoder's passes (activities/embedding_batches.py); a session asked for again before its
round comes is embedded once, with all it has by then. Nothing waits for it: the tail step
asks and ends. (A summary run started only to embed a turn's two messages cost the Temporal
server, the worker and PostgreSQL more than the embedding; the summary's passes still embed
what is left when they fold.) Best effort: a worker that stops drops what was asked (`stop`);
messages left without a vector are found by full-text search, and the session's next turn
asks again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from parley.activities.recall import EMBED_BATCH, embed_pending
from parley.config import Settings
from parley.context import WindowMessage
from parley.gateway.minilm import Embedder
from parley.prompt import MIN_RECENT
from parley.store.db import Database
from parley.store.summaries import Backlog
from parley.tenancy import TenantConfig
from parley.tokens import counter_for
from parley.window import choose_window, group_turns

log = logging.getLogger(__name__)

# Sessions embedded at once: their texts share passes, each holds a connection briefly.
AT_ONCE = 8


def smallest_window(settings: Settings, tenant: TenantConfig) -> int:
    """The smallest window a turn will show, in tokens: the conversation budget's floor less
    the largest summary and recall blocks."""
    conversation = tenant.context_conversation_tokens or settings.context_conversation_tokens
    return max(
        MIN_RECENT,
        conversation - settings.context_summary_tokens - settings.context_recall_tokens,
    )


def by_stored_counts(
    backlog: Backlog, settings: Settings, tenant: TenantConfig
) -> list[WindowMessage] | None:
    """The backlog's messages as the window's grouping sees them, by their stored token
    counts (None: a count is missing or made by another counter than the tenant's)."""
    counter = counter_for(tenant.model or settings.model)
    messages: list[WindowMessage] = []
    for seq, role, status, tokens, made_by, shows in backlog.messages:
        if tokens is None or made_by != counter.name:
            return None
        # The text stands in for what the window's grouping asks of it: is there any.
        messages.append(WindowMessage(seq, role, "." if shows else "", status, tokens=tokens))
    return messages


def recall_may_search(backlog: Backlog | None, settings: Settings) -> bool:
    """Whether a coming turn's recall may search the session, so its messages need their
    vectors now (the module's rule). True, as always before, when the stored counts cannot
    tell, or a summary already folded a part of the conversation."""
    if backlog is None or backlog.base:
        return True
    tenant = TenantConfig.model_validate(backlog.tenant_config)
    messages = by_stored_counts(backlog, settings, tenant)
    if messages is None:
        return True
    turns = group_turns(messages)
    if not turns:
        return bool(messages)  # nothing a window shows: searched as any other
    half = smallest_window(settings, tenant) // 2
    return choose_window(turns, recent_tokens=half, summary_through=0).from_seq != 1


@dataclass(frozen=True)
class _Asked:
    sessions: Database
    embedder: Embedder
    session_id: str


class _Queue:
    """The sessions asked for, in order, each once, and the task embedding them."""

    def __init__(self) -> None:
        self.asked: dict[_Asked, None] = {}
        self.task: asyncio.Task[None] | None = None

    def running(self) -> asyncio.Task[None] | None:
        """The task embedding on this event loop (None: idle)."""
        task = self.task
        if task is None or task.done() or task.get_loop() is not asyncio.get_running_loop():
            return None
        return task


_QUEUE = _Queue()


def ask(sessions: Database, embedder: Embedder, *, session_id: str) -> None:
    """Have the session's messages without a vector embedded soon, in this process."""
    _QUEUE.asked[_Asked(sessions, embedder, session_id)] = None
    if _QUEUE.running() is None:
        _QUEUE.task = asyncio.create_task(_embed_asked())


async def idle() -> None:
    """Return once everything asked so far is embedded (or given up)."""
    while (task := _QUEUE.running()) is not None:
        await asyncio.wait([task])


async def stop() -> None:
    """Drop what is asked and stop embedding (a worker's shutdown)."""
    _QUEUE.asked.clear()
    task = _QUEUE.running()
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _embed_asked() -> None:
    asked = _QUEUE.asked
    while asked:
        taken = list(asked)[:AT_ONCE]
        for one in taken:
            del asked[one]
        stored = await asyncio.gather(
            *(embed_pending(a.sessions, a.embedder, session_id=a.session_id) for a in taken),
            return_exceptions=True,
        )
        for one, result in zip(taken, stored, strict=True):
            if isinstance(result, BaseException):  # recall finds them by their words
                log.warning("embedding the messages of %s failed", one.session_id, exc_info=result)
            elif result == EMBED_BATCH:  # more are waiting: after those asked meanwhile
                asked[one] = None
