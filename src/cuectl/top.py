"""One picture of the farm for ``cuectl top``: hosts and their devices, running frames with
their live GPU values, waiting jobs with their pending reasons, and totals.

``snapshot(store)`` returns plain JSON-ready data (no rich, no typer): the CLI renders it,
``cuectl top --json`` prints it as is. Who holds a device, in order of trust: the RUNNING
frame the store says has it (``frame``); else a lease in the local lock directory
(``worker``/``run``/``api``, from ``cuectl gpu leases``); else, when the host's last
heartbeat saw the device busy (memory used or utilisation above a small floor) with
neither, a process cuectl does not know about (``foreign``); else nobody (``None``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from cuectl.sched import model as m
from cuectl.units import iso

if TYPE_CHECKING:
    from cuectl.sched.store import Store

# A device that idles with a little memory in use (driver context, display) is not "held".
FOREIGN_MEMORY_FLOOR_BYTES = 256 * 1024 ** 2
FOREIGN_UTIL_FLOOR_PCT = 5.0


def _local_leases(lock_dir: Path | None) -> list[Any]:
    """The local lock directory's held leases; none when it cannot be read (top is a view:
    a missing or unreadable directory is not an error)."""
    from cuectl import config
    from cuectl.errors import CuectlError
    from cuectl.run.lease import list_leases

    try:
        return list(list_leases(lock_dir or config.lock_dir()))
    except (CuectlError, OSError):
        return []


def _holder(uuid: str, frames_by_uuid: Mapping[str, Mapping[str, Any]], leases: Mapping[str, Any],
            live: Mapping[str, Any] | None) -> dict[str, Any] | None:
    frame = frames_by_uuid.get(uuid)
    if frame is not None:
        return {"kind": "frame", "frame_id": frame["id"], "label": f"{frame['job']}/{frame['name']}",
                "pid": None, "user": None}
    info = leases.get(uuid)
    if info is not None:
        return {"kind": info.kind or "lease", "frame_id": None, "label": info.label or info.holder,
                "pid": info.pid, "user": info.user}
    if live is not None:
        used = live.get("memory_used_bytes") or 0
        util = live.get("utilization_pct") or 0.0
        if used >= FOREIGN_MEMORY_FLOOR_BYTES or util >= FOREIGN_UTIL_FLOOR_PCT:
            return {"kind": "foreign", "frame_id": None, "label": None, "pid": None, "user": None}
    return None


def _device(gpu: Mapping[str, Any], live: Mapping[str, Any] | None, holder: dict[str, Any] | None
            ) -> dict[str, Any]:
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
        "holder": holder,
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


def snapshot(store: Store, *, lock_dir: Path | None = None, now: float | None = None,
             down_after: float = m.HOST_DOWN_AFTER_S, frame_limit: int = 500,
             local_leases: bool = True) -> dict[str, Any]:
    """The farm right now, as one JSON-ready dict (keys: ``at``, ``hosts``, ``frames``,
    ``waiting``, ``totals``; see docs/accounting.md, "cuectl top")."""
    from cuectl.sched.pending import describe_jobs

    now = store.clock() if now is None else now  # heartbeats are on the store's clock
    frames, frames_total = store.list_frames(state=m.RUNNING, limit=frame_limit)
    frames_by_uuid = {uuid: f for f in frames for uuid in (f.get("gpu_uuids") or [])}
    leases = {info.uuid: info for info in _local_leases(lock_dir)} if local_leases else {}

    hosts = []
    for h in store.list_hosts(now=now, down_after=down_after):
        live_doc = h.get("live") or {}
        live_by_uuid = {d.get("uuid"): d for d in (live_doc.get("devices") or []) if isinstance(d, Mapping)}
        devices = []
        for gpu in sorted(h.get("gpus") or [], key=lambda g: (g.get("index") is None, g.get("index") or 0)):
            live = live_by_uuid.get(gpu.get("uuid"))
            devices.append(_device(gpu, live, _holder(gpu.get("uuid", ""), frames_by_uuid, leases, live)))
        hosts.append({
            "name": h["name"],
            "state": h["state"],
            "locked": h["locked"],
            "last_heartbeat": h["last_heartbeat"],
            "live_at": _at(live_doc.get("at")),
            "running": sum(1 for f in frames if f.get("host") == h["name"]),
            "devices": devices,
        })

    running = [{
        "id": f["id"], "job": f["job"], "name": f["name"], "host": f["host"], "attempts": f["attempts"],
        "gpu_uuids": f.get("gpu_uuids") or [], "started_at": f["started_at"],
        "elapsed_s": _elapsed(f["started_at"], now),
        "gpu_util_pct": f.get("gpu_util_pct"), "gpu_memory_used_bytes": f.get("gpu_memory_used_bytes"),
        "gpu_sampled_at": f.get("gpu_sampled_at"),
    } for f in frames]

    waiting = []
    for j in describe_jobs(store, include_finished=False):
        counts = j.get("frame_counts") or {}
        if not (counts.get(m.WAITING) or counts.get(m.DEPEND)):
            continue
        waiting.append({"id": j["id"], "name": j["name"], "user": j["user"], "priority": j["priority"],
                        "paused": j["paused"], "waiting": counts.get(m.WAITING, 0),
                        "depend": counts.get(m.DEPEND, 0), "pending_reason": j.get("pending_reason")})

    all_devices = [d for h in hosts for d in h["devices"]]
    return {
        "at": iso(now),
        "hosts": hosts,
        "frames": running,
        "waiting": waiting,
        "totals": {
            "hosts": len(hosts),
            "hosts_up": sum(1 for h in hosts if h["state"] == "UP"),
            "gpus": len(all_devices),
            "gpus_held": sum(1 for d in all_devices if d["holder"] is not None),
            "running": frames_total,
            "waiting_jobs": len(waiting),
            "waiting_frames": sum(w["waiting"] for w in waiting),
        },
    }
