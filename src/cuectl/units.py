"""Sizes, durations and timestamps: parsed and rendered in one place.

Sizes follow Slurm: a bare number is MiB; K, M, G, T (optionally followed by ``B`` or
``iB``) are binary multiples. Durations accept ``90``, ``90s``, ``15m``, ``2h``, ``7d``,
``1w`` and combinations such as ``1h30m``.
"""

from __future__ import annotations

import math
import re
import time
from datetime import datetime, timezone

from cuectl.errors import InvalidInput

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(I?B)?\s*$", re.IGNORECASE)
_SIZE_MULT = {"": MIB, "K": KIB, "M": MIB, "G": GIB, "T": TIB, "P": 1024**5}
_DUR_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)", re.IGNORECASE)
_DUR_MULT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_size(value: str | int | float, *, field: str = "size") -> int:
    """Return bytes. ``int`` values are taken as bytes already; strings follow Slurm."""
    if isinstance(value, bool):
        raise InvalidInput(f"{field}: expected a size like 8G, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise InvalidInput(f"{field}: must be 0 or more")
        return value
    if isinstance(value, float):
        raise InvalidInput(f"{field}: expected a size like 8G or 512M, got {value!r}")
    text = str(value)
    m = _SIZE_RE.match(text)
    if not m or (m.group(3) and not m.group(2) and m.group(3).upper() == "IB"):
        raise InvalidInput(f"{field}: invalid size {text!r} (use e.g. 512M, 8G, 24GiB; a bare number is MiB)")
    number, unit = float(m.group(1)), m.group(2).upper()
    if unit == "" and m.group(3):  # "100B" means bytes
        return int(number)
    return int(number * _SIZE_MULT[unit])


def parse_duration(value: str | int | float, *, field: str = "duration") -> float:
    """Return seconds (> = 0). Accepts numbers (seconds) and ``1h30m``-style strings."""
    if isinstance(value, bool):
        raise InvalidInput(f"{field}: expected a duration like 30m, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise InvalidInput(f"{field}: must be 0 or more")
        return float(value)
    text = str(value).strip()
    if not text:
        raise InvalidInput(f"{field}: empty duration")
    pos, total = 0, 0.0
    for m in _DUR_RE.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DUR_MULT[m.group(2).lower()]
        pos = m.end()
    if pos != len(text) or pos == 0:
        raise InvalidInput(f"{field}: invalid duration {text!r} (use e.g. 90, 30s, 15m, 2h, 7d)")
    return total


def nominal_gib(memory_bytes: int) -> int:
    """A card's marketing size: its total memory rounded to the nearest GiB.

    A "24 GB" RTX 4090 reports 24564 MiB and a "16 GB" V100 16160 MiB; both must satisfy a
    request of 24G / 16G respectively (DESIGN §5). Used by the matcher only.
    """
    return int((memory_bytes + GIB // 2) // GIB)


def memory_satisfies(total_bytes: int | None, requested_bytes: int) -> bool:
    """DESIGN §5: total, or total rounded to the nearest GiB, is at least the request."""
    if requested_bytes <= 0:
        return True
    if total_bytes is None:
        return False
    return total_bytes >= requested_bytes or nominal_gib(total_bytes) * GIB >= requested_bytes


#: A dotted version: one to six whole numbers (``8.9``, ``535.104.05``, ``12.2``).
_VERSION_RE = re.compile(r"^[0-9]{1,9}(?:\.[0-9]{1,9}){0,5}$")


def version_key(text: str | None) -> tuple[int, ...] | None:
    """The numeric parts of a dotted version (``"535.104.05"`` -> ``(535, 104, 5)``), or
    None when ``text`` is not one (unknown, empty, ``gfx90a``). Parts compare as numbers,
    so ``8.9 < 8.10`` and ``535.104.05 < 550``."""
    if text is None:
        return None
    stripped = str(text).strip()
    if not _VERSION_RE.match(stripped):
        return None
    return tuple(int(part) for part in stripped.split("."))


def version_at_least(have: str | None, want: str) -> bool:
    """True when version ``have`` is ``want`` or newer, numerically part by part, missing
    parts counting as 0 (``12`` == ``12.0``); an unknown or malformed ``have`` never is."""
    got, need = version_key(have), version_key(want)
    if got is None or need is None:
        return False
    width = max(len(got), len(need))
    return got + (0,) * (width - len(got)) >= need + (0,) * (width - len(need))


def format_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit in ("B", "KiB", "MiB") else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


#: The last whole second ``iso`` formatted, and its text: a worker writes a log header and
#: footer per frame, and a listing many timestamps, mostly within one second of another.
_iso_second: tuple[float, str] = (-1.0, "")


def iso(ts: float | None) -> str | None:
    """Epoch seconds -> ISO 8601 UTC with a ``Z`` and milliseconds, as every ``--json``
    timestamp (``2026-12-04T10:20:30.123Z``).

    The same text as ``datetime.fromtimestamp(ts, timezone.utc)`` formatted with
    ``%Y-%m-%dT%H:%M:%S.%f`` cut to milliseconds — rounded to the microsecond half to
    even, as datetime does, then truncated — at a fraction of its cost (tested against it
    over datetime's range, years 1–9999; beyond it, where datetime raised, the year is
    printed as it is). A time no clock can show (NaN, an infinity, past what ``gmtime``
    takes: values a hostile store row can hold, and Python's json reads) is None, unknown,
    rather than an error in every view that prints it.
    """
    global _iso_second
    if ts is None:
        return None
    try:
        fraction, whole = math.modf(ts)
        micros = round(fraction * 1e6)
        if micros >= 1_000_000:
            micros -= 1_000_000
            whole += 1.0
        elif micros < 0:  # before 1970
            micros += 1_000_000
            whole -= 1.0
        second, text = _iso_second
        if whole != second:
            text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
            _iso_second = (whole, text)
    except (OverflowError, ValueError, OSError):
        return None
    return f"{text}.{micros // 1000:03d}Z"


def parse_time(value: str, *, now: float, field: str = "time") -> float:
    """``7d`` (ago), ``2026-01-31`` or a full ISO 8601 timestamp -> epoch seconds."""
    text = value.strip()
    try:
        return now - parse_duration(text, field=field)
    except InvalidInput:
        pass
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(
            f"{field}: invalid time {value!r} (use e.g. 7d, 12h, 2026-01-31 or an ISO timestamp)"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()
