"""Frame ranges in OpenCue FrameSet syntax (DESIGN §4): parse, count, chunk, render.

A frame set is comma-separated sections, each one of (Cuebot's FrameRange, exactly)::

    N          one frame (may be negative: -3)
    A-B        every frame from A to B, in that direction (10-1 counts down)
    A-BxS      every S-th frame of A-B, starting at A. S is signed and must point the
               range's way: 10-1x-2 -> 10,8,6,4,2; 1-10x-2 and 10-1x2 are errors; S = 0 is
               an error; S = 1 on a descending range (10-1x1) lists nothing, as in Cuebot
    A-ByS      the frames of A-B (walked the way S points) that A-BxS leaves out
    A-B:S      interleave: A-BxS, then A-Bx(S/2) (halved towards zero), ... down to step
               +-1, keeping only frames not yet listed (Cuebot's order:
               1-10:5 -> 1,6,3,5,7,9,2,4,8,10; 10-1:-5 -> 10,5,8,6,4,2,9,7,3,1)

Differences from Cuebot's FrameSet, both deliberate: whitespace around a section is ignored
(Cuebot refuses " 1"), and a frame listed again by a later section is dropped (first
occurrence wins; Cuebot's FrameSet keeps the repeat and its job launch would then create two
frames of one name), so the result is always a list of distinct numbers. As in Cuebot (Java's
``split(",")``), trailing commas are ignored and an empty section elsewhere is an error.

Frame counts are computed arithmetically before anything is expanded, so an absurd range
such as ``1-1000000000`` is refused at once instead of filling memory (the limit comes from
``CUECTL_FRAME_LIMIT`` via :func:`cuectl.config.frame_limit` unless the caller passes one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Sequence

from cuectl.errors import InvalidInput

# Cuebot stores frame numbers in a Java int; staying inside that range keeps every store,
# the zero-padded tokens and the JSON output safe from overflow.
MAX_FRAME = 2**31 - 1
# Digits in one number beyond which it is out of range anyway. Checking the length first
# also keeps int() away from Python's 4300-digit conversion guard (a ValueError).
_MAX_DIGITS = len(str(MAX_FRAME))
# How many frames the sections of one frame set may list in total, counting repeats, as a
# multiple of the frame limit. Expanding costs time per listed frame even when it is a
# repeat; without this bound "1-100000,1-100000,..." could keep a submit busy for minutes.
REPEAT_FACTOR = 10

_SECTION_RE = re.compile(r"(-?[0-9]+)(?:-(-?[0-9]+)(?:([xy:])(-?[0-9]+))?)?", re.ASCII)
_CLIP = 60


@dataclass(frozen=True)
class _Section:
    """One parsed section; ``kind`` is '' (every frame), 'x', 'y' or ':'."""

    start: int
    end: int
    kind: str = ""
    step: int = 1

    # ``step`` is signed (x, y, :) and points the way the frames are walked; for a plain
    # A-B section it is the direction, +1 or -1.

    @property
    def _empty(self) -> bool:
        # Cuebot checks the sign only for steps other than 1, so a step of 1 on a descending
        # range is not an error: it walks up from A to B and finds nothing.
        return self.step > 0 and self.end < self.start

    @property
    def _span(self) -> int:
        return abs(self.end - self.start) + 1

    def count(self) -> int:
        """Exact number of frames this section lists (arithmetic, no expansion)."""
        if self._empty:
            return 0
        span = self._span
        if self.kind == "x":
            return (span - 1) // abs(self.step) + 1
        if self.kind == "y":
            return span - ((span - 1) // abs(self.step) + 1)
        return span  # '' and ':' (the last interleave pass has step +-1, so it covers A-B)

    def frames(self) -> Iterator[int]:
        """The frames in order. Work is proportional to count(), never to the span alone."""
        if self._empty:
            return
        start, end, step = self.start, self.end, self.step
        d = 1 if step > 0 else -1
        stop = end + d
        if self.kind == "x":
            yield from range(start, stop, step)
        elif self.kind == "y":
            size = abs(step)
            if size == 1:  # A-Bx1 takes everything; walking the span would be wasted work
                return
            for base in range(start, stop, step):
                for offset in range(1, size):
                    frame = base + d * offset
                    if (frame - end) * d > 0:
                        break
                    yield frame
        elif self.kind == ":":
            seen: set[int] = set()
            while step != 0:
                for frame in range(start, stop, step):
                    if frame not in seen:
                        seen.add(frame)
                        yield frame
                step = d * (abs(step) // 2)  # Java's int division: towards zero
        else:
            yield from range(start, stop, step)


def _clip(text: str) -> str:
    """Quote user text for a one-line message without echoing megabytes of it."""
    return repr(text if len(text) <= _CLIP else text[:_CLIP] + "...")


def _number(digits: str, section: str, text: str) -> int:
    negative = digits.startswith("-")
    magnitude = digits.lstrip("-").lstrip("0") or "0"  # int() refuses > 4300 digits, zeros included
    if len(magnitude) > _MAX_DIGITS or int(magnitude) > MAX_FRAME:
        raise InvalidInput(
            f"invalid frame range section {_clip(section)} in {_clip(text)}: "
            f"frame numbers and steps must be within ±{MAX_FRAME}"
        )
    return -int(magnitude) if negative else int(magnitude)


def _parse_section(section: str, text: str) -> _Section:
    m = _SECTION_RE.fullmatch(section)
    if m is None:
        if not section:
            raise InvalidInput(f"invalid frame range {_clip(text)}: empty section (check the commas)")
        raise InvalidInput(f"invalid frame range section {_clip(section)} in {_clip(text)}")
    start = _number(m.group(1), section, text)
    if m.group(2) is None:
        return _Section(start, start)
    end = _number(m.group(2), section, text)
    if m.group(3) is None:
        return _Section(start, end, "", 1 if end >= start else -1)
    step = _number(m.group(4), section, text)
    # Cuebot's FrameRange.validateStepSign, rule for rule (a step of exactly 1 is not checked).
    where = f"invalid frame range section {_clip(section)} in {_clip(text)}"
    if step == 0:
        raise InvalidInput(f"{where}: the step cannot be zero")
    if step > 1 and end < start:
        raise InvalidInput(f"{where}: a range that counts down needs a negative step (e.g. {start}-{end}x-{step})")
    if step < 0 and end >= start:
        raise InvalidInput(
            f"{where}: a negative step needs a range that counts down (e.g. {end}-{start}x{step})"
            if end > start
            else f"{where}: a negative step needs a range that counts down"
        )
    return _Section(start, end, m.group(3), step)


def _parse_sections(text: str) -> list[_Section]:
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise InvalidInput(f"a frame range must be a string like 1-100, got {type(text).__name__}")
    text = str(text)
    if not text.strip():
        raise InvalidInput("empty frame range (use e.g. 1, 1-100 or 1-100x5)")
    parts = text.split(",")
    while len(parts) > 1 and not parts[-1].strip():  # Java's split(",") drops trailing empties
        parts.pop()
    return [_parse_section(part.strip(), text) for part in parts]


def count_frameset(text: str) -> int:
    """How many frames ``text`` lists, without expanding it.

    This is an UPPER BOUND: the sum of the sections' exact sizes. It equals
    ``len(parse_frameset(text))`` whenever no frame appears in two sections (the usual case);
    with overlapping sections it counts the repeats too. Raises InvalidInput on bad syntax;
    applies no limit.
    """
    return sum(section.count() for section in _parse_sections(text))


def parse_frameset(text: str, *, limit: int | None = None) -> list[int]:
    """Expand a FrameSet into its distinct frame numbers, in order.

    ``limit`` is the most frames allowed; None means the configured limit
    (``CUECTL_FRAME_LIMIT``, default 100,000). Refused (InvalidInput), all before or while
    expanding so memory stays bounded by the limit:

    - a section with more frames than the limit (its exact size is a lower bound of the
      total, so the refusal is certain; nothing is expanded);
    - sections that together list more than ``REPEAT_FACTOR`` x limit frames counting repeats
      (a pathological overlap; nothing is expanded);
    - more distinct frames than the limit (checked while expanding; stops at limit + 1);
    - no frames at all (e.g. ``1-10y1``).
    """
    sections = _parse_sections(text)
    text = str(text)
    if limit is None:
        from cuectl.config import frame_limit

        limit = frame_limit()
    counts = [section.count() for section in sections]
    largest, listed = max(counts), sum(counts)
    if largest > limit:
        # One section alone is over: its size is exact; the total may be larger still.
        size = f"{largest}" if len(sections) == 1 else f"at least {largest}"
        raise InvalidInput(f"frame range {_clip(text)} has {size} frames; the limit is {limit} (CUECTL_FRAME_LIMIT)")
    if listed > REPEAT_FACTOR * limit:
        raise InvalidInput(
            f"frame range {_clip(text)} lists {listed} frames counting repeats; "
            f"the limit is {limit} (CUECTL_FRAME_LIMIT)"
        )
    # dict keeps insertion order and gives O(1) membership: first occurrence wins.
    seen: dict[int, None] = {}
    for section in sections:
        for frame in section.frames():
            if frame not in seen:
                seen[frame] = None
                if len(seen) > limit:
                    raise InvalidInput(
                        f"frame range {_clip(text)} has more than {limit} frames; "
                        f"the limit is {limit} (CUECTL_FRAME_LIMIT)"
                    )
    if not seen:
        raise InvalidInput(f"frame range {_clip(text)} has no frames")
    return list(seen)


def chunk_frames(frames: Sequence[int], chunk: int) -> list[tuple[int, ...]]:
    """Split the expanded list into chunks of ``chunk`` consecutive entries (the last may be
    shorter). Each chunk becomes one frame of the layer, named by its first entry."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise InvalidInput(f"chunk size must be an integer of 1 or more, got {chunk!r}")
    items = tuple(frames)
    return [items[i : i + chunk] for i in range(0, len(items), chunk)]


