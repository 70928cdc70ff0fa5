"""``cuectl.gpu.v1.GpuInterface``: cuectl's per-device GPU data on the wire, beside OpenCue's
services (proto/cuectl_gpu.proto says what each field means; docs/opencue-grpc.md, "The GPU
proto").

Every answer is read from the store, as `cuectl host show`, `cuectl frame show` and `cuectl
job show` read it: a host's devices with the live values its worker last published (a value
older than two of its sampling intervals is not current, as in ``cuectl.top``) and who holds
each (a RUNNING frame, the store's truth, before anything a worker published); a frame's use
of its devices, from the series and the attempt summary its worker stored; a layer's GPU
request as it was submitted. No scheduling rule, no subprocess, no local file.

``GpuServicer(stores)`` is registered with
``cuectl_gpu_pb2_grpc.add_GpuInterfaceServicer_to_server(servicer, server)``; ``stores()``
returns the calling thread's store connection (gRPC answers on a pool of threads). The
``host_gpus``, ``frame_gpu_usage`` and ``layer_gpu_request`` functions build the answers from
a store and raise cuectl's errors; the servicer turns those into gRPC status codes.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Callable, Mapping, NoReturn, Optional, Sequence, TypeVar

import grpc

from cuectl.cuebot.proto import cuectl_gpu_pb2 as pb
from cuectl.cuebot.proto import cuectl_gpu_pb2_grpc as pb_grpc
from cuectl.errors import CuectlError, InvalidInput, NotFound, NotOwner, StoreError, Unproven
from cuectl.sched import model as m
from cuectl.top import (
    DEFAULT_SAMPLE_INTERVAL_S,
    FOREIGN_MEMORY_FLOOR_BYTES,
    FOREIGN_UTIL_FLOOR_PCT,
    FRESH_INTERVALS,
    live_values,
)

if TYPE_CHECKING:
    from cuectl.sched.store import Store

T = TypeVar("T")

# Every RUNNING frame is read to say who holds a device (the store's truth, as `cuectl job
# why` reads it): a farm never runs this many at once.
RUNNING_FRAMES_LIMIT = 100_000
_CUDA_RE = re.compile(r"CUDA\s+(\S+)", re.IGNORECASE)
# Device keys that have a field of their own in GpuDevice; the rest go to its attributes.
_OWN_FIELDS = {
    "index",
    "uuid",
    "vendor",
    "model",
    "memory_total_bytes",
    "memory_free_bytes",
    "utilization_pct",
    "pci_bus_id",
    "driver_version",
    "api_version",
    "attributes",
}


# -- times and values -----------------------------------------------------------------------------
def _epoch(value: Any) -> float | None:
    """A stored time (ISO 8601 text, or epoch seconds in older rows) as epoch seconds."""
    from cuectl.units import parse_time

    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value:
        try:
            return parse_time(value, now=0.0)
        except InvalidInput:
            return None
    return None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _whole(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _text(value: Any) -> str:
    """An attribute's value as text: true/false for booleans (as JSON writes them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (Mapping, list, tuple)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _required(value: str, what: str) -> str:
    text = value.strip()
    if not text:
        raise InvalidInput(f"{what}: required")
    return text


# -- GetHostGpus ----------------------------------------------------------------------------------
def _sample_interval(live_doc: Mapping[str, Any]) -> float | None:
    interval = _number(live_doc.get("sample_interval_s"))
    return interval if interval is not None and 0 < interval < 86400 else None


def _holder(
    uuid: str,
    frames_by_uuid: Mapping[str, Mapping[str, Any]],
    dispatch: Mapping[str, Any],
    live: Mapping[str, Any] | None,
    host_up: bool,
) -> tuple[str, str, str]:
    """(kind, in words, frame id) of whoever holds the device now; all "" when nobody does.

    A RUNNING frame of the store first: a worker's published word may be a heartbeat old
    (a frame that ended since holds nothing). Then, only while the host is UP (a down host's
    last word is stale), the lease or other program its worker saw. Last, as ``cuectl top``
    judges it, a current sample taken while no frame of the worker held the device that saw
    it busy: a program cuectl does not know about."""
    frame = frames_by_uuid.get(uuid)
    if frame is not None:
        return "frame", f"frame {frame['id']} (job {frame['job']})", str(frame["id"])
    state = dispatch.get(uuid)
    if host_up and isinstance(state, Mapping):
        words = state.get("holder")
        if state.get("state") == "lease":
            return "lease", str(words or "a lease"), ""
        if state.get("state") == "nimby":
            return "other", str(words or "another process"), ""
    if live is not None and live["fresh"] and live["frame_id"] is None:
        used = live.get("memory_used_bytes") or 0
        util = live.get("utilization_pct") or 0.0
        if used >= FOREIGN_MEMORY_FLOOR_BYTES or util >= FOREIGN_UTIL_FLOOR_PCT:
            return "other", f"another process ({used / 1024**3:.1f} GiB used, {util:g} % busy)", ""
    return "", "", ""


