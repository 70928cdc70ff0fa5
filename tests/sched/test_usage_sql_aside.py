"""A report reads its queue waits on a second connection, on a thread of its own, while the
first adds up the sums (``_snapshot_pair`` of each store). Both must read one snapshot: a
worker committing meanwhile must be kept out (it would put an attempt's wait in the report
without its sums). SQLite lines its two readers up by holding the write lock while they
begin, and a store whose write lock is taken reads on one connection instead; PostgreSQL
exports the first reader's snapshot to the second."""

from __future__ import annotations

import json
import random
import sqlite3
import sys
import threading
from pathlib import Path

import pytest

from cuectl.sched import usage_sql
from cuectl.sched.store import open_store
from cuectl.sched.store.sqlite import SQLiteStore

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib: the helpers beside this file
from test_usage_sql import NOW, WINDOW, add_attempt, add_frames, load, random_farm  # noqa: E402

BYS = [None, "job", "layer", "user", "host", "day", "gpu-model"]


@pytest.fixture
def farm(tmp_path):
    store = SQLiteStore(tmp_path / "farm.db")
    load(store, random_farm(random.Random(11), 60))
    yield store
    store.close()


@pytest.fixture
def any_farm(store):
    """The same farm in each backend."""
    load(store, random_farm(random.Random(11), 60))
    return store


def second_reader(store) -> str:
    """The thread that reads the waits: a second reader's, except behind a transaction
    pooler, where a report reads on one connection (docs/postgres.md)."""
    return threading.current_thread().name if getattr(store, "pooled", False) else "cuectl-report-waits"


def figures(groups, total):
    return (
        {g.key: (g.attempts, g.frames, round(g.wall_seconds, 6), g.waits) for g in groups},
        None if total is None else (total.attempts, total.frames, total.waits),
    )


def threads_reading_waits(monkeypatch) -> list[str]:
    names: list[str] = []
    read = usage_sql._read_waits

    def recorded(*args):
        names.append(threading.current_thread().name)
        return read(*args)

    monkeypatch.setattr(usage_sql, "_read_waits", recorded)
    return names


@pytest.mark.parametrize("by", BYS)
def test_waits_are_read_beside_the_sums_with_the_same_figures(any_farm, monkeypatch, by):
    names = threads_reading_waits(monkeypatch)
    beside = figures(*any_farm.usage_summary(**WINDOW, by=by))
    assert names[:1] == [second_reader(any_farm)]  # the second reader was used
    monkeypatch.setattr(type(any_farm), "_snapshot_pair", lambda self, fn: self._snapshot(lambda f: fn(f, None)))
    names.clear()
    alone = figures(*any_farm.usage_summary(**WINDOW, by=by))
    assert names[:1] == [threading.current_thread().name]
    assert beside == alone


def test_a_commit_after_the_report_began_is_not_in_it(any_farm, store_url, monkeypatch):
    worker = open_store(store_url)  # a worker finishing a frame, on its own connection
    (frame,) = add_frames(worker, 1, job="late")
    want = figures(*any_farm.usage_summary(**WINDOW, by="host"))
    read = usage_sql._read_waits
    names: list[str] = []

    def worker_finishes_then_read(*args):
        if not names:  # the sums' reader has begun: the waits' must not see this
            add_attempt(worker, frame, host="late", waiting=NOW - 7, start=NOW, end=NOW + 1)
        names.append(threading.current_thread().name)
        return read(*args)

    monkeypatch.setattr(usage_sql, "_read_waits", worker_finishes_then_read)
    got = figures(*any_farm.usage_summary(**WINDOW, by="host"))
    assert names[:1] == [second_reader(any_farm)]
    assert got == want
    groups, _ = any_farm.usage_summary(**WINDOW, by="host")  # the next report has it
    assert [g.waits for g in groups if g.key == ("late",)] == [[7.0]]
    worker.close()


