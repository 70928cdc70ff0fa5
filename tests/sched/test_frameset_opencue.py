"""Cuebot's own frame-range test vectors, run against cuectl's parser (DESIGN §4).

Sources (AcademySoftwareFoundation/OpenCue, master as fetched 2026-08):
  cuebot/src/test/java/com/imageworks/spcue/test/util/FrameRangeTests.java
  cuebot/src/test/java/com/imageworks/spcue/test/util/FrameSetTests.java
and the rules of cuebot/src/main/java/com/imageworks/spcue/util/FrameRange.java
(validateStepSign, getIntRange, getInterleavedRange) and FrameSet.java (split on ",",
getChunk). Each case names the Java test (or the source rule) it comes from. Only inputs
and expected outputs are ported; the code is cuectl's.

Deliberate differences (docs/opencue.md, "Differences and why"): cuectl drops a frame that
a later section lists again (Cuebot's FrameSet keeps it; its job launch would then insert
two frames of one name), and ignores whitespace around a section (Cuebot refuses it).
"""

from __future__ import annotations

import pytest

from cuectl.errors import InvalidInput
from cuectl.sched.frameset import chunk_frames, compact_range, count_frameset, parse_frameset

BIG = 10**9


def _first_occurrences(frames: list[int]) -> list[int]:
    return list(dict.fromkeys(frames))


@pytest.mark.parametrize(
    ("source", "text", "expected"),
    [
        ("FrameRangeTests.testSingleFrame", "4927", [4927]),
        ("FrameRangeTests.testNegativeSingleFrame", "-4982", [-4982]),
        ("FrameRangeTests.testFrameRange", "1-7", [1, 2, 3, 4, 5, 6, 7]),
        ("FrameRangeTests.testNegativeFrameRange", "-20--13", [-20, -19, -18, -17, -16, -15, -14, -13]),
        ("FrameRangeTests.testNegativeToPositiveFrameRange", "-5-3", [-5, -4, -3, -2, -1, 0, 1, 2, 3]),
        ("FrameRangeTests.testReverseFrameRange", "6-2", [6, 5, 4, 3, 2]),
        ("FrameRangeTests.testReverseNegativeFrameRange", "-2--6", [-2, -3, -4, -5, -6]),
        ("FrameRangeTests.testStep", "1-8x2", [1, 3, 5, 7]),
        ("FrameRangeTests.testNegativeStep", "8-1x-2", [8, 6, 4, 2]),
        ("FrameRangeTests.testInvertedStep", "1-8y2", [2, 4, 6, 8]),
        ("FrameRangeTests.testNegativeInvertedStep", "8-1y-2", [7, 5, 3, 1]),
        ("FrameRangeTests.testInterleave", "1-10:5", [1, 6, 3, 5, 7, 9, 2, 4, 8, 10]),
        ("FrameRangeTests.testNegativeInterleave", "10-1:-5", [10, 5, 8, 6, 4, 2, 9, 7, 3, 1]),
        # FrameRange.java class comment: "1-10y3 == 2, 3, 5, 6, 8, 9"
        ("FrameRange.java javadoc", "1-10y3", [2, 3, 5, 6, 8, 9]),
        # The examples, worked through FrameRange.getIntRange by hand.
        ("FrameRange.getSteppedRange", "10-1x-2", [10, 8, 6, 4, 2]),
        ("FrameRange.getSteppedRange", "3-1x-1", [3, 2, 1]),
        ("FrameRange.getSteppedRange", "10-1y-3", [9, 8, 6, 5, 3, 2]),
        # validateStepSign checks only steps > 1 against a descending range, so a step of 1
        # walks up from 10 to 1 and lists nothing: only the other section remains.
        ("FrameRange.validateStepSign (step 1)", "10-1x1,20", [20]),
        ("FrameRange.validateStepSign (step 1)", "10-1:1,20", [20]),
        ("FrameRange.validateStepSign (step 1)", "10-1y1,20", [20]),
        ("FrameRange.validateStepSign (single frame)", "5-5x3", [5]),
        ("FrameRange.getSteppedRange (single frame)", "5-5y2,6", [6]),
        # Java int division truncates towards zero: -7 -> -3 -> -1.
        ("FrameRange.getInterleavedRange", "7-1:-7", [7, 4, 1, 6, 5, 3, 2]),
        # FrameSet.parseFrameRange uses String.split(","), which drops trailing empty strings.
        ("FrameSet.parseFrameRange (split)", "1-3,", [1, 2, 3]),
        ("FrameSet.parseFrameRange (split)", "1-3,,", [1, 2, 3]),
    ],
)
def test_cuebot_vectors(source: str, text: str, expected: list[int]) -> None:
    assert parse_frameset(text, limit=BIG) == expected, source
    assert count_frameset(text) == len(expected), source


def test_frameset_should_split_list_and_maintain_order() -> None:
    # FrameSetTests.shouldSplitListAndMaintainOrder. Cuebot keeps repeats; cuectl keeps the
    # first occurrence of each frame, in the same order.
    cuebot = [57, 1, 2, 3, 4, 3, 2, 12, 14, 76, 73, 70, 6, 7, 9, 10, 12, 1, 6, 3, 5, 7, 2, 4]
    text = "57,1-3,4-2,12-15x2,76-70x-3,5-12y3,1-7:5"
    assert parse_frameset(text, limit=BIG) == _first_occurrences(cuebot)
    assert count_frameset(text) == len(cuebot)  # the count is an upper bound: repeats included


