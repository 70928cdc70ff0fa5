"""A worker's availability window: ``cuectl worker --available "Mon-Fri 19:00-08:00, Sat-Sun"``.

A workstation lent to the farm at night must stop taking new frames when its owner comes
back in the morning; a running frame is left alone (the worker decides that, not this
module). Everything here is a pure function of the text and the datetime it is asked
about, so the worker loop, pending reasons and tests all agree.

Grammar (case-insensitive; spaces around ``-`` are allowed)::

    schedule := entry ("," entry)*
    entry    := DAYS [HH:MM-HH:MM] | HH:MM-HH:MM
    DAYS     := DAY | DAY-DAY | "*" | "daily"
    DAY      := Mon..Sun | Monday..Sunday

- A day range is inclusive and may wrap: ``Fri-Mon`` is Fri, Sat, Sun, Mon; ``Mon-Mon`` is
  Monday alone, and a range of all seven days is written back as ``daily``.
- No time range means the whole day; no days means every day.
- A time range whose end is not after its start crosses midnight and belongs to the day it
  starts on: ``Mon-Fri 19:00-08:00`` covers Mon 19:00 .. Tue 08:00, …, Fri 19:00 .. Sat
  08:00 — and *not* Mon 00:00 .. 08:00 (that is Sunday night's part, open only if Sunday is
  listed). ``08:00-08:00`` is 24 hours from 08:00. ``24:00`` is allowed as an end only.
- The window repeats weekly, minute by minute, in local wall-clock time: the datetime asked
  about is read through its wall-clock fields (weekday, hour, minute) whether naive or
  aware, so a host's schedule follows its own clock across DST changes.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Callable

from cuectl.errors import InvalidInput

DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_FULL_NAMES = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_DAY_BY_NAME = {**{n.lower(): i for i, n in enumerate(DAY_NAMES)}, **{n: i for i, n in enumerate(_FULL_NAMES)}}
_EVERY_DAY = ("*", "daily")

MINUTES_PER_DAY = 24 * 60
MINUTES_PER_WEEK = 7 * MINUTES_PER_DAY

_TIME_RE = re.compile(r"(\d{1,2}):(\d{2})")
# The error factory each parser gets, so that every message names the whole entry.
_Bad = Callable[[str], InvalidInput]
_EXAMPLE = "use e.g. 'Mon-Fri 19:00-08:00, Sat-Sun'"


@dataclass(frozen=True)
class Entry:
    """One comma-separated part of a schedule: some weekdays and one time range on each.

    ``days`` are weekday numbers (Monday = 0, as ``datetime.weekday``); ``start`` and
    ``end`` are minutes after midnight, ``end`` in 1..1440. ``end <= start`` means the
    range ends the next day. ``days_text`` is the normalised spelling of the days.
    """

    days: tuple[int, ...]
    start: int = 0
    end: int = MINUTES_PER_DAY
    days_text: str = "daily"

    def whole_day(self) -> bool:
        return self.start == 0 and self.end == MINUTES_PER_DAY

    def describe(self) -> str:
        """Normalised text: the whole day is written without a time range."""
        if self.whole_day():
            return self.days_text
        return f"{self.days_text} {_hhmm(self.start)}-{_hhmm(self.end)}"

    def minutes(self) -> list[tuple[int, int]]:
        """Half-open intervals in minutes of the week; may end past the week (wraps)."""
        out = []
        for day in self.days:
            begin = day * MINUTES_PER_DAY + self.start
            finish = day * MINUTES_PER_DAY + self.end
            if self.end <= self.start:
                finish += MINUTES_PER_DAY
            out.append((begin, finish))
        return out


@dataclass(frozen=True)
class Schedule:
    """A weekly availability window; build it with ``parse_schedule``."""

    entries: tuple[Entry, ...]
    # One byte per minute of the week (1 = open) and the minutes where the state flips:
    # 10 KiB buys trivially correct unions of overlapping and wrapping entries.
    _open: bytes = field(init=False, repr=False, compare=False)
    _changes: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        week = bytearray(MINUTES_PER_WEEK)
        for entry in self.entries:
            for begin, finish in entry.minutes():
                for minute in range(begin, finish):
                    week[minute % MINUTES_PER_WEEK] = 1
        changes = tuple(m for m in range(MINUTES_PER_WEEK) if week[m] != week[m - 1])
        object.__setattr__(self, "_open", bytes(week))
        object.__setattr__(self, "_changes", changes)

    def is_open(self, when: datetime) -> bool:
        """Whether the worker may take new frames at ``when`` (its wall-clock fields)."""
        return bool(self._open[_minute_of_week(when)])

    def next_change(self, when: datetime) -> datetime | None:
        """The first moment after ``when`` at which ``is_open`` flips, or None if it never does.

        The result keeps ``when``'s tzinfo and is computed in wall-clock minutes (adding a
        timedelta to an aware datetime does that), so it names the local time the schedule
        text says, e.g. 19:00, even across a DST change.
        """
        if not self._changes:
            return None
        now = _minute_of_week(when)
        i = bisect_right(self._changes, now)
        target = self._changes[i] if i < len(self._changes) else self._changes[0] + MINUTES_PER_WEEK
        return when.replace(second=0, microsecond=0) + timedelta(minutes=target - now)

    def closed_reason(self, when: datetime) -> str | None:
        """A pending reason while closed, e.g. ``outside the host's schedule (opens Mon 19:00)``.

        None while open. The form is stable so that the worker can show it as is.
        """
        if self.is_open(when):
            return None
        opens = self.next_change(when)
        if opens is None:
            return "outside the host's schedule (never open)"
        return f"outside the host's schedule (opens {DAY_NAMES[opens.weekday()]} {opens:%H:%M})"

    def always_open(self) -> bool:
        return not self._changes and bool(self._open[0])

    def describe(self) -> str:
        """The schedule in normalised text; ``parse_schedule`` of it gives the same window."""
        return ", ".join(entry.describe() for entry in self.entries)


def parse_schedule(text: str, *, field: str = "--available") -> Schedule:
    """Parse the ``--available`` text; InvalidInput (one line) names the bad entry and why."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput(f"{field}: empty schedule ({_EXAMPLE})")
    return Schedule(tuple(_parse_entry(raw, field) for raw in text.split(",")))


