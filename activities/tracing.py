"""The trace ledger: each activity records a span (name, attempt, timing, outcome).

Written in its own transaction after the step, so a failing step still leaves its span and
tracing never rolls back the work it describes.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio import activity

from store.models import TraceSpan

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def span(
    sessions: async_sessionmaker[AsyncSession],
    turn_id: str,
    name: str,
    attrs: dict[str, Any] | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """Yields a dict the step may fill with attributes (model, tokens, …)."""
    started = datetime.now(UTC)
    extra: dict[str, Any] = dict(attrs or {})
    outcome = "ok"
    try:
        yield extra
    except BaseException as exc:
        outcome = type(exc).__name__
        raise
    finally:
        attempt = activity.info().attempt if activity.in_activity() else 1
        try:
            async with sessions() as db:
                db.add(
                    TraceSpan(
                        turn_id=turn_id,
                        name=name,
                        attempt=attempt,
                        started_at=started,
                        ended_at=datetime.now(UTC),
                        outcome=outcome,
                        attrs=extra or None,
                    )
                )
                await db.commit()
        except Exception:  # the ledger is best effort; the step's own result stands
            log.warning("could not record trace span %s for %s", name, turn_id, exc_info=True)