@pytest.mark.parametrize(
    ("source", "text", "index", "size"),
    [
        ("FrameRangeTests.testSize / FrameSetTests.shouldReturnCorrectSize", "1-7", None, 7),
        ("FrameRangeTests.testGet / FrameSetTests.shouldReturnSingleFrame", "1-7", 4, 5),
    ],
)
def test_size_and_get(source: str, text: str, index: int | None, size: int) -> None:
    frames = parse_frameset(text, limit=BIG)
    if index is None:
        assert len(frames) == size, source
    else:
        assert frames[index] == size, source


def test_index() -> None:
    # FrameRangeTests.testIndex / FrameSetTests.shouldReturnCorrectIndexes
    frames = parse_frameset("1-7", limit=BIG)
    assert frames.index(6) == 5
    assert 22 not in frames


@pytest.mark.parametrize(
    ("source", "text"),
    [
        ("FrameRangeTests.testNegativeStepInvalidRange", "1-8x-2"),
        ("FrameRangeTests.testNonNumericalInput", "a"),
        ("FrameRangeTests.testNonNumericalInput", "a-b"),
        ("FrameRangeTests.testNonNumericalInput", "1-5xc"),
        ("FrameRangeTests.testNonNumericalInput", "1-5:c"),
        ("FrameRangeTests.testInvalidRange", "1-10-20"),
        ("FrameRangeTests.testInvalidRange", "1x10-20"),
        ("FrameRangeTests.testInvalidRange", "1:10-20"),
        # validateStepSign: "step cannot be zero" (the javadoc's "produces an empty
        # FrameRange" is not what the code does).
        ("FrameRange.validateStepSign", "1-10x0"),
        ("FrameRange.validateStepSign", "1-10y0"),
        ("FrameRange.validateStepSign", "1-10:0"),
        ("FrameRange.validateStepSign", "1-10x-2"),
        ("FrameRange.validateStepSign", "1-10:-2"),
        ("FrameRange.validateStepSign", "10-1x2"),
        ("FrameRange.validateStepSign", "10-1y2"),
        ("FrameRange.validateStepSign", "10-1:5"),
        ("FrameRange.validateStepSign (end >= start)", "5-5x-1"),
        # An empty section that is not trailing, as Java's split keeps it.
        ("FrameSet.parseFrameRange (split)", "1,,2"),
        ("FrameSet.parseFrameRange (split)", ",1"),
    ],
)
def test_cuebot_refusals(source: str, text: str) -> None:
    with pytest.raises(InvalidInput):
        parse_frameset(text, limit=BIG)


def _chunk_spec(text: str, start_index: int, size: int) -> str:
    """Cuebot's FrameSet.getChunk(start_index, size), in cuectl terms."""
    frames = parse_frameset(text, limit=BIG)
    return compact_range(frames[start_index : start_index + size])


@pytest.mark.parametrize(
    ("source", "text", "start_index", "size", "expected"),
    [
        ("FrameSetTests.shouldReconstructSteppedRange", "1-10x2,11-100x20,103-108", 5, 5, "11-91x20"),
        ("FrameSetTests.shouldCreateNewSteppedRangeAndNextFrame", "1-10x2,11-100x20,103-108", 2, 5, "5-11x2,31"),
        ("FrameSetTests.shouldReturnCommaSeparatedList", "1-10x2,11-100x20,103-108", 9, 3, "91,103,104"),
        ("FrameSetTests.shouldReturnSubsetOfSteppedRange", "1-100x3", 9, 3, "28-34x3"),
        ("FrameSetTests.shouldReturnSubsetOfRange", "1-100", 9, 3, "10-12"),
        ("FrameSetTests.shouldStopBeforeTheEndOfTheRange", "55-60", 0, 10, "55-60"),
        # FrameSet.framesToFrameRanges: a consecutive pair is written as a range.
        ("FrameSet.framesToFrameRanges (pair)", "1-10", 0, 2, "1-2"),
        # buildFrangePart keeps the step's sign.
        ("FrameSet.buildFrangePart (signed step)", "10-1x-2", 0, 3, "10-6x-2"),
    ],
)
def test_cuebot_chunk_specs(source: str, text: str, start_index: int, size: int, expected: str) -> None:
    """#FRAMESPEC# is Cuebot's getChunk text for these chunks."""
    assert _chunk_spec(text, start_index, size) == expected, source
    assert parse_frameset(expected, limit=BIG) == parse_frameset(text, limit=BIG)[start_index : start_index + size]


def test_should_return_last_frame() -> None:
    # FrameSetTests.shouldReturnLastFrame: the chunk's last frame (#FRAME_END#).
    chunks = chunk_frames(parse_frameset("1-10x2", limit=BIG), 3)
    assert parse_frameset(compact_range(chunks[0]), limit=BIG)[-1] == 5
    assert parse_frameset(compact_range(chunks[1]), limit=BIG)[-1] == 9
    assert chunk_frames(parse_frameset("1", limit=BIG), 3)[0][-1] == 1
