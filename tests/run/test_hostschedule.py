"""The worker's ``--available`` window: grammar, midnight and week wraps, next change."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuectl.errors import InvalidInput
from cuectl.run.hostschedule import DAY_NAMES, parse_schedule

# 2024-01-01 is a Monday: day(0) is Mon, day(6) is Sun, day(7) the next Monday.
MONDAY = datetime(2024, 1, 1)


def at(day: int, hhmm: str, second: int = 0) -> datetime:
    h, m = map(int, hhmm.split(":"))
    return MONDAY + timedelta(days=day, hours=h, minutes=m, seconds=second)


def open_days_hours(text: str) -> set[tuple[str, int]]:
    """(day, hour) pairs open at hh:30 — a compact picture of a window for assertions."""
    s = parse_schedule(text)
    return {(DAY_NAMES[d], h) for d in range(7) for h in range(24) if s.is_open(at(d, f"{h}:30"))}


# --------------------------------------------------------------------------- examples


def test_the_flag_example() -> None:
    s = parse_schedule("Mon-Fri 19:00-08:00, Sat-Sun")
    assert not s.is_open(at(0, "07:59"))  # Monday morning belongs to Sunday night: listed as whole Sun
    assert s.is_open(at(0, "19:00"))
    assert not s.is_open(at(0, "18:59"))
    assert s.is_open(at(1, "07:59"))
    assert not s.is_open(at(1, "08:00"))
    assert s.is_open(at(4, "23:00"))
    assert s.is_open(at(5, "12:00"))  # Saturday whole day
    assert s.is_open(at(6, "23:59"))
    assert s.describe() == "Mon-Fri 19:00-08:00, Sat-Sun"


def test_overnight_range_belongs_to_its_start_day() -> None:
    s = parse_schedule("Mon-Fri 19:00-08:00")
    assert not s.is_open(at(0, "03:00"))  # Mon 00:00-08:00 would be Sunday's night
    assert s.is_open(at(1, "03:00"))  # Mon night
    assert s.is_open(at(5, "07:59"))  # Fri night runs into Saturday
    assert not s.is_open(at(5, "08:00"))
    assert not s.is_open(at(6, "03:00"))


def test_sunday_night_wraps_into_monday() -> None:
    s = parse_schedule("Sun 22:00-06:00")
    assert s.is_open(at(6, "22:00"))
    assert s.is_open(at(7, "05:59"))  # next Monday
    assert s.is_open(at(0, "05:59"))  # the same weekly window seen on any Monday
    assert not s.is_open(at(0, "06:00"))
    assert s.next_change(at(0, "01:00")) == at(0, "06:00")
    assert s.next_change(at(0, "06:00")) == at(6, "22:00")


def test_wrapping_day_range() -> None:
    assert {d for d, _ in open_days_hours("Fri-Mon")} == {"Fri", "Sat", "Sun", "Mon"}
    assert parse_schedule("fri-mon").describe() == "Fri-Mon"
    assert parse_schedule("Sat-Sat").describe() == "Sat"
    assert parse_schedule("Tue-Mon").describe() == "daily"


def test_24_00_and_midnight_ends() -> None:
    s = parse_schedule("Mon 18:00-24:00")
    assert s.is_open(at(0, "23:59"))
    assert not s.is_open(at(1, "00:00"))
    assert s.next_change(at(0, "20:00")) == at(1, "00:00")
    assert parse_schedule("Mon 18:00-00:00").describe() == "Mon 18:00-24:00"
    assert parse_schedule("Mon 00:00-24:00").describe() == "Mon"
    assert parse_schedule("Mon 00:00-00:00").describe() == "Mon"


def test_equal_start_and_end_is_a_full_24_hours() -> None:
    s = parse_schedule("Wed 08:00-08:00")
    assert s.is_open(at(2, "08:00")) and s.is_open(at(3, "07:59"))
    assert not s.is_open(at(3, "08:00")) and not s.is_open(at(2, "07:59"))


def test_times_without_days_mean_every_day() -> None:
    s = parse_schedule("19:00-08:00")
    assert s.describe() == "daily 19:00-08:00"
    for day in range(7):
        assert s.is_open(at(day, "02:00")) and s.is_open(at(day, "19:00"))
        assert not s.is_open(at(day, "12:00"))
    assert parse_schedule("19:00-08:00") == parse_schedule("* 19:00-08:00") == parse_schedule("Daily 19:00-08:00")


def test_spelling_is_forgiving_and_normalised() -> None:
    s = parse_schedule("  monday - FRIDAY  9:00 - 17:30 ,SUNDAY")
    assert s.describe() == "Mon-Fri 09:00-17:30, Sun"
    assert parse_schedule(s.describe()) == s
    assert parse_schedule("Mon-Sun").describe() == "daily"


def test_always_open_has_no_next_change() -> None:
    for text in (
        "daily",
        "*",
        "Mon-Sun",
        "00:00-00:00",
        "Mon-Fri, Sat-Sun",
        "Sat 12:00-12:00, Sun-Fri, Sat 00:00-12:00",
    ):
        s = parse_schedule(text)
        assert s.always_open(), text
        assert s.next_change(at(3, "10:00")) is None
        assert s.closed_reason(at(3, "10:00")) is None
    # Sun 12:00-12:00 runs into Monday: Sunday morning stays closed.
    s = parse_schedule("Sun 12:00-12:00, Mon-Sat")
    assert not s.always_open() and not s.is_open(at(6, "11:59"))
    assert s.closed_reason(at(6, "11:59")) == "outside the host's schedule (opens Sun 12:00)"


def test_overlapping_entries_union() -> None:
    s = parse_schedule("Mon 08:00-12:00, Mon 10:00-14:00")
    assert s.is_open(at(0, "13:59")) and not s.is_open(at(0, "14:00"))
    assert s.next_change(at(0, "09:00")) == at(0, "14:00")


def test_next_change_and_reason() -> None:
    s = parse_schedule("Mon-Fri 19:00-08:00, Sat-Sun")
    assert s.closed_reason(at(0, "10:00")) == "outside the host's schedule (opens Mon 19:00)"
    assert s.closed_reason(at(0, "20:00")) is None
    assert s.next_change(at(0, "10:00", second=42)) == at(0, "19:00")
    # Fri night runs into the weekend; Sunday ends at Mon 00:00 (Mon 00:00-08:00 is not listed).
    assert s.next_change(at(4, "20:00")) == at(7, "00:00")
    assert s.closed_reason(at(2, "12:00")) == "outside the host's schedule (opens Wed 19:00)"


def test_aware_datetimes_use_their_wall_clock() -> None:
    s = parse_schedule("Mon-Fri 19:00-08:00")
    tz = ZoneInfo("Europe/Berlin")
    when = datetime(2024, 1, 1, 10, 0, tzinfo=tz)  # Monday 10:00 local
    assert not s.is_open(when)
    nxt = s.next_change(when)
    assert nxt is not None and nxt.tzinfo is tz and (nxt.hour, nxt.minute, nxt.weekday()) == (19, 0, 0)
    # The same instant in UTC is 09:00 on the UTC clock: still the caller's clock that counts.
    assert not s.is_open(when.astimezone(timezone.utc))
    # Across the spring DST change (2024-03-31, Sunday): Monday 19:00 local still.
    s2 = parse_schedule("Mon 19:00-20:00")
    sunday = datetime(2024, 3, 31, 1, 0, tzinfo=tz)
    nxt = s2.next_change(sunday)
    assert nxt is not None and (nxt.month, nxt.day, nxt.hour, nxt.minute) == (4, 1, 19, 0)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "empty schedule"),
        ("   ", "empty schedule"),
        ("Mon,", "empty entry"),
        ("Mon,,Tue", "empty entry"),
        ("Mun", "unknown day 'Mun'"),
        ("Mon-Fry 19:00-08:00", "unknown day 'Fry'"),
        ("Mon-Tue-Wed", "bad day range"),
        ("Mon 25:00-08:00", "bad time '25:00'"),
        ("Mon 19:60-08:00", "bad time '19:60'"),
        ("Mon 24:30-08:00", "bad time '24:30'"),
        ("Mon 24:00-08:00", "cannot start at 24:00"),
        ("Mon 19:00", "bad time range '19:00'"),
        ("Mon 7pm-8am", "bad time '7pm'"),
        ("Mon 19:00-08:00 extra", "expected DAYS [HH:MM-HH:MM]"),
        ("19:00-08:00 Mon", "days come before"),
        ("Mon 1900-0800", "bad time '1900'"),
    ],
)
def test_bad_input_names_the_bad_part(text: str, fragment: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_schedule(text)
    message = str(info.value)
    assert message.startswith("--available: ") and fragment in message
    assert "\n" not in message and info.value.exit_code == 2


def test_bad_entry_is_named_whole() -> None:
    with pytest.raises(InvalidInput, match=r"bad entry 'Mon-Fry 19:00-08:00'"):
        parse_schedule("Sat-Sun, Mon-Fry 19:00-08:00")


def test_field_name_is_the_callers() -> None:
    with pytest.raises(InvalidInput, match=r"^available: empty"):
        parse_schedule("", field="available")


# --------------------------------------------------------------------------- properties

_days = st.sampled_from(["Mon", "tue", "Wednesday", "THU", "Fri", "sat", "Sunday", "*", "daily"])
_time = st.tuples(st.integers(0, 23), st.integers(0, 59)).map(lambda t: f"{t[0]:02d}:{t[1]:02d}")
_end = st.one_of(_time, st.just("24:00"))


@st.composite
def _entry(draw: st.DrawFn) -> str:
    first = draw(_days)
    days = first
    if first not in ("*", "daily") and draw(st.booleans()):
        second = draw(_days.filter(lambda d: d not in ("*", "daily")))
        days = f"{first}-{second}"
    times = f"{draw(_time)}-{draw(_end)}" if draw(st.booleans()) else None
    if times is None:
        return days
    return times if draw(st.integers(0, 4)) == 0 else f"{days} {times}"


schedules = st.lists(_entry(), min_size=1, max_size=4).map(", ".join)
moments = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1))


@settings(max_examples=300, deadline=None)
@given(schedules, moments)
def test_state_is_constant_until_next_change_and_flips_there(text: str, when: datetime) -> None:
    s = parse_schedule(text)
    state = s.is_open(when)
    nxt = s.next_change(when)
    if nxt is None:
        assert s.always_open()
        for minutes in range(0, 7 * 24 * 60, 97):
            assert s.is_open(when + timedelta(minutes=minutes)) == state
        return
    assert when < nxt <= when + timedelta(days=7)
    assert (nxt.second, nxt.microsecond) == (0, 0)
    assert s.is_open(nxt) != state
    assert s.is_open(nxt - timedelta(microseconds=1)) == state
    step = max(timedelta(minutes=1), (nxt - when) / 50)
    t = when
    while t < nxt:
        assert s.is_open(t) == state
        t += step


@settings(max_examples=200, deadline=None)
@given(schedules, moments)
def test_describe_round_trips(text: str, when: datetime) -> None:
    s = parse_schedule(text)
    again = parse_schedule(s.describe())
    assert again.describe() == s.describe()
    assert again.is_open(when) == s.is_open(when)
    assert again.next_change(when) == s.next_change(when)


@settings(max_examples=200, deadline=None)
@given(schedules, moments)
def test_window_repeats_weekly(text: str, when: datetime) -> None:
    s = parse_schedule(text)
    assert s.is_open(when) == s.is_open(when + timedelta(weeks=1))
