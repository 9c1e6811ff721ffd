"""Stored messages' embeddings, batched across the sessions a worker serves.

A forward pass of the local encoder (gateway/minilm.py) costs far more per text when it is
given one or two short texts than when it is given many: its products are then a few rows
tall, and most of the time goes in per-product overhead (on two cores, about 43 ms of CPU
for one short message alone, 13 ms each in a batch of sixteen). A worker that serves many
sessions asks for a session's two new messages at a time, from many summary runs at once, so
the asks wait in one queue and every pass takes all of them: the first ask of a quiet worker
runs at once, as before, and the asks that arrive while a pass runs share the next one.

The passes run on one thread of their own (`EXECUTOR`), so that however many sessions ask,
the embedding takes one core in turn, never the event loop (a question's embedding on a
turn's path runs on the loop's own pool and never waits behind these).
"""

from __future__ import annotations

import asyncio
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from parley.gateway.minilm import Embedder

EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed-backlog")


@dataclass
class _Ask:
    embedder: Embedder
    texts: list[str]
    answer: asyncio.Future[list[list[float]]] = field(repr=False)


class EmbeddingBatches:
    """One event loop's queue of asks; `embed` answers each with its own texts' vectors."""

    def __init__(self, executor: ThreadPoolExecutor = EXECUTOR) -> None:
        self._executor = executor
        self._waiting: list[_Ask] = []
        self._passing: asyncio.Task[None] | None = None
        self.passes = 0  # forward-pass calls made, for tests and the curious

    async def embed(self, embedder: Embedder, texts: list[str]) -> list[list[float]]:
        loop = asyncio.get_running_loop()
        ask = _Ask(embedder, texts, loop.create_future())
        self._waiting.append(ask)
        if self._passing is None or self._passing.done():
            self._passing = asyncio.create_task(self._pass_all())
        return await ask.answer

    async def _pass_all(self) -> None:
        while self._waiting:
            taken, self._waiting = self._waiting, []
            for embedder in {id(a.embedder): a.embedder for a in taken}.values():
                await self._pass(embedder, [a for a in taken if a.embedder is embedder])

    async def _pass(self, embedder: Embedder, asks: list[_Ask]) -> None:
        asks = [a for a in asks if not a.answer.done()]  # an ask whose step was cancelled
        if not asks:
            return
        texts = [text for ask in asks for text in ask.texts]
        self.passes += 1
        try:
            vectors = await asyncio.get_running_loop().run_in_executor(
                self._executor, embedder.embed, texts
            )
        except Exception as exc:
            for ask in asks:
                if not ask.answer.done():
                    ask.answer.set_exception(exc)
            return
        at = 0
        for ask in asks:
            mine, at = vectors[at : at + len(ask.texts)], at + len(ask.texts)
            if not ask.answer.done():
                ask.answer.set_result(mine)


_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, EmbeddingBatches] = (
    weakref.WeakKeyDictionary()
)


def batches() -> EmbeddingBatches:
    """The running loop's queue (a test's loop gets its own)."""
    loop = asyncio.get_running_loop()
    found = _BY_LOOP.get(loop)
    if found is None:
        found = _BY_LOOP[loop] = EmbeddingBatches()
    return found
