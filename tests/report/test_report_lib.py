"""cuectl.report's pure parts: percentiles, the window, the Prometheus text, the atomic
writer under a concurrent reader. The sums themselves are tested per store in
tests/sched/test_usage_sql.py."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from cuectl.errors import InvalidInput, StoreError
from cuectl.report import (
    ReportRow,
    check_by,
    escape_label_value,
    parse_window,
    percentile,
    render_prometheus,
    write_atomically,
)

NOW = 1_700_000_000.0


def test_percentile_is_nearest_rank():
    values = list(range(1, 11))
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 100)) == (5, 10, 10)
    assert percentile(list(range(1, 101)), 95) == 95
    assert percentile([1, 2, 3, 4, 5], 50) == 3 and percentile([10, 20, 30, 40], 50) == 20  # not interpolated
    assert percentile([7.0], 50) == percentile([7.0], 95) == 7.0
    assert percentile([], 50) is None


def test_bad_by_and_window():
    with pytest.raises(InvalidInput, match="--by"):
        check_by("nope")
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
