"""`parley erase` and `parley erasure receipt | show`: an operator erases a user and, later,
proves it happened.

`erase` records the erasure (revoking the user's tokens), starts its workflow and, unless
told not to wait, prints the receipt when it ends. `receipt` finds the receipts of a subject
by recomputing the keyed hash the receipt keeps (the ids are not stored); `show` prints one
by its id.
"""

from __future__ import annotations

from typing import Any

from temporalio.client import Client

from parley.config import Settings
from parley.dispatch.erasure import start_erasure
from parley.erasure import ErasureInput, subject_hash
from parley.launch.seeding import require_database
from parley.store.db import Database, create_engine
from parley.store.lifecycle import erasure


async def erase_user(settings: Settings, *, tenant: str, user: str, wait: bool) -> dict[str, Any]:
    """Erase one user; the receipt (or, without `wait`, the erasure as started)."""
    engine = create_engine(require_database(settings), pool_size=2)
    sessions = Database(engine)
    try:
        async with sessions() as db:
            row = await erasure.request_erasure(
                db, key=settings.erasure_receipt_key, tenant_id=tenant, user_id=user
            )
            await db.commit()
        client = await Client.connect(
            settings.temporal_address, namespace=settings.temporal_namespace
        )
        inp = ErasureInput(erasure_id=row.id)
        handle = await start_erasure(client, sessions, inp, task_queue=settings.task_queue)
        if wait:
            await handle.result()
        async with sessions() as db:
            done = await erasure.get_erasure(db, erasure_id=row.id)
        assert done is not None
        return erasure.receipt_view(done)
    finally:
        await engine.dispose()


async def find_receipts(
    settings: Settings, *, tenant: str, user: str, session: str | None
) -> list[dict[str, Any]]:
    """The receipts of a user (every erasure of theirs, sessions' included when `session`
    names one)."""
    key = settings.erasure_receipt_key
    hashes = [subject_hash(key, tenant, user)]
    if session is not None:
        hashes.append(subject_hash(key, tenant, user, session))
    engine = create_engine(require_database(settings), pool_size=1)
    try:
        async with Database(engine)() as db:
            rows = await erasure.find_receipts(db, hashes=hashes)
        return [erasure.receipt_view(row) for row in rows]
    finally:
        await engine.dispose()


async def show_receipt(settings: Settings, *, erasure_id: str) -> dict[str, Any] | None:
    engine = create_engine(require_database(settings), pool_size=1)
    try:
        async with Database(engine)() as db:
            row = await erasure.get_erasure(db, erasure_id=erasure_id)
        return erasure.receipt_view(row) if row is not None else None
    finally:
        await engine.dispose()
