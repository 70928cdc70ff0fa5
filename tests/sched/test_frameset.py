"""Frame ranges: the OpenCue FrameSet contract (DESIGN §4), limits, chunks, #FRAMESPEC#."""

from __future__ import annotations

import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cuectl.errors import InvalidInput
from cuectl.sched.frameset import MAX_FRAME, chunk_frames, compact_range, count_frameset, parse_frameset

# --------------------------------------------------------------------------------------
# Examples: the contract vectors


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", [1]),
        ("0", [0]),
        ("-3", [-3]),
        ("1-4", [1, 2, 3, 4]),
        ("4-1", [4, 3, 2, 1]),
        ("1-10x3", [1, 4, 7, 10]),
        ("1-9x2", [1, 3, 5, 7, 9]),
        ("1-10x4", [1, 5, 9]),
        ("10-1x-3", [10, 7, 4, 1]),  # a descending range takes a negative step (Cuebot)
        ("1-10y3", [2, 3, 5, 6, 8, 9]),
        ("10-1y-3", [9, 8, 6, 5, 3, 2]),
        ("1-10:5", [1, 6, 3, 5, 7, 9, 2, 4, 8, 10]),  # DESIGN §4, verbatim
        ("1-10:3", [1, 4, 7, 10, 2, 3, 5, 6, 8, 9]),  # 3 halves to 1 directly
        ("1-5:1", [1, 2, 3, 4, 5]),
        ("1-20:8", [1, 9, 17, 5, 13, 3, 7, 11, 15, 19, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20]),
        ("-5--1", [-5, -4, -3, -2, -1]),
        ("-1--5", [-1, -2, -3, -4, -5]),
        ("-3-3", [-3, -2, -1, 0, 1, 2, 3]),
        ("3--3x-3", [3, 0, -3]),
        ("5-5", [5]),
        ("5-5x7", [5]),
        ("1,3,8-10", [1, 3, 8, 9, 10]),
        (" 1-3 , 7 ", [1, 2, 3, 7]),
        ("\t1-3,\n5", [1, 2, 3, 5]),
        ("5,1-6", [5, 1, 2, 3, 4, 6]),  # duplicates dropped, first occurrence wins
        ("1-3,3-1", [1, 2, 3]),
        ("1-10x2,1-10y2", [1, 3, 5, 7, 9, 2, 4, 6, 8, 10]),
        ("007", [7]),
        (f"{MAX_FRAME}", [MAX_FRAME]),
        (f"-{MAX_FRAME}", [-MAX_FRAME]),
    ],
)
def test_parse_examples(text: str, expected: list[int]) -> None:
    assert parse_frameset(text) == expected


def test_int_input_is_accepted_as_a_single_frame() -> None:
    assert parse_frameset(12) == [12]  # type: ignore[arg-type]  # YAML `range: 12`


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1-10,1-x", "invalid frame range section '1-x' in '1-10,1-x'"),
        ("abc", "invalid frame range section 'abc' in 'abc'"),
        ("1-10x0", "the step cannot be zero"),
        ("1-10:0", "the step cannot be zero"),
        ("1-10y0", "the step cannot be zero"),
        ("1-10x-2", "a negative step needs a range that counts down"),
        ("10-1x3", "a range that counts down needs a negative step"),
        ("1-10x", "invalid frame range section '1-10x'"),
        ("1x2", "invalid frame range section '1x2'"),
        ("1-2-3", "invalid frame range section '1-2-3'"),
        ("1 - 3", "invalid frame range section '1 - 3'"),
        ("1-10X2", "invalid frame range section '1-10X2'"),
        ("1,,2", "empty section"),
        (",1-3", "empty section"),  # a trailing comma is ignored, as in Cuebot
        ("", "empty frame range"),
        ("   ", "empty frame range"),
        ("1-10y1", "has no frames"),
        ("1-1y5", "has no frames"),
        ("٣", "invalid frame range section"),  # a non-ASCII digit is not a frame number
        (str(MAX_FRAME + 1), "must be within"),
        ("1-" + "9" * 5000, "must be within"),  # int() would raise ValueError past 4300 digits
        ("0" * 5000 + "1", None),  # leading zeros are fine, however many
    ],
)
def test_parse_errors_name_the_section(text: str, message: str | None) -> None:
    if message is None:
        assert parse_frameset(text) == [1]
        return
    with pytest.raises(InvalidInput) as info:
        parse_frameset(text)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_long_input_is_clipped_in_messages() -> None:
    text = ",".join(str(i) for i in range(5000)) + ",oops"
    with pytest.raises(InvalidInput) as info:
        parse_frameset(text)
    assert "'oops'" in str(info.value)
    assert len(str(info.value)) < 300


def test_non_string_input_is_invalid_input() -> None:
    for value in (None, 1.5, True, [1, 2]):
        with pytest.raises(InvalidInput):
            parse_frameset(value)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------
# Limits: refuse without allocating


