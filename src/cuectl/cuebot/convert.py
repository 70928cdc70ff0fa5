"""cuectl's JSON shapes (DESIGN §9) to OpenCue's protobuf messages, as Cuebot forms them.

Pure functions of what the store returned: no store calls here. Each rule is one line of
the mapping table in docs/opencue-grpc.md; Cuebot's own conventions are followed where the
protos leave a choice (ids are strings, times epoch seconds, memory KiB, cores as a
float, a frame's ``last_resource`` ``host/cores/gpus``, ``exit_status`` -1 before a run).
"""

from __future__ import annotations

import calendar
import time
from datetime import datetime
from typing import Any, Iterable, Mapping, Sequence

from opencue_proto import cue_pb2, depend_pb2, facility_pb2, host_pb2, job_pb2, limit_pb2, service_pb2, show_pb2

from cuectl.sched.views import frame_name

#: The show of a job submitted without one (cuectl's own specs need none; OpenCue's do).
DEFAULT_SHOW = "default"
#: Every host's allocation: OpenCue's sandbox default, so ``cueadmin -la`` and CueCommander
#: read as on a fresh Cuebot. cuectl has no allocations; a host's tags say what it runs.
FACILITY = "local"
ALLOCATION = "local.general"
KIB = 1024
_EPOCH = datetime(1970, 1, 1)


def epoch(value: Any) -> int:
    """ISO 8601 UTC (as the store writes times) or epoch seconds -> whole epoch seconds; 0 for none."""
    if value is None or value == "":
        return 0
    if isinstance(value, (int, float)):
        return int(value)
    text = str(value).rstrip("Z")
    whole, _, _fraction = text.partition(".")
    if len(whole) == 19:  # the store's own form, parsed in C: 0.7 us against strptime's 7 (a frame has 2-4)
        try:
            return int((datetime.fromisoformat(whole) - _EPOCH).total_seconds())
        except ValueError:
            pass  # anything else strptime takes (a leap second) or refuses, as before
    try:
        return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return 0


def kib(value: Any) -> int:
    return int(value) // KIB if value else 0


def show_of(job: Mapping[str, Any]) -> str:
    return str(job.get("show") or DEFAULT_SHOW)


# -- jobs ------------------------------------------------------------------------------
def job_state(job: Mapping[str, Any]) -> int:
    """OpenCue keeps a job with DEAD frames in the cue (PENDING, shown "Failing") until
    someone retries or eats them or kills it; cuectl finishes it. So: FINISHED only when
    it succeeded or was killed."""
    if job.get("state") == "FINISHED" and job.get("outcome") != "FAILED":
        return job_pb2.FINISHED
    return job_pb2.PENDING


def in_cue(job: Mapping[str, Any]) -> bool:
    """Whether OpenCue would still list the job without ``include_finished``."""
    return job_state(job) == job_pb2.PENDING


def _frame_counts(counts: Mapping[str, int]) -> dict[str, int]:
    get = counts.get
    return {
        "total_frames": sum(counts.values()),
        "waiting_frames": get("WAITING", 0),
        "running_frames": get("RUNNING", 0),
        "dead_frames": get("DEAD", 0),
        "eaten_frames": get("EATEN", 0),
        "depend_frames": get("DEPEND", 0),
        "succeeded_frames": get("SUCCEEDED", 0),
        "pending_frames": get("WAITING", 0) + get("DEPEND", 0),
    }


def job(
    job: Mapping[str, Any], *, log_dir: str = "", layers: int = 0, reserved: tuple[float, int] = (0.0, 0)
) -> job_pb2.Job:
    """A ``job list``/``job show`` dict as OpenCue's Job. ``reserved``: (cores, gpus) its
    running frames hold now."""
    counts = job.get("frame_counts") or {}
    stats = job_pb2.JobStats(
        total_layers=layers, reserved_cores=reserved[0], reserved_gpus=reserved[1], **_frame_counts(counts)
    )
    stopped = epoch(job.get("finished_at")) if job_state(job) == job_pb2.FINISHED else 0
    started = epoch(job.get("created_at"))
    return job_pb2.Job(
        id=str(job["id"]),
        name=str(job["name"]),
        state=job_state(job),
        show=show_of(job),
        shot=str(job.get("shot") or ""),
        user=str(job.get("user") or ""),
        group=show_of(job),
        facility=FACILITY,
        os="linux",
        priority=int(job.get("priority") or 0),
        min_cores=0.0,
        max_cores=float(job.get("max_cores") or 0.0),
        min_gpus=0.0,
        max_gpus=float(job.get("max_gpus") or 0),
        log_dir=log_dir,
        is_paused=bool(job.get("paused")),
        start_time=started,
        stop_time=stopped,
        eligible_time=started,
        job_stats=stats,
    )


