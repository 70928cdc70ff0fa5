"""cuectl.report as pure functions: hand-made usage records in, figures out; the
Prometheus text; the atomic writer under a concurrent reader."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from cuectl.errors import InvalidInput, StoreError
from cuectl.report import (ReportRow, build, build_report, escape_label_value, parse_window, percentile,
                           render_prometheus, write_atomically)

NOW = 1_700_000_000.0


def rec(frame_id: int, attempt: int = 1, *, outcome: str = "succeeded", start: float = 0.0, end: float = 10.0,
        uuids: tuple[str, ...] = (), models: tuple[str, ...] = (), alloc: float | None = None,
        busy: float | None = None, util: float | None = None, waiting: float | None = None, **extra: Any) -> dict:
    """One ``usage_records`` dict; every key a store returns is present."""
    base = {"frame_id": frame_id, "attempt": attempt, "job_id": 1, "job": "j", "user": "u", "layer": "l",
            "number": frame_id, "host": "h", "gpu_uuids": list(uuids), "gpu_models": list(models),
            "outcome": outcome, "waiting_since": waiting, "started_at": start, "ended_at": end, "exit_code": 0,
            "exit_signal": None, "timed_out": False, "max_rss_bytes": None, "cpu_seconds": None, "cores": 1.0,
            "gpu_util_mean_pct": util, "gpu_util_max_pct": util, "gpu_memory_peak_bytes": None,
            "gpu_seconds": alloc, "gpu_busy_seconds": busy}
    base.update(extra)
    return base


def test_percentile_is_nearest_rank():
    values = list(range(1, 11))
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 100)) == (5, 10, 10)
    assert percentile(list(range(1, 101)), 95) == 95
    assert percentile([1, 2, 3, 4, 5], 50) == 3 and percentile([10, 20, 30, 40], 50) == 20  # not interpolated
    assert percentile([7.0], 50) == percentile([7.0], 95) == 7.0
    assert percentile([], 50) is None


@pytest.mark.parametrize("outcomes, dead", [
    (["failed"], 1),                   # failed, nothing after it in the window
    (["failed", "succeeded"], 0),      # retried and then succeeded
    (["succeeded", "failed"], 1),      # re-run by a user, then failed for good
    (["timeout"], 1), (["killed"], 1), (["lost"], 1),
    (["failed", "worker stopped"], 0),  # requeued by a stopping worker: back in the queue, not dead
    (["eaten"], 0), (["retried"], 0), (["drain"], 0), (["orphaned"], 0),
])
def test_dead_is_decided_by_the_last_attempt(outcomes, dead):
    records = [rec(1, i + 1, outcome=o) for i, o in enumerate(outcomes)]
    (row,) = build_report(list(reversed(records)), by="user")  # record order must not matter
    assert (row.frames, row.dead, row.retries, row.attempts) == (1, dead, len(outcomes) - 1, len(outcomes))
    assert row.succeeded == outcomes.count("succeeded")


def test_gpu_model_shares_are_per_device():
    records = [rec(1, uuids=("a", "b", "c"), models=("A100", "A100", "V100"), alloc=30.0, busy=15.0, util=50.0,
                   end=10.0),
               rec(2, uuids=("d",), start=0.0, end=7.0),  # never reported: 7 s x 1 device, model unknown
               rec(3)]
    rows = {r.group: r for r in build_report(records, by="gpu-model")}
    assert rows["A100"].gpu_seconds_allocated == pytest.approx(20.0)
    assert rows["A100"].gpu_seconds_busy == pytest.approx(10.0)
    assert rows["V100"].gpu_seconds_allocated == pytest.approx(10.0)
    assert rows["unknown"].gpu_seconds_allocated == 7.0 and rows["unknown"].gpu_seconds_busy == 0.0
    assert rows["cpu"].gpu_seconds_allocated == 0.0 and rows["cpu"].gpu_efficiency_pct is None
    # Counts and wall are attempt facts: the three-device attempt is a whole frame in each model.
    assert (rows["A100"].frames, rows["V100"].frames, rows["A100"].wall_seconds) == (1, 1, 10.0)


def test_utilisation_is_weighted_by_allocation_and_waits_clamped():
    records = [rec(1, uuids=("a",), alloc=300.0, busy=30.0, util=10.0, start=100.0, waiting=40.0),
               rec(2, uuids=("a",), alloc=100.0, busy=90.0, util=90.0, start=100.0, waiting=130.0)]
    (row,) = build_report(records, by="user")
    assert row.gpu_util_mean_pct == pytest.approx((10 * 300 + 90 * 100) / 400)  # 30, not the plain mean 50
    assert row.gpu_efficiency_pct == pytest.approx(120 / 400 * 100)
    assert row.gpu_seconds_wasted == pytest.approx(280.0)
    assert (row.wait_p50_s, row.wait_p95_s) == (0.0, 60.0)  # a clock-skewed negative wait counts as 0


def test_wasted_never_negative_and_missing_times_are_zero_wall():
    (row,) = build_report([rec(1, uuids=("a",), alloc=10.0, busy=10.0004, util=100.0),
                           rec(2, start=None, end=5.0)], by="user")
    assert row.gpu_seconds_wasted == 0.0 and row.wall_seconds == 10.0


def test_rows_sorted_by_allocated_then_group_and_job_ids_numerically():
    records = [rec(1, job_id=10, job="b", uuids=("a",), alloc=5.0), rec(2, job_id=2, job="z"),
               rec(3, job_id=9, job="a"), rec(4, job_id=3, job="y", uuids=("a",), alloc=50.0)]
    assert [r.group for r in build_report(records, by="job")] == ["3 y", "10 b", "2 z", "9 a"]


def test_day_groups_use_utc():
    day = 86400.0
    records = [rec(1, end=19723 * day + 1), rec(2, end=19724 * day - 1), rec(3, end=19724 * day)]
    assert [(r.group, r.frames) for r in build_report(records, by="day")] == [("2024-01-01", 2), ("2024-01-02", 1)]


def test_total_counts_distinct_frames_across_groups():
    records = [rec(1, 1, outcome="failed", host="h1"), rec(1, 2, host="h2")]
    rows, total = build(records, by="host")
    assert sum(r.frames for r in rows) == 2 and total is not None and total.frames == 1 and total.dead == 0


def test_bad_by_and_window():
    with pytest.raises(InvalidInput, match="--by"):
        build_report([], by="nope")
    assert parse_window("1h", None, now=NOW) == (NOW - 3600, NOW)
    assert parse_window("2024-01-01", "2024-01-02T00:00:00Z", now=NOW) == (1704067200.0, 1704153600.0)
    with pytest.raises(InvalidInput, match="must be before"):
        parse_window("1h", "2h", now=NOW)


def test_prometheus_escapes_and_omits_unknown_values():
    assert escape_label_value('a\\b"c\nd') == 'a\\\\b\\"c\\nd'
    row = ReportRow(group='we"ird\nuser\\', frames=1, wall_seconds=2.5)
    text = render_prometheus([row], by="user", generated_at=NOW)
    assert 'cuectl_report_wall_seconds{by="user",group="we\\"ird\\nuser\\\\"} 2.5\n' in text
    assert all(line.startswith(("# ", "cuectl_report_")) for line in text.splitlines())  # no line was split
    assert "cuectl_report_gpu_efficiency_ratio{" not in text  # no GPU allocated: unknown, left out
    assert "cuectl_report_queue_wait_seconds{" not in text
    assert f'cuectl_report_generated_timestamp_seconds{{by="user"}} {NOW!r}\n' in text
    assert text.count("# TYPE cuectl_report_wall_seconds gauge\n") == 1


def test_write_atomically_readers_never_see_a_partial_file(tmp_path: Path):
    target = tmp_path / "out.prom"
    versions = ["a" * 2_000_000 + "\n", "b" * 3_000_000 + "\n"]
    write_atomically(target, versions[0])
    seen: set[int] = set()
    bad: list[int] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            text = target.read_text()
            if text not in versions:
                bad.append(len(text))
            seen.add(len(text))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(30):
            write_atomically(target, versions[i % 2])
    finally:
        stop.set()
        thread.join()
    assert not bad, f"reader saw partial files of sizes {bad[:5]}"
    assert sorted(os.listdir(tmp_path)) == ["out.prom"]


def test_write_atomically_failure_keeps_old_file_and_leaves_no_temp(tmp_path: Path):
    target = tmp_path / "dir-in-the-way"
    target.mkdir()
    (target / "keep").write_text("x")
    with pytest.raises(StoreError, match="cannot write"):
        write_atomically(target, "new\n")  # renaming a file over a directory fails
    assert sorted(os.listdir(tmp_path)) == ["dir-in-the-way"]
    assert (target / "keep").read_text() == "x"
