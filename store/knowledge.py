"""Knowledge documents in PostgreSQL: loading (versioned), full-text and vector search.

Every search takes the tenant as a keyword argument and filters on it inside the SQL
statement, so another tenant's rows never leave the database. Functions never commit (the
caller does, store/__init__.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from parley.ids import new_id
from parley.knowledge import Chunk, Document, DocumentMode, Passage, or_query
from store.models import KnowledgeChunk, KnowledgeDocument


@dataclass(frozen=True)
class Loaded:
    doc: str
    version: int
    changed: bool  # a new version was stored
    chunks: int


async def load_document(
    db: AsyncSession,
    *,
    tenant_id: str,
    document: Document,
    chunks: Sequence[Chunk],
) -> Loaded:
    """Store the document as its tenant's current version: unchanged content keeps the
    current version; changed content adds the next one and retires the old."""
    current = await db.scalar(
        select(KnowledgeDocument).where(
            KnowledgeDocument.tenant_id == tenant_id,
            KnowledgeDocument.doc == document.doc,
            KnowledgeDocument.current.is_(True),
        )
    )
    if current is not None and current.content_hash == document.content_hash:
        return Loaded(document.doc, current.version, False, len(chunks))
    version = 1
    if current is not None:
        version = current.version + 1
        await db.execute(
            update(KnowledgeDocument)
            .where(KnowledgeDocument.id == current.id)
            .values(current=False)
        )
    row = KnowledgeDocument(
        id=new_id("kd"),
        tenant_id=tenant_id,
        doc=document.doc,
        version=version,
        title=document.title,
        mode=document.mode,
        content_hash=document.content_hash,
        current=True,
    )
    db.add(row)
    await db.flush()
    db.add_all(
        KnowledgeChunk(
            document_id=row.id,
            tenant_id=tenant_id,
            position=c.position,
            section=c.section,
            text=c.text,
        )
        for c in chunks
    )
    await db.flush()
    return Loaded(document.doc, version, True, len(chunks))


async def has_vectors(db: AsyncSession) -> bool:
    """Whether this database has the `embedding` column (pgvector was there to migrate)."""
    found = await db.scalar(
        text(
            "SELECT count(*) FROM information_schema.columns "
            "WHERE table_name = 'knowledge_chunks' AND column_name = 'embedding'"
        )
    )
    return bool(found)


async def chunks_to_embed(db: AsyncSession, *, tenant_id: str, model: str) -> list[tuple[int, str]]:
    """(id, text) of the tenant's current chunks not yet embedded by `model`."""
    rows = await db.execute(
        select(KnowledgeChunk.id, KnowledgeChunk.section, KnowledgeChunk.text)
        .join(KnowledgeDocument, KnowledgeDocument.id == KnowledgeChunk.document_id)
        .where(
            KnowledgeChunk.tenant_id == tenant_id,
            KnowledgeDocument.current.is_(True),
            KnowledgeChunk.embedding_model.is_distinct_from(model),
        )
        .order_by(KnowledgeChunk.id)
    )
    return [(r.id, f"{r.section}\n{r.text}") for r in rows]


async def store_embeddings(
    db: AsyncSession, *, model: str, embeddings: Sequence[tuple[int, Sequence[float]]]
) -> None:
    for chunk_id, vector in embeddings:
        await db.execute(
            text(
                "UPDATE knowledge_chunks SET embedding = CAST(:v AS vector), "
                "embedding_model = :m WHERE id = :id"
            ),
            {"v": _vector(vector), "m": model, "id": chunk_id},
        )


_COLUMNS = """
    d.doc, d.title, c.section, d.version, c.position, c.text, d.mode
    FROM knowledge_chunks c JOIN knowledge_documents d ON d.id = c.document_id
"""


