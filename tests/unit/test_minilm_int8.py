"""MiniLM's int8 encoder (gateway/minilm_onnx.py `quantized`), the default of
`embeddings_precision`: its vectors are stored under the float32 model's name and compared
with float32 ones, so they must stay close to them, and a text's vector must not depend on
the texts embedded beside it. Also the batching rule of gateway/minilm.py `embed`."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from parley.config import Settings
from parley.gateway.minilm import MiniLMEmbedder, batches, build_embedder
from parley.gateway.minilm_onnx import exact_signed_products

LOCOMO = Path(__file__).resolve().parents[2] / "bench" / "data" / "locomo3.json"
SHORT = ["", "yes", "ok", "no", "thanks!", "hello", "Where is my order?", "Zürich — 東京 🎉 Привет"]


def _varied_texts() -> list[str]:
    """Short replies, questions and conversation lines of every length LoCoMo has (one line
    in seven of a conversation, 3 to 120 tokens, and twenty of its questions)."""
    conversation = json.loads(LOCOMO.read_text())["conv-30"]
    lines = [t["text"] for s in conversation["sessions"] for t in s["turns"]][::7]
    questions = [qa["question"] for qa in conversation["qa"]][:20]
    return SHORT + questions + lines


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def int8_minilm() -> Iterator[MiniLMEmbedder]:
    yield MiniLMEmbedder(int8=True)


def test_the_default_precision_is_int8_and_float32_stays_a_setting() -> None:
    int8 = build_embedder(Settings(database_url=None))
    assert isinstance(int8, MiniLMEmbedder) and int8.precision == "int8"
    fp32 = build_embedder(Settings(database_url=None, embeddings_precision="float32"))
    assert isinstance(fp32, MiniLMEmbedder) and fp32.precision == "float32"
    assert int8.name == fp32.name  # stored vectors of both compare (gateway/minilm.py)


def test_an_int8_session_that_cannot_be_built_leaves_the_float32_encoder(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An onnxruntime without the integer operators costs the saving, not the speed of the
    float32 graph (nor recall by meaning)."""
    from parley.gateway import minilm_onnx

    built = minilm_onnx.EncoderSession

    def float32_only(*args: object, quantized: bool = False, **kwargs: object) -> object:
        if quantized:
            raise RuntimeError("MatMulInteger is not implemented")
        return built(*args, **kwargs)

    monkeypatch.setattr(minilm_onnx, "EncoderSession", float32_only)
    embedder = MiniLMEmbedder(int8=True)
    assert (embedder.runtime, embedder.precision) == ("onnxruntime", "float32")
    assert "the float32 encoder" in caplog.text and "MatMulInteger" in caplog.text


def test_the_int8_encoder_multiplies_integers_in_every_linear_layer(
    int8_minilm: MiniLMEmbedder,
) -> None:
    """Six layers of six linear layers each; the float products left are attention's."""
    from parley.gateway.minilm_onnx import describe_encoder

    g = describe_encoder(int8_minilm._w, layers=6, heads=12, eps=int8_minilm._eps, quantized=True)
    arrays = g.arrays
    kinds = [kind for kind, *_ in g.nodes]
    assert kinds.count("MatMulInteger") == 36
    assert kinds.count("MatMul") == 12  # scores and context, per layer
    stored = {a.dtype.name for n, a in arrays.items() if n.endswith(".int8")}
    assert stored == ({"int8"} if exact_signed_products() else {"uint8"})


def _one_linear_layer(signed_weights: bool) -> Any:
    """A session over one int8 linear layer of 64 inputs whose weights are all 1.0: (batch,
    tokens, 64) -> (batch, tokens, 8)."""
    import numpy as np

    from parley.gateway.minilm_onnx import FLOAT, ONNX_TYPES, _Encoder, session, written

    weights = {
        "embeddings.word_embeddings.weight": np.zeros((2, 64), np.float32),
        "layer.weight": np.ones((8, 64), np.float32),
        "layer.bias": np.zeros(8, np.float32),
    }
    g = _Encoder(weights, heads=1, eps=1e-12, quantized=True, signed_weights=signed_weights)
    g.nodes.append(("Identity", [g.dense("x", "layer")], "y", {}))
    inputs = (("input_ids", ONNX_TYPES["int64"], ["b", "t"]), ("x", FLOAT, ["b", "t", 64]))
    model = written(g, inputs, (("y", FLOAT, ["b", "t", 8]),))
    return session(model.SerializeToString(), g.arrays)