def _render_run(first: int, last: int, step: int) -> str:
    # As Cuebot's FrameSet.getChunk writes a run: the step keeps its sign and +1 is left
    # out. One difference: a -1 step is left out too (10,9,8 -> "10-8", where Cuebot writes
    # "10-8x-1"); both read back as 10,9,8 and the short form is never longer than a list.
    if abs(step) == 1:
        return f"{first}-{last}"
    return f"{first}-{last}x{step}"


def compact_range(frames: Sequence[int]) -> str:
    """Render frames as a short FrameSet that ``parse_frameset`` turns back into the same
    list, order preserved (the ``#FRAMESPEC#`` token): ``1-4``, ``1-9x2``, ``1,3,8-10``.

    Greedy: each maximal run of three or more entries with a constant non-zero difference
    becomes ``A-B`` or ``A-BxS`` (S signed, as Cuebot's ``FrameSet.getChunk`` writes it:
    ``10-6x-2``), and so does a pair of consecutive frames that does not follow a lone
    frame (``1-2``, ``1-3,7-8``, but ``91,103,104``, as Cuebot); anything else is listed
    singly. For the chunks a job produces this is Cuebot's text (its test
    vectors are in tests/sched/test_frameset_opencue.py); Cuebot's renderer writes a few
    out-of-order chunks differently (and some wrongly), this one always round-trips for
    distinct frames. Repeated entries are rendered but a parse drops the repeats.
    ``[]`` gives ``''``.
    """
    items = list(frames)
    parts: list[str] = []
    i, n = 0, len(items)
    single = False  # the last part written was a lone frame
    while i < n:
        j = i + 1
        if j < n and items[j] != items[i]:
            step = items[j] - items[i]
            while j + 1 < n and items[j + 1] - items[j] == step:
                j += 1
            # Three or more entries make a range; so does a consecutive pair, unless it
            # follows a lone frame (Cuebot: 1-2 and 1-3,7-8, but 91,103,104).
            if j - i >= 2 or (step == 1 and not single):
                parts.append(_render_run(items[i], items[j], step))
                i, single = j + 1, False
                continue
        parts.append(str(items[i]))
        i, single = i + 1, True
    return ",".join(parts)
