"""The Prometheus exposition of ``cuectl serve`` (``GET /metrics``) and the GPU figures of
``GET /readyz``.

Two sources, read once per scrape by the caller and passed in: the store's counts
(``Store.farm_figures``: frames per state, queue depth, device leases of frame attempts)
and the farm picture of ``cuectl top`` (``cuectl.top.snapshot``: hosts, their devices with
live values and holders, running frames). Nothing is kept between scrapes: every call builds
a fresh ``CollectorRegistry`` (never the process-wide default one, which would mix the
figures of several stores served by one process, as the tests do) and renders it with the
official ``prometheus_client``, which escapes label values — job, layer and host names come
from users and may hold ``"``, ``\\`` or line feeds.

Conventions (the same as ``cuectl admin report --format prometheus``, docs/accounting.md):
ratios are 0–1, sizes bytes, durations seconds; an unknown value (a device that reports no
utilisation) is left out, never written as NaN; the job's name is the label ``job_name``,
not ``job``, because Prometheus sets ``job`` on every scraped series itself and a clash
would rename ours to ``exported_job``. Every metric is described in docs/monitoring.md.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

import prometheus_client
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from cuectl.errors import InvalidInput
from cuectl.sched import model as m
from cuectl.sched.store.base import LEASE_BUCKETS_S, FarmFigures
from cuectl.units import parse_time

if TYPE_CHECKING:
    from cuectl.sched.store import Store

# A device holder of this kind is a process cuectl does not know about (cuectl.top): the
# device is busy, so not available, but it is nobody's lease.
FOREIGN = "foreign"
# The holder kinds cuectl itself creates (cuectl.top): a RUNNING frame's claim, and the
# local lock directory's worker / `cuectl run` / `cuectl.lease()` leases ("lease" when a
# lock record names no kind). cuectl_leases_held has a sample for each of these even at 0,
# so a dashboard's series do not vanish while the farm is idle.
LEASE_KINDS = ("frame", "worker", "run", "api", "lease")

DEVICE_LABELS = ("host", "uuid", "index", "model")

# The body is the text format 0.0.4 (generate_latest with legacy metric names only).
# prometheus_client >= 0.22 calls that CONTENT_TYPE_PLAIN_0_0_4 and moved CONTENT_TYPE_LATEST
# to "version=1.0.0", which it serves only to scrapers that ask for 1.0.0 in Accept (and
# some Prometheus 2 releases do not know); before 0.22, CONTENT_TYPE_LATEST is 0.0.4.
CONTENT_TYPE: str = getattr(prometheus_client, "CONTENT_TYPE_PLAIN_0_0_4", CONTENT_TYPE_LATEST)


def render(store: Store, *, snapshot: dict[str, Any]) -> tuple[bytes, str]:
    """The body and content type of ``GET /metrics``.

    ``snapshot`` is ``cuectl.top.snapshot(store, local_leases=True)``, taken by the caller
    just before; the store's counts are read here, in one read snapshot of the database
    (``Store.farm_figures``)."""
    registry = CollectorRegistry()
    registry.register(_GpuHealthCollector(store.device_states(), store.gpu_event_counts()))
    registry.register(_FarmCollector(store.farm_figures(), snapshot))
    registry.register(_GpuWatchCollector(store.gpu_event_counts(), snapshot))
    return generate_latest(registry), CONTENT_TYPE


class _GpuWatchCollector:
    """What workers saw on their GPUs (docs/gpu-health.md): events recorded in the store, by
    kind, and the devices a frame holds idle now (from the hosts' published devices)."""

    def __init__(self, counts: Mapping[str, int], snapshot: Mapping[str, Any]) -> None:
        self.counts, self.snapshot = counts, snapshot

    def collect(self) -> Iterator[Metric]:
        counts = self.counts
        yield CounterMetricFamily(
            "cuectl_gpu_escapes",
            "Frame processes seen on a GPU the frame was not given (events kept in the store).",
            value=counts.get("escape", 0),
        )
        yield CounterMetricFamily(
            "cuectl_gpu_foreign_processes",
            "Processes not run by cuectl seen holding memory on a GPU a frame or lease held.",
            value=counts.get("foreign", 0),
        )
        yield CounterMetricFamily(
            "cuectl_gpu_idle_events",
            "Frames that held every GPU under their idle threshold past their gpu_idle_limit.",
            value=counts.get("idle", 0),
        )
        idle = GaugeMetricFamily(
            "cuectl_gpu_held_idle",
            "Whether a frame holds the device idle now (past its gpu_idle_limit).",
            labels=DEVICE_LABELS,
        )
        for host, device in _all_devices(self.snapshot):
            if device.get("holder") is not None:
                idle.add_metric(_device_labels(host, device), 1.0 if device.get("held_idle") else 0.0)
        yield idle
        yield GaugeMetricFamily(
            "cuectl_gpus_held_idle",
            "Devices a frame holds idle now (past its gpu_idle_limit), farm-wide.",
            value=sum(1 for _host, device in _all_devices(self.snapshot) if device.get("held_idle")),
        )


# How ``device_states`` files each device: exactly one of these.
DEVICE_STATES = ("leased", "foreign_busy", "available", "unavailable")


def device_states(snapshot: Mapping[str, Any]) -> Iterator[tuple[Mapping[str, Any], Mapping[str, Any], str]]:
    """Every device of the snapshot once, as (host, device, state), state one of
    DEVICE_STATES: ``leased`` (held by cuectl: a RUNNING frame's claim or a local lease,
    holder kind frame/worker/run/api/lease), ``foreign_busy`` (a process cuectl does not
    know uses it, holder ``foreign``), ``available`` (no holder, on a host that is UP and
    not locked), ``unavailable`` (no holder, on a DOWN or locked host). A device listed by
    two hosts (a host registered again under another name keeps its old, silent row) is
    counted once, from the UP host if either is."""
    chosen: dict[str, tuple[Mapping[str, Any], Mapping[str, Any]]] = {}
    order: list[tuple[Mapping[str, Any], Mapping[str, Any]]] = []
    for host, device in _all_devices(snapshot):
        uuid = device.get("uuid")
        if not isinstance(uuid, str) or not uuid:
            order.append((host, device))
            continue
        seen = chosen.get(uuid)
        if seen is None:
            chosen[uuid] = (host, device)
            order.append((host, device))
        elif seen[0].get("state") != "UP" and host.get("state") == "UP":
            order[order.index(seen)] = chosen[uuid] = (host, device)
    for host, device in order:
        kind = _holder_kind(device)
        if kind == FOREIGN:
            yield host, device, "foreign_busy"
        elif kind is not None:
            yield host, device, "leased"
        elif host.get("state") == "UP" and not host.get("locked"):
            yield host, device, "available"
        else:
            yield host, device, "unavailable"


def gpu_stats(snapshot: Mapping[str, Any], *, active_jobs: int) -> dict[str, int]:
    """The GPU figures of ``GET /readyz``, from a ``cuectl.top.snapshot``: ``total``, every
    device once, and how many of them are in each of DEVICE_STATES (``device_states``), so
    ``total == leased + foreign_busy + available + unavailable``; ``active_jobs`` is passed
    through (``FarmFigures.active_jobs``: jobs not FINISHED)."""
    counts = Counter(state for _host, _device, state in device_states(snapshot))
    return {
        "total": sum(counts.values()),
        **{state: counts.get(state, 0) for state in DEVICE_STATES},
        "active_jobs": active_jobs,
    }


class _FarmCollector:
    """A ``prometheus_client`` collector over one scrape's figures (registered in a fresh
    registry per scrape, so it needs no ``describe``)."""

    def __init__(self, figures: FarmFigures, snapshot: Mapping[str, Any]) -> None:
        self.figures, self.snapshot = figures, snapshot

    def collect(self) -> Iterator[Metric]:
        fig, snap = self.figures, self.snapshot
        yield _frames(fig)
        yield _queue_depth(fig)
        yield GaugeMetricFamily("cuectl_jobs_active", "Jobs not FINISHED (pending or running).", value=fig.active_jobs)
        yield from _devices(snap)
        yield _device_counts(snap)
        yield from _hosts(snap)
        yield CounterMetricFamily(
            "cuectl_lease_acquisitions",
            "Frame attempts that were given GPUs (finished ones plus RUNNING frames holding devices).",
            value=fig.lease_acquisitions,
        )
        yield _lease_durations(fig)
        yield _leases_held(snap)
        yield _oldest_lease(snap)


def _frames(fig: FarmFigures) -> GaugeMetricFamily:
    family = GaugeMetricFamily("cuectl_frames", "Frames in the store, by state.", labels=["state"])
    # Every known state at 0 too: `cuectl_frames{state="RUNNING"} == 0` must be a sample,
    # not an absent series, for the queue-stuck alert.
    states = list(m.FRAME_STATES) + sorted(set(fig.frames_by_state) - set(m.FRAME_STATES))
    for state in states:
        family.add_metric([state], fig.frames_by_state.get(state, 0))
    return family


def _queue_depth(fig: FarmFigures) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "cuectl_queue_depth",
        "WAITING frames per layer (layers with none are left out).",
        labels=["job_id", "job_name", "layer"],
    )
    for job_id, job, layer, waiting in fig.queue_depth:
        family.add_metric([str(job_id), job, layer], waiting)
    return family