def _attributes(gpu: Mapping[str, Any]) -> dict[str, str]:
    """The backend's extra attributes, then every other known key the device has (backend,
    compute capability, MIG parent and profile, Apple's cores and unified memory)."""
    out: dict[str, str] = {}
    raw = gpu.get("attributes")
    for key, value in raw.items() if isinstance(raw, Mapping) else ():
        if value is not None:
            out[str(key)] = _text(value)
    for key, value in gpu.items():
        if key not in _OWN_FIELDS and value is not None:
            out[str(key)] = _text(value)
    return out


def _device(gpu: Mapping[str, Any], live: Mapping[str, Any] | None, holder: tuple[str, str, str]) -> Any:
    api = str(gpu.get("api_version") or "")
    cuda = _CUDA_RE.search(api)
    device = pb.GpuDevice(
        id=str(gpu.get("uuid") or ""),
        uuid=str(gpu.get("uuid") or ""),
        index=_whole(gpu.get("index")) or 0,
        vendor=str(gpu.get("vendor") or ""),
        model=str(gpu.get("model") or ""),
        memory_bytes=_whole(gpu.get("memory_total_bytes")) or 0,
        pci_bus=str(gpu.get("pci_bus_id") or ""),
        driver_version=str(gpu.get("driver_version") or ""),
        api_version=api,
        cuda_version=cuda.group(1) if cuda else "",
        metal_version=api if api.lower().startswith("metal") else "",
        attributes=_attributes(gpu),
        holder_kind=holder[0],
        holder=holder[1],
        holder_frame_id=holder[2],
    )
    if live is not None:
        device.sampled_at = _epoch(live.get("sampled_at")) or 0.0
        # live_values has set a stale value to None already: it stays unset here.
        util, used = _number(live.get("utilization_pct")), _whole(live.get("memory_used_bytes"))
        if util is not None:
            device.utilization_pct = util
        if used is not None:
            device.memory_used_bytes = used
    return device


def host_gpus(store: Store, name: str) -> Any:
    """``GetHostGpusResponse`` for the host ``name``. NotFound: no such host."""
    name = _required(name, "host")
    now = store.clock()  # heartbeats and samples are on the store's clock
    host = store.get_host(name, now=now, down_after=m.HOST_DOWN_AFTER_S)
    # The live document is whatever the host's worker wrote: read it defensively.
    live_doc = _mapping(host.get("live"))
    live_by_uuid = live_values(live_doc, now=now)
    states = _mapping(_mapping(live_doc.get("dispatch")).get("devices"))
    frames, _ = store.list_frames(state=m.RUNNING, limit=RUNNING_FRAMES_LIMIT)
    frames_by_uuid = {u: f for f in frames for u in (f.get("gpu_uuids") or [])}
    gpus = [g for g in host.get("gpus") or [] if isinstance(g, Mapping)]
    devices = []
    for gpu in sorted(gpus, key=lambda g: (_whole(g.get("index")) is None, _whole(g.get("index")) or 0)):
        uuid = str(gpu.get("uuid") or "")
        live = live_by_uuid.get(uuid)
        devices.append(_device(gpu, live, _holder(uuid, frames_by_uuid, states, live, host.get("state") == "UP")))
    return pb.GetHostGpusResponse(devices=devices, sample_interval_s=_sample_interval(live_doc) or 0.0)


# -- GetFrameGpuUsage -----------------------------------------------------------------------------
Point = tuple[float, Optional[float], Optional[int]]  # (epoch seconds, util %, memory bytes)


