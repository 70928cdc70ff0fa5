"""Field validators shared by job specs (sched/spec.py) and what borrows their rules:
services (sched/services.py: a service holds only what a layer could ask for itself) and
the store's limits and projects (sched/store/caps.py).

Each takes the value and the label its error names (``layers[0].cores``, ``--cores``) and
returns the checked value or raises one ``InvalidInput`` line.
"""

from __future__ import annotations

import math
import re
from typing import Any

from cuectl.errors import InvalidInput
from cuectl.sched.fields import as_list, describe, expect_str, item_label, quote
from cuectl.units import parse_duration

MAX_CORES = 100_000
# The smallest share of a core a layer may reserve: at most 10 frames per core. Below that a
# reservation means nothing (a 2-core host ran 40 frames at once with --cores 0.001).
MIN_CORES = 0.1
# Layer, tag, limit and project names: 1-100 of A-Z a-z 0-9 _ . -, so they read the same in every table.
NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,100}", re.ASCII)
LIMIT_NAME_RE = NAME_RE
_TAG_RE = NAME_RE


def cores_field(value: Any, label: str) -> float:
    """A ``cores`` value (a layer's, a cap's, a service's): a positive, finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"{label}: expected a number of cores, got {describe(value)}")
    if not math.isfinite(value) or value <= 0:
        raise InvalidInput(f"{label}: must be more than 0")
    if value < MIN_CORES:
        raise InvalidInput(f"{label}: must be at least {MIN_CORES:g} (a tenth of a core)")
    if value > MAX_CORES:
        raise InvalidInput(f"{label}: must be at most {MAX_CORES}")
    return float(value)


def timeout_field(value: Any, label: str) -> float:
    """A ``timeout`` value (a layer's or a service's): a duration, in seconds."""
    if not isinstance(value, (str, int, float)):
        raise InvalidInput(f"{label}: expected a duration like 2h, got {describe(value)}")
    seconds = parse_duration(value, field=label)
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidInput(f"{label}: must be more than 0 (leave it out for no timeout)")
    return seconds


def label_name(value: Any, label: str, what: str) -> str:
    """A limit or project name: 1-100 of A-Z a-z 0-9 _ . - (they appear in tables and SQL keys)."""
    name = expect_str(value, label)
    if not LIMIT_NAME_RE.fullmatch(name) or not name.strip("-."):
        # ("-" alone reads as "none" in every table: `admin report --by project` shows jobs
        # without a project as "-".)
        raise InvalidInput(
            f"{label}: invalid {what} name {quote(name)} (1-100 of A-Z a-z 0-9 _ . -, not only dashes and dots)"
        )
    return name


def limit_names(value: Any, label: str) -> tuple[str, ...]:
    """The named limits a layer holds while a frame runs: a list (or one name), each once."""
    names: list[str] = []
    for i, item in enumerate(as_list(value, label)):
        name = label_name(item, item_label(label, i), "limit")
        if name not in names:
            names.append(name)
    return tuple(names)


def tags_field(value: Any, label: str) -> tuple[str, ...]:
    """A ``tags`` value (a layer's or a service's): a list of tag names, or one."""
    tags: list[str] = []
    for index, item in enumerate(as_list(value, label)):
        where = item_label(label, index)
        tag = expect_str(item, where, what="a tag")
        # "a | b": any of the alternatives (OpenCue's tag semantics); entries: all of them.
        alternatives = [t.strip() for t in tag.split("|")]
        if not all(_TAG_RE.fullmatch(t) for t in alternatives):
            raise InvalidInput(
                f"{where}: invalid tag {quote(tag)} (1-100 of A-Z a-z 0-9 _ . -; alternatives separated by |)"
            )
        tag = " | ".join(alternatives)
        if tag not in tags:
            tags.append(tag)
    return tuple(tags)
