"""The fake provider's embeddings: deterministic hashed bag-of-words vectors.

Not a semantic model: two texts are close only when they share (crudely stemmed) words, so
"broken" and "damaged" are as far apart as any two words. It exists so tests and the bench
can exercise the vector path and hybrid ranking end to end without a model.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

from fastapi import FastAPI, Request

DIMENSIONS = 256
MODEL = "fake-hashed-bow-256"

_WORD = re.compile(r"[a-z0-9]+")
_SKIP = frozenset(
    "a an the and or of to in on at for with from by is are was be can could do does did i "
    "you your my we our it its that this what how when where which who will would".split()
)


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def hashed_embedding(text: str, dimensions: int = DIMENSIONS) -> list[float]:
    """Each word adds +1 or -1 to one of `dimensions` buckets (both from its hash); the
    vector is scaled to unit length (a text with no words gets a fixed unit vector, so a
    cosine distance is always defined)."""
    vector = [0.0] * dimensions
    for word in _WORD.findall(text.lower()):
        if word in _SKIP:
            continue
        digest = hashlib.sha256(_stem(word).encode()).digest()
        bucket = int.from_bytes(digest[:4], "big") % dimensions
        vector[bucket] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vector))
    return [v / norm for v in vector] if norm else [1.0] + [0.0] * (dimensions - 1)


def add_embeddings_route(app: FastAPI) -> None:
    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> dict[str, Any]:
        """OpenAI embeddings: hashed bag-of-words vectors (not semantic)."""
        body = await request.json()
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [
            {"object": "embedding", "index": i, "embedding": hashed_embedding(str(text))}
            for i, text in enumerate(inputs)
        ]
        return {"object": "list", "model": body.get("model"), "data": data}
