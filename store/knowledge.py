"""Knowledge documents in PostgreSQL: loading (versioned), full-text and vector search.

Every search takes the tenant as a keyword argument and filters on it inside the SQL
statement, so another tenant's rows never leave the database. Functions never commit (the
caller does, store/__init__.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from parley.ids import new_id
from parley.knowledge import Chunk, Document, DocumentMode, Passage, or_query
from parley.store.db import Db


@dataclass(frozen=True)
class Loaded:
    doc: str
    version: int
    changed: bool  # a new version was stored
    chunks: int


async def load_document(
    db: Db,
    *,
    tenant_id: str,
    document: Document,
    chunks: Sequence[Chunk],
) -> Loaded:
    """Store the document as its tenant's current version: unchanged content keeps the
    current version; changed content adds the next one and retires the old."""
    current = await db.row(_CURRENT, {"tenant_id": tenant_id, "doc": document.doc}, _Current)
    if current is not None and current.content_hash == document.content_hash:
        return Loaded(document.doc, current.version, False, len(chunks))
    version = 1
    if current is not None:
        version = current.version + 1
        await db.run(_RETIRE, {"id": current.id})
    params = {
        "id": new_id("kd"),
        "tenant_id": tenant_id,
        "doc": document.doc,
        "version": version,
        "title": document.title,
        "mode": DocumentMode(document.mode).value,
        "content_hash": document.content_hash,
        "positions": [c.position for c in chunks],
        "sections": [c.section for c in chunks],
        "texts": [c.text for c in chunks],
    }
    await db.run(_STORE_VERSION, params)
    return Loaded(document.doc, version, True, len(chunks))


@dataclass(frozen=True)
class _Current:
    id: str
    version: int
    content_hash: str


_CURRENT = """
    SELECT id, version, content_hash FROM knowledge_documents
    WHERE tenant_id = %(tenant_id)s AND doc = %(doc)s AND current
"""
_RETIRE = "UPDATE knowledge_documents SET current = false WHERE id = %(id)s"
# The new version and its chunks, in one statement.
_STORE_VERSION = """
    WITH document AS (
        INSERT INTO knowledge_documents
            (id, tenant_id, doc, version, title, mode, content_hash, current)
        VALUES (%(id)s, %(tenant_id)s, %(doc)s, %(version)s, %(title)s, %(mode)s,
            %(content_hash)s, true)
        RETURNING id
    )
    INSERT INTO knowledge_chunks (document_id, tenant_id, position, section, text)
    SELECT document.id, %(tenant_id)s, chunk.position, chunk.section, chunk.text
    FROM document, unnest(CAST(%(positions)s AS integer[]), CAST(%(sections)s AS text[]),
        CAST(%(texts)s AS text[])) AS chunk(position, section, text)
"""


async def has_vectors(db: Db) -> bool:
    """Whether this database has the `embedding` column (pgvector was there to migrate)."""
    return bool(await db.value(_HAS_VECTORS, {}))


_HAS_VECTORS = (
    "SELECT count(*) FROM information_schema.columns "
    "WHERE table_name = 'knowledge_chunks' AND column_name = 'embedding'"
)


async def chunks_to_embed(db: Db, *, tenant_id: str, model: str) -> list[tuple[int, str]]:
    """(id, text) of the tenant's current chunks not yet embedded by `model`."""
    rows = await db.rows(_TO_EMBED, {"tenant_id": tenant_id, "model": model}, _ToEmbed)
    return [(r.id, f"{r.section}\n{r.text}") for r in rows]


@dataclass(frozen=True)
class _ToEmbed:
    id: int
    section: str
    text: str


_TO_EMBED = """
    SELECT c.id, c.section, c.text
    FROM knowledge_chunks c JOIN knowledge_documents d ON d.id = c.document_id
    WHERE c.tenant_id = %(tenant_id)s AND d.current
        AND c.embedding_model IS DISTINCT FROM %(model)s
    ORDER BY c.id
"""


async def store_embeddings(
    db: Db, *, model: str, embeddings: Sequence[tuple[int, Sequence[float]]]
) -> None:
    for chunk_id, vector in embeddings:
        await db.run(_STORE_EMBEDDING, {"v": _vector(vector), "m": model, "id": chunk_id})


_STORE_EMBEDDING = (
    "UPDATE knowledge_chunks SET embedding = CAST(%(v)s AS vector), "
    "embedding_model = %(m)s WHERE id = %(id)s"
)


