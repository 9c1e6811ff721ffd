"""Embeddings for knowledge retrieval: `embed(texts)` against an OpenAI-compatible server
(`POST {base}/embeddings`), the only place besides the chat adapters that talks to a provider.

Configured by `PARLEY_EMBEDDING_MODEL` (empty: no embeddings, retrieval is full-text only) and
`PARLEY_EMBEDDING_BASE_URL` (default `OPENAI_BASE_URL`); the key is `OPENAI_API_KEY`, never
logged. Failures raise `EmbeddingError`; callers degrade to full-text search.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol

import httpx

from parley.config import Settings
from parley.tls import httpx_verified


class EmbeddingError(Exception):
    """The embedding server did not answer with vectors (status or transport named, no body)."""


class Embedder(Protocol):
    model: str

    async def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


class OpenAICompatEmbedder:
    """`POST /v1/embeddings` with `encoding_format: float`; vectors come back in input order."""

    def __init__(self, *, base_url: str, api_key: str, model: str, timeout_s: float = 10.0) -> None:
        self.model = model
        self._url = base_url.rstrip("/") + "/embeddings"
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._timeout = timeout_s

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        body = {"model": self.model, "input": list(texts), "encoding_format": "float"}
        try:
            async with httpx.AsyncClient(timeout=self._timeout, verify=httpx_verified()) as http:
                response = await http.post(self._url, json=body, headers=self._headers)
        except httpx.HTTPError as exc:
            raise EmbeddingError(f"embeddings: {type(exc).__name__}") from None
        if response.status_code != 200:
            raise EmbeddingError(f"embeddings: HTTP {response.status_code}")
        data = sorted(response.json()["data"], key=lambda item: item["index"])
        if len(data) != len(texts):
            raise EmbeddingError("embeddings: wrong number of vectors")
        return [[float(x) for x in item["embedding"]] for item in data]


def build_embedder(settings: Settings) -> Embedder | None:
    """The configured embedder, or None when no embedding model is set."""
    if not settings.embedding_model:
        return None
    base = settings.embedding_base_url or os.environ.get("OPENAI_BASE_URL") or ""
    if not base:
        base = "https://api.openai.com/v1"
    return OpenAICompatEmbedder(
        base_url=base,
        api_key=os.environ.get("OPENAI_API_KEY") or "unused",
        model=settings.embedding_model,
    )