def test_huge_range_is_refused_at_once_with_tiny_memory() -> None:
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(InvalidInput) as info:
            parse_frameset("1-1000000000", limit=100_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < 20  # a bound on a blow-up, not a speed measure
    assert peak < 1_000_000
    assert (
        str(info.value) == "frame range '1-1000000000' has 1000000000 frames; the limit is 100000 (CUECTL_FRAME_LIMIT)"
    )


def test_huge_section_among_others_is_a_lower_bound() -> None:
    with pytest.raises(InvalidInput, match="has at least 999999 frames; the limit is 1000"):
        parse_frameset("1-5,1-999999", limit=1000)


def test_sum_of_sections_over_limit_is_caught_while_expanding() -> None:
    assert len(parse_frameset("1-600,601-1000", limit=1000)) == 1000
    with pytest.raises(InvalidInput, match="has more than 1000 frames; the limit is 1000"):
        parse_frameset("1-600,601-1001", limit=1000)


def test_overlap_within_limit_is_accepted() -> None:
    assert parse_frameset("1-1000,1-1000,500-1000", limit=1000) == list(range(1, 1001))


def test_pathological_repeats_are_refused_without_expanding() -> None:
    text = ",".join(["1-1000"] * 11)  # 11x the limit in repeats, 1000 distinct
    started = time.perf_counter()
    with pytest.raises(InvalidInput, match="lists 11000 frames counting repeats"):
        parse_frameset(text, limit=1000)
    assert time.perf_counter() - started < 20  # a bound on a blow-up, not a speed measure


def test_sparse_huge_span_costs_nothing() -> None:
    # The span is huge but the frames are few: only the frame count matters.
    started = time.perf_counter()
    assert parse_frameset(f"0-{MAX_FRAME}x1000000000", limit=10) == [0, 1_000_000_000, 2_000_000_000]
    with pytest.raises(InvalidInput, match="has no frames"):  # y1 leaves nothing: no walk of the span
        parse_frameset(f"0-{MAX_FRAME}y1", limit=10)
    assert time.perf_counter() - started < 20  # a bound on a blow-up, not a speed measure


def test_default_limit_comes_from_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUECTL_FRAME_LIMIT", "10")
    assert len(parse_frameset("1-10")) == 10
    with pytest.raises(InvalidInput, match="the limit is 10 "):
        parse_frameset("1-11")
    monkeypatch.delenv("CUECTL_FRAME_LIMIT")
    assert len(parse_frameset("1-100000")) == 100_000
    with pytest.raises(InvalidInput, match="the limit is 100000"):
        parse_frameset("1-100001")


# --------------------------------------------------------------------------------------
# count_frameset, chunk_frames, compact_range


@pytest.mark.parametrize(
    ("text", "count"),
    [("1", 1), ("1-10", 10), ("1-10x3", 4), ("1-10y3", 6), ("1-10:5", 10), ("1-1000000000", 10**9), ("1-3,2-4", 6)],
)
def test_count_is_arithmetic(text: str, count: int) -> None:
    assert count_frameset(text) == count


def test_count_rejects_bad_syntax() -> None:
    with pytest.raises(InvalidInput, match="'1-x'"):
        count_frameset("1-x")


def test_chunk_frames() -> None:
    assert chunk_frames([1, 2, 3, 4, 5], 2) == [(1, 2), (3, 4), (5,)]
    assert chunk_frames([1, 6, 3], 1) == [(1,), (6,), (3,)]
    assert chunk_frames([1, 2], 10) == [(1, 2)]
    assert chunk_frames([], 3) == []
    for bad in (0, -1, True, 1.5):
        with pytest.raises(InvalidInput, match="chunk size"):
            chunk_frames([1], bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("frames", "text"),
    [
        ([1, 2, 3, 4], "1-4"),
        ([1, 3, 5, 7, 9], "1-9x2"),
        ([1, 3, 8, 9, 10], "1,3,8-10"),
        ([4, 3, 2, 1], "4-1"),
        ([9, 6, 3], "9-3x-3"),
        ([10, 9, 8], "10-8"),  # Cuebot writes "10-8x-1": same frames (docs/opencue.md)
        ([-5, -4, -3], "-5--3"),
        ([-3, -2, -1, 0, 1], "-3-1"),
        ([1, 2], "1-2"),  # as Cuebot's getChunk
        ([2, 1], "2,1"),
        ([1, 3], "1,3"),
        ([7], "7"),
        ([], ""),
        ([1, 2, 3, 10, 20, 30, 31], "1-3,10-30x10,31"),
    ],
)
def test_compact_range_examples(frames: list[int], text: str) -> None:
    assert compact_range(frames) == text
    if frames:
        assert parse_frameset(text) == frames


# --------------------------------------------------------------------------------------
# Properties

FRAMES = st.integers(min_value=-300, max_value=300)
STEPS = st.integers(min_value=1, max_value=40)
BIG = 10**9  # limit for property runs: never the reason a case fails


def _signed(a: int, b: int, s: int) -> int:
    """The step S pointed the way A-B counts (Cuebot refuses a step that points away)."""
    return s if b >= a else -s


def _inclusive(a: int, b: int) -> list[int]:
    return list(range(a, b + 1)) if b >= a else list(range(a, b - 1, -1))


def _progressions() -> st.SearchStrategy[list[int]]:
    """Distinct lists made of arithmetic runs (what real chunks look like) plus noise."""
    run = st.tuples(FRAMES, st.integers(-7, 7), st.integers(1, 12)).map(
        lambda t: [t[0] + t[1] * i for i in range(t[2])]
    )
    return st.lists(st.one_of(run, st.lists(FRAMES, max_size=3)), max_size=8).map(
        lambda parts: list(dict.fromkeys(f for part in parts for f in part))
    )


@given(st.one_of(st.lists(st.integers(-(10**6), 10**6), unique=True, max_size=40), _progressions()))
def test_compact_range_round_trips(frames: list[int]) -> None:
    text = compact_range(frames)
    if frames:
        assert parse_frameset(text, limit=BIG) == frames
        assert count_frameset(text) == len(frames)  # compact output never overlaps itself
        assert len(text) <= len(",".join(map(str, frames)))  # never longer than a plain list
    else:
        assert text == ""


_SECTION_CHARS = st.sampled_from(list("0123456789-,xy: ") + ["1-10", "-", "x0", ":2", "\n", "٣", "9" * 12])


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=40), st.lists(_SECTION_CHARS, max_size=20).map("".join)))
def test_parse_only_ever_raises_invalid_input(text: str) -> None:
    try:
        frames = parse_frameset(text, limit=10_000)
    except InvalidInput as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert frames and len(frames) == len(set(frames)) <= 10_000
    assert len(frames) <= count_frameset(text)  # the count is an upper bound


