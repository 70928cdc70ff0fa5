"""Accounting: per-group figures from the store's per-attempt usage records (``cuectl admin
report``, DESIGN §6 and §9; every figure is explained in docs/accounting.md).

The input is ``Store.usage_records(since=…, until=…)``: one dict per frame *attempt* that
ended in the window. Everything here is a pure function of those dicts, so the SQLite and
PostgreSQL stores give the same report and the tests can feed known numbers.

Rules worth knowing before changing anything:

- ``frames`` counts distinct frames with an attempt in the window; ``succeeded`` and
  ``retries`` count attempts; ``dead`` counts frames whose *last* attempt in the window is a
  failure (see ``FAILED_OUTCOMES``) — a frame still waiting for its retry when the window
  closes counts as dead in that window, because the records cannot see the future.
- GPU-seconds allocated is the worker's ``gpu_seconds`` (wall × devices). An attempt the
  worker never reported (reaped as ``lost``, requeued by a stopping worker) has none; it
  still held its devices, so it is charged wall × devices with nothing busy — wasted.
- ``--by gpu-model`` gives an attempt on several models an even share of its GPU figures
  per device; counts, wall and core-seconds are attempt facts and go to each model whole.
"""

from __future__ import annotations

import csv
import gc
import io
import json
import math
import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from cuectl.errors import InvalidInput, StoreError
from cuectl.units import iso, parse_time

GROUPINGS = ("job", "layer", "user", "host", "gpu-model", "day")
FORMATS = ("table", "csv", "json", "prometheus")

# Outcomes after which a frame can be DEAD (``_next_state``/``reap`` in the store). A
# user's ``eat``/``retry`` and a worker's requeue (``worker stopped``, ``drain``,
# ``orphaned``…) are not failures of the frame.
FAILED_OUTCOMES = frozenset({"failed", "timeout", "killed", "lost"})
SUCCEEDED = "succeeded"
CPU_GROUP = "cpu"          # --by gpu-model: attempts that used no GPU
UNKNOWN_MODEL = "unknown"  # --by gpu-model: held GPUs but no model was recorded (lost attempts)

# The DESIGN §9 report-row keys, in order; ``to_json`` adds the extras after them.
ROW_KEYS = ("group", "frames", "succeeded", "dead", "retries", "wall_seconds", "gpu_seconds_allocated",
            "gpu_seconds_busy", "gpu_efficiency_pct", "gpu_util_mean_pct", "gpu_memory_peak_bytes",
            "core_seconds", "wait_p50_s", "wait_p95_s")
EXTRA_KEYS = ("gpu_seconds_wasted", "attempts", "labels")


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
            "attempts": self.attempts,
            "labels": dict(self.labels),
        }


# Grouping is done on a raw key taken from each record by a C-level itemgetter where
# possible; the group's display name, labels and sort key are made once per group. The
# report must stay well under a second for 100,000 attempts, and per-record Python work
# (f-strings, dict lookups in bytecode) was most of its cost.
def _day_number(rec: Mapping[str, Any]) -> int:
    return int(rec["ended_at"] // 86400)  # days since the epoch = UTC days, whatever the host's zone


RAW_KEYS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "job": itemgetter("job_id", "job"),
    "layer": itemgetter("job", "layer"),
    "user": itemgetter("user"),
    "host": itemgetter("host"),
    "day": _day_number,
}


def _describe(by: str, raw: Any) -> tuple[str, dict[str, str], tuple]:
    """A group's name, extra labels (Prometheus/JSON) and sort key, from its raw key."""
    if by == "job":
        job_id, name = raw
        return f"{job_id} {name}", {"job_id": str(job_id), "job_name": str(name)}, (job_id, str(name))
    if by == "layer":
        job, layer = raw
        return f"{job}/{layer}", {"job_name": str(job), "layer": str(layer)}, (0, f"{job}/{layer}")
    if by == "day":
        day = time.strftime("%Y-%m-%d", time.gmtime(raw * 86400))
        return day, {}, (0, day)
    name = "-" if raw is None else str(raw)
    return name, {}, (0, name)


def _gpu_model_shares(rec: Mapping[str, Any]) -> list[tuple[str, float]]:
    """(model, share of the attempt's GPU figures): each device is an equal part of the
    allocation, so 2 × A100 + 1 × V100 gives A100 2/3 and V100 1/3."""
    models = rec.get("gpu_models") or ()
    if not models:
        return [(UNKNOWN_MODEL if rec.get("gpu_uuids") else CPU_GROUP, 1.0)]
    if len(models) == 1:
        return [(str(models[0]), 1.0)]
    counts: dict[str, int] = {}
    for model in models:
        counts[str(model)] = counts.get(str(model), 0) + 1
    return [(model, n / len(models)) for model, n in counts.items()]


