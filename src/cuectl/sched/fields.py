"""Field validators shared by every form of user input: YAML job specs, ``cuectl submit``
and ``cuectl run`` flags, and the Python lease API.

Each validator takes the value and the *label* of the field as the user spelled it
(``layers[1].gpus``, ``--gpu-model``, ``gpu_models``) and raises one ``InvalidInput`` line
that starts with that label. Only the label differs between the forms, never the rest of
the message, so one mistake reads the same wherever it was made.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from cuectl.errors import InvalidInput
from cuectl.units import parse_size, version_key

#: A field's name (``gpu_models``) -> its label as the user spelled it (``--gpu-model``).
Label = Callable[[str], str]

MAX_BYTES = 2**60  # an exabyte: anything above is a typo, and it still fits an SQL BIGINT
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Flags whose name is not the field's name with dashes (repeatable flags are singular).
_FLAG_NAMES = {
    "name": "--layer",
    "command": "COMMAND",
    "gpu_models": "--gpu-model",
    "tags": "--tag",
    "limits": "--limit",
}


def flag_label(field: str) -> str:
    """The command-line flag of ``field``: ``gpu_memory_min`` -> ``--gpu-memory-min``."""
    return _FLAG_NAMES.get(field, "--" + field.replace("_", "-"))


def keyword_label(field: str) -> str:
    """The Python keyword of ``field``: the field's own name."""
    return field


def describe(value: Any) -> str:
    """Describe a value's type for a message without echoing a (possibly huge) container."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"a string ({quote(value)})"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"a {type(value).__name__} ({quote(str(value))}; quote it to make it a string)"


def quote(text: str, width: int = 60) -> str:
    """``repr`` of ``text``, cut at ``width`` characters."""
    return repr(text if len(text) <= width else text[:width] + "...")


def item_label(label: str, index: int) -> str:
    """The label of one item of a list field. Flags repeat (``--gpu-model A --gpu-model B``):
    an index would read oddly there."""
    return label if label.startswith("-") or label == "COMMAND" else f"{label}[{index}]"


def as_list(value: Any, label: str) -> list[Any]:
    """A list, or one scalar standing for a list of one (``tags: render``)."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, (Mapping, set)):
        raise InvalidInput(f"{label}: expected a list, got {describe(value)}")
    return [value]


def expect_str(value: Any, label: str, *, what: str = "a string") -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"{label}: expected {what}, got {describe(value)}")
    return value


def whole_number(value: Any, label: str, *, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{label}: expected a whole number, got {describe(value)}")
    if value < minimum:
        raise InvalidInput(f"{label}: must be {minimum} or more")
    if value > maximum:
        raise InvalidInput(f"{label}: must be at most {maximum}")
    return value


def size_bytes(value: Any, label: str) -> int:
    """Bytes from a size string (DESIGN §5: ``24G``; a bare number is MiB) or an int of bytes.

    An int means bytes because only library callers pass one; YAML turns ``memory: 512``
    into an int too, and the spec reader makes that a string first (MiB, as DESIGN says).
    """
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InvalidInput(f"{label}: expected a size like 8G, got {describe(value)}")
    result = parse_size(value, field=label)
    if result > MAX_BYTES:
        raise InvalidInput(f"{label}: {value!r} is too large")
    return result


def version(value: Any, label: str) -> str:
    """A dotted version constraint (``8.9``, ``535.104.05``): the text, stripped. Numbers
    are taken as written (YAML reads ``8.9`` as a number): quote a version whose last part
    ends in 0 (``"8.10"``), which a number would lose."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise InvalidInput(f"{label}: expected a version like 8.9, got {describe(value)}")
    text = value.strip() if isinstance(value, str) else repr(value)
    if version_key(text) is None:
        raise InvalidInput(
            f"{label}: invalid version {quote(text)} (expected numbers separated by dots, like 8.9 or 535.104.05)"
        )
    return text


MIN_LOG_LIMIT = 4096  # the cut marker alone is ~150 bytes; below a few KiB a log says nothing


def log_limit_bytes(value: Any, label: str) -> int:
    """An attempt's log cap (``log_limit``, ``--log-limit``, DESIGN §5 sizes): at least 4 KiB."""
    result = size_bytes(value, label)
    if result < MIN_LOG_LIMIT:
        raise InvalidInput(f"{label}: must be at least 4K (got {result} bytes)")
    return result


MAX_PRIORITY = 2**31 - 1  # a 32-bit signed int, as OpenCue's priority column


def priority(value: Any, label: str) -> int:
    """A job priority, the same range wherever one is given (submit, spec, ``job priority``)."""
    return whole_number(value, label, minimum=-MAX_PRIORITY, maximum=MAX_PRIORITY)


#: Unicode categories of characters that do not print: controls (Cc), format characters
#: such as the bidi overrides U+202E/U+2066 and zero-width joiners (Cf), private use (Co),
#: surrogates (Cs), line/paragraph separators (Zl, Zp), unassigned (Cn) and spaces other
#: than U+0020 (Zs). Python's ``str.isprintable`` is False for exactly these.
def invisible_character(text: str) -> str | None:
    """The first character of ``text`` that would not print as itself, described, else None."""
    if text.isprintable():
        return None
    import unicodedata

    for ch in text:
        if not ch.isprintable():
            name = unicodedata.name(ch, "")
            return f"U+{ord(ch):04X}" + (f" {name}" if name else "") + f" ({unicodedata.category(ch)})"
    return None


def printable_name(value: str, label: str) -> str:
    """Refuse names with characters that do not print as themselves (a name that reads as
    something else in a listing: ``x\u202egnp.exe`` shows as ``xexe.png``)."""
    bad = invisible_character(value)
    if bad is not None:
        raise InvalidInput(f"{label}: must contain only visible characters and plain spaces (found {bad})")
    return value
