"""Files a skill produced, kept with the session like an upload (`files` table).

They are served by the same owner-only route as uploads (`GET .../files/{file_id}`). Their
ids derive from the tool call (parley/ids.py), so an attempt that runs the skill again finds
the file an earlier one stored instead of storing it twice. Nothing here commits (see
`store`).
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from store.models import SessionFile


async def store_artifact(
    db: AsyncSession,
    *,
    file_id: str,
    session_id: str,
    tenant_id: str,
    user_id: str,
    name: str,
    content_type: str,
    content: bytes,
) -> SessionFile:
    """Keep one produced file with the session, once per id."""
    existing = await db.get(SessionFile, file_id)
    if existing is not None:
        return existing
    row = SessionFile(
        id=file_id,
        session_id=session_id,
        tenant_id=tenant_id,
        user_id=user_id,
        name=name,
        content_type=content_type,
        size=len(content),
        content=content,
        text="",  # a skill's output is shown to the user, never put in a prompt
        meta={"origin": "skill"},
    )
    db.add(row)
    await db.flush()
    return row
