"""The period a question names (parley/periods.py), which recall shows the lines of first."""

from __future__ import annotations

from datetime import date

from parley.periods import in_period, named_period

TODAY = date(2026, 12, 6)  # a Sunday


def test_a_named_month_with_or_without_its_year() -> None:
    assert named_period("What did Calvin buy in March 2023?", TODAY) == (
        date(2023, 3, 1),
        date(2023, 3, 31),
    )
    # A month without a year: the latest such month not after today.
    assert named_period("what happened in March?", TODAY) == (date(2026, 3, 1), date(2026, 3, 31))
    assert named_period("and in december", date(2026, 11, 2)) == (
        date(2025, 12, 1),
        date(2025, 12, 31),
    )


def test_a_named_day_in_either_order() -> None:
    assert named_period("his venture as of 1 May, 2023?", TODAY) == (date(2023, 5, 1),) * 2
    assert named_period("on May 8th 2023", TODAY) == (date(2023, 5, 8),) * 2


def test_periods_counted_back_from_the_day_asked() -> None:
    assert named_period("what did I order yesterday?", TODAY) == (date(2026, 12, 5),) * 2
    assert named_period("the parcel from last week", TODAY) == (
        date(2026, 11, 23),
        date(2026, 11, 29),
    )
    assert named_period("anything last month?", TODAY) == (date(2026, 11, 1), date(2026, 11, 30))
    assert named_period("what did we say in 2024", TODAY) == (date(2024, 1, 1), date(2024, 12, 31))


def test_no_period_and_may_the_verb() -> None:
    assert named_period("Where is my order?", TODAY) is None
    assert named_period("I may need a refund", TODAY) is None
    assert named_period("in 2031", TODAY) is None  # not yet


def test_a_recalled_lines_date_is_in_the_period_or_not() -> None:
    march = (date(2023, 3, 1), date(2023, 3, 31))
    assert in_period("2023-03-31", march)
    assert not in_period("2023-04-01", march)
    assert not in_period("", march)
