"""Accounting: per-group figures of the attempts that ended in a window (``cuectl admin
report``, DESIGN §6 and §9; every figure is explained in docs/accounting.md).

The store adds the attempts up (``Store.usage_summary``, one SQL text for SQLite and
PostgreSQL in ``cuectl.sched.usage_sql``, where the summing rules are); this module turns
each group's sums into a report row — names, labels, derived figures, percentiles, order —
and renders the rows.

Rules worth knowing before changing anything:

- ``frames`` counts distinct frames with an attempt in the window; ``succeeded`` and
  ``retries`` count attempts; ``dead`` counts frames whose *last* attempt in the window is a
  failure (``FAILED_OUTCOMES``) — a frame still waiting for its retry when the window
  closes counts as dead in that window, because the window cannot see the future.
- GPU-seconds allocated is the worker's ``gpu_seconds`` (wall × devices). An attempt the
  worker never reported (reaped as ``lost``, requeued by a stopping worker) has none; it
  still held its devices, so it is charged wall × devices with nothing busy — wasted.
- ``--by gpu-model`` gives an attempt on several models an even share of its GPU figures
  per device; counts, wall and core-seconds are attempt facts and go to each model whole.
  An unreported attempt's devices take their models from their host's inventory; only a
  device no inventory lists is ``unknown``.
- ``--by project`` groups by the job's ``project``; jobs without one form the group ``-``
  (as ``--by host`` names attempts without a host). ``--by show`` likewise, by its ``show``.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from cuectl.errors import InvalidInput, StoreError
from cuectl.sched.usage_sql import GROUPINGS, UsageGroup
from cuectl.units import iso, parse_time

FORMATS = ("table", "csv", "json", "prometheus")

# The DESIGN §9 report-row keys, in order; ``to_json`` adds the extras after them.
ROW_KEYS = (
    "group",
    "frames",
    "succeeded",
    "dead",
    "retries",
    "wall_seconds",
    "gpu_seconds_allocated",
    "gpu_seconds_busy",
    "gpu_efficiency_pct",
    "gpu_util_mean_pct",
    "gpu_memory_peak_bytes",
    "core_seconds",
    "wait_p50_s",
    "wait_p95_s",
)
EXTRA_KEYS = ("gpu_seconds_wasted", "gpu_seconds_held_idle", "attempts", "labels")


# -- building rows -------------------------------------------------------------------------
@dataclass
class ReportRow:
    """One group's figures. Derived figures (wasted, efficiency) are properties so they can
    never disagree with the sums they come from."""

    group: str
    labels: dict[str, str] = field(default_factory=dict)
    frames: int = 0
    succeeded: int = 0
    dead: int = 0
    retries: int = 0
    attempts: int = 0
    wall_seconds: float = 0.0
    gpu_seconds_allocated: float = 0.0
    gpu_seconds_busy: float = 0.0
    gpu_util_mean_pct: float | None = None
    gpu_memory_peak_bytes: int | None = None
    core_seconds: float = 0.0
    wait_p50_s: float | None = None
    wait_p95_s: float | None = None
    # Device-seconds frames held idle past their layer's gpu_idle_limit (docs/gpu-health.md):
    # the part of "wasted" a rule flagged.
    gpu_seconds_held_idle: float = 0.0

    @property
    def gpu_seconds_wasted(self) -> float:
        # Busy can exceed allocated by a rounding hair (both are rounded by the worker).
        return max(0.0, self.gpu_seconds_allocated - self.gpu_seconds_busy)

    @property
    def gpu_efficiency_pct(self) -> float | None:
        if self.gpu_seconds_allocated <= 0:
            return None
        return self.gpu_seconds_busy / self.gpu_seconds_allocated * 100.0

    def to_json(self) -> dict[str, Any]:
        """DESIGN §9 keys (sizes in bytes, durations in seconds, unknown = None) + extras."""
        return {
            "group": self.group,
            "frames": self.frames,
            "succeeded": self.succeeded,
            "dead": self.dead,
            "retries": self.retries,
            "wall_seconds": _round(self.wall_seconds, 3),
            "gpu_seconds_allocated": _round(self.gpu_seconds_allocated, 3),
            "gpu_seconds_busy": _round(self.gpu_seconds_busy, 3),
            "gpu_efficiency_pct": _round(self.gpu_efficiency_pct, 2),
            "gpu_util_mean_pct": _round(self.gpu_util_mean_pct, 2),
            "gpu_memory_peak_bytes": self.gpu_memory_peak_bytes,
            "core_seconds": _round(self.core_seconds, 3),
            "wait_p50_s": _round(self.wait_p50_s, 3),
            "wait_p95_s": _round(self.wait_p95_s, 3),
            "gpu_seconds_wasted": _round(self.gpu_seconds_wasted, 3),
            "gpu_seconds_held_idle": _round(self.gpu_seconds_held_idle, 3),
            "attempts": self.attempts,
            "labels": dict(self.labels),
        }


def describe(by: str, key: tuple) -> tuple[str, dict[str, str], tuple]:
    """A group's name, extra labels (Prometheus/JSON) and sort key, from its store key."""
    if by == "job":
        job_id, name = key
        return f"{job_id} {name}", {"job_id": str(job_id), "job_name": str(name)}, (int(job_id), str(name))
    if by == "layer":
        job, layer = key
        return f"{job}/{layer}", {"job_name": str(job), "layer": str(layer)}, (0, f"{job}/{layer}")
    if by == "day":
        day = time.strftime("%Y-%m-%d", time.gmtime(int(key[0]) * 86400))  # UTC, whatever the host's zone
        return day, {}, (0, day)
    name = "-" if key[0] is None else str(key[0])
    return name, {}, (0, name)


