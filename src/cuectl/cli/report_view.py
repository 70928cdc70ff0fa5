"""What ``cuectl admin report`` prints, given the options (DESIGN §6, §9; figures explained
in docs/accounting.md): the figures come from ``cuectl.report``; this turns them into a
table or a machine format. Import-light, without typer: the console script answers an
ordinary report here directly (``cuectl.cli.entry``), and the typer command
(``cuectl.cli.report_cmd``) calls the same function."""

from __future__ import annotations

import time
from typing import Any, Callable

from cuectl.cli import term
from cuectl.errors import InvalidInput

TABLE_COLUMNS = (
    "GROUP",
    "FRAMES",
    "OK",
    "DEAD",
    "RETRIES",
    "WALL",
    "GPU-H ALLOC",
    "GPU-H BUSY",
    "WASTED",
    "HELD IDLE",
    "EFF%",
    "UTIL%",
    "PEAK MEM",
    "CORE-H",
    "WAIT P50/P95",
)


def show_report(
    store: Callable[[], Any],
    *,
    since: str = "7d",
    until: str | None = None,
    by: str = "job",
    format_: str = "table",
    output: str | None = None,
    as_json: bool = False,
) -> None:
    """The report over [since, until) grouped ``by``, printed (or written to ``output``).
    ``store()`` opens the store: only once every option has been checked."""
    from cuectl import report

    fmt = _format(format_, as_json)
    by = report.check_by(by)
    if output is not None and fmt == "table":
        raise InvalidInput("--output needs a machine format", hint="add --format csv, json or prometheus")
    now = time.time()
    start, end = report.parse_window(since, until, now=now)
    rows, total = report.run_report(store(), by=by, since=start, until=end, with_total=fmt in ("table", "json"))
    if fmt == "table":
        _table(rows, total, by=by, start=start, end=end)
        return
    if fmt == "csv":
        text = report.render_csv(rows)
    elif fmt == "json":
        text = report.render_json(rows, report.report_meta(by=by, since=start, until=end, generated_at=now), total)
    else:
        text = report.render_prometheus(rows, by=by, generated_at=now, since=start, until=end)
    if output is None:
        term.write_text(text)
    else:
        # Silent on success: a cron job mails whatever it prints.
        report.write_atomically(output, text)


def _format(format_: str, as_json: bool) -> str:
    from cuectl.report import check_format

    fmt = check_format(format_)
    if as_json:
        if fmt not in ("table", "json"):  # "table" is the default: --json alone means json
            raise InvalidInput(f"--json conflicts with --format {fmt}")
        return "json"
    return fmt


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def _pct(value: float | None) -> str | None:
    return None if value is None else f"{value:.1f}"


def _cells(row, *, gpu: bool) -> list:
    from cuectl.units import format_bytes, format_duration

    waits = "-" if row.wait_p50_s is None else f"{format_duration(row.wait_p50_s)}/{format_duration(row.wait_p95_s)}"
    return [
        row.group,
        row.frames,
        row.succeeded,
        row.dead,
        row.retries,
        format_duration(row.wall_seconds),
        _hours(row.gpu_seconds_allocated) if gpu else None,
        _hours(row.gpu_seconds_busy) if gpu else None,
        _hours(row.gpu_seconds_wasted) if gpu else None,
        _hours(row.gpu_seconds_held_idle) if gpu else None,
        _pct(row.gpu_efficiency_pct),
        _pct(row.gpu_util_mean_pct),
        format_bytes(row.gpu_memory_peak_bytes) if row.gpu_memory_peak_bytes is not None else None,
        _hours(row.core_seconds),
        waits,
    ]


def _table(rows, total, *, by: str, start: float, end: float) -> None:
    from cuectl.units import iso

    window = f"{iso(start)} to {iso(end)}"
    if not rows:
        term.info(f"no frame attempts ended from {window}")
        return
    cells = [_cells(r, gpu=r.gpu_seconds_allocated > 0) for r in rows]
    if total is not None and len(rows) > 1:
        cells.append(_cells(total, gpu=total.gpu_seconds_allocated > 0))
        cells[-1][0] = "TOTAL"
    term.table(
        TABLE_COLUMNS,
        cells,
        title=f"Accounting by {by}, attempts that ended from {window}",
        footer=f"window {window} (UTC); GPU-H in device-hours; WASTED = allocated - busy; HELD IDLE: held idle past a "
        "gpu_idle_limit (docs/gpu-health.md); "
        "figures explained in docs/accounting.md",
    )
