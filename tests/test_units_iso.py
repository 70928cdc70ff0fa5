"""``units.iso`` (every --json timestamp, a frame log's header and footer) gives the very
text datetime gives: its own arithmetic must not move a millisecond, a second or a day."""

from __future__ import annotations

from datetime import datetime, timezone

from hypothesis import example, given, settings
from hypothesis import strategies as st

from cuectl.units import iso


def datetime_iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# From 1900 to 9999, datetime's range; fractions near a microsecond's half and a second's end.
TIMESTAMPS = st.one_of(
    st.floats(min_value=-2.2e9, max_value=253402300799.0, allow_nan=False),
    st.builds(lambda s, half_us: s + half_us / 2e6, st.integers(0, 4_000_000_000), st.integers(0, 2_000_000)),
)


@settings(max_examples=3000)
@given(TIMESTAMPS)
@example(1e9 + 0.9999995)  # rounds up into the next second
@example(1733000000.9999996)
@example(1e9 + 0.0000005)  # half a microsecond: to even (down)
@example(1e9 + 0.0000015)  # to even (up)
@example(-1.0000005)  # before 1970
@example(0.0)
def test_iso_is_datetimes_text(ts: float) -> None:
    assert iso(ts) == datetime_iso(ts)


def test_iso_of_consecutive_seconds_and_none() -> None:
    # the second's text is kept between calls: the next second must not reuse it
    assert iso(86399.9994) == "1970-01-01T23:59:59.999Z"
    assert iso(86400.0) == "1970-01-02T00:00:00.000Z"
    assert iso(86399.5) == "1970-01-01T23:59:59.500Z"
    assert iso(None) is None
