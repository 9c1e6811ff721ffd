"""The worker's embedding queue (activities/embedding_batches.py): asks that arrive while a
forward pass runs share the next one, and each ask gets its own texts' vectors back."""

from __future__ import annotations

import asyncio
import threading

import pytest

from parley.activities.embedding_batches import EmbeddingBatches
from parley.gateway.minilm import MiniLMEmbedder


class _Gated:
    """An encoder whose first pass waits for the test, so that asks pile up behind it;
    a text's vector names the text, so a mix-up shows."""

    name = "gated"
    dimensions = 1

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.first_running = threading.Event()
        self.release = threading.Event()
        self.fail_with: Exception | None = None

    def embed(self, texts: list[str]) -> list[list[float]]:
        self.calls.append(list(texts))
        if len(self.calls) == 1:
            self.first_running.set()
            self.release.wait(10)
        if self.fail_with is not None:
            raise self.fail_with
        return [[float(len(t))] for t in texts]


async def _started(encoder: _Gated) -> None:
    while not encoder.first_running.is_set():
        await asyncio.sleep(0.001)


def test_asks_made_during_a_pass_share_the_next_and_each_gets_its_own_vectors() -> None:
    async def run() -> None:
        encoder, queue = _Gated(), EmbeddingBatches()
        first = asyncio.create_task(queue.embed(encoder, ["a"]))
        await _started(encoder)
        later = [asyncio.create_task(queue.embed(encoder, ["bb" * i, "c" * i])) for i in (1, 2, 3)]
        await asyncio.sleep(0)  # every later ask is queued before the first pass ends
        encoder.release.set()
        assert await first == [[1.0]]
        assert await asyncio.gather(*later) == [[[2.0], [1.0]], [[4.0], [2.0]], [[6.0], [3.0]]]
        assert encoder.calls == [["a"], ["bb", "c", "bbbb", "cc", "bbbbbb", "ccc"]]
        assert queue.passes == 2

    asyncio.run(run())


def test_a_failed_pass_fails_its_asks_and_a_cancelled_ask_leaves_the_others_answered() -> None:
    async def run() -> None:
        encoder, queue = _Gated(), EmbeddingBatches()
        first = asyncio.create_task(queue.embed(encoder, ["a"]))
        await _started(encoder)
        gone = asyncio.create_task(queue.embed(encoder, ["never"]))
        kept = asyncio.create_task(queue.embed(encoder, ["kept"]))
        await asyncio.sleep(0)
        gone.cancel()
        encoder.fail_with = RuntimeError("the encoder broke")
        encoder.release.set()
        with pytest.raises(RuntimeError, match="broke"):
            await first
        with pytest.raises(RuntimeError, match="broke"):
            await kept
        assert encoder.calls[1] == ["kept"]  # the cancelled ask's text was not encoded
        encoder.fail_with = None
        assert await queue.embed(encoder, ["again"]) == [[5.0]]  # the queue goes on

    asyncio.run(run())


def test_a_messages_vector_is_the_same_alone_and_in_a_shared_pass(
    minilm: MiniLMEmbedder,
) -> None:
    texts = ["Where is my order?", "I'd like to return the hiking boots I bought in May."]

    async def run() -> list[list[list[float]]]:
        queue = EmbeddingBatches()
        return list(await asyncio.gather(*(queue.embed(minilm, [t]) for t in texts)))

    shared = asyncio.run(run())
    for text, [vector] in zip(texts, shared, strict=True):
        [alone] = minilm.embed([text])
        assert max(abs(a - b) for a, b in zip(vector, alone, strict=True)) < 1e-5
