"""MiniLM through onnxruntime (gateway/minilm_onnx.py): the same vectors as the NumPy pass,
which stays the fallback when onnxruntime is not installed. Stored vectors carry one model
name whichever pass made them, so the two must agree."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator

import pytest

from parley.gateway.minilm import MAX_TOKENS, MiniLMEmbedder

LONG = " ".join(
    f"On day {i} we walked along the river to the old mill and talked about the harvest."
    for i in range(40)
)
TEXTS = [
    "",
    "hello",
    "Where is my order?",
    "I'd like to return the hiking boots I bought in May; they rub at the heel.",
    LONG,
    "Zürich — 東京で会いましょう 🎉 Привет, как дела? ¿Qué tal?",
    "ok",
    "My sister repaired the garden fence after the storm last week, with nails from the shed.",
]


@pytest.fixture(scope="module")
def numpy_minilm() -> Iterator[MiniLMEmbedder]:
    """The embedder as it loads where onnxruntime is not installed (its import fails)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` raises
        yield MiniLMEmbedder()


def _assert_same(got: list[list[float]], want: list[list[float]]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert len(a) == len(b) == 384
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5
        assert sum(x * y for x, y in zip(a, b, strict=True)) >= 0.99999


def test_the_extra_runs_the_encoder_through_onnxruntime_on_one_thread(
    minilm: MiniLMEmbedder,
) -> None:
    """`make embeddings` installs onnxruntime, so the embedder uses it; its session has one
    thread each way, as NumPy's BLAS (a pool per product spins on a busy worker)."""
    assert minilm.runtime == "onnxruntime"
    options = minilm._session._session.get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (1, 1)


def test_without_onnxruntime_the_numpy_pass_runs(numpy_minilm: MiniLMEmbedder) -> None:
    assert numpy_minilm.runtime == "numpy"
    [vector] = numpy_minilm.embed(["Where did I go hiking?"])
    assert len(vector) == 384 and math.isclose(sum(x * x for x in vector), 1.0, rel_tol=1e-5)


def test_onnxruntime_gives_the_numpy_pass_s_vectors(
    minilm: MiniLMEmbedder, numpy_minilm: MiniLMEmbedder
) -> None:
    """Empty text, one word, unicode and a message past the model's 256 tokens, batched
    together (short ones padded to the long one) and each alone."""
    assert len(minilm._tokenizer.encode(LONG).ids) == MAX_TOKENS  # cut at the model's length
    together = minilm.embed(TEXTS)
    _assert_same(together, numpy_minilm.embed(TEXTS))
    for text, vector in zip(TEXTS, together, strict=True):
        _assert_same(minilm.embed([text]), [vector])


def test_a_long_message_is_cut_at_the_model_s_length_on_both_passes(
    minilm: MiniLMEmbedder, numpy_minilm: MiniLMEmbedder
) -> None:
    """What follows the 256th token does not move the vector, on either pass."""
    longer = LONG + " And then, much later, the storm came and the bridge washed away."
    _assert_same(minilm.embed([longer]), minilm.embed([LONG]))
    _assert_same(numpy_minilm.embed([longer]), minilm.embed([LONG]))


def test_a_session_that_cannot_be_built_leaves_the_numpy_pass(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An onnxruntime that is installed but refuses the graph (a version too old for its
    operators, say) costs the speed, not recall by meaning."""
    from parley.gateway import minilm_onnx

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("this onnxruntime cannot load opset 17")

    monkeypatch.setattr(minilm_onnx, "EncoderSession", refuse)
    embedder = MiniLMEmbedder()
    assert embedder.runtime == "numpy"
    assert "no onnxruntime session" in caplog.text and "opset 17" in caplog.text
    [vector] = embedder.embed(["Where did I go hiking?"])
    assert math.isclose(sum(x * x for x in vector), 1.0, rel_tol=1e-5)
