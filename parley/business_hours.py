"""A support team's weekly hours, and the claim clock that runs only while they are open.

A tenant names a time zone and its hours per weekday (`{"time_zone": "Europe/Berlin",
"days": {"mon": "09:00-17:00", ...}}`, in `handoff_rules.business_hours`). A case's claim
timeout then counts open time only: a case opened on Friday at 16:30 with 60 minutes to be
claimed is due on Monday at 09:30, not on Friday at 17:30. Outside the hours the customer is
told when a person will be back (`next_opening`).

Pure functions of an instant and the week, so the hand-off workflow computes its deadline
from `workflow.now()` deterministically (workflows/handoff.py). Local times are the zone's
wall clock (zoneinfo): a day's hours keep their local times across a daylight-saving change,
so the UTC length of a weekend or a night shifts by the hour the clock moved.
"""

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")  # as `date.weekday()` counts them
SPAN_PATTERN = r"^([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-4]):([0-5]\d)$"
_SPAN = re.compile(SPAN_PATTERN)
# How far ahead a deadline is looked for: a week with any hours reaches it well inside this.
_HORIZON_DAYS = 400


@dataclass(frozen=True)
class BusinessWeek:
    """What the workflow carries (its input): the zone and `"HH:MM-HH:MM"` per open day."""

    time_zone: str
    days: dict[str, str]


def check_span(span: str) -> tuple[time, time | None]:
    """A day's `"HH:MM-HH:MM"`, its end after its start (`24:00`: the day's end, None)."""
    match = _SPAN.match(span)
    if match is None:
        raise ValueError(f"{span!r} is not HH:MM-HH:MM")
    h1, m1, h2, m2 = (int(g) for g in match.groups())
    if (h2, m2) > (24, 0) or (h2, m2) <= (h1, m1):
        raise ValueError(f"{span!r} must end after it starts, within the day")
    return time(h1, m1), None if h2 == 24 else time(h2, m2)


def open_spans(week: BusinessWeek, start: datetime) -> Iterator[tuple[datetime, datetime]]:
    """The open hours (UTC, in order) from the local day of `start` on; the first may have
    begun before `start`."""
    zone = ZoneInfo(week.time_zone)
    first = start.astimezone(zone).date()
    for offset in range(_HORIZON_DAYS):
        day = first + timedelta(days=offset)
        span = week.days.get(DAYS[day.weekday()])
        if span:
            opens, closes = check_span(span)
            yield _utc(day, opens, zone), _utc_end(day, closes, zone)


def claim_deadline(week: BusinessWeek, start: datetime, seconds: float) -> datetime:
    """When `seconds` of open time have passed since `start` (UTC)."""
    left = timedelta(seconds=seconds)
    for opens, closes in open_spans(week, start):
        begin = max(opens, start)
        if closes <= begin:
            continue
        if begin + left <= closes:
            return begin + left
        left -= closes - begin
    raise ValueError("the week has no open hours")


def next_opening(week: BusinessWeek, at: datetime) -> datetime | None:
    """When the team is next open, if it is closed `at`; None while it is open."""
    for opens, closes in open_spans(week, at):
        if closes <= at:
            continue
        return None if opens <= at else opens
    raise ValueError("the week has no open hours")


def local_text(week: BusinessWeek, at: datetime) -> str:
    """`at` as the customer reads it: the weekday and time in the team's zone."""
    local = at.astimezone(ZoneInfo(week.time_zone))
    return f"{local:%A %d %B at %H:%M} ({week.time_zone} time)"


def _utc(day: date, at: time, zone: ZoneInfo) -> datetime:
    return datetime.combine(day, at, tzinfo=zone).astimezone(UTC)


def _utc_end(day: date, at: time | None, zone: ZoneInfo) -> datetime:
    if at is None:  # 24:00: the next day's midnight
        return _utc(day + timedelta(days=1), time(0), zone)
    return _utc(day, at, zone)
