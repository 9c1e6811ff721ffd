"""Files a skill produced, kept with the session like an upload (`files` table).

They are served by the same owner-only route as uploads (`GET .../files/{file_id}`). Their
ids derive from the tool call (parley/ids.py), so an attempt that runs the skill again finds
the file an earlier one stored instead of storing it twice. Nothing here commits (see
`store`).
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg.types.json import Jsonb

from parley.store.db import Db


@dataclass(frozen=True)
class ArtifactRow:
    """A stored file, as the `artifact` event names it."""

    id: str
    name: str
    content_type: str
    size: int


async def store_artifact(
    conn: Db,
    *,
    file_id: str,
    session_id: str,
    tenant_id: str,
    user_id: str,
    name: str,
    content_type: str,
    content: bytes,
) -> ArtifactRow:
    """Keep one produced file with the session, once per id: one statement."""
    params = {
        "id": file_id,
        "session_id": session_id,
        "tenant_id": tenant_id,
        "user_id": user_id,
        "name": name,
        "content_type": content_type,
        "size": len(content),
        "content": content,
        # A skill's output is shown to the user, never put in a prompt.
        "text": "",
        "meta": Jsonb({"origin": "skill"}),
    }
    found = await conn.row(_STORE, params, ArtifactRow)
    if found is None:  # stored by an attempt that committed after this statement began
        found = await conn.row(_STORED, {"id": file_id}, ArtifactRow)
        assert found is not None
    return found


# The second arm reads the snapshot from before the insert: exactly one arm holds the row,
# the one inserted or the one an earlier attempt stored.
_STORE = """
    WITH made AS (
        INSERT INTO files
            (id, session_id, tenant_id, user_id, name, content_type, bytes, content, text, meta)
        VALUES (%(id)s, %(session_id)s, %(tenant_id)s, %(user_id)s, %(name)s,
            %(content_type)s, %(size)s, %(content)s, %(text)s, %(meta)s)
        ON CONFLICT (id) DO NOTHING
        RETURNING id, name, content_type, bytes AS size
    )
    SELECT id, name, content_type, size FROM made
    UNION ALL
    SELECT id, name, content_type, bytes AS size FROM files WHERE id = %(id)s
    LIMIT 1
"""
_STORED = "SELECT id, name, content_type, bytes AS size FROM files WHERE id = %(id)s"
