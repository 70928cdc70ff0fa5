"""Per-frame GPU usage: samples in, a bounded series and a summary out.

The worker feeds one ``DeviceSample`` per device of the frame at each sampling tick (and
always once at start and once at the end, so short frames have data). Where the backend
reports the frame's own processes, their memory and utilisation are billed to the frame
instead of the whole device's, so another process on the same card is not charged to it.

Summary (DESIGN §4 usage, docs/accounting.md):
- ``gpu_util_mean_pct``: time-weighted mean utilisation over the frame's devices;
- ``gpu_util_max_pct``: the highest utilisation seen on any of its devices;
- ``gpu_memory_peak_bytes``: the highest memory seen on any one of its devices;
- ``gpu_seconds``: wall time × devices (allocated);
- ``gpu_busy_seconds``: Σ utilisation × interval over devices (used).

A share of one device (``gpu_share``) counts its part of the device (budget / memory) of
``gpu_seconds`` — three 8 GiB shares of a 24 GiB card for an hour are one device-hour
between them — and at most that of ``gpu_busy_seconds``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Collection, Mapping, Sequence

from cuectl.gpu.device import DeviceSample

# Stored points per attempt and device. Older points are merged pairwise when the series
# is full (each merged point keeps the max of both), so a week-long frame keeps a coarse
# but complete picture and its peaks, in bounded space.
MAX_POINTS = 120


@dataclass
class Point:
    t: float  # epoch seconds (start of the interval it covers)
    util: float | None
    mem: int | None

    def merge(self, other: "Point") -> "Point":
        util = max((u for u in (self.util, other.util) if u is not None), default=None)
        mem = max((m for m in (self.mem, other.mem) if m is not None), default=None)
        return Point(self.t, util, mem)


@dataclass
class DeviceSeries:
    points: list[Point] = field(default_factory=list)

    def add(self, point: Point) -> None:
        self.points.append(point)
        if len(self.points) > MAX_POINTS:
            merged = [a.merge(b) for a, b in zip(self.points[0::2], self.points[1::2])]
            if len(self.points) % 2:
                merged.append(self.points[-1])
            self.points = merged


def _frame_values(sample: DeviceSample, pids: Collection[int]) -> tuple[float | None, int | None]:
    """The frame's own utilisation and memory on this device (its processes when known)."""
    own = [p for p in sample.processes if p.pid in pids] if pids else []
    if own:
        mems = [p.memory_used_bytes for p in own if p.memory_used_bytes is not None]
        utils = [p.utilization_pct for p in own if p.utilization_pct is not None]
        mem = sum(mems) if mems else sample.memory_used_bytes
        util = min(100.0, sum(utils)) if utils else sample.utilization_pct
        return util, mem
    return sample.utilization_pct, sample.memory_used_bytes


class UsageTracker:
    """Accumulates one frame attempt's GPU usage from periodic samples."""

    def __init__(self, uuids: Sequence[str], started_at: float) -> None:
        self.uuids = tuple(uuids)
        self.started_at = started_at
        self.series = {u: DeviceSeries() for u in self.uuids}
        self._last_t: dict[str, float] = {}
        self._last_util: dict[str, float | None] = {}
        self._busy = 0.0
        self._util_time = 0.0
        self._util_weight = 0.0
        self._util_max: float | None = None
        self._mem_peak: int | None = None
        self.samples_taken = 0
        self.last_at: float | None = None  # when the latest sample was added
        self._now: dict[str, tuple[float | None, int | None]] = {}  # uuid -> latest (util, mem)
        # uuid -> the latest memory of the frame's own processes there and its biggest
        # process (None: the backend listed no process, so nothing is known of the frame's own).
        self._own: dict[str, tuple[int | None, int | None]] = {}
        #: A share of one device (budget / its memory): GPU-seconds allocated and busy count
        #: that part of the device's time (docs/accounting.md). None: whole devices.
        self.share_fraction: float | None = None

    def add(self, samples: Mapping[str, DeviceSample], pids: Collection[int], now: float) -> None:
        for uuid in self.uuids:
            sample = samples.get(uuid)
            if sample is None:
                continue
            util, mem = _frame_values(sample, pids)
            if sample.processes:
                own = [p for p in sample.processes if p.pid in pids and p.memory_used_bytes is not None]
                biggest = max(own, key=lambda p: p.memory_used_bytes or 0) if own else None
                self._own[uuid] = (sum(p.memory_used_bytes or 0 for p in own), biggest.pid if biggest else None)
            else:
                self._own.pop(uuid, None)
            self._integrate(uuid, util, now)
            if util is not None:
                self._util_max = util if self._util_max is None else max(self._util_max, util)
            if mem is not None:
                self._mem_peak = mem if self._mem_peak is None else max(self._mem_peak, mem)
            self.series[uuid].add(Point(now, util, mem))
            self._now[uuid] = (util, mem)
        self.samples_taken += 1
        self.last_at = now

    def current(self) -> tuple[float | None, int | None]:
        """The latest sample: mean utilisation over the frame's devices that reported one,
        and the most memory used on any one of them (as ``gpu_memory_peak_bytes``)."""
        utils = [u for u, _ in self._now.values() if u is not None]
        mems = [m for _, m in self._now.values() if m is not None]
        return (round(sum(utils) / len(utils), 2) if utils else None), (max(mems) if mems else None)

    def own_memory(self, uuid: str) -> int | None:
        """The memory of the frame's own processes on ``uuid`` at the latest sample (0 when
        the device lists processes and none is the frame's); None when the backend listed
        none there: unlike ``current``, never the whole device's use, which neighbours
        sharing it (``gpu_share``) are part of."""
        own = self._own.get(uuid)
        return own[0] if own is not None else None

    def own_biggest_pid(self, uuid: str) -> int | None:
        """The frame's process using the most memory on ``uuid`` at the latest sample."""
        own = self._own.get(uuid)
        return own[1] if own is not None else None

    def series_json(self) -> dict[str, list[list[Any]]]:
        """The bounded series so far, per device, as stored (``[[t, util, mem], ...]``)."""
        return {u: [[p.t, p.util, p.mem] for p in s.points] for u, s in self.series.items()}

    def _integrate(self, uuid: str, util: float | None, now: float) -> None:
        # Utilisation is held from one sample to the next (a step function): the interval
        # before a sample is charged at the previous value, the first at the current one.
        last_t = self._last_t.get(uuid, self.started_at)
        prev = self._last_util.get(uuid, util)
        dt = max(0.0, now - last_t)
        if prev is not None and dt > 0:
            self._busy += prev / 100.0 * dt
            self._util_time += prev * dt
            self._util_weight += dt
        self._last_t[uuid] = now
        self._last_util[uuid] = util

    def summary(self, ended_at: float) -> dict[str, Any]:
        if not self.uuids:
            return {}
        wall = max(0.0, ended_at - self.started_at)
        mean = (
            (self._util_time / self._util_weight)
            if self._util_weight > 0
            else (self._util_max if self.samples_taken else None)
        )
        allocated = wall * len(self.uuids)
        busy = self._busy
        if self.share_fraction is not None:
            # Its part of the device's time; busy no more than that (the device's own
            # utilisation, where the backend gives none per process, is its neighbours' too).
            allocated *= self.share_fraction
            busy = min(busy, allocated)
        return {
            "gpu_util_mean_pct": round(mean, 2) if mean is not None else None,
            "gpu_util_max_pct": self._util_max,
            "gpu_memory_peak_bytes": self._mem_peak,
            "gpu_seconds": round(allocated, 3),
            "gpu_busy_seconds": round(busy, 3),
            "samples": self.series_json(),
        }
