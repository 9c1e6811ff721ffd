"""The period a message names, as a range of days: "in March 2023", "on 8 May, 2023", "last
week", "yesterday", "in 2022". Recall ranks the lines said in that period first
(activities/recall.py), so a question about "last March" finds what was said then, not what
was said most recently with the same words.

Relative periods count back from `today`, the day the question was asked. A month without a
year is the latest such month not after `today`. Only the first period named counts; a
message that names none gives None.
"""

from __future__ import annotations

import calendar
import re
from datetime import date, timedelta

_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
_MONTHS |= {name.lower(): i for i, name in enumerate(calendar.month_abbr) if name}
_MONTH = "|".join(sorted(_MONTHS, key=len, reverse=True))
_DAY_MONTH = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+({_MONTH})\b\.?,?\s*(\d{{4}})?", re.I)
_MONTH_DAY = re.compile(rf"\b({_MONTH})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?\b,?\s*(\d{{4}})?", re.I)
_MONTH_YEAR = re.compile(rf"\b({_MONTH})\b\.?,?\s*(\d{{4}})?", re.I)
_YEAR = re.compile(r"\b(?:in|during|of|since)\s+((?:19|20)\d\d)\b", re.I)
_RELATIVE = re.compile(r"\b(yesterday|today|(?:last|this|past)\s+(?:week|month|year))\b", re.I)

Period = tuple[date, date]  # the first and the last day, both included


def named_period(text: str, today: date) -> Period | None:
    """The days the message's first named period covers, or None."""
    for find in (_day, _month, _relative, _year):
        found = find(text, today)
        if found is not None:
            return found
    return None


def _day(text: str, today: date) -> Period | None:
    for pattern, day_at, month_at in ((_DAY_MONTH, 1, 2), (_MONTH_DAY, 2, 1)):
        m = pattern.search(text)
        if m is None:
            continue
        month, year = _MONTHS[m.group(month_at).lower()], _year_of(m.group(3), today)
        try:
            day = date(year, month, int(m.group(day_at)))
        except ValueError:
            continue
        return day, day
    return None


def _month(text: str, today: date) -> Period | None:
    m = _MONTH_YEAR.search(text)
    if m is None or (m.group(1).lower() == "may" and m.group(2) is None):
        return None  # "may" alone is a verb far more often than a month
    month = _MONTHS[m.group(1).lower()]
    year = int(m.group(2)) if m.group(2) else today.year - (month > today.month)
    return date(year, month, 1), date(year, month, calendar.monthrange(year, month)[1])


def _relative(text: str, today: date) -> Period | None:
    m = _RELATIVE.search(text)
    if m is None:
        return None
    words = m.group(1).lower().split()
    if words == ["yesterday"]:
        day = today - timedelta(days=1)
        return day, day
    if words == ["today"]:
        return today, today
    which, unit = words
    if unit == "week":
        start = today - timedelta(days=today.weekday())
        if which == "this":
            return start, today
        return start - timedelta(days=7), start - timedelta(days=1)
    if unit == "month":
        start = today.replace(day=1)
        if which == "this":
            return start, today
        last = start - timedelta(days=1)
        return last.replace(day=1), last
    if which == "this":
        return date(today.year, 1, 1), today
    return date(today.year - 1, 1, 1), date(today.year - 1, 12, 31)


def _year(text: str, today: date) -> Period | None:
    m = _YEAR.search(text)
    if m is None or int(m.group(1)) > today.year:
        return None
    year = int(m.group(1))
    return date(year, 1, 1), date(year, 12, 31)


def _year_of(found: str | None, today: date) -> int:
    return int(found) if found else today.year


def in_period(day: str, period: Period) -> bool:
    """Whether an ISO date (a recalled line's) is in the period."""
    try:
        when = date.fromisoformat(day)
    except ValueError:
        return False
    return period[0] <= when <= period[1]