def layer(
    layer: Mapping[str, Any],
    *,
    job_id: int,
    counts: Mapping[str, int],
    order: int,
    reserved: tuple[float, int] = (0.0, 0),
) -> job_pb2.Layer:
    command = layer.get("command")
    text = command if isinstance(command, str) else " ".join(str(a) for a in (command or []))
    gpus = int(layer.get("gpus") or 0)
    per_device = int(layer.get("gpu_memory_min_bytes") or 0)
    stats = job_pb2.LayerStats(reserved_cores=reserved[0], reserved_gpus=reserved[1], **_frame_counts(counts))
    cores = float(layer.get("cores") or 0.0)
    return job_pb2.Layer(
        id=str(layer["id"]),
        parent_id=str(job_id),
        name=str(layer["name"]),
        range=str(layer.get("range") or ""),
        command=text,
        chunk_size=int(layer.get("chunk") or 1),
        dispatch_order=order,
        tags=list(layer.get("tags") or []),
        min_cores=cores,
        max_cores=cores,
        is_threadable=False,
        # OpenCue's min_gpu_memory is the whole frame's; cuectl's is each device's.
        min_memory=kib(layer.get("memory_bytes")),
        min_gpu_memory=kib(per_device * gpus),
        min_gpus=float(gpus),
        max_gpus=float(gpus),
        type=job_pb2.RENDER,
        services=[str(layer.get("service"))] if layer.get("service") else [],
        limits=list(layer.get("limits") or []),
        timeout=int((layer.get("timeout_s") or 0) // 60),
        layer_stats=stats,
    )


# -- frames ----------------------------------------------------------------------------
FRAME_STATES = {
    "WAITING": job_pb2.WAITING,
    "RUNNING": job_pb2.RUNNING,
    "SUCCEEDED": job_pb2.SUCCEEDED,
    "DEPEND": job_pb2.DEPEND,
    "DEAD": job_pb2.DEAD,
    "EATEN": job_pb2.EATEN,
}
STATE_NAMES = {value: name for name, value in FRAME_STATES.items()}


def frame_number(value: Any) -> int:
    """A frame's number for an int32 field: what the store holds, or 0 for a value that is no
    whole number an int32 holds (a hostile edit of a SQLite store: its name shows the value
    as stored, views.frame_name; one bad row must not break a whole listing)."""
    return value if type(value) is int and -(2**31) <= value < 2**31 else 0


def exit_status(frame: Mapping[str, Any]) -> int:
    """Cuebot's: -1 until an attempt ends; a signal's death is 128 + signal, as RQD reports it."""
    if frame.get("exit_code") is not None:
        return int(frame["exit_code"])
    if frame.get("exit_signal") is not None:
        return 128 + int(frame["exit_signal"])
    return -1


def last_resource(host: str | None, cores: float, gpus: int) -> str:
    """Cuebot's proc name: ``host/cores/gpus`` (``gpu-01/1.00/1``); empty before a host ran it."""
    return f"{host}/{cores:4.2f}/{gpus}" if host else ""


def frame(
    frame: Mapping[str, Any],
    *,
    booking: Mapping[str, Any] | None = None,
    layer_of: Mapping[str, Any] | None = None,
    now: float | None = None,
) -> job_pb2.Frame:
    """A ``frame list`` dict as OpenCue's Frame. ``booking``: its ``running_bookings`` row
    while it runs (reserved memory and cores); ``layer_of``: its layer (for the resource
    string of a finished frame)."""
    source = booking or layer_of or {}
    cores, gpus = float(source.get("cores") or 0.0), int(source.get("gpus") or 0)
    started, stopped = epoch(frame.get("started_at")), epoch(frame.get("ended_at"))
    running = frame.get("state") == "RUNNING"
    peak_gpu = int(frame.get("gpu_memory_peak_bytes") or 0)
    used_gpu = int(frame.get("gpu_memory_used_bytes") or 0)
    gpu_seconds = float(frame.get("gpu_seconds") or 0.0)
    if running and now is not None and started:
        gpu_seconds = max(gpu_seconds, (now - started) * gpus)
    return job_pb2.Frame(
        id=str(frame["id"]),
        name=str(frame["name"]),
        layer_name=str(frame["layer"]),
        number=frame_number(frame["number"]),
        state=FRAME_STATES.get(str(frame.get("state")), job_pb2.WAITING),
        retry_count=max(int(frame.get("attempts") or 0) - 1, 0),
        exit_status=exit_status(frame),
        dispatch_order=int(frame["id"]),
        start_time=started,
        stop_time=0 if running else stopped,
        max_rss=kib(frame.get("max_rss_bytes")),
        used_memory=kib(frame.get("max_rss_bytes")) if running else 0,
        reserved_memory=reserved_memory_kib(source) if running else 0,
        reserved_gpu_memory=kib(int(source.get("gpu_memory_min_bytes") or 0) * gpus) if running else 0,
        last_resource=last_resource(frame.get("host"), cores, gpus),
        total_gpu_time=int(gpu_seconds),
        max_gpu_memory=kib(peak_gpu),
        used_gpu_memory=kib(used_gpu),
        llu_time=started,
    )


def updated_frame(frame: Mapping[str, Any], booking: Mapping[str, Any] | None) -> job_pb2.UpdatedFrame:
    full = globals()["frame"](frame, booking=booking)
    return job_pb2.UpdatedFrame(
        id=full.id,
        state=full.state,
        retry_count=full.retry_count,
        exit_status=full.exit_status,
        start_time=full.start_time,
        stop_time=full.stop_time,
        max_rss=full.max_rss,
        used_memory=full.used_memory,
        last_resource=full.last_resource,
        llu_time=full.llu_time,
        max_gpu_memory=full.max_gpu_memory,
        used_gpu_memory=full.used_gpu_memory,
    )


#: What a running frame reserves when its layer asked for no memory: Cuebot never books a
#: proc with 0 (its default layer minimum is 3.25 GiB); cuectl books none, so CueGUI would
#: show 0 of 0. 256 MiB says "something, not much", documented in docs/opencue-grpc.md.
MIN_RESERVED_KIB = 256 * 1024


def reserved_memory_kib(booking: Mapping[str, Any]) -> int:
    return max(kib(booking.get("memory_bytes")), MIN_RESERVED_KIB)


# -- hosts and procs ---------------------------------------------------------------------
def host(host: Mapping[str, Any], bookings: Sequence[Mapping[str, Any]], leased: Iterable[str] = ()) -> host_pb2.Host:
    """A ``host list`` dict as OpenCue's Host, its idle share computed from the frames
    running there (``bookings``) and the devices an ad-hoc lease holds (``leased`` uuids)."""
    gpus = list(host.get("gpus") or [])
    held = {uuid for b in bookings for uuid in (b.get("gpu_uuids") or [])} | set(leased)
    idle_devices = [g for g in gpus if g.get("uuid") not in held]
    cores = float(host.get("cores") or 0.0)
    memory = kib(host.get("memory_bytes"))
    used_cores = sum(float(b.get("cores") or 0.0) for b in bookings)
    used_memory = sum(reserved_memory_kib(b) for b in bookings)
    gpu_memory = sum(kib(g.get("memory_total_bytes")) for g in gpus)
    free_gpu_memory = sum(
        kib(g.get("memory_free_bytes") if g.get("memory_free_bytes") is not None else g.get("memory_total_bytes"))
        for g in gpus
    )
    heartbeat = epoch(host.get("last_heartbeat"))
    return host_pb2.Host(
        id=str(host["name"]),
        name=str(host["name"]),
        alloc_name=ALLOCATION,
        cores=cores,
        idle_cores=max(cores - used_cores, 0.0),
        memory=memory,
        idle_memory=max(memory - used_memory, 0),
        total_memory=memory,
        free_memory=max(memory - used_memory, 0),
        gpus=float(len(gpus)),
        idle_gpus=float(len(idle_devices)),
        gpu_memory=gpu_memory,
        idle_gpu_memory=sum(kib(g.get("memory_total_bytes")) for g in idle_devices),
        total_gpu_memory=gpu_memory,
        free_gpu_memory=free_gpu_memory,
        ping_time=heartbeat,
        boot_time=heartbeat,
        os="linux",
        tags=list(host.get("tags") or []),
        state=host_pb2.UP if host.get("state") == "UP" else host_pb2.DOWN,
        lock_state=host_pb2.LOCKED if host.get("locked") else host_pb2.OPEN,
        thread_mode=host_pb2.AUTO,
    )


def proc(booking: Mapping[str, Any], *, log_path: str = "") -> host_pb2.Proc:
    """A running frame as OpenCue's Proc (a booked slot on a host). Its id is the frame's."""
    cores, gpus = float(booking.get("cores") or 0.0), int(booking.get("gpus") or 0)
    name = frame_name(booking["number"], str(booking["layer_name"]))
    started = epoch(booking.get("started_at"))
    per_device = int(booking.get("gpu_memory_min_bytes") or 0)
    return host_pb2.Proc(
        id=str(booking["id"]),
        name=last_resource(str(booking.get("host")), cores, gpus),
        show_name=str(booking.get("job_show") or DEFAULT_SHOW),
        job_name=str(booking["job_name"]),
        frame_name=name,
        group_name=str(booking.get("job_show") or DEFAULT_SHOW),
        ping_time=epoch(booking.get("lease_expires")),
        bookedTime=started,
        dispatch_time=started,
        reserved_memory=reserved_memory_kib(booking),
        reserved_cores=cores,
        reserved_gpus=float(gpus),
        reserved_gpu_memory=kib(per_device * gpus),
        used_memory=kib(booking.get("max_rss_bytes")),
        used_gpu_memory=kib(booking.get("gpu_memory_used_bytes")),
        log_path=log_path,
    )


# -- shows, groups, allocations, services, limits ------------------------------------------
def show(name: str, jobs: Sequence[Mapping[str, Any]], reserved: tuple[float, int] = (0.0, 0)) -> show_pb2.Show:
    """``reserved``: (cores, gpus) the running frames of the show's jobs hold now."""
    counts: dict[str, int] = {}
    for j in jobs:
        for state, n in (j.get("frame_counts") or {}).items():
            counts[state] = counts.get(state, 0) + n
    stats = show_pb2.ShowStats(
        running_frames=counts.get("RUNNING", 0),
        dead_frames=counts.get("DEAD", 0),
        pending_frames=counts.get("WAITING", 0) + counts.get("DEPEND", 0),
        pending_jobs=sum(1 for j in jobs if in_cue(j)),
        created_job_count=len(jobs),
        created_frame_count=sum(counts.values()),
        rendered_frame_count=counts.get("SUCCEEDED", 0),
        failed_frame_count=counts.get("DEAD", 0),
        reserved_cores=reserved[0],
        reserved_gpus=reserved[1],
    )
    return show_pb2.Show(id=name, name=name, active=True, booking_enabled=True, dispatch_enabled=True, show_stats=stats)


def group(name: str, jobs: Sequence[Mapping[str, Any]], reserved: tuple[float, int] = (0.0, 0)) -> job_pb2.Group:
    counts = show(name, jobs, reserved).show_stats
    stats = job_pb2.GroupStats(
        running_frames=counts.running_frames,
        dead_frames=counts.dead_frames,
        waiting_frames=counts.pending_frames,
        pending_jobs=counts.pending_jobs,
        reserved_cores=counts.reserved_cores,
        reserved_gpus=counts.reserved_gpus,
    )
    return job_pb2.Group(id=name, name=name, department="Unknown", level=0, group_stats=stats)


def nested_group(
    name: str, jobs: Sequence[job_pb2.Job], stats: job_pb2.GroupStats | None = None
) -> job_pb2.NestedGroup:
    """A show's whiteboard: one group (the show's) holding its jobs, as CueGUI's Cuetopia
    and CueCommander read them: ``inline_jobs`` the Job messages themselves (opencue-proto's
    field is ``repeated Job``; CueGUI's Monitor Cue shows them instead of a GetJobs per
    group), ``stats`` the group's counts (the group row's Run, Wait, ...)."""
    return job_pb2.NestedGroup(
        id=name, name=name, department="Unknown", level=0, jobs=[j.id for j in jobs], inline_jobs=jobs, stats=stats
    )


def allocation(hosts: Sequence[host_pb2.Host]) -> facility_pb2.Allocation:
    up = [h for h in hosts if h.state == host_pb2.UP]
    stats = facility_pb2.AllocationStats(
        cores=sum(h.cores for h in hosts),
        available_cores=sum(h.idle_cores for h in up if h.lock_state == 0),
        idle_cores=sum(h.idle_cores for h in up),
        running_cores=sum(h.cores - h.idle_cores for h in hosts),
        locked_cores=sum(h.cores for h in hosts if h.lock_state != host_pb2.OPEN),
        hosts=len(hosts),
        locked_hosts=sum(1 for h in hosts if h.lock_state != host_pb2.OPEN),
        down_hosts=sum(1 for h in hosts if h.state != host_pb2.UP),
        gpus=int(sum(h.gpus for h in hosts)),
        idle_gpus=int(sum(h.idle_gpus for h in up)),
        available_gpus=int(sum(h.idle_gpus for h in up if h.lock_state == host_pb2.OPEN)),
        running_gpus=int(sum(h.gpus - h.idle_gpus for h in hosts)),
        locked_gpus=int(sum(h.gpus for h in hosts if h.lock_state != host_pb2.OPEN)),
    )
    return facility_pb2.Allocation(
        id=ALLOCATION, name=ALLOCATION, tag="general", facility=FACILITY, billable=False, stats=stats
    )


def service(entry: Mapping[str, Any]) -> service_pb2.Service:
    """A ``cuectl admin service`` entry as OpenCue's Service (its layer defaults)."""
    values = entry  # ``list_services`` rows: the defaults beside the name (None: no default)
    gpus = int(values.get("gpus") or 0)
    cores = float(values.get("cores") or 0.0)
    return service_pb2.Service(
        id=str(entry["name"]),
        name=str(entry["name"]),
        threadable=False,
        min_cores=int(cores * 100),
        max_cores=int(cores * 100),
        min_memory=kib(values.get("memory_bytes")),
        min_gpu_memory=kib(int(values.get("gpu_memory_min_bytes") or 0) * gpus),
        min_gpus=gpus,
        max_gpus=gpus,
        tags=list(values.get("tags") or []),
        timeout=int((values.get("timeout_s") or 0) // 60),
    )


def limit(entry: Mapping[str, Any]) -> limit_pb2.Limit:
    return limit_pb2.Limit(
        id=str(entry["name"]),
        name=str(entry["name"]),
        max_value=int(entry.get("max_running") or 0),
        current_running=int(entry.get("running") or 0),
    )


def depend(row: Mapping[str, Any]) -> depend_pb2.Depend:
    """A ``job depends`` entry as OpenCue's Depend: cuectl keeps OpenCue's dependency
    types by name (``layer-on-layer`` is LAYER_ON_LAYER); a dropped one is inactive."""
    kind = str(row.get("type") or "").upper().replace("-", "_")
    job, on_job = row.get("job") or {}, row.get("on_job") or {}
    number, on_number = row.get("frame"), row.get("on_frame")
    layer, on_layer = str(row.get("layer") or ""), str(row.get("on_layer") or "")
    return depend_pb2.Depend(
        id=str(row["id"]),
        type=depend_pb2.DependType.Value(kind) if kind in depend_pb2.DependType.keys() else 0,
        target=depend_pb2.INTERNAL if job.get("id") == on_job.get("id") else depend_pb2.EXTERNAL,
        any_frame=bool(row.get("any_frame")),
        active=row.get("state") == "waiting",
        depend_er_job=str(job.get("name") or ""),
        depend_er_layer=layer,
        depend_er_frame=frame_name(int(number), layer) if number is not None and layer else "",
        depend_on_job=str(on_job.get("name") or ""),
        depend_on_layer=on_layer,
        depend_on_frame=frame_name(int(on_number), on_layer) if on_number is not None and on_layer else "",
    )


def system_stats() -> cue_pb2.SystemStats:
    """Cuebot's thread-pool figures: cuectl has none (workers dispatch themselves), so zeros."""
    return cue_pb2.SystemStats()
