"""run/framelog/: the one follower gives the same bytes whether the CLI drives it
(``time.sleep``) or the API does (``asyncio.sleep``) — a running line goes on where it
stopped, a log cut back to its limit is taken up near its new end — and the name of an
attempt's log has one definition, which the claim statement's SQL is made from."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, Callable

import pytest

from cuectl.run import framelog
from cuectl.sched.dialect import POSTGRES, SQLITE
from cuectl.sched.store import lifecycle


def scripted(log: Path, events: list[Callable[[], None]]) -> Callable[[], dict[str, Any]]:
    """A frame record that is RUNNING (attempt 1) while ``events`` are left: each refresh
    first does the next one to the file."""
    left = list(events)

    def refresh() -> dict[str, Any]:
        if left:
            left.pop(0)()
            return {"attempts": 1, "state": "RUNNING"}
        return {"attempts": 1, "state": "SUCCEEDED"}

    return refresh


def append(log: Path, data: bytes) -> Callable[[], None]:
    def do() -> None:
        with log.open("ab") as f:
            f.write(data)

    return do


def cut(log: Path, keep: bytes) -> Callable[[], None]:
    def do() -> None:
        with log.open("r+b") as f:
            f.seek(0)
            f.write(keep)
            f.truncate(len(keep))

    return do


def events_for(log: Path) -> list[Callable[[], None]]:
    return [
        append(log, b"-rest\nfour\n"),
        lambda: None,
        append(log, b"five"),
        append(log, b"-end\n" + b"x" * 100),
        cut(log, b"head\n=== cut ===\nrecent 1\nrecent 2\n"),
        append(log, b"footer\n"),
    ]


def follow_sync(log: Path, tail: int | None) -> tuple[bytes, list[str]]:
    out: list[bytes] = []
    notes: list[str] = []
    fd = os.open(log, os.O_RDONLY)
    try:
        steps = framelog.follow(fd, {"attempts": 1, "state": "RUNNING"}, 1, tail=tail, poll_s=0, file_poll_s=0)
        end = framelog.drive(
            steps, write=out.append, note=notes.append, refresh=scripted(log, events_for(log)), sleep=lambda s: None
        )
    finally:
        os.close(fd)
    assert end["state"] == "SUCCEEDED"
    return b"".join(out), notes


def follow_async(log: Path, tail: int | None) -> bytes:
    refresh = scripted(log, events_for(log))

    async def answer() -> dict[str, Any]:
        return refresh()

    async def run() -> bytes:
        fd = os.open(log, os.O_RDONLY)
        try:
            steps = framelog.follow(fd, {"attempts": 1, "state": "RUNNING"}, 1, tail=tail, poll_s=0, file_poll_s=0)
            return b"".join([data async for data in framelog.drive_async(steps, answer)])
        finally:
            os.close(fd)

    return asyncio.run(run())


@pytest.mark.parametrize("tail", [None, 0, 1, 2, 10])
def test_the_cli_and_the_api_drive_one_follower_to_the_same_bytes(tmp_path: Path, tail: int | None) -> None:
    log = tmp_path / "a.log"
    log.write_bytes(b"one\ntwo\nthree-partial")
    got, notes = follow_sync(log, tail)
    log.write_bytes(b"one\ntwo\nthree-partial")
    assert follow_async(log, tail) == got
    start = {
        None: b"one\ntwo\nthree-partial",
        0: b"",
        1: b"three-partial",
        2: b"two\nthree-partial",
        10: b"one\ntwo\nthree-partial",
    }[tail]
    assert got.startswith(start + b"-rest\nfour\nfive-end\n"), got
    assert got.endswith(b"recent 1\nrecent 2\nfooter\n"), got  # taken up again near the new end
    assert notes == [
        "--- the log was cut back to its size limit; going on near its new end (a few lines may repeat) ---"
    ]


def test_tail_is_byte_for_byte(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    for data, lines, want in (
        (b"one\ntwo\nthree-partial", 1, b"three-partial"),
        (b"one\ntwo\nthree-partial", 2, b"two\nthree-partial"),
        (b"one\ntwo\n", 1, b"two\n"),
        (b"one\ntwo\n", 5, b"one\ntwo\n"),
        (b"", 3, b""),
        (b"abc", 0, b""),
    ):
        log.write_bytes(data)
        fd = os.open(log, os.O_RDONLY)
        try:
            assert framelog.read_log(fd, lines) == want, (data, lines)
            assert os.lseek(fd, 0, os.SEEK_CUR) == len(data)  # a follower goes on from the end
        finally:
            os.close(fd)


def test_the_log_name_has_one_definition() -> None:
    assert framelog.attempt_log_name("0001-render", 3) == "0001-render.3.log"
    frame = {"id": 7, "state": "RUNNING", "attempts": 3, "log_path": "/logs/12/0001-render.3.log"}
    assert framelog.attempt_log_path(frame, 1) == "/logs/12/0001-render.1.log"
    assert framelog.attempt_log_path(frame) == "/logs/12/0001-render.3.log"
    # The claim statement's SQL is made from the same constants, and says what it always said.
    for dialect in (SQLITE, POSTGRES):
        for alias in ("", "f"):
            col = f"{alias}." if alias else ""
            assert lifecycle.log_path_sql(dialect, alias) == (
                f"CAST(? AS TEXT) || '/' || {col}job_id || '/' || {dialect.pad4(col + 'number')} || '-' || "
                f"CAST(? AS TEXT) || '.' || ({col}attempts + 1) || '.log'"
            )


def test_the_sql_name_is_the_python_name(tmp_path: Path) -> None:
    import sqlite3

    conn = sqlite3.connect(":memory:")
    try:
        conn.execute("CREATE TABLE frames (job_id INTEGER, number INTEGER, attempts INTEGER)")
        conn.execute("INSERT INTO frames VALUES (12, 1, 2)")
        (path,) = conn.execute(f"SELECT {lifecycle.log_path_sql(SQLITE)} FROM frames", ("/logs", "render")).fetchone()
    finally:
        conn.close()
    assert path == str(framelog.job_log_dir("/logs", 12) / framelog.attempt_log_name("0001-render", 3))
