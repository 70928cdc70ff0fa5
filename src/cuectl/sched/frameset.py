"""Frame ranges in OpenCue FrameSet syntax (DESIGN §4): parse, count, chunk, render.

A frame set is comma-separated sections, each one of::

    N          one frame (may be negative: -3)
    A-B        every frame from A to B, in that direction (10-1 counts down)
    A-BxS      every S-th frame of A-B, starting at A
    A-ByS      the frames of A-B that A-BxS leaves out
    A-B:S      interleave: A-BxS, then A-Bx(S//2), ... down to step 1, keeping only
               frames not yet listed (Cuebot's order: 1-10:5 -> 1,6,3,5,7,9,2,4,8,10)

Whitespace around a section is ignored; a frame listed again by a later section is dropped
(first occurrence wins), so the result is always a list of distinct numbers.

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

    @property
    def _direction(self) -> int:
        return 1 if self.end >= self.start else -1

    @property
    def _span(self) -> int:
        return abs(self.end - self.start) + 1

    def count(self) -> int:
        """Exact number of frames this section lists (arithmetic, no expansion)."""
        span = self._span
        if self.kind == "x":
            return (span - 1) // self.step + 1
        if self.kind == "y":
            return span - ((span - 1) // self.step + 1)
        return span  # '' and ':' (the last interleave pass has step 1, so it covers A-B)

    def frames(self) -> Iterator[int]:
        """The frames in order. Work is proportional to count(), never to the span alone."""
        d, start, end, step = self._direction, self.start, self.end, self.step
        stop = end + d
        if self.kind == "x":
            yield from range(start, stop, d * step)
        elif self.kind == "y":
            if step == 1:  # A-Bx1 takes everything; walking the span would be wasted work
                return
            for base in range(start, stop, d * step):
                for offset in range(1, step):
                    frame = base + d * offset
                    if (frame - end) * d > 0:
                        break
                    yield frame
        elif self.kind == ":":
            seen: set[int] = set()
            while step >= 1:
                for frame in range(start, stop, d * step):
                    if frame not in seen:
                        seen.add(frame)
                        yield frame
                step //= 2
        else:
            yield from range(start, stop, d)


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
        return _Section(start, end)
    step = _number(m.group(4), section, text)
    if step < 1:
        raise InvalidInput(
            f"invalid frame range section {_clip(section)} in {_clip(text)}: the step must be 1 or more"
        )
    return _Section(start, end, m.group(3), step)


def _parse_sections(text: str) -> list[_Section]:
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise InvalidInput(f"a frame range must be a string like 1-100, got {type(text).__name__}")
    text = str(text)
    if not text.strip():
        raise InvalidInput("empty frame range (use e.g. 1, 1-100 or 1-100x5)")
    return [_parse_section(part.strip(), text) for part in text.split(",")]


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
    if abs(step) == 1:
        return f"{first}-{last}"
    return f"{first}-{last}x{abs(step)}"


def compact_range(frames: Sequence[int]) -> str:
    """Render frames as a short FrameSet that ``parse_frameset`` turns back into the same
    list, order preserved (the ``#FRAMESPEC#`` token): ``1-4``, ``1-9x2``, ``1,3,8-10``.

    Greedy: each maximal run of three or more entries with a constant non-zero difference
    becomes ``A-B`` or ``A-BxS`` (either direction); anything else is listed singly. The
    round trip holds for distinct frames (what ``parse_frameset`` and chunks produce);
    repeated entries are rendered but a parse drops the repeats. ``[]`` gives ``''``.
    """
    items = list(frames)
    parts: list[str] = []
    i, n = 0, len(items)
    while i < n:
        j = i + 1
        if j < n and items[j] != items[i]:
            step = items[j] - items[i]
            while j + 1 < n and items[j + 1] - items[j] == step:
                j += 1
            if j - i >= 2:  # three or more entries: a range is shorter than a list
                parts.append(_render_run(items[i], items[j], step))
                i = j + 1
                continue
        parts.append(str(items[i]))
        i += 1
    return ",".join(parts)
