"""One owner per invariant of the record: each is written in one module of store/, and a
statement elsewhere that needs it (one round trip doing several things) composes the owner's
named SQL fragments instead of writing it again.

The check reads the text of the product code (every package `pip install` ships and
worker.py; not tests, migrations or bench/) for each invariant's greppable forms, so a
second copy, in SQL or through the ORM, names the module that wrote it. Prose that spells
a form out counts too: say "the doorbell", not the function's name, outside its owner.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = (
    "api",
    "workflows",
    "activities",
    "parley",
    "store",
    "gateway",
    "demo_backend",
    "dispatch",
    "launch",
    "parley_eval",
)
TOP_MODULES = ("worker.py",)

# invariant: (its owner, the forms that write it)
OWNERS: dict[str, tuple[str, tuple[str, ...]]] = {
    # An event is appended (its id taken from the turn's counter) in one place.
    "the event append": ("store/events.py", (r"INSERT INTO turn_events",)),
    # Every NOTIFY, with its payload's format: the event log's doorbell and the outbox's.
    "a doorbell": ("store/events.py", (r"pg_notify",)),
    # A turn's state changes in one UPDATE (and a turn is born by one INSERT); through the
    # ORM, a `Turn`'s state is never assigned.
    "a turn's state": (
        "store/turn_states.py",
        (r"UPDATE turns SET state", r"INSERT INTO turns\b", r"\bturn\.state = "),
    ),
    # A message's seq: the session's `last_seq` moves by one, or to the seq a message took,
    # in SQL or on the ORM row (alone or in a tuple assignment).
    "the message seq": (
        "store/messages.py",
        (r"last_seq \+", r"SET last_seq", r"last_seq = %\(", r"\.last_seq \+?= ", r"\.last_seq,.* = "),
    ),
}


def _product_files() -> list[Path]:
    files = [
        path
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        if "migrations" not in path.parts
    ]
    return files + [REPO / name for name in TOP_MODULES]


FILES = {str(path.relative_to(REPO)): path.read_text() for path in _product_files()}


def writers(forms: tuple[str, ...], files: dict[str, str] = FILES) -> set[str]:
    """The modules whose text holds any of `forms`."""
    return {name for name, text in files.items() if any(re.search(f, text) for f in forms)}


@pytest.mark.parametrize("invariant", sorted(OWNERS))
def test_each_invariant_is_written_in_its_owner_alone(invariant: str) -> None:
    owner, forms = OWNERS[invariant]
    assert writers(forms) == {owner}, f"{invariant} belongs to {owner} alone"


def test_the_owner_check_sees_a_second_copy() -> None:
    """Guards the guard: a copy of each form outside its owner is found, and the product's
    files are read at all."""
    assert len(FILES) > 40 and "store/events.py" in FILES
    copies = {
        "INSERT INTO turn_events (turn_id, id)": "the event append",
        "SELECT pg_notify('parley_outbox', %(id)s)": "a doorbell",
        "UPDATE turns SET state = 'completed'": "a turn's state",
        "turn.state = TurnState.failed": "a turn's state",
        "session.last_seq += 1": "the message seq",
        "session.last_seq, session.active_turn_id = seq, turn_id": "the message seq",
        "UPDATE sessions SET active_turn_id = %(t)s, last_seq = %(seq)s": "the message seq",
        "UPDATE sessions SET last_seq = last_seq + 1": "the message seq",
    }
    for text, invariant in copies.items():
        owner, forms = OWNERS[invariant]
        found = writers(forms, {owner: "", "store/elsewhere.py": f"x = '''{text}'''"})
        assert found == {"store/elsewhere.py"}, text
