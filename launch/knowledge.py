"""Loading the knowledge library: `launch/knowledge/<tenant>/<doc>.md` into PostgreSQL.

The demo seed loads it, and `parley knowledge load [--dir D]` loads any folder of the same
shape. Loading is idempotent: an unchanged file keeps its version, a changed one becomes the
next version. With an embedding model configured, chunks not yet embedded by it are embedded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from parley.config import Settings
from parley.gateway.embeddings import Embedder, build_embedder
from parley.knowledge import Document, chunk_document, parse_document
from parley.store import knowledge as knowledge_store
from parley.store.db import Database, Db, create_engine

KNOWLEDGE_DIR = Path(__file__).resolve().parent / "knowledge"
EMBED_BATCH = 32


def read_library(directory: Path = KNOWLEDGE_DIR) -> dict[str, list[Document]]:
    """Documents by tenant: one folder per tenant, one Markdown file per document."""
    library: dict[str, list[Document]] = {}
    for folder in sorted(p for p in directory.iterdir() if p.is_dir()):
        library[folder.name] = [
            parse_document(path.read_text(encoding="utf-8"), doc=path.stem)
            for path in sorted(folder.glob("*.md"))
        ]
    return library


async def load_library(
    db: Db,
    library: Mapping[str, Sequence[Document]],
    *,
    embedder: Embedder | None = None,
) -> list[str]:
    """Store every document (the caller commits); returns one line per document."""
    lines = []
    for tenant_id, documents in library.items():
        for document in documents:
            loaded = await knowledge_store.load_document(
                db, tenant_id=tenant_id, document=document, chunks=chunk_document(document)
            )
            state = "new version" if loaded.changed else "unchanged"
            lines.append(
                f"{tenant_id}/{loaded.doc}: version {loaded.version} ({state}, "
                f"{loaded.chunks} chunks)"
            )
        if embedder is not None and await knowledge_store.has_vectors(db):
            lines.append(f"{tenant_id}: {await embed_chunks(db, tenant_id, embedder)} embedded")
    return lines


async def embed_chunks(db: Db, tenant_id: str, embedder: Embedder) -> int:
    """Embed the tenant's current chunks that `embedder`'s model has not embedded yet."""
    pending = await knowledge_store.chunks_to_embed(db, tenant_id=tenant_id, model=embedder.model)
    for start in range(0, len(pending), EMBED_BATCH):
        batch = pending[start : start + EMBED_BATCH]
        vectors = await embedder.embed([text for _, text in batch])
        await knowledge_store.store_embeddings(
            db,
            model=embedder.model,
            embeddings=[(chunk_id, v) for (chunk_id, _), v in zip(batch, vectors, strict=True)],
        )
    return len(pending)


async def load_knowledge(settings: Settings, directory: Path = KNOWLEDGE_DIR) -> list[str]:
    """The CLI's and the seed's unit of work: load, embed if configured, commit."""
    assert settings.database_url is not None
    engine = create_engine(settings.database_url, pool_size=1)
    try:
        async with Database(engine)() as db:
            lines = await load_library(
                db, read_library(directory), embedder=build_embedder(settings)
            )
            await db.commit()
            return lines
    finally:
        await engine.dispose()
