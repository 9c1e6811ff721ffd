"""The decisions' outbox (dispatch/control.py): a stored decision is delivered as the API
delivered it when it was made, so a turn hears the same from the sweep as from the route."""

from __future__ import annotations

import pytest

from parley.dispatch.control import stored_decision
from parley.statuses import Decision, DeclineReason
from parley.store.actions import DecidedAction


@pytest.mark.parametrize(
    ("status", "reason", "delivered"),
    [
        ("confirmed", None, Decision.confirmed),
        ("declined", None, Decision.declined),
        ("declined", DeclineReason.turn_ended.value, Decision.declined),
        # The user moved on from the card (store/posting.py): the turn ends superseded.
        ("superseded", None, Decision.superseded),
    ],
)
def test_a_stored_decision_is_delivered_as_it_was_made(
    status: str, reason: str | None, delivered: Decision
) -> None:
    action = DecidedAction("act_1", "trn_1", status, reason, turn_ended=False)
    signal = stored_decision(action)
    assert (signal.action_id, signal.decision) == ("act_1", delivered)