def check_by(by: str) -> str:
    if by not in GROUPINGS:
        raise InvalidInput(f"--by: unknown grouping {by!r}", hint="use one of: " + ", ".join(GROUPINGS))
    return by


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


# The record fields the figures need, fetched by one C-level call per record.
_FIELDS = itemgetter("frame_id", "attempt", "outcome", "started_at", "ended_at", "cores", "gpu_seconds",
                     "gpu_uuids", "gpu_busy_seconds", "gpu_util_mean_pct", "gpu_memory_peak_bytes", "waiting_since")
_Values = tuple  # what _FIELDS returns, in that order


@dataclass
class _Bucket:
    labels: dict[str, str]
    sort_key: tuple
    values: list[_Values] = field(default_factory=list)
    shares: list[float] | None = None  # --by gpu-model only: the group's share of each record


def build_report(records: Iterable[Mapping[str, Any]], *, by: str) -> list[ReportRow]:
    """Group usage records (dicts with every ``usage_records`` key) and compute each
    group's figures; rows sorted by GPU-seconds allocated (largest first), then by group
    (job id for ``--by job``)."""
    return build(records, by=by, with_total=False)[0]


def build(records: Iterable[Mapping[str, Any]], *, by: str,
          with_total: bool = True) -> tuple[list[ReportRow], ReportRow | None]:
    """``build_report`` plus, optionally, the ``total`` row over all records: distinct
    frames and percentiles over the whole window, which summing the rows cannot give."""
    check_by(by)
    records = records if isinstance(records, list) else list(records)
    values = list(map(_FIELDS, records))
    buckets = _group_by_model(records, values) if by == "gpu-model" else _group(records, values, by)
    dead_ids = dead_attempts(values)
    rows = [(_figures(name, b.values, b.shares, dead_ids, b.labels), b.sort_key) for name, b in buckets.items()]
    rows.sort(key=lambda rs: (-rs[0].gpu_seconds_allocated, rs[1]))
    total = _figures("total", values, None, dead_ids, {}) if with_total else None
    return [row for row, _ in rows], total


def _group(records: list[Mapping[str, Any]], values: list[_Values], by: str) -> dict[str, _Bucket]:
    by_raw: dict[Any, list[_Values]] = {}
    for raw, vals in zip(map(RAW_KEYS[by], records), values):
        bucket = by_raw.get(raw)
        if bucket is None:
            by_raw[raw] = [vals]
        else:
            bucket.append(vals)
    buckets: dict[str, _Bucket] = {}
    for raw, vals in by_raw.items():
        name, labels, sort_key = _describe(by, raw)
        if name in buckets:  # two raw keys, one name (a None host and a host called "-")
            buckets[name].values.extend(vals)
        else:
            buckets[name] = _Bucket(labels, sort_key, vals)
    return buckets


def _group_by_model(records: list[Mapping[str, Any]], values: list[_Values]) -> dict[str, _Bucket]:
    buckets: dict[str, _Bucket] = {}
    for rec, vals in zip(records, values):
        for name, share in _gpu_model_shares(rec):
            bucket = buckets.get(name)
            if bucket is None:
                bucket = buckets[name] = _Bucket({}, (0, name), shares=[])
            bucket.values.append(vals)
            bucket.shares.append(share)  # type: ignore[union-attr]
    return buckets


def build_total(records: Iterable[Mapping[str, Any]]) -> ReportRow:
    """All records as one group, ``total``."""
    values = list(map(_FIELDS, records))
    return _figures("total", values, None, dead_attempts(values), {})


def dead_attempts(values: Iterable[_Values]) -> dict[int, int]:
    """frame id -> attempt, for each frame whose last attempt in the window failed
    (``FAILED_OUTCOMES``). Nothing follows the last attempt, so in particular no success
    does: the frame is DEAD, or still waiting for a retry when the window ends."""
    last: dict[int, _Values] = {}
    for vals in values:
        seen = last.get(vals[0])
        if seen is None or vals[1] > seen[1]:
            last[vals[0]] = vals
    return {vals[0]: vals[1] for vals in last.values() if vals[2] in FAILED_OUTCOMES}


