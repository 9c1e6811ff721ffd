"""The claim clock in business hours (parley/business_hours.py): it runs only while the team
works, across nights, weekends and daylight-saving changes; outside the hours the customer
hears when a person is back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError

from parley.business_hours import BusinessWeek, claim_deadline, local_text, next_opening
from parley.handoff_rules import HandoffRules

WEEKDAYS = dict.fromkeys(("mon", "tue", "wed", "thu", "fri"), "09:00-17:00")
BERLIN = BusinessWeek("Europe/Berlin", WEEKDAYS)
NEW_YORK = BusinessWeek("America/New_York", WEEKDAYS)


def at(zone: str, *parts: int) -> datetime:
    """A local wall-clock time in `zone`, as the UTC instant it is."""
    return datetime(*parts, tzinfo=ZoneInfo(zone)).astimezone(UTC)  # type: ignore[misc]


def test_within_the_hours_the_clock_runs_as_a_plain_timer() -> None:
    opened = at("Europe/Berlin", 2026, 6, 8, 10, 0)  # a Monday
    assert claim_deadline(BERLIN, opened, 30 * 60) == opened + timedelta(minutes=30)
    assert next_opening(BERLIN, opened) is None


def test_the_night_does_not_count() -> None:
    opened = at("Europe/Berlin", 2026, 6, 8, 16, 30)  # Monday, half an hour before closing
    assert claim_deadline(BERLIN, opened, 3600) == at("Europe/Berlin", 2026, 6, 9, 9, 30)


def test_the_weekend_does_not_count() -> None:
    friday = at("Europe/Berlin", 2026, 6, 12, 16, 30)
    assert claim_deadline(BERLIN, friday, 3600) == at("Europe/Berlin", 2026, 6, 15, 9, 30)
    saturday = at("Europe/Berlin", 2026, 6, 13, 11, 0)
    monday_nine = at("Europe/Berlin", 2026, 6, 15, 9, 0)
    assert next_opening(BERLIN, saturday) == monday_nine
    assert claim_deadline(BERLIN, saturday, 300) == monday_nine + timedelta(minutes=5)
    # Closing time itself is closed: the next day's opening.
    assert next_opening(BERLIN, at("Europe/Berlin", 2026, 6, 12, 17, 0)) == monday_nine


def test_a_weekend_with_the_spring_change_is_an_hour_shorter() -> None:
    # Europe moves its clocks forward on Sunday 29 March 2026: 09:30 on Monday is 07:30 UTC,
    # where on the Friday 09:00 was 08:00 UTC.
    friday = at("Europe/Berlin", 2026, 3, 27, 16, 30)
    due = claim_deadline(BERLIN, friday, 3600)
    assert due == datetime(2026, 3, 30, 7, 30, tzinfo=UTC)
    assert due - friday == timedelta(days=2, hours=16)  # 2 d 17 h on a weekend without it


def test_a_weekend_with_the_autumn_change_is_an_hour_longer() -> None:
    # New York moves its clocks back on Sunday 1 November 2026.
    friday = at("America/New_York", 2026, 10, 30, 16, 30)  # 20:30 UTC (EDT)
    due = claim_deadline(NEW_YORK, friday, 3600)
    assert due == datetime(2026, 11, 2, 14, 30, tzinfo=UTC)  # 09:30 EST
    assert due - friday == timedelta(days=2, hours=18)  # 2 d 17 h on a weekend without it


def test_a_long_timeout_spans_several_working_days() -> None:
    monday = at("America/New_York", 2026, 6, 8, 9, 0)
    assert claim_deadline(NEW_YORK, monday, 20 * 3600) == at("America/New_York", 2026, 6, 10, 13, 0)


def test_a_team_open_around_the_clock_is_a_plain_timer() -> None:
    always = BusinessWeek(
        "UTC", dict.fromkeys(("mon", "tue", "wed", "thu", "fri", "sat", "sun"), "00:00-24:00")
    )
    opened = datetime(2026, 6, 13, 23, 59, tzinfo=UTC)
    assert claim_deadline(always, opened, 7200) == opened + timedelta(hours=2)
    assert next_opening(always, opened) is None


def test_the_customer_reads_when_a_person_is_back_in_the_teams_time() -> None:
    back = at("Europe/Berlin", 2026, 6, 15, 9, 0)
    assert local_text(BERLIN, back) == "Monday 15 June at 09:00 (Europe/Berlin time)"


def test_a_tenants_hours_are_checked_as_its_config_is_saved() -> None:
    rules = HandoffRules.model_validate(
        {"business_hours": {"time_zone": "Europe/Berlin", "days": {"mon": "09:00-17:30"}}}
    )
    assert rules.week() == BusinessWeek("Europe/Berlin", {"mon": "09:00-17:30"})
    assert HandoffRules().week() is None
    for wrong in (
        {"time_zone": "Mars/Olympus", "days": {"mon": "09:00-17:00"}},
        {"time_zone": "UTC", "days": {}},
        {"time_zone": "UTC", "days": {"mon": "17:00-09:00"}},
        {"time_zone": "UTC", "days": {"mon": "9-17"}},
        {"time_zone": "UTC", "days": {"funday": "09:00-17:00"}},
    ):
        with pytest.raises(ValidationError):
            HandoffRules.model_validate({"business_hours": wrong})