def _attempt_ending_now(conn: sqlite3.Connection, frame_id: int) -> None:
    """A worker's commit: one more attempt in the window, with a wait (as complete_frame writes)."""
    job_id = conn.execute("SELECT job_id FROM frames WHERE id = ?", (frame_id,)).fetchone()[0]
    attempt = conn.execute(
        "SELECT COALESCE(MAX(attempt), 0) + 1 FROM attempts WHERE frame_id = ?", (frame_id,)
    ).fetchone()[0]
    conn.execute(
        "INSERT INTO attempts(frame_id, attempt, job_id, host, gpu_uuids, outcome, waiting_since, "
        "started_at, ended_at, cores) VALUES (?, ?, ?, 'late', ?, 'succeeded', ?, ?, ?, 1)",
        (frame_id, attempt, job_id, json.dumps([]), NOW - 7, NOW, NOW + 1),
    )


def test_a_commit_cannot_fall_between_the_two_readers(farm, monkeypatch):
    names = threads_reading_waits(monkeypatch)
    writer = sqlite3.connect(str(farm.path), timeout=0, isolation_level=None)
    tried: list[str] = []

    def worker_commits(sql: str) -> None:
        # The first reader has begun its snapshot: a worker now finishing a frame would put
        # its attempt in the second reader's snapshot only, were commits let through.
        if sql.startswith("SELECT COUNT(*) FROM meta") and not tried:
            try:
                _attempt_ending_now(writer, 1)
                tried.append("committed")
            except sqlite3.OperationalError as exc:
                tried.append(str(exc))

    farm.conn.set_trace_callback(worker_commits)
    try:
        groups, total = farm.usage_summary(**WINDOW, by="host")
    finally:
        farm.conn.set_trace_callback(None)
    assert names[:1] == ["cuectl-report-waits"]
    assert tried == ["database is locked"]
    assert "late" not in {g.key[0] for g in groups}
    waits_held = sum(len(g.waits) for g in groups)
    assert total is not None and len(total.waits) == waits_held
    # Once the readers have begun, the worker's commit goes through and the next report has it.
    _attempt_ending_now(writer, 1)
    groups, _ = farm.usage_summary(**WINDOW, by="host")
    assert [g.waits for g in groups if g.key == ("late",)] == [[7.0]]
    writer.close()


def test_a_store_whose_write_lock_is_held_is_read_on_one_connection(farm, monkeypatch):
    want = figures(*farm.usage_summary(**WINDOW, by="user"))
    names = threads_reading_waits(monkeypatch)
    holder = sqlite3.connect(str(farm.path), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # a long write transaction (a big submit)
    try:
        got = figures(*farm.usage_summary(**WINDOW, by="user"))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert got == want
    assert names == [threading.current_thread().name]  # no second reader
    assert not farm.conn.in_transaction


def test_an_error_on_the_second_reader_reaches_the_caller_and_ends_both_snapshots(farm, monkeypatch):
    def broken(*args):
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(usage_sql, "_read_waits", broken)
    with pytest.raises(Exception, match="disk I/O error"):
        farm.usage_summary(**WINDOW, by="job")
    assert not farm.conn.in_transaction
    farm.conn.execute("BEGIN IMMEDIATE")  # nobody holds a snapshot or lock behind
    farm.conn.execute("ROLLBACK")


def test_postgres_second_reader_imports_the_first_ones_snapshot(pg_url, monkeypatch):
    # The narrowest window: a worker commits after the report's first reader began and
    # before the second connects. Only the exported snapshot keeps the commit out of it.
    from cuectl.sched.store import postgres

    report = open_store(pg_url)
    load(report, random_farm(random.Random(13), 30))
    worker = open_store(pg_url)
    (frame,) = add_frames(worker, 1, job="late")
    want = figures(*report.usage_summary(**WINDOW, by="host"))
    names = threads_reading_waits(monkeypatch)
    connect = postgres.psycopg.connect
    committed: list[bool] = []

    def worker_commits_then_connect(*args, **kwargs):
        if not committed:
            add_attempt(worker, frame, host="late", waiting=NOW - 7, start=NOW, end=NOW + 1)
            committed.append(True)
        return connect(*args, **kwargs)

    monkeypatch.setattr(postgres.psycopg, "connect", worker_commits_then_connect)
    got = figures(*report.usage_summary(**WINDOW, by="host"))
    assert committed and names[:1] == ["cuectl-report-waits"]
    assert got == want
    monkeypatch.setattr(postgres.psycopg, "connect", connect)
    groups, _ = report.usage_summary(**WINDOW, by="host")
    assert [g.waits for g in groups if g.key == ("late",)] == [[7.0]]
    worker.close()
    report.close()
