"""IN lists of ids, in batches every database accepts."""

from __future__ import annotations

from typing import Iterator, Sequence

# Ids per IN (...) list: well under SQLite's 32,766 host parameters (and PostgreSQL's 65,535).
IN_BATCH = 500


def marks(n: int) -> str:
    """``?, ?, …`` for an IN list of ``n`` values."""
    return ", ".join("?" * n)


def batches(ids: Sequence[int]) -> Iterator[list[int]]:
    for start in range(0, len(ids), IN_BATCH):
        yield list(ids[start : start + IN_BATCH])