def _figures(group: str, values: Sequence[_Values], shares: Sequence[float] | None,
             dead_ids: dict[int, int], labels: dict[str, str]) -> ReportRow:
    """One group's row. A hot loop: locals only."""
    frame_ids: set[int] = set()
    succeeded = retries = dead = 0
    wall_sum = core_sum = alloc_sum = busy_sum = util_sum = util_weight = 0.0
    peak: int | None = None
    waits: list[float] = []
    share = 1.0
    for i, (frame_id, attempt, outcome, started, ended, cores, allocated, uuids, busy, util, mem,
            waiting) in enumerate(values):
        if shares is not None:
            share = shares[i]
        frame_ids.add(frame_id)
        if outcome == SUCCEEDED:
            succeeded += 1
        if attempt > 1:
            retries += 1
        if dead_ids and dead_ids.get(frame_id) == attempt:
            dead += 1
        wall = ended - started if started is not None and ended is not None and ended > started else 0.0
        wall_sum += wall
        if cores:
            core_sum += cores * wall
        if allocated is None:
            # Never reported (lost, requeued): the devices were held all the same.
            allocated = wall * len(uuids) if uuids else 0.0
        alloc_sum += allocated * share
        if busy:
            busy_sum += busy * share
        if util is not None and allocated > 0:
            util_sum += util * allocated * share
            util_weight += allocated * share
        if mem is not None and (peak is None or mem > peak):
            peak = int(mem)
        if waiting is not None and started is not None:
            waits.append(started - waiting if started > waiting else 0.0)
    waits.sort()
    return ReportRow(
        group=group, labels=labels, frames=len(frame_ids), succeeded=succeeded, dead=dead, retries=retries,
        attempts=len(values), wall_seconds=wall_sum, gpu_seconds_allocated=alloc_sum, gpu_seconds_busy=busy_sum,
        gpu_util_mean_pct=(util_sum / util_weight) if util_weight > 0 else None, gpu_memory_peak_bytes=peak,
        core_seconds=core_sum, wait_p50_s=percentile(waits, 50), wait_p95_s=percentile(waits, 95))


# -- reading the store ---------------------------------------------------------------------
@contextmanager
def gc_paused() -> Iterator[None]:
    """Reading and grouping 100,000 records allocates ~10^6 objects and no cycles; the
    cyclic garbage collector would scan them ~900 times and find nothing (measured: a
    sixth of the report's time at 100,000 attempts). Pause it, as batch tools do."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def run_report(store: Any, *, by: str, since: float, until: float,
               with_total: bool = True) -> tuple[list[ReportRow], ReportRow | None]:
    """Read the window's records from any store (``usage_records``, never SQL) and build."""
    check_by(by)
    with gc_paused():
        records = store.usage_records(since=since, until=until)
        return build(records, by=by, with_total=with_total)


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
CSV_COLUMNS = ROW_KEYS + ("gpu_seconds_wasted", "attempts")


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
    ("frames_dead", "Frames whose last attempt in the window failed (dead, or awaiting a retry).",
     lambda r: r.dead),
    ("retries", "Attempts beyond a frame's first (retries and requeues) in the window.", lambda r: r.retries),
    ("wall_seconds", "Sum of attempt wall-clock seconds.", lambda r: r.wall_seconds),
    ("gpu_seconds_allocated", "GPU-seconds allocated to attempts (wall time x devices).",
     lambda r: r.gpu_seconds_allocated),
    ("gpu_seconds_busy", "GPU-seconds the devices were busy (utilisation x time).", lambda r: r.gpu_seconds_busy),
    ("gpu_seconds_wasted", "GPU-seconds allocated but idle (allocated - busy).", lambda r: r.gpu_seconds_wasted),
    ("gpu_efficiency_ratio", "Busy / allocated GPU-seconds (0-1).", lambda r: _ratio(r.gpu_efficiency_pct)),
    ("gpu_utilization_mean_ratio", "Allocation-weighted mean GPU utilisation of attempts (0-1).",
     lambda r: _ratio(r.gpu_util_mean_pct)),
    ("gpu_memory_peak_bytes", "Highest GPU memory one device of an attempt used.",
     lambda r: r.gpu_memory_peak_bytes),
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


def render_prometheus(rows: Sequence[ReportRow], *, by: str, generated_at: float,
                      since: float | None = None, until: float | None = None) -> str:
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
                lines.append(f"{PROM_PREFIX}queue_wait_seconds{_labels({**labels, 'quantile': quantile})} "
                             f"{_number(value)}")
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
        raise StoreError(f"cannot write {target}: {exc.strerror or exc}",
                         hint="check that the directory exists and is writable") from None
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