def _parse_entry(raw: str, field: str) -> Entry:
    shown = " ".join(raw.split())
    if not shown:
        raise InvalidInput(f"{field}: empty entry between commas ({_EXAMPLE})")

    def bad(why: str) -> InvalidInput:
        return InvalidInput(f"{field}: bad entry {shown!r}: {why}")

    tokens = re.sub(r"\s*-\s*", "-", shown).split(" ")
    if len(tokens) > 2:
        raise bad(f"expected DAYS [HH:MM-HH:MM] ({_EXAMPLE})")
    days_token: str | None = tokens[0]
    time_token: str | None = tokens[1] if len(tokens) == 2 else None
    if len(tokens) == 1 and ":" in tokens[0]:
        days_token, time_token = None, tokens[0]
    if days_token is not None and ":" in days_token:
        raise bad("the days come before the time range")
    days, days_text = _parse_days(days_token, bad) if days_token is not None else (tuple(range(7)), "daily")
    if time_token is None:
        return Entry(days, 0, MINUTES_PER_DAY, days_text)
    start, end = _parse_time_range(time_token, bad)
    return Entry(days, start, end, days_text)


def _parse_days(token: str, bad: _Bad) -> tuple[tuple[int, ...], str]:
    """``Mon`` / ``Mon-Fri`` / ``Fri-Mon`` / ``*`` / ``daily`` -> weekdays and normal text."""
    if token.lower() in _EVERY_DAY:
        return tuple(range(7)), "daily"
    names = token.split("-")
    if len(names) > 2 or not all(names):
        raise bad(f"bad day range {token!r} (use a day like Mon, a range like Mon-Fri, or daily)")
    numbers = []
    for name in names:
        number = _DAY_BY_NAME.get(name.lower())
        if number is None:
            raise bad(f"unknown day {name!r} (use Mon..Sun or Monday..Sunday)")
        numbers.append(number)
    first, last = numbers[0], numbers[-1]
    count = (last - first) % 7 + 1
    days = tuple((first + k) % 7 for k in range(count))
    if count == 7:
        return days, "daily"
    if count == 1:
        return days, DAY_NAMES[first]
    return days, f"{DAY_NAMES[first]}-{DAY_NAMES[last]}"


def _parse_time_range(token: str, bad: _Bad) -> tuple[int, int]:
    parts = token.split("-")
    if len(parts) != 2 or not all(parts):
        raise bad(f"bad time range {token!r} (use HH:MM-HH:MM, e.g. 19:00-08:00)")
    start = _parse_time(parts[0], bad)
    end = _parse_time(parts[1], bad)
    if start == MINUTES_PER_DAY:
        raise bad("a time range cannot start at 24:00 (use 00:00 of the next day)")
    if end == 0:
        end = MINUTES_PER_DAY  # "-00:00" is midnight at the end of the day: same as 24:00
    return start, end


def _parse_time(text: str, bad: _Bad) -> int:
    m = _TIME_RE.fullmatch(text)
    if not m:
        raise bad(f"bad time {text!r} (use HH:MM, 00:00 to 24:00)")
    hours, minutes = int(m.group(1)), int(m.group(2))
    if minutes > 59 or hours > 24 or (hours == 24 and minutes):
        raise bad(f"bad time {text!r} (use HH:MM, 00:00 to 24:00)")
    return hours * 60 + minutes


def _minute_of_week(when: datetime) -> int:
    return when.weekday() * MINUTES_PER_DAY + when.hour * 60 + when.minute


def _hhmm(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"
