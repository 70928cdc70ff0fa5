"""One picture of the farm for ``cuectl top``: hosts and their devices, running frames with
their live GPU values, waiting jobs with their pending reasons, and totals.

``snapshot(store)`` returns plain JSON-ready data (no rich, no typer): the CLI renders it,
``cuectl top --json`` prints it as is. Who holds a device, in order of trust: the RUNNING
frame the store says has it (``frame``); else a lease in the local lock directory
(``worker``/``run``/``api``, from ``cuectl gpu leases``); else, when the host's last
sample of the device, fresh and taken while no frame of its worker held it, saw it busy
(memory used or utilisation above a small floor), a process cuectl does not know about
(``foreign``); else nobody (``None``).

A worker samples every device each ``--sample-interval`` and publishes each device's values
with the time they were read (``live_values``). A value older than two intervals is not
shown as current: the device reads ``null`` with its ``sampled_at`` and ``sample_age_s``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from cuectl.sched import model as m
from cuectl.units import iso

if TYPE_CHECKING:
    from cuectl.sched.store import Store

# A device that idles with a little memory in use (driver context, display) is not "held".
FOREIGN_MEMORY_FLOOR_BYTES = 256 * 1024**2
FOREIGN_UTIL_FLOOR_PCT = 5.0
# The sampling interval of a worker that does not publish its own (``cuectl worker
# --sample-interval``'s default), and how many intervals old a value may be and still be
# shown as current.
DEFAULT_SAMPLE_INTERVAL_S = 10.0
FRESH_INTERVALS = 2


# The published times a view can print: from the epoch to the end of year 9999 (``iso``
# cannot write a later one, nor NaN or an infinity, which Python's json also reads).
_LAST_EPOCH = 253402300800.0


def _epoch(value: Any) -> float | None:
    """A published time: epoch seconds, or ISO 8601 text (``...Z``); None when unreadable.
    Any member of a shared store's group can write a host's live document: a time no view
    can print is unreadable, not an error that breaks `top`, `host show` and the API."""
    from cuectl.errors import InvalidInput
    from cuectl.units import parse_time

    at: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        at = float(value)
    elif isinstance(value, str) and value:
        try:
            at = parse_time(value, now=0.0)
        except InvalidInput:
            return None
    return at if at is not None and 0.0 <= at < _LAST_EPOCH else None


def live_values(live_doc: Mapping[str, Any] | None, *, now: float) -> dict[str, dict[str, Any]]:
    """Each device's published values judged at ``now`` (uuid -> ``utilization_pct``,
    ``memory_used_bytes``, ``memory_free_bytes``, ``sampled_at`` (ISO), ``sample_age_s``,
    ``fresh``, ``frame_id``). A value read more than FRESH_INTERVALS of the worker's
    sampling interval ago is None (unknown now), its time and age kept so a view can say how
    old the last one is. A device without its own time (an older worker) has the doc's."""
    doc = live_doc if isinstance(live_doc, Mapping) else {}
    interval = doc.get("sample_interval_s")
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 < interval < 86400:
        interval = DEFAULT_SAMPLE_INTERVAL_S  # (NaN fails the comparison too)
    doc_at = _epoch(doc.get("at"))
    out: dict[str, dict[str, Any]] = {}
    for d in doc.get("devices") or []:
        if not isinstance(d, Mapping) or not isinstance(d.get("uuid"), str):
            continue
        at = _epoch(d["sampled_at"]) if "sampled_at" in d else doc_at
        age = None if at is None else max(0.0, now - at)  # clocks may disagree by a little
        fresh = age is not None and age <= FRESH_INTERVALS * interval
        frame_id = d.get("frame_id")
        out[d["uuid"]] = {
            "utilization_pct": d.get("utilization_pct") if fresh else None,
            "memory_used_bytes": d.get("memory_used_bytes") if fresh else None,
            "memory_free_bytes": d.get("memory_free_bytes") if fresh else None,
            "sampled_at": iso(at),
            "sample_age_s": None if age is None else round(age, 3),
            "fresh": fresh,
            "frame_id": frame_id if isinstance(frame_id, int) and not isinstance(frame_id, bool) else None,
            # Whose processes run on it, and whether a frame holds it idle (docs/gpu-health.md).
            "processes": _processes(d.get("processes")) if fresh else [],
            "held_idle": d.get("held_idle") is True and fresh,
        }
    return out


# What a process entry of a host's live document may hold: every value is checked, as any
# member of a shared store's group can write that document.
_PROCESS_OWNERS = ("frame", "lease", "foreign")