def _devices(snap: Mapping[str, Any]) -> Iterator[GaugeMetricFamily]:
    util = GaugeMetricFamily(
        "cuectl_gpu_utilization_ratio", "GPU utilisation at the device's last live sample, 0-1.", labels=DEVICE_LABELS
    )
    used = GaugeMetricFamily(
        "cuectl_gpu_memory_used_bytes", "GPU memory in use at the device's last live sample.", labels=DEVICE_LABELS
    )
    total = GaugeMetricFamily("cuectl_gpu_memory_total_bytes", "GPU memory of the device.", labels=DEVICE_LABELS)
    held = GaugeMetricFamily(
        "cuectl_gpu_held",
        '1 when the device has a holder (kind: frame, worker, run, api, lease, foreign), else 0 with kind="".',
        labels=[*DEVICE_LABELS, "kind"],
    )
    age = GaugeMetricFamily(
        "cuectl_gpu_sample_age_seconds",
        "Seconds since the device's last live sample (the "
        "values above are left out once it is older than two sampling intervals).",
        labels=DEVICE_LABELS,
    )
    for host, device in _all_devices(snap):
        labels = _device_labels(host, device)
        _add_known(util, labels, _ratio(device.get("utilization_pct")))
        _add_known(used, labels, device.get("memory_used_bytes"))
        _add_known(total, labels, device.get("memory_total_bytes"))
        _add_known(age, labels, device.get("sample_age_s"))
        kind = _holder_kind(device)
        held.add_metric([*labels, kind or ""], 0 if kind is None else 1)
    yield from (util, used, total, held, age)