@given(FRAMES, FRAMES, STEPS)
def test_x_and_y_partition_the_range(a: int, b: int, s: int) -> None:
    every = _inclusive(a, b)
    s_ = _signed(a, b, s)
    x = parse_frameset(f"{a}-{b}x{s_}", limit=BIG)
    assert x == every[::s]  # every s-th, starting at A, in A->B direction
    try:
        y = parse_frameset(f"{a}-{b}y{s_}", limit=BIG)
    except InvalidInput as exc:  # only when x took everything
        assert "has no frames" in str(exc) and x == every
        y = []
    assert set(x).isdisjoint(y)
    assert sorted(x + y) == sorted(every)
    assert y == [f for f in every if f not in set(x)]  # y keeps the range's order
    assert count_frameset(f"{a}-{b}x{s_}") == len(x)
    assert count_frameset(f"{a}-{b}y{s_}") == len(y)


@given(FRAMES, FRAMES, STEPS)
def test_interleave_is_a_permutation_starting_with_the_coarsest_pass(a: int, b: int, s: int) -> None:
    frames = parse_frameset(f"{a}-{b}:{_signed(a, b, s)}", limit=BIG)
    every = _inclusive(a, b)
    assert sorted(frames) == sorted(every) and len(frames) == len(set(frames))
    assert frames[: len(every[::s])] == every[::s]
    assert frames[0] == a
    assert count_frameset(f"{a}-{b}:{_signed(a, b, s)}") == len(frames)


def _reference_interleave(a: int, b: int, s: int) -> list[int]:
    """Straight from the contract text: A-BxS, then halve S down to 1, first occurrence wins."""
    out: list[int] = []
    every = _inclusive(a, b)
    while s >= 1:
        out += [f for f in every[::s] if f not in out]
        s //= 2
    return out


@given(st.integers(-30, 30), st.integers(-30, 30), st.integers(1, 20))
def test_interleave_matches_the_contract_reference(a: int, b: int, s: int) -> None:
    assert parse_frameset(f"{a}-{b}:{_signed(a, b, s)}", limit=BIG) == _reference_interleave(a, b, s)


@given(st.lists(FRAMES, unique=True, max_size=60), st.integers(1, 70))
def test_chunks_concatenate_back(frames: list[int], chunk: int) -> None:
    chunks = chunk_frames(frames, chunk)
    assert [f for c in chunks for f in c] == frames
    assert all(len(c) == chunk for c in chunks[:-1])
    assert all(1 <= len(c) <= chunk for c in chunks)
    assert len(chunks) == -(-len(frames) // chunk)


@given(st.lists(st.tuples(FRAMES, FRAMES, st.sampled_from(["", "x", "y", ":"]), STEPS), min_size=1, max_size=5))
def test_counts_agree_with_expansion(sections: list[tuple[int, int, str, int]]) -> None:
    text = ",".join(f"{a}-{b}{k}{_signed(a, b, s)}" if k else f"{a}-{b}" for a, b, k, s in sections)
    per_section = [count_frameset(part) for part in text.split(",")]
    assert count_frameset(text) == sum(per_section)
    try:
        frames = parse_frameset(text, limit=BIG)
    except InvalidInput as exc:
        assert "has no frames" in str(exc) and sum(per_section) == 0
        return
    assert len(frames) <= sum(per_section)
    assert len(frames) == len(set().union(*(_expand_one(a, b, k, s) for a, b, k, s in sections)))


def _expand_one(a: int, b: int, kind: str, s: int) -> set[int]:
    every = _inclusive(a, b)
    if kind == "x":
        return set(every[::s])
    if kind == "y":
        return set(every) - set(every[::s])
    return set(every)