def check_by(by: str) -> str:
    """The grouping in its canonical spelling: ``gpu_model`` is ``gpu-model`` (the JSON
    keys are spelled with ``_``, the option's values with ``-``; users type either)."""
    canonical = by.replace("_", "-")
    if canonical not in GROUPINGS:
        raise InvalidInput(f"--by: unknown grouping {by!r}", hint="use one of: " + ", ".join(GROUPINGS))
    return canonical


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise InvalidInput(f"--format: unknown format {fmt!r}", hint="use one of: " + ", ".join(FORMATS))
    return fmt


def percentile(sorted_values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile: the smallest observed value with at least ``pct`` % of the
    values at or below it (always a real observation, never interpolated)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(pct / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def report_row(group: UsageGroup, name: str, labels: dict[str, str] | None = None) -> ReportRow:
    """A group's sums as a report row: the weighted mean utilisation and the wait percentiles."""
    return ReportRow(
        group=name,
        labels=dict(labels or {}),
        frames=group.frames,
        succeeded=group.succeeded,
        dead=group.dead,
        retries=group.retries,
        attempts=group.attempts,
        wall_seconds=group.wall_seconds,
        gpu_seconds_allocated=group.gpu_seconds_allocated,
        gpu_seconds_busy=group.gpu_seconds_busy,
        gpu_util_mean_pct=(group.util_weighted / group.util_weight) if group.util_weight > 0 else None,
        gpu_memory_peak_bytes=group.gpu_memory_peak_bytes,
        core_seconds=group.core_seconds,
        wait_p50_s=percentile(group.waits, 50),
        wait_p95_s=percentile(group.waits, 95),
        gpu_seconds_held_idle=group.gpu_seconds_idle,
    )


def build_rows(groups: Sequence[UsageGroup], *, by: str) -> list[ReportRow]:
    """Rows sorted by GPU-seconds allocated (largest first), then by group (job id for
    ``--by job``)."""
    described = []
    for group in groups:
        name, labels, sort_key = describe(by, group.key)
        described.append((report_row(group, name, labels), sort_key))
    described.sort(key=lambda rs: (-rs[0].gpu_seconds_allocated, rs[1]))
    return [row for row, _ in described]


# -- reading the store ---------------------------------------------------------------------
def run_report(
    store: Any, *, by: str, since: float, until: float, with_total: bool = True
) -> tuple[list[ReportRow], ReportRow | None]:
    """The window's rows (and the ``total`` row over all of it: distinct frames and
    percentiles over the whole window, which adding the rows up cannot give) from any store."""
    by = check_by(by)  # the library's callers may spell it gpu_model too
    groups, total = store.usage_summary(since=since, until=until, by=by, with_total=with_total)
    return build_rows(groups, by=by), (report_row(total, "total") if total is not None else None)


def parse_window(since: str, until: str | None, *, now: float) -> tuple[float, float]:
    """``--since``/``--until`` (``7d`` = 7 days before now, or ISO dates/timestamps, UTC
    unless they say otherwise) to epoch seconds; ``--until`` defaults to now."""
    start = parse_time(since, now=now, field="--since")
    end = parse_time(until, now=now, field="--until") if until else now
    if start >= end:
        raise InvalidInput(f"--since ({iso(start)}) must be before --until ({iso(end)})")
    return start, end


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


# -- rendering -----------------------------------------------------------------------------
CSV_COLUMNS = ROW_KEYS + ("gpu_seconds_wasted", "gpu_seconds_held_idle", "attempts")


def render_csv(rows: Sequence[ReportRow]) -> str:
    """RFC 4180 CSV (``\\n`` line ends), header row first, unknown values empty."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        data = row.to_json()
        writer.writerow(["" if data[k] is None else data[k] for k in CSV_COLUMNS])
    return out.getvalue()


def render_json(rows: Sequence[ReportRow], meta: Mapping[str, Any], total: ReportRow | None = None) -> str:
    """``{"by", "since", "until", "generated_at", …meta, "rows": [row…], "total": row}``."""
    doc: dict[str, Any] = dict(meta)
    doc["rows"] = [r.to_json() for r in rows]
    if total is not None:
        doc["total"] = total.to_json()
    return json.dumps(doc, indent=2) + "\n"


# Prometheus families: (name suffix, help, value getter). Ratios are 0–1 and durations in
# seconds, as Prometheus conventions want; docs/accounting.md maps them to the JSON keys.
def _ratio(pct: float | None) -> float | None:
    return None if pct is None else pct / 100.0


PROM_FAMILIES: tuple[tuple[str, str, Callable[[ReportRow], float | int | None]], ...] = (
    ("frames", "Distinct frames with an attempt that ended in the report window.", lambda r: r.frames),
    ("frames_succeeded", "Attempts that succeeded in the window.", lambda r: r.succeeded),
    ("frames_dead", "Frames whose last attempt in the window failed (dead, or awaiting a retry).", lambda r: r.dead),
    ("retries", "Attempts beyond a frame's first (retries and requeues) in the window.", lambda r: r.retries),
    ("wall_seconds", "Sum of attempt wall-clock seconds.", lambda r: r.wall_seconds),
    (
        "gpu_seconds_allocated",
        "GPU-seconds allocated to attempts (wall time x devices).",
        lambda r: r.gpu_seconds_allocated,
    ),
    ("gpu_seconds_busy", "GPU-seconds the devices were busy (utilisation x time).", lambda r: r.gpu_seconds_busy),
    ("gpu_seconds_wasted", "GPU-seconds allocated but idle (allocated - busy).", lambda r: r.gpu_seconds_wasted),
    (
        "gpu_seconds_held_idle",
        "GPU-seconds frames held idle past their layer's gpu_idle_limit.",
        lambda r: r.gpu_seconds_held_idle,
    ),
    ("gpu_efficiency_ratio", "Busy / allocated GPU-seconds (0-1).", lambda r: _ratio(r.gpu_efficiency_pct)),
    (
        "gpu_utilization_mean_ratio",
        "Allocation-weighted mean GPU utilisation of attempts (0-1).",
        lambda r: _ratio(r.gpu_util_mean_pct),
    ),
    ("gpu_memory_peak_bytes", "Highest GPU memory one device of an attempt used.", lambda r: r.gpu_memory_peak_bytes),
    ("core_seconds", "Reserved CPU cores x attempt wall seconds.", lambda r: r.core_seconds),
)
PROM_PREFIX = "cuectl_report_"


def escape_label_value(value: str) -> str:
    """Text exposition format: backslash, double quote and line feed are escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: Mapping[str, str]) -> str:
    return "{" + ",".join(f'{k}="{escape_label_value(str(v))}"' for k, v in pairs.items()) + "}"


def _number(value: float | int) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    return repr(round(float(value), 6))


def render_prometheus(
    rows: Sequence[ReportRow], *, by: str, generated_at: float, since: float | None = None, until: float | None = None
) -> str:
    """Prometheus text exposition (node_exporter textfile collector): one gauge family per
    figure, each sample labelled ``by`` and ``group`` (+ ``job_id``/``job_name``/``layer``
    for ``--by job|layer``). Every sample carries ``by`` so that several reports (one file
    per ``--by``) can sit in the same textfile directory without duplicate series. Unknown
    values (efficiency of CPU-only groups, waits without data) are left out, not NaN."""
    lines: list[str] = []
    row_labels = [{"by": by, "group": r.group, **r.labels} for r in rows]

    def family(name: str, help_text: str) -> None:
        lines.append(f"# HELP {PROM_PREFIX}{name} {help_text}")
        lines.append(f"# TYPE {PROM_PREFIX}{name} gauge")

    for suffix, help_text, getter in PROM_FAMILIES:
        family(suffix, help_text)
        for row, labels in zip(rows, row_labels):
            value = getter(row)
            if value is not None:
                lines.append(f"{PROM_PREFIX}{suffix}{_labels(labels)} {_number(value)}")
    family("queue_wait_seconds", "Queue wait of attempts (start - became waiting), nearest-rank quantiles.")
    for row, labels in zip(rows, row_labels):
        for quantile, value in (("0.5", row.wait_p50_s), ("0.95", row.wait_p95_s)):
            if value is not None:
                lines.append(
                    f"{PROM_PREFIX}queue_wait_seconds{_labels({**labels, 'quantile': quantile})} {_number(value)}"
                )
    family("generated_timestamp_seconds", "When this report was generated (Unix time).")
    lines.append(f"{PROM_PREFIX}generated_timestamp_seconds{_labels({'by': by})} {_number(generated_at)}")
    if since is not None and until is not None:
        family("window_seconds", "Length of the report window (--since to --until).")
        lines.append(f"{PROM_PREFIX}window_seconds{_labels({'by': by})} {_number(until - since)}")
    return "\n".join(lines) + "\n"


def report_meta(*, by: str, since: float, until: float, generated_at: float) -> dict[str, Any]:
    return {"by": by, "since": iso(since), "until": iso(until), "generated_at": iso(generated_at)}


# -- output file ---------------------------------------------------------------------------
def write_atomically(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that readers (node_exporter, a cron consumer) see
    the old file or the new one, never half of one: write a temp file in the same directory
    (a rename is only atomic within a filesystem), fsync it, rename it over the target,
    then fsync the directory so the rename itself survives a crash.

    A new file is made 0644 — the textfile collector runs as another user; an existing
    file keeps its mode. Errors raise ``StoreError`` (exit 1) and leave no temp file.
    """
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    try:
        mode = target.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o644
    except OSError as exc:
        raise StoreError(f"cannot write {target}: {exc.strerror or exc}") from None
    import tempfile  # here: only --output needs it, and every report would import it (~5 ms)

    tmp_name: str | None = None
    try:
        fd, tmp_name = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
        tmp_name = None
        _fsync_dir(directory)
    except OSError as exc:
        raise StoreError(
            f"cannot write {target}: {exc.strerror or exc}", hint="check that the directory exists and is writable"
        ) from None
    finally:
        if tmp_name is not None:
            try:
                os.unlink(tmp_name)
            except OSError:
                pass


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # some platforms/filesystems cannot open a directory; the data is synced
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