def _device_counts(snap: Mapping[str, Any]) -> GaugeMetricFamily:
    # Every device once, in exactly one state (the figures of /readyz): sum by (state) is the
    # farm's device count, and a dashboard's series do not vanish at 0.
    counts = Counter(state for _host, _device, state in device_states(snap))
    family = GaugeMetricFamily(
        "cuectl_gpus",
        "GPU devices by state: leased (held by cuectl), foreign_busy (used by "
        "a process cuectl does not know), available, unavailable (DOWN or locked host); "
        "each device counted once.",
        labels=["state"],
    )
    for state in DEVICE_STATES:
        family.add_metric([state], counts.get(state, 0))
    return family


def _hosts(snap: Mapping[str, Any]) -> Iterator[GaugeMetricFamily]:
    up = GaugeMetricFamily(
        "cuectl_host_up", "1 when the host's worker sent a heartbeat recently, else 0.", labels=["host"]
    )
    age = GaugeMetricFamily(
        "cuectl_host_heartbeat_age_seconds", "Seconds since the host's last heartbeat.", labels=["host"]
    )
    now = _epoch(snap.get("at"))
    for host in snap.get("hosts") or []:
        name = str(host.get("name"))
        up.add_metric([name], 1 if host.get("state") == "UP" else 0)
        beat = _epoch(host.get("last_heartbeat"))
        if now is not None and beat is not None:
            age.add_metric([name], max(0.0, now - beat))  # clocks may disagree by a little
    yield from (up, age)


def _lease_durations(fig: FarmFigures) -> HistogramMetricFamily:
    # The store's counts are cumulative already (one per bound, duration <= bound), as the
    # exposition wants them; +Inf is every finished lease.
    buckets = [
        (floatToGoString(bound), float(n)) for bound, n in zip(LEASE_BUCKETS_S, fig.lease_bucket_counts, strict=True)
    ]
    buckets.append(("+Inf", float(fig.lease_count)))
    return HistogramMetricFamily(
        "cuectl_lease_duration_seconds",
        "How long finished frame attempts held their GPUs.",
        buckets=buckets,
        sum_value=fig.lease_seconds_sum,
    )


