"""Result sets as referents, the pure rules (parley/result_sets.py): date phrases against the
demo clock, "over" as strictly greater, and the ladder that tells a refinement from a new
scope from a reference, asking when two sets are equally plausible."""

from __future__ import annotations

import csv
import io
from datetime import date

import pytest

from parley.result_sets import (
    RESULT_SET,
    NeedsToday,
    StoredSet,
    decide,
    describe_set,
    orders_csv,
    read_scope,
    week_before,
)

TODAY = date(2026, 10, 28)  # the demo's Wednesday
LAST_WEEK = {"placed_from": "2026-10-19", "placed_to": "2026-10-25"}
LAST_WEEK_SET = StoredSet(
    "rs_aaaaaa", LAST_WEEK, ["9101", "9104", "9105", "9107", "9108", "9111", "9112", "9114"], 1
)
OVER_500 = StoredSet(
    "rs_bbbbbb",
    {**LAST_WEEK, "min_total": 500.0},
    ["9104", "9107", "9111"],
    3,
    [
        {"order_id": "9104", "placed": "2026-10-20", "total": "740.00", "status": "shipped"},
        {"order_id": "9107", "placed": "2026-10-22", "total": "1250.00", "status": "processing"},
        {"order_id": "9111", "placed": "2026-10-23", "total": "515.50", "status": "delivered"},
    ],
)


@pytest.mark.parametrize(
    ("today", "monday", "sunday"),
    [
        (date(2026, 10, 28), date(2026, 10, 19), date(2026, 10, 25)),  # a Wednesday
        (date(2026, 10, 26), date(2026, 10, 19), date(2026, 10, 25)),  # a Monday
        (date(2026, 11, 1), date(2026, 10, 19), date(2026, 10, 25)),  # a Sunday
        (date(2027, 1, 2), date(2026, 12, 21), date(2026, 12, 27)),  # across the year
    ],
)
def test_last_week_is_the_previous_monday_to_sunday(
    today: date, monday: date, sunday: date
) -> None:
    assert week_before(today) == (monday, sunday)


def test_date_phrases_read_against_the_clock() -> None:
    assert read_scope("my orders from last week", TODAY).query() == LAST_WEEK
    october = read_scope("everything over $1,000 in October", TODAY).query()
    assert october == {"placed_from": "2026-10-01", "placed_to": "2026-10-31", "min_total": 1000.0}
    # A month that has not begun this year is last year's.
    assert read_scope("orders in December", TODAY).placed_from == "2025-12-01"
    assert read_scope("orders from last month", TODAY).query() == {
        "placed_from": "2026-09-01",
        "placed_to": "2026-09-30",
    }
    # "may" the verb is no month; a month needs a preposition.
    assert read_scope("May I see my orders?", TODAY).query() == {}


def test_amounts_and_statuses() -> None:
    assert read_scope("just the ones over $500", None).min_total == 500.0
    assert read_scope("more than USD 1,250.50", None).min_total == 1250.5
    assert read_scope("only the shipped ones", None).status == "shipped"
    assert read_scope("which hasn't shipped yet", None).status is None  # negated: no filter


def test_a_date_phrase_needs_the_clock() -> None:
    with pytest.raises(NeedsToday):
        decide("Show me my orders from last week.", sets=[])


def test_danas_five_turns_step_by_step() -> None:
    first = decide("Show me my orders from last week.", sets=[], today=TODAY)
    assert (first.kind, first.query) == ("new", LAST_WEEK)

    second = decide("Just the ones over $500.", sets=[LAST_WEEK_SET], today=TODAY)
    assert second.kind == "refine" and second.target == LAST_WEEK_SET
    assert second.query == {**LAST_WEEK, "min_total": 500.0}  # same dates, strictly over 500

    both = [LAST_WEEK_SET, OVER_500]
    third = decide("Export those as CSV.", sets=both, today=TODAY)
    assert third.kind == "referent" and third.target == OVER_500  # the latest set

    fourth = decide("Which of them hasn't shipped yet?", sets=both, today=TODAY)
    assert fourth.kind == "referent" and fourth.target == OVER_500
    state = fourth.as_state()
    assert state is not None and state["order_ids"] == ["9104", "9107", "9111"]

    fifth = decide("And everything over $1,000 in October?", sets=both, today=TODAY)
    assert fifth.kind == "new" and fifth.target is None  # a new scope, not the subset
    assert fifth.query == {
        "placed_from": "2026-10-01",
        "placed_to": "2026-10-31",
        "min_total": 1000.0,
    }


def test_messages_about_one_order_are_left_to_the_order_resolver() -> None:
    for text in ("Has 9104 shipped?", "Where is my order?", "What about the refund?", "Thanks."):
        assert decide(text, sets=[LAST_WEEK_SET], today=TODAY).kind == "none", text
    # Without a stored set, "those" refers to nothing.
    assert decide("Export those as CSV.", sets=[], today=TODAY).kind == "none"


def test_two_sets_from_one_turn_are_equally_plausible_so_ask() -> None:
    twin = StoredSet("rs_cccccc", {"min_total": 1000.0}, ["9097", "9107", "9118"], 3)
    asked = decide("Just the ones over $2,000.", sets=[LAST_WEEK_SET, OVER_500, twin], today=TODAY)
    assert asked.kind == "clarify" and asked.clarification is not None
    options = asked.clarification.options
    assert [o.id for o in options] == ["rs_bbbbbb", "rs_cccccc"]
    assert all(o.type == RESULT_SET for o in options)
    assert options[0].label == "3 orders over $500.00 placed Oct 19 – Oct 25"
    pending = asked.pending_slot_value()
    assert pending["refine"] == {"min_total": 2000.0}

    # The answer (the option's text, or an ordinal) picks one, and the refinement waits for it.
    for answer in (options[1].value, "the second one"):
        picked = decide(answer, sets=[LAST_WEEK_SET, OVER_500, twin], pending=pending)
        assert picked.kind == "refine" and picked.target == twin
        assert picked.query == {"min_total": 2000.0}
    # "those" alone between the two asks as well.
    those = decide("Export those.", sets=[OVER_500, twin], today=TODAY)
    assert those.kind == "clarify"


def test_the_csv_has_exactly_the_rows_in_order() -> None:
    text = orders_csv(OVER_500.rows)
    parsed = list(csv.DictReader(io.StringIO(text)))
    assert [r["order_id"] for r in parsed] == ["9104", "9107", "9111"]
    assert list(parsed[0]) == ["order_id", "placed", "total", "status"]
    assert parsed[2] == {
        "order_id": "9111",
        "placed": "2026-10-23",
        "total": "515.50",
        "status": "delivered",
    }
    assert describe_set(OVER_500) == "3 orders over $500.00 placed Oct 19 – Oct 25"