# The searches are in psycopg's form (`%(name)s`), on a `Db`.
_COLUMNS = """
    d.doc, d.title, c.section, d.version, c.position, c.text, d.mode
    FROM knowledge_chunks c JOIN knowledge_documents d ON d.id = c.document_id
"""


_WHERE_CURRENT = "c.tenant_id = %(tenant)s AND d.tenant_id = %(tenant)s AND d.current"
_ALWAYS_ORDER = "d.doc, c.position"
_ALWAYS = f"SELECT {_COLUMNS} WHERE {_WHERE_CURRENT} AND d.mode = 'always' ORDER BY {_ALWAYS_ORDER}"
_FOUND = "CROSS JOIN websearch_to_tsquery('english', %(q)s) AS q"
_FOUND_WHERE = f"{_WHERE_CURRENT} AND d.mode = 'retrieved' AND c.tsv @@ q"
_FOUND_ORDER = "ts_rank_cd(c.tsv, q) DESC, c.id"
_SEARCH = f"SELECT {_COLUMNS} {_FOUND} WHERE {_FOUND_WHERE} ORDER BY {_FOUND_ORDER} LIMIT %(limit)s"
# Both reads of a turn's knowledge in one round trip: the always-documents' chunks (part 0,
# in document order), then the search's hits (part 1, best first), each numbered in its order.
_ALWAYS_AND_SEARCH = f"""
    (SELECT 0 AS part, row_number() OVER (ORDER BY {_ALWAYS_ORDER}) AS ord, {_COLUMNS}
     WHERE {_WHERE_CURRENT} AND d.mode = 'always')
    UNION ALL
    (SELECT 1, row_number() OVER (ORDER BY {_FOUND_ORDER}), {_COLUMNS} {_FOUND}
     WHERE {_FOUND_WHERE} ORDER BY {_FOUND_ORDER} LIMIT %(limit)s)
    ORDER BY part, ord
"""
_VECTOR = f"""
    SELECT {_COLUMNS} WHERE {_WHERE_CURRENT} AND d.mode = 'retrieved'
        AND c.embedding_model = %(model)s
    ORDER BY c.embedding <=> CAST(%(v)s AS vector), c.id LIMIT %(limit)s
"""


@dataclass(frozen=True)
class _Chunk(Passage):
    """A row of the searches: a passage's columns as the database gives them (its `mode`
    the column's text, made the domain's enum by `passage`)."""

    def passage(self) -> Passage:
        columns = {f.name: getattr(self, f.name) for f in fields(Passage)}
        return Passage(**{**columns, "mode": DocumentMode(self.mode)})


@dataclass(frozen=True)
class _PartChunk(_Chunk):
    part: int = 0
    ord: int = 0


async def always_passages(db: Db, *, tenant_id: str) -> list[Passage]:
    """Every chunk of the tenant's current always-documents, in document order."""
    rows = await db.rows(_ALWAYS, {"tenant": tenant_id}, _Chunk)
    return [r.passage() for r in rows]


async def search_text(db: Db, *, tenant_id: str, terms: Sequence[str], limit: int) -> list[Passage]:
    """The tenant's retrieved-mode chunks matching any term, best first (ts_rank_cd: more
    terms, closer together, and a match in the section title count more)."""
    if not terms:
        return []
    params = {"tenant": tenant_id, "q": or_query(terms), "limit": limit}
    return [r.passage() for r in await db.rows(_SEARCH, params, _Chunk)]


async def always_and_search_text(
    db: Db, *, tenant_id: str, terms: Sequence[str], limit: int
) -> tuple[list[Passage], list[Passage]]:
    """`always_passages` and `search_text` in one statement: (always, found)."""
    if not terms:
        return await always_passages(db, tenant_id=tenant_id), []
    params = {"tenant": tenant_id, "q": or_query(terms), "limit": limit}
    parts: tuple[list[Passage], list[Passage]] = ([], [])
    for row in await db.rows(_ALWAYS_AND_SEARCH, params, _PartChunk):
        parts[row.part].append(row.passage())
    return parts


async def search_vector(
    db: Db, *, tenant_id: str, model: str, vector: Sequence[float], limit: int
) -> list[Passage]:
    """The tenant's retrieved-mode chunks nearest to `vector` (cosine), embedded by `model`."""
    params = {"tenant": tenant_id, "model": model, "v": _vector(vector), "limit": limit}
    return [r.passage() for r in await db.rows(_VECTOR, params, _Chunk)]


def _vector(values: Sequence[float]) -> str:
    return "[" + ",".join(f"{float(v):.6f}" for v in values) + "]"