_WHERE_CURRENT = "c.tenant_id = :tenant AND d.tenant_id = :tenant AND d.current"
_ALWAYS_ORDER = "d.doc, c.position"
_ALWAYS_SQL = (
    f"SELECT {_COLUMNS} WHERE {_WHERE_CURRENT} AND d.mode = 'always' ORDER BY {_ALWAYS_ORDER}"
)
_FOUND = "CROSS JOIN websearch_to_tsquery('english', :q) AS q"
_FOUND_WHERE = f"{_WHERE_CURRENT} AND d.mode = 'retrieved' AND c.tsv @@ q"
_FOUND_ORDER = "ts_rank_cd(c.tsv, q) DESC, c.id"
_ALWAYS = text(_ALWAYS_SQL)
_SEARCH = text(
    f"SELECT {_COLUMNS} {_FOUND} WHERE {_FOUND_WHERE} ORDER BY {_FOUND_ORDER} LIMIT :limit"
)
# Both reads of a turn's knowledge in one round trip: the always-documents' chunks (part 0,
# in document order), then the search's hits (part 1, best first), each numbered in its order.
_ALWAYS_AND_SEARCH = text(
    f"""
    (SELECT 0 AS part, row_number() OVER (ORDER BY {_ALWAYS_ORDER}) AS ord, {_COLUMNS}
     WHERE {_WHERE_CURRENT} AND d.mode = 'always')
    UNION ALL
    (SELECT 1, row_number() OVER (ORDER BY {_FOUND_ORDER}), {_COLUMNS} {_FOUND}
     WHERE {_FOUND_WHERE} ORDER BY {_FOUND_ORDER} LIMIT :limit)
    ORDER BY part, ord
    """
)


async def always_passages(db: AsyncSession, *, tenant_id: str) -> list[Passage]:
    """Every chunk of the tenant's current always-documents, in document order."""
    rows = await db.execute(_ALWAYS, {"tenant": tenant_id})
    return [_passage(r) for r in rows]


async def search_text(
    db: AsyncSession, *, tenant_id: str, terms: Sequence[str], limit: int
) -> list[Passage]:
    """The tenant's retrieved-mode chunks matching any term, best first (ts_rank_cd: more
    terms, closer together, and a match in the section title count more)."""
    if not terms:
        return []
    rows = await db.execute(_SEARCH, {"tenant": tenant_id, "q": or_query(terms), "limit": limit})
    return [_passage(r) for r in rows]


async def always_and_search_text(
    db: AsyncSession, *, tenant_id: str, terms: Sequence[str], limit: int
) -> tuple[list[Passage], list[Passage]]:
    """`always_passages` and `search_text` in one statement: (always, found)."""
    if not terms:
        return await always_passages(db, tenant_id=tenant_id), []
    rows = await db.execute(
        _ALWAYS_AND_SEARCH, {"tenant": tenant_id, "q": or_query(terms), "limit": limit}
    )
    parts: tuple[list[Passage], list[Passage]] = ([], [])
    for row in rows:
        parts[row.part].append(_passage(row))
    return parts


async def search_vector(
    db: AsyncSession, *, tenant_id: str, model: str, vector: Sequence[float], limit: int
) -> list[Passage]:
    """The tenant's retrieved-mode chunks nearest to `vector` (cosine), embedded by `model`."""
    rows = await db.execute(
        text(
            f"SELECT {_COLUMNS} WHERE c.tenant_id = :tenant AND d.tenant_id = :tenant "
            "AND d.current AND d.mode = 'retrieved' AND c.embedding_model = :model "
            "ORDER BY c.embedding <=> CAST(:v AS vector), c.id LIMIT :limit"
        ),
        {"tenant": tenant_id, "model": model, "v": _vector(vector), "limit": limit},
    )
    return [_passage(r) for r in rows]


def _passage(row: Any) -> Passage:
    return Passage(
        str(row.doc),
        str(row.title),
        str(row.section),
        int(row.version),
        int(row.position),
        str(row.text),
        DocumentMode(row.mode),
    )


def _vector(values: Sequence[float]) -> str:
    return "[" + ",".join(f"{float(v):.6f}" for v in values) + "]"