def _points(raw: Any) -> list[Point]:
    """A device's stored series ``[[time, util, mem], ...]`` in time order; unreadable points
    are dropped."""
    out: list[Point] = []
    for item in raw if isinstance(raw, list) else ():
        if isinstance(item, (list, tuple)) and len(item) == 3 and (at := _epoch(item[0])) is not None:
            out.append((at, _number(item[1]), _whole(item[2])))
    return sorted(out, key=lambda p: p[0])


def _device_summary(uuid: str, points: Sequence[Point], started: float | None, ended: float) -> Any:
    """One device's summary from its series, integrated as the worker integrates a frame's:
    each sampled utilisation holds until the next sample, and the first also covers the
    time from the attempt's start to it."""
    usage = pb.GpuUsage(device_id=uuid)
    start = started if started is not None else (points[0][0] if points else ended)
    usage.gpu_seconds = round(max(0.0, ended - start), 3)
    utils = [p[1] for p in points if p[1] is not None]
    mems = [p[2] for p in points if p[2] is not None]
    if utils:
        usage.utilization_max_pct = max(utils)
        weighted = weight = 0.0
        last_t, last_util = start, points[0][1]
        for t, util, _ in points:
            if last_util is not None and t > last_t:
                weighted += last_util * (t - last_t)
                weight += t - last_t
            last_t, last_util = t, util
        # No time between the samples (one sample at the start): the worker's rule, the max.
        usage.utilization_mean_pct = round(weighted / weight, 2) if weight > 0 else max(utils)
    if mems:
        usage.memory_peak_bytes = max(mems)
    return usage


def _combined(summaries: Sequence[Any]) -> Any:
    """A running attempt's total over its devices, so far (the figures the worker stores
    when it ends: mean of the devices, highest max and peak, device-seconds summed)."""
    total = pb.GpuUsage(gpu_seconds=round(sum(s.gpu_seconds for s in summaries), 3))
    means = [s.utilization_mean_pct for s in summaries if s.HasField("utilization_mean_pct")]
    if means:
        total.utilization_mean_pct = round(sum(means) / len(means), 2)
    maxes = [s.utilization_max_pct for s in summaries if s.HasField("utilization_max_pct")]
    if maxes:
        total.utilization_max_pct = max(maxes)
    peaks = [s.memory_peak_bytes for s in summaries if s.HasField("memory_peak_bytes")]
    if peaks:
        total.memory_peak_bytes = max(peaks)
    return total


def _recorded(attempt: Mapping[str, Any]) -> Any:
    """An ended attempt's total as the worker recorded it (exact: every sample counted)."""
    total = pb.GpuUsage(gpu_seconds=_number(attempt.get("gpu_seconds")) or 0.0)
    if (mean := _number(attempt.get("gpu_util_mean_pct"))) is not None:
        total.utilization_mean_pct = mean
    if (top := _number(attempt.get("gpu_util_max_pct"))) is not None:
        total.utilization_max_pct = top
    if (peak := _whole(attempt.get("gpu_memory_peak_bytes"))) is not None:
        total.memory_peak_bytes = peak
    return total


def _fresh_within(store: Store, host: Any, now: float) -> float:
    """How old a running frame's latest sample may be and still be current: two of its
    host's sampling intervals (the default interval's when the host is gone or silent)."""
    interval = None
    if isinstance(host, str) and host:
        try:
            interval = _sample_interval(
                _mapping(store.get_host(host, now=now, down_after=m.HOST_DOWN_AFTER_S).get("live"))
            )
        except NotFound:
            pass
    return FRESH_INTERVALS * (interval or DEFAULT_SAMPLE_INTERVAL_S)