def test_large_activations_meeting_large_weights_still_sum_exactly() -> None:
    """Every activation at its token's peak meets a weight at its column's: the integer
    products are the largest there are. On x86 without VNNI onnxruntime's uint8 x int8
    kernel adds them in pairs in 16 bits, which saturate; the encoder this CPU gets sums
    them exactly (module docstring of gateway/minilm_onnx.py)."""
    import numpy as np

    layer = _one_linear_layer(signed_weights=exact_signed_products())
    x = np.ones((1, 3, 64), np.float32) * np.array([1.0, 3.5, 0.02], np.float32)[None, :, None]
    (y,) = layer.run(["y"], {"input_ids": np.zeros((1, 3), np.int64), "x": x})
    assert np.allclose(y, x.sum(axis=2, keepdims=True).repeat(8, axis=2), rtol=1e-5)


def test_int8_vectors_stay_close_to_float32_ones(
    int8_minilm: MiniLMEmbedder, minilm: MiniLMEmbedder
) -> None:
    """Measured on these 81 texts (2 to 100 tokens): lowest 0.969 ("thanks!"; the one-word
    texts are the farthest, "no" 0.981, "yes" 0.982), median 0.997. On LoCoMo those vectors
    lost no recall (bench (e), docs/benchmarks-results.md). The floors sit a little under the
    measure (float rounding differs by CPU) and above what a slip gives: the products' zero
    point off by one gave 0.66 at the lowest (median 0.90), every weight scale 5% off 0.90
    (median 0.984)."""
    texts = _varied_texts()
    cosines = sorted(
        _cosine(a, b) for a, b in zip(int8_minilm.embed(texts), minilm.embed(texts), strict=True)
    )
    assert cosines[0] >= 0.96
    assert cosines[len(cosines) // 2] >= 0.99


def test_an_int8_vector_does_not_depend_on_its_batch(int8_minilm: MiniLMEmbedder) -> None:
    """Each token's activations get their own scale, so a text padded to a long neighbour,
    or batched with texts whose activations run larger, gives the vector it gives alone."""
    texts = SHORT + sorted(_varied_texts(), key=len)[-4:]  # padded to 100+ tokens
    int8_minilm.padding_slack = math.inf  # one batch, whatever the padding
    try:
        together = int8_minilm.embed(texts)
    finally:
        int8_minilm.padding_slack = MiniLMEmbedder.padding_slack
    for text, vector in zip(texts, together, strict=True):
        [alone] = int8_minilm.embed([text])
        assert max(abs(x - y) for x, y in zip(vector, alone, strict=True)) < 1e-5


def test_a_text_much_longer_than_the_batch_starts_the_next() -> None:
    # A question and an answer: padding the question to the answer would double the work.
    assert batches([15, 74], limit=32) == [range(0, 1), range(1, 2)]
    # Like lengths stay together, up to the limit.
    assert batches([20, 21, 22, 24, 25], limit=32) == [range(0, 5)]
    assert batches([10] * 5, limit=2) == [range(0, 2), range(2, 4), range(4, 5)]
    assert batches([], limit=32) == []


def test_every_batch_keeps_its_padding_within_the_slack() -> None:
    lengths = sorted([3, 5, 5, 8, 12, 13, 14, 30, 31, 33, 60, 61, 120, 200, 256] * 3)
    cuts = batches(lengths, limit=8, slack=0.25)
    assert [i for cut in cuts for i in cut] == list(range(len(lengths)))  # in order, all
    for cut in cuts:
        part = lengths[cut.start : cut.stop]
        assert len(part) <= 8
        assert len(part) == 1 or len(part) * max(part) <= 1.25 * sum(part)
