"""The session stream's contract in code (parley/live.py, store/live.py): its cursor, its
frame names, and the rule that keeps it whole: every statement that gives birth to a turn
announces it on the session's log, or the session stream would never follow that turn."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import parley.store
from parley.live import (
    READY,
    SESSION_EVENT_DATA,
    SessionCursor,
    SessionEventType,
    SessionTurnData,
)
from parley.store.live import announce_params
from parley.store.turn_states import BORN
from parley.wire import EVENT_DATA


def test_a_cursor_reads_back_as_it_was_written() -> None:
    for cursor in (
        SessionCursor(0),
        SessionCursor(12, (("trn_0a1b", 45),)),
        SessionCursor(7, (("trn_a", 3), ("trn_b", 0))),
    ):
        assert SessionCursor.parse(str(cursor)) == cursor
    assert str(SessionCursor(12, (("trn_0a1b", 45),))) == "12.trn_0a1b.45"


@pytest.mark.parametrize(
    "text", ["", "x", "-1", "1.", "1.trn_a", "1.trn_a.x", "1.trn a.2", "1" * 19, "1.t.2\n"]
)
def test_anything_else_is_not_a_cursor(text: str) -> None:
    with pytest.raises(ValueError):
        SessionCursor.parse(text)


def test_session_frames_and_turn_frames_never_share_a_name() -> None:
    session_frames = {*SESSION_EVENT_DATA, READY}
    assert set(SessionEventType) == set(SESSION_EVENT_DATA)
    assert session_frames.isdisjoint(EVENT_DATA)


def test_a_session_event_carries_its_own_payload_model_only() -> None:
    params = announce_params(SessionEventType.turn, SessionTurnData(turn_id="trn_x"))
    assert params["live_type"] == "turn" and '"turn_id": "trn_x"' in params["live_data"]
    with pytest.raises(TypeError):
        announce_params(SessionEventType.session_deleted, SessionTurnData(turn_id="trn_x"))


def _store_statements() -> dict[str, str]:
    found = {}
    for module in pkgutil.walk_packages(parley.store.__path__, "parley.store."):
        if ".migrations" in module.name:
            continue
        loaded = importlib.import_module(module.name)
        for name, value in vars(loaded).items():
            if isinstance(value, str) and name.isupper():
                found[f"{module.name}.{name}"] = value
    return found


def test_every_statement_that_gives_birth_to_a_turn_announces_it() -> None:
    births = {name: sql for name, sql in _store_statements().items() if BORN in sql and sql != BORN}
    assert len(births) >= 3, births.keys()  # a plain post, a queued one, a retry
    silent = [name for name, sql in births.items() if "INSERT INTO session_events" not in sql]
    assert silent == [], f"these give birth to a turn the session stream never hears of: {silent}"
