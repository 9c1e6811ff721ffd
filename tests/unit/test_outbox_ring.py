"""The outbox's doorbell (store/events.py `OutboxRing`) and who answers it
(dispatch/outbox.py `start_rung`): a posted turn's ring is claimed by a worker of the queue it
names; a promoted turn's names the queue of the API that queued its message and is claimed
the same way, so a worker of another deployment on the same database leaves it alone; one
queued before the queue was recorded names none, and only a worker running the outbox loop
(`promoted`) starts it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import pytest

from parley.dispatch import outbox
from parley.dispatch.outbox import Starts, start_rung
from parley.store.events import OutboxRing


def test_a_posted_ring_carries_what_its_api_starts_the_turn_with() -> None:
    ring = OutboxRing("trn_1", "turns-a", 90.0, True, "00-abc-def-01")
    assert ring.payload() == "trn_1 turns-a 90 1 00-abc-def-01"
    assert OutboxRing.heard(ring.payload()) == ring
    assert not ring.promoted


def test_a_promoted_ring_names_its_queue_and_an_older_one_names_none() -> None:
    named = OutboxRing("trn_2", "turns-a", promoted=True)
    assert named.payload() == "trn_2 turns-a"
    assert OutboxRing.heard("trn_2 turns-a") == named
    traced = OutboxRing("trn_2", "turns-a", trace="00-abc-def-01", promoted=True)
    assert traced.payload() == "trn_2 turns-a 00-abc-def-01"  # the queuing POST's trace
    assert OutboxRing.heard(traced.payload()) == traced
    older = OutboxRing.heard("trn_3")  # what a release before the queue was recorded rings
    assert (older.turn_id, older.task_queue, older.promoted) == ("trn_3", None, True)
    assert older.payload() == "trn_3"


@pytest.mark.parametrize(
    ("payload", "promoted", "route"),
    [
        ("trn_4 turns-a", False, "claim"),  # its own queue: the tests' in-process worker too
        ("trn_4 turns-a", True, "claim"),  # claimed by one worker, started eagerly
        ("trn_4 turns-b", True, None),  # another deployment's, even for the outbox loop
        ("trn_4", True, "promoted"),  # named none: the outbox loop starts it
        ("trn_4", False, None),  # ... and a worker without one leaves it
    ],
)
async def test_a_promoted_turn_is_started_by_a_worker_of_the_queue_its_ring_names(
    monkeypatch: pytest.MonkeyPatch, payload: str, promoted: bool, route: str | None
) -> None:
    taken: list[tuple[str, str]] = []

    async def start_promoted(starts: Starts, turn_id: str) -> bool:
        taken.append(("promoted", turn_id))
        return True

    async def claim_start(db: object, *, turn_id: str) -> None:
        taken.append(("claim", turn_id))  # another worker holds it: nothing more here

    @asynccontextmanager
    async def unit_of_work() -> AsyncIterator[None]:
        yield None

    monkeypatch.setattr(outbox, "start_promoted", start_promoted)
    monkeypatch.setattr(outbox.outbox, "claim_start", claim_start)
    starts = Starts(cast(Any, None), cast(Any, unit_of_work), "turns-a")
    await start_rung(starts, payload, promoted=promoted)
    assert taken == ([(route, "trn_4")] if route else [])