def _processes(value: Any, most: int = 64) -> list[dict[str, Any]]:
    """The published processes of one device (``run/worker/gpuwatch.py``), each entry's
    values checked: pid, user, memory_bytes, utilization_pct, owner, frame_id, holder."""
    out: list[dict[str, Any]] = []
    for p in value if isinstance(value, list) else []:
        if not isinstance(p, Mapping) or not _whole(p.get("pid")) or p.get("owner") not in _PROCESS_OWNERS:
            continue
        util = p.get("utilization_pct")
        out.append(
            {
                "pid": p["pid"],
                "user": _text(p.get("user")),
                "memory_bytes": p.get("memory_bytes") if _whole(p.get("memory_bytes")) else None,
                "utilization_pct": util if isinstance(util, (int, float)) and not isinstance(util, bool) else None,
                "owner": p["owner"],
                "frame_id": p.get("frame_id") if _whole(p.get("frame_id")) else None,
                "holder": _text(p.get("holder")),
            }
        )
        if len(out) >= most:
            break
    return out


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _text(value: Any, most: int = 200) -> str | None:
    """A published name, one line of printable characters (a hostile one cannot move the cursor)."""
    if not isinstance(value, str):
        return None
    return "".join(ch if ch.isprintable() else "?" for ch in value[:most])


def _local_leases(lock_dir: Path | None) -> list[Any]:
    """The local lock directory's held leases; none when it cannot be read (top is a view:
    a missing or unreadable directory is not an error)."""
    from dataclasses import replace

    from cuectl import config
    from cuectl.errors import CuectlError
    from cuectl.run.lease import list_leases
    from cuectl.run.lease.shares import share_infos

    where = lock_dir or config.lock_dir()
    try:
        held = list(list_leases(where))
        # Shares of a device (gpu_share) are held in its ledger: one holder line per device,
        # naming the first share and how many there are.
        shares: dict[str, list[Any]] = {}
        for info, _budget in share_infos(where):
            shares.setdefault(info.uuid, []).append(info)
    except (CuectlError, OSError):
        return []
    for infos in shares.values():
        first = infos[0]
        label = first.label or first.holder or "a share"
        more = f" and {len(infos) - 1} more share{'s' if len(infos) > 2 else ''}" if len(infos) > 1 else " (a share)"
        held.append(replace(first, label=f"{label}{more}"))
    return held


def _holder(
    uuid: str,
    frames_by_uuid: Mapping[str, Mapping[str, Any]],
    leases: Mapping[str, Any],
    live: Mapping[str, Any] | None,
) -> dict[str, Any] | None:
    frame = frames_by_uuid.get(uuid)
    if frame is not None:
        return {
            "kind": "frame",
            "frame_id": frame["id"],
            "label": f"{frame['job']}/{frame['name']}",
            "pid": None,
            "user": None,
        }
    info = leases.get(uuid)
    if info is not None:
        return {
            "kind": info.kind or "lease",
            "frame_id": None,
            "label": info.label or info.holder,
            "pid": info.pid,
            "user": info.user,
        }
    # Only a fresh sample taken while no frame of its worker held the device tells of another
    # program: a frame's own use, read just before it ended, is not a stranger's.
    if live is not None and live["fresh"] and live["frame_id"] is None:
        used = live.get("memory_used_bytes") or 0
        util = live.get("utilization_pct") or 0.0
        if used >= FOREIGN_MEMORY_FLOOR_BYTES or util >= FOREIGN_UTIL_FLOOR_PCT:
            return {"kind": "foreign", "frame_id": None, "label": None, "pid": None, "user": None}
    return None


def _device(gpu: Mapping[str, Any], live: Mapping[str, Any] | None, holder: dict[str, Any] | None) -> dict[str, Any]:
    used = live.get("memory_used_bytes") if live else None
    total = gpu.get("memory_total_bytes")
    if total is None and live and used is not None and live.get("memory_free_bytes") is not None:
        total = used + live["memory_free_bytes"]
    return {
        "index": gpu.get("index"),
        "uuid": gpu.get("uuid"),
        "vendor": gpu.get("vendor"),
        "model": gpu.get("model"),
        "utilization_pct": live.get("utilization_pct") if live else None,
        "memory_used_bytes": used,
        "memory_total_bytes": total,
        "compute_capability": gpu.get("compute_capability"),
        "driver_version": gpu.get("driver_version"),
        "cuda_version": gpu.get("cuda_version"),
        # When those values were read (None: never); past two sampling intervals the values
        # above are None and these say how old the last ones are.
        "sampled_at": live["sampled_at"] if live else None,
        "sample_age_s": live["sample_age_s"] if live else None,
        "holder": holder,
        "processes": live["processes"] if live else [],
        "held_idle": bool(live and live["held_idle"]),
    }