def _leases_held(snap: Mapping[str, Any]) -> GaugeMetricFamily:
    # A lease can hold several devices (a frame asking for 2 GPUs): count holders, not
    # devices. A holder is one frame (its id) or one local lease (pid and label on a host).
    holders = {
        (str(host.get("name")), kind, holder.get("frame_id"), holder.get("pid"), holder.get("label"))
        for host, device in _all_devices(snap)
        if (holder := device.get("holder")) and (kind := str(holder.get("kind"))) != FOREIGN
    }
    by_kind = Counter(key[1] for key in holders)
    family = GaugeMetricFamily(
        "cuectl_leases_held",
        "Device leases held now, by holder kind (frames and local "
        "leases; devices busy with unknown processes are not counted).",
        labels=["kind"],
    )
    for kind in list(LEASE_KINDS) + sorted(set(by_kind) - set(LEASE_KINDS)):
        family.add_metric([kind], by_kind.get(kind, 0))
    return family


def _oldest_lease(snap: Mapping[str, Any]) -> GaugeMetricFamily:
    # For the "lease held too long" alert: the finished-lease histogram cannot see an
    # attempt that never ends, so the age of the oldest RUNNING frame holding GPUs is
    # exported per host (hosts with none are left out).
    oldest: dict[str, float] = {}
    for frame in _running(snap):
        elapsed = frame.get("elapsed_s")
        if frame.get("gpu_uuids") and elapsed is not None:
            host = str(frame.get("host"))
            oldest[host] = max(oldest.get(host, 0.0), float(elapsed))
    family = GaugeMetricFamily(
        "cuectl_lease_oldest_age_seconds", "Age of the oldest RUNNING frame holding GPUs, per host.", labels=["host"]
    )
    for host in sorted(oldest):
        family.add_metric([host], oldest[host])
    return family


# -- helpers -------------------------------------------------------------------------------
def _all_devices(snap: Mapping[str, Any]) -> Iterator[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    for host in snap.get("hosts") or []:
        for device in host.get("devices") or []:
            yield host, device


def _running(snap: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    return snap.get("frames") or []


def _device_labels(host: Mapping[str, Any], device: Mapping[str, Any]) -> list[str]:
    index = device.get("index")
    return [
        str(host.get("name")),
        str(device.get("uuid") or ""),
        "" if index is None else str(index),
        str(device.get("model") or ""),
    ]


def _holder_kind(device: Mapping[str, Any]) -> str | None:
    holder = device.get("holder")
    return str(holder.get("kind")) if holder else None


def _add_known(family: GaugeMetricFamily, labels: Sequence[str], value: float | None) -> None:
    """Add a sample unless the value is unknown (None): no NaN in the exposition."""
    if value is not None:
        family.add_metric(labels, value)


def _ratio(pct: float | None) -> float | None:
    return None if pct is None else float(pct) / 100.0


def _epoch(text: Any) -> float | None:
    """An ISO 8601 timestamp of the snapshot (``...Z``) -> epoch seconds; None when absent or
    unreadable. ``now`` does not matter: a full timestamp is never read as relative."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return parse_time(text, now=0.0)
    except InvalidInput:
        return None


class _GpuHealthCollector:
    """Sick GPUs (docs/gpu-health.md): the devices out of service now, and the Xid events the
    workers recorded, per code."""

    def __init__(self, states: Sequence[Any], counts: Mapping[str, int]) -> None:
        self.states, self.counts = states, counts

    def collect(self) -> Iterator[Metric]:
        drained = GaugeMetricFamily(
            "cuectl_gpu_drained",
            "1 for each device out of service on its host (state drained or lost; why: `host show`).",
            labels=["host", "uuid", "state"],
        )
        for s in self.states:
            if not s.in_service:
                drained.add_metric([s.host, s.uuid, s.state], 1.0)
        yield drained
        xids = CounterMetricFamily(
            "cuectl_gpu_xid", "Xid events the workers saw on their GPUs, per Xid code.", labels=["xid"]
        )
        for kind, n in sorted(self.counts.items()):
            if kind.startswith("xid:"):
                xids.add_metric([kind.removeprefix("xid:")], float(n))
        yield xids