def frame_gpu_usage(store: Store, ref: str) -> Any:
    """``GetFrameGpuUsageResponse`` for the frame ``ref`` (an id, or JOB/FRAME)."""
    frame_id = store.frame_id(_required(ref, "frame_id"))
    frame = store.get_frame(frame_id)
    now = store.clock()
    attempt = _whole(frame.get("samples_attempt")) or 0
    series = {str(u): _points(p) for u, p in (frame.get("samples") or {}).items()}
    series = {u: p for u, p in series.items() if p}
    record = next((a for a in frame.get("attempt_history") or [] if a.get("attempt") == attempt), None)
    running = frame.get("state") == m.RUNNING and attempt == frame.get("attempts") and record is None
    response = pb.GetFrameGpuUsageResponse(frame_id=str(frame_id), attempt=attempt)
    if not series:
        return response
    # The attempt's run time: recorded once it ended; a running one's, so far.
    started = _epoch(record.get("started_at") if record else frame.get("started_at"))
    ended = (_epoch(record.get("ended_at")) if record else None) or now
    order = [u for u in frame.get("gpu_uuids") or [] if u in series] + sorted(
        set(series) - set(frame.get("gpu_uuids") or [])
    )
    summaries = [_device_summary(u, series[u], started, ended) for u in order]
    response.summary.extend(summaries)
    response.total.CopyFrom(_recorded(record) if record else _combined(summaries))
    if running:
        fresh_within = _fresh_within(store, frame.get("host"), now)
        for uuid in order:
            at, util, mem = series[uuid][-1]
            if now - at > fresh_within:
                continue  # the worker has not sampled it for a while: not current
            current = pb.GpuUsage(device_id=uuid, sampled_at=at)
            if util is not None:
                current.utilization_pct = util
            if mem is not None:
                current.memory_used_bytes = mem
            response.current.append(current)
    return response


# -- GetLayerGpuRequest ---------------------------------------------------------------------------
def layer_gpu_request(store: Store, job_ref: str, layer_ref: str) -> Any:
    """``GetLayerGpuRequestResponse`` for the layer ``layer_ref`` (its name, or its id) of the
    job ``job_ref`` (its id or name)."""
    job = store.get_job(_required(job_ref, "job"))
    wanted = _required(layer_ref, "layer")
    layers = job.get("layers") or []
    layer = next((la for la in layers if la.get("name") == wanted), None) or next(
        (la for la in layers if str(la.get("id")) == wanted), None
    )
    if layer is None:
        raise NotFound(
            f"job {job['id']} ({job['name']}) has no layer {wanted!r}",
            hint=f"its layers: {', '.join(str(la.get('name')) for la in layers)}",
        )
    request = pb.LayerGpuRequest(
        gpus=int(layer.get("gpus") or 0),
        gpu_vendor=str(layer.get("gpu_vendor") or ""),
        gpu_models_allowed=[str(x) for x in layer.get("gpu_models") or []],
        min_gpu_memory_bytes=int(layer.get("gpu_memory_min_bytes") or 0),
    )
    return pb.GetLayerGpuRequestResponse(request=request, job_id=str(job["id"]), layer_id=str(layer["id"]))


# -- the servicer ---------------------------------------------------------------------------------
def _status(exc: CuectlError) -> Any:
    """The gRPC status code of a cuectl error."""
    if isinstance(exc, NotFound):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, InvalidInput):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, (NotOwner, Unproven)):
        return grpc.StatusCode.PERMISSION_DENIED
    if isinstance(exc, StoreError):
        return grpc.StatusCode.UNAVAILABLE
    # Conflict (a job name two jobs have, a frame number in two layers) and the rest: the
    # store's state, not the request alone, is what stands in the way.
    return grpc.StatusCode.FAILED_PRECONDITION


def _abort(context: Any, exc: CuectlError) -> NoReturn:
    hint = getattr(exc, "hint", None)
    context.abort(_status(exc), f"{exc} ({hint})" if hint else str(exc))
    raise AssertionError("grpc's context.abort returned")  # it raises; this keeps NoReturn honest


class GpuServicer(pb_grpc.GpuInterfaceServicer):
    """``cuectl.gpu.v1.GpuInterface`` answered from ``stores()``, the calling thread's store."""

    def __init__(self, stores: Callable[[], Store]) -> None:
        self._stores = stores

    def _answer(self, context: Any, build: Callable[[Store], T]) -> T:
        try:
            return build(self._stores())
        except CuectlError as exc:
            _abort(context, exc)

    def GetHostGpus(self, request: Any, context: Any) -> Any:  # noqa: N802 (the rpc's name)
        return self._answer(context, lambda store: host_gpus(store, request.host))

    def GetFrameGpuUsage(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self._answer(context, lambda store: frame_gpu_usage(store, request.frame_id))

    def GetLayerGpuRequest(self, request: Any, context: Any) -> Any:  # noqa: N802
        return self._answer(context, lambda store: layer_gpu_request(store, request.job, request.layer))