def _elapsed(started_at: str | None, now: float) -> float | None:
    from cuectl.errors import InvalidInput
    from cuectl.units import parse_time

    if not started_at:
        return None
    try:
        return max(0.0, now - parse_time(started_at, now=now))
    except InvalidInput:
        return None


def _at(value: Any) -> str | None:
    """A heartbeat's live-sample time: ISO already (hosts' JSON), or epoch seconds (older rows)."""
    if isinstance(value, str):
        return value
    return iso(value) if isinstance(value, (int, float)) else None


def snapshot(
    store: Store,
    *,
    lock_dir: Path | None = None,
    now: float | None = None,
    down_after: float = m.HOST_DOWN_AFTER_S,
    frame_limit: int = 500,
    local_leases: bool = True,
    waiting: bool = True,
) -> dict[str, Any]:
    """The farm right now, as one JSON-ready dict (keys: ``at``, ``hosts``, ``frames``,
    ``waiting``, ``totals``; see docs/accounting.md, "cuectl top"). ``waiting=False``: no
    waiting jobs (``[]``, their totals None), for views of the hosts alone: each waiting
    job's pending reason is the most of the work (93 ms against 5 ms with 300 of them)."""
    from cuectl.sched.pending import describe_jobs

    now = store.clock() if now is None else now  # heartbeats are on the store's clock
    frames, frames_total = store.list_frames(state=m.RUNNING, limit=frame_limit)
    frames_by_uuid = {uuid: f for f in frames for uuid in (f.get("gpu_uuids") or [])}
    leases = {info.uuid: info for info in _local_leases(lock_dir)} if local_leases else {}
    # Devices out of service (drained or lost, with why: docs/gpu-health.md); the rest are ok.
    states = {(s.host, s.uuid): s for s in store.device_states()}

    hosts = []
    for h in store.list_hosts(now=now, down_after=down_after):
        live_doc = h.get("live") or {}
        live_by_uuid = live_values(live_doc, now=now)
        devices = []
        for gpu in sorted(h.get("gpus") or [], key=lambda g: (g.get("index") is None, g.get("index") or 0)):
            live = live_by_uuid.get(gpu.get("uuid"))
            device = _device(gpu, live, _holder(gpu.get("uuid", ""), frames_by_uuid, leases, live))
            state = states.get((h["name"], gpu.get("uuid")))
            device["state"] = state.state if state is not None else "ok"
            device["reason"] = state.reason if state is not None else None
            devices.append(device)
        hosts.append(
            {
                "name": h["name"],
                "state": h["state"],
                "locked": h["locked"],
                "last_heartbeat": h["last_heartbeat"],
                "live_at": _at(live_doc.get("at")),
                "running": sum(1 for f in frames if f.get("host") == h["name"]),
                "devices": devices,
            }
        )

    running = [
        {
            "id": f["id"],
            "job": f["job"],
            "name": f["name"],
            "host": f["host"],
            "attempts": f["attempts"],
            "gpu_uuids": f.get("gpu_uuids") or [],
            "started_at": f["started_at"],
            "elapsed_s": _elapsed(f["started_at"], now),
            "gpu_util_pct": f.get("gpu_util_pct"),
            "gpu_memory_used_bytes": f.get("gpu_memory_used_bytes"),
            "gpu_sampled_at": f.get("gpu_sampled_at"),
        }
        for f in frames
    ]

    queue: list[dict[str, Any]] = []
    for j in describe_jobs(store, include_finished=False) if waiting else ():
        counts = j.get("frame_counts") or {}
        if not (counts.get(m.WAITING) or counts.get(m.DEPEND)):
            continue
        queue.append(
            {
                "id": j["id"],
                "name": j["name"],
                "user": j["user"],
                "priority": j["priority"],
                "paused": j["paused"],
                "waiting": counts.get(m.WAITING, 0),
                "depend": counts.get(m.DEPEND, 0),
                "pending_reason": j.get("pending_reason"),
            }
        )

    all_devices = [d for h in hosts for d in h["devices"]]
    return {
        "at": iso(now),
        "hosts": hosts,
        "frames": running,
        "waiting": queue,
        "totals": {
            "hosts": len(hosts),
            "hosts_up": sum(1 for h in hosts if h["state"] == "UP"),
            "gpus": len(all_devices),
            "gpus_held": sum(1 for d in all_devices if d["holder"] is not None),
            "running": frames_total,
            "waiting_jobs": len(queue) if waiting else None,
            "waiting_frames": sum(w["waiting"] for w in queue) if waiting else None,
        },
    }
