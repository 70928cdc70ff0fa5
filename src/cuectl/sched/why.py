"""Why a job's frames wait: ``cuectl job why JOB`` and every ``pending_reason``.

One source of truth, in the spirit of HTCondor's ``condor_q -better-analyze``: for each
layer of a job, the frames per state, one line saying why its waiting frames are not
running (None: nothing waits, or a worker could claim one now), and one line per
registered host saying why the layer can or cannot run there right now.

A host is checked in this order (the first that applies is its line):

1. DOWN (no heartbeat for ``model.HOST_DOWN_AFTER_S``), locked by an admin, not accepting
   work (draining, or outside its schedule), ``worker --allow-user`` excluding the job's
   user, a root worker and a job nothing proves its user submitted — the host could run
   the layer, but will not now;
2. the layer's tags, ``--gpu-only`` for CPU layers, the GPU request against the host's
   inventory (``select_devices(...).could_ever_fit``), cores or memory larger than the
   host has — the host can never run the layer;
3. a reached cap (``store.cap_reached``: farm-wide, so said once at layer level);
4. what holds the fitting devices now (a frame, a ``cuectl run``/lease, a foreign
   process), too little free GPU memory, devices reserved for a higher-priority frame, a
   full CPU pool — else "could run now".

Steps 1 and 4 read what each worker publishes with its heartbeat (``live["dispatch"]``,
docs/scheduling.md), except frames: which frame holds a device is the store's RUNNING
frames now, whatever the worker last published. A host whose worker publishes none (an
older cuectl, or one that started moments ago) gets no claim about the rest: it is never
blamed for what is unknown.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from cuectl.gpu.device import Device
from cuectl.sched import identity
from cuectl.sched import model as m
from cuectl.sched.match import (
    CpuPool,
    GpuRequest,
    cpu_fits,
    device_fits_now,
    device_fits_statically,
    explain_hosts,
    select_devices,
    tags_fit,
)
from cuectl.sched.store.lifecycle import bigger_devices
from cuectl.units import format_bytes, format_duration, iso

# Host line kinds (``check`` in JSON), in the order they are tested.
AVAILABILITY = ("down", "locked", "closed", "user", "proof")  # could fit, but will not take work now
STATIC = ("tags", "gpu_only", "devices", "size")  # can never run the layer
RUNTIME = ("cap", "reserving", "reserved", "busy", "memory", "cpu", "unknown", "ok")

_LIST_LIMIT = 4  # devices, hosts or frames named in one line


# --------------------------------------------------------------------------- results


@dataclass
class HostLine:
    """Why one layer can or cannot run on one host right now."""

    host: str
    state: str  # UP / DOWN
    check: str  # one of AVAILABILITY, STATIC, RUNTIME
    reason: str

    @property
    def can_run(self) -> bool:
        return self.check == "ok"

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "state": self.state,
            "check": self.check,
            "can_run": self.can_run,
            "reason": self.reason,
        }


@dataclass
class LayerExplanation:
    id: int
    name: str
    counts: dict[str, int]
    reason: str | None = None  # the whole layer, one line (None: nothing waits / runs now)
    waiting_reason: str | None = None  # why its WAITING frames are not claimed
    depend_reason: str | None = None  # what its DEPEND frames wait on
    cap: str | None = None  # a reached cap, farm-wide
    hosts: list[HostLine] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "counts": dict(self.counts),
            "reason": self.reason,
            "waiting_reason": self.waiting_reason,
            "depend_reason": self.depend_reason,
            "cap": self.cap,
            "hosts": [h.to_json() for h in self.hosts],
        }


@dataclass
class JobExplanation:
    job: dict[str, Any]  # id, name, user, priority, state, paused, frame_counts
    reason: str | None  # the short form: ``pending_reason``
    layers: list[LayerExplanation]
    at: float = 0.0
    # What workers saw on the devices of its frames lately (escapes, foreign processes, idle
    # devices, shares over budget, sick devices: docs/gpu-health.md), newest last.
    gpu_events: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "job": dict(self.job),
            "at": iso(self.at),
            "pending_reason": self.reason,
            "layers": [layer.to_json() for layer in self.layers],
            "gpu_events": list(self.gpu_events),
        }


# --------------------------------------------------------------------------- the farm, read once


@dataclass
class Farm:
    """Registered hosts (``list_hosts`` rows) and, read lazily, which RUNNING frame holds
    which device (for hosts whose worker publishes no dispatch state)."""

    store: Any
    now: float
    hosts: list[dict[str, Any]]
    _holders: dict[str, str] | None = None

    @classmethod
    def read(cls, store: Any, now: float) -> Farm:
        return cls(store, now, store.list_hosts(now=now, down_after=m.HOST_DOWN_AFTER_S))

    def frame_holders(self) -> dict[str, str]:
        """Device uuid -> the RUNNING frame holding it, as the store says now: the truth a
        worker's published holders are checked against (a frame that ended since its last
        heartbeat holds nothing, however the worker last described it)."""
        if self._holders is None:
            frames, _ = self.store.list_frames(state=m.RUNNING, limit=100_000)
            self._holders = {u: f"frame {f['id']} (job {f['job']})" for f in frames for u in f.get("gpu_uuids") or []}
        return self._holders


def _epoch(value: Any, now: float) -> float | None:
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value:
        from datetime import datetime

        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def _ago(host: Mapping[str, Any], now: float) -> str:
    at = _epoch(host.get("last_heartbeat"), now)
    return "unknown" if at is None else format_duration(max(0.0, now - at))


def dispatch_of(host: Mapping[str, Any]) -> dict[str, Any] | None:
    """The host's published dispatch state, or None (an older worker: unknown)."""
    live = host.get("live")
    d = live.get("dispatch") if isinstance(live, Mapping) else None
    return d if isinstance(d, dict) else None


def _devices(host: Mapping[str, Any]) -> list[Device]:
    out = []
    for d in host.get("gpus") or []:
        try:
            out.append(Device.from_json(d))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _cap_list(items: Sequence[str], sep: str = "; ") -> str:
    if len(items) <= _LIST_LIMIT:
        return sep.join(items)
    return sep.join(items[:_LIST_LIMIT]) + f"{sep}+{len(items) - _LIST_LIMIT} more"


# --------------------------------------------------------------------------- one host


def no_dispatch_state(host: Mapping[str, Any]) -> str:
    """Why a host publishes no dispatch state, in words: a worker of this version publishes
    it after its first dispatch pass (moments after it registers), an older cuectl never."""
    from cuectl import __version__

    if host.get("version") == __version__:
        return "its worker has not published its dispatch state yet (it started moments ago)"
    return "its worker publishes no dispatch state (an older cuectl)"


def _availability(
    host: Mapping[str, Any], user: str, now: float, unproven: str | None = None
) -> tuple[str, str] | None:
    name = host["name"]
    if host.get("state") == "DOWN":
        return "down", f"DOWN (last heartbeat {_ago(host, now)} ago)"
    if host.get("locked"):
        return "locked", f"locked by an admin (`cuectl host unlock {name}`)"
    d = dispatch_of(host)
    if d is None:
        return None
    if d.get("accepting") is False:
        schedule = d.get("schedule")
        if isinstance(schedule, Mapping) and schedule.get("open") is False:
            return "closed", str(schedule.get("reason") or f"outside the host's schedule ({schedule.get('text')})")
        return "closed", "draining: its worker takes no new frames"
    allowed = [str(u) for u in d.get("allowed_users") or []]
    if allowed and user not in allowed:
        return "user", f"runs only the work of {', '.join(allowed)} (worker --allow-user), not {user}'s"
    if unproven and d.get("run_as_submitter"):
        # A root worker runs frames as their user, and only what that user provably
        # submitted (docs/security.md): it will never claim this job as it stands.
        return "proof", f"runs frames as their users and will not run it as {user} (nothing proves {user} submitted it)"
    return None


def _pool(host: Mapping[str, Any]) -> tuple[float, int]:
    d = dispatch_of(host) or {}
    cores = d.get("cores") if isinstance(d.get("cores"), (int, float)) else host.get("cores")
    memory = d.get("memory_bytes") if isinstance(d.get("memory_bytes"), int) else host.get("memory_bytes")
    return float(cores or 0), int(memory or 0)


def _static(layer: Mapping[str, Any], host: Mapping[str, Any]) -> tuple[str, str] | None:
    if not tags_fit(layer["tags"], host.get("tags") or []):
        missing = sorted(set(t.casefold() for t in layer["tags"]) - set(t.casefold() for t in host.get("tags") or []))
        return "tags", f"lacks the tag{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
    if layer["gpus"] > 0:
        request = GpuRequest.from_record(layer)
        match = select_devices(request, _devices(host))
        if not match.could_ever_fit:
            return "devices", match.reason or "no fitting devices"
        oom = _gpu_oom_bytes(layer)
        if oom and not select_devices(request, bigger_devices(_devices(host), oom)).could_ever_fit:
            return "devices", f"{_oom_text(oom)}; this host has none"
        return None
    d = dispatch_of(host)
    if d is not None and d.get("gpu_only"):
        return "gpu_only", "runs GPU frames only (worker --gpu-only)"
    cores, memory = _pool(host)
    if layer["cores"] > cores + 1e-9:
        return "size", f"needs {layer['cores']:g} cores; host has {cores:g}"
    if layer["memory_bytes"] and layer["memory_bytes"] > memory:
        return "size", f"needs {format_bytes(layer['memory_bytes'])} of memory; host has {format_bytes(memory)}"
    return None


def _gpu_oom_bytes(layer: Mapping[str, Any]) -> int:
    """The device size the layer's WAITING frames ran out of GPU memory on, each wanting a
    bigger one (``retry_on_gpu_oom: bigger``; 0: some frame takes any fitting device)."""
    return int(layer.get("waiting_gpu_oom_bytes") or 0)


def _oom_text(oom: int) -> str:
    return f"ran out of GPU memory on {format_bytes(oom)}: waits for a GPU bigger than {format_bytes(oom)}"


def _live_free(host: Mapping[str, Any]) -> dict[str, int | None]:
    live = host.get("live")
    devs = live.get("devices") if isinstance(live, Mapping) else None
    # A reading taken while a frame of the worker held the device tells nothing of it now: that
    # frame is RUNNING (the device is busy) or has ended (its memory is free again).
    return {
        str(d.get("uuid")): d.get("memory_free_bytes")
        for d in devs or []
        if isinstance(d, Mapping) and d.get("frame_id") is None
    }


def _gpu_now(layer: Mapping[str, Any], host: Mapping[str, Any], farm: Farm) -> tuple[str, str]:
    request = GpuRequest.from_record(layer)
    d = dispatch_of(host)
    states: Mapping[str, Any] = (d or {}).get("devices") or {}
    res = (d or {}).get("reservation")
    res = res if isinstance(res, Mapping) else None
    mine = res is not None and res.get("layer_id") == layer["id"]
    res_uuids = set(res.get("uuids") or []) if res is not None else set()
    # The store's RUNNING frames are the truth about frames: the published state is as old
    # as the last heartbeat, and a frame named there may have ended (or be this job's own,
    # back in its retry back-off), another started.
    holders = farm.frame_holders()
    live_free = _live_free(host)

    devices = bigger_devices(_devices(host), _gpu_oom_bytes(layer))
    parents = {x.mig_parent_uuid for x in devices if x.mig_parent_uuid}
    fitting = sorted(
        (x for x in devices if x.uuid not in parents and device_fits_statically(request, x) is None),
        key=lambda x: (x.index, x.uuid),
    )
    free: list[Device] = []
    reserved: list[Device] = []
    busy: list[str] = []
    low: list[str] = []
    for dev in fitting:
        raw = states.get(dev.uuid)
        info: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        state = info.get("state")
        parent_holder = holders.get(dev.mig_parent_uuid or "")
        if dev.uuid in holders or parent_holder:
            busy.append(f"gpu {dev.index} held by {holders.get(dev.uuid) or parent_holder}")
            continue
        if state == "frame":  # that frame has ended since: the device is free as far as anyone knows
            info, state = {}, "free"
        if state in ("lease", "nimby"):
            holder = info.get("holder") or {"lease": "a lease", "nimby": "another process"}[str(state)]
            busy.append(f"gpu {dev.index} held by {holder}")
            continue
        if not mine and (state == "reserved" or dev.uuid in res_uuids):
            reserved.append(dev)
            continue
        mem = info.get("memory_free_bytes") if "memory_free_bytes" in info else live_free.get(dev.uuid)
        why = device_fits_now(request, dataclasses.replace(dev, memory_free_bytes=mem)) if mem is not None else None
        if why:
            low.append(f"gpu {dev.index} {why}")
        else:
            free.append(dev)

    need = request.gpus
    if len(free) >= need:
        if d is None:
            return "unknown", f"fits; {no_dispatch_state(host)}, so whether it is free now is unknown"
        return "ok", "could run now (a worker will claim it at its next poll)"
    if mine and res is not None:
        text = (
            f"holding {_plural(int(res.get('free') or len(free)), 'free GPU')} on host {host['name']} "
            f"until {need} are free"
        )
        if busy:
            text += f" ({_cap_list(busy)})"
        return "reserving", text
    if reserved and len(free) + len(reserved) >= need and res is not None:
        return "reserved", reserved_text(res)
    parts = []
    if busy:
        parts.append(f"GPUs busy: {_cap_list(busy)}")
    if low:
        parts.append(f"too little free GPU memory: {_cap_list(low)}")
    if reserved and res is not None:
        parts.append(f"{_plural(len(reserved), 'device')} {reserved_text(res)}")
    head = f"needs {_plural(need, 'GPU')}, {len(free)} of {len(fitting)} fitting free"
    check = "busy" if busy else "memory" if low else "reserved"
    return check, head + (": " + "; ".join(parts) if parts else "")


def reserved_text(res: Mapping[str, Any]) -> str:
    """``reserved for job big (#7) (needs 4 × NVIDIA device matching 'A100', 2 free)``."""
    job = res.get("job") or "?"
    text = f"reserved for job {job} (#{res.get('job_id')})"
    details = [str(res["needs"])] if res.get("needs") else []
    if res.get("free") is not None:
        details.append(f"{res['free']} free")
    return text + (f" (needs {', '.join(details)})" if details else "")


def _cpu_now(layer: Mapping[str, Any], host: Mapping[str, Any]) -> tuple[str, str]:
    d = dispatch_of(host)
    if d is None or not isinstance(d.get("cores_free"), (int, float)):
        return "unknown", f"fits; {no_dispatch_state(host)}, so its free cores are unknown"
    mem = d.get("memory_free_bytes")
    why = cpu_fits(
        layer["cores"],
        layer["memory_bytes"],
        CpuPool(float(d["cores_free"]), int(mem) if isinstance(mem, int) else 1 << 62),
    )
    if why:
        return "cpu", f"CPU pool busy: {why}"
    return "ok", "could run now (a worker will claim it at its next poll)"


def explain_host(
    layer: Mapping[str, Any],
    host: Mapping[str, Any],
    *,
    user: str,
    farm: Farm,
    cap: str | None,
    unproven: str | None = None,
) -> HostLine:
    """``unproven``: why nothing proves that ``user`` submitted the job (root workers will
    not run it), or None."""
    state = str(host.get("state") or "UP")
    for check in (_availability(host, user, farm.now, unproven), _static(layer, host)):
        if check is not None:
            return HostLine(host["name"], state, *check)
    if cap:
        return HostLine(host["name"], state, "cap", f"fits, but held back by {cap}")
    kind, text = _gpu_now(layer, host, farm) if layer["gpus"] > 0 else _cpu_now(layer, host)
    return HostLine(host["name"], state, kind, text)


# --------------------------------------------------------------------------- one layer


def _farm_static(layer: Mapping[str, Any], hosts: Sequence[Mapping[str, Any]]) -> str | None:
    """Why no registered host could ever run the layer, whatever their state (or None)."""
    if not hosts:
        return "no host registered (start `cuectl worker`)"
    tagged = [h for h in hosts if tags_fit(layer["tags"], h.get("tags") or [])]
    if not tagged:
        return f"no registered host has the tags {', '.join(layer['tags'])}"
    if layer["gpus"] > 0:
        request = GpuRequest.from_record(layer)
        static = explain_hosts(request, {h["name"]: _devices(h) for h in tagged})
        oom = _gpu_oom_bytes(layer)
        if static is None and oom:
            bigger = {h["name"]: bigger_devices(_devices(h), oom) for h in tagged}
            if not any(select_devices(request, devs).could_ever_fit for devs in bigger.values()):
                return f"{_oom_text(oom)}; no registered host has one (`cuectl frame retry` once one is added)"
        return static
    cpu = [h for h in tagged if not (dispatch_of(h) or {}).get("gpu_only")]
    if not cpu:
        return "every host with its tags runs GPU frames only (worker --gpu-only)"
    best = max(cpu, key=lambda h: _pool(h)[0])
    if layer["cores"] > _pool(best)[0] + 1e-9:
        return f"needs {layer['cores']:g} cores; the largest host has {_pool(best)[0]:g} ({best['name']})"
    if layer["memory_bytes"]:
        best = max(cpu, key=lambda h: _pool(h)[1])
        if layer["memory_bytes"] > _pool(best)[1]:
            return (
                f"needs {format_bytes(layer['memory_bytes'])} of memory; the largest host has "
                f"{format_bytes(_pool(best)[1])} ({best['name']})"
            )
    return None


def _no_worker_alive(hosts: Sequence[Mapping[str, Any]], now: float) -> str | None:
    if any(h.get("state") != "DOWN" for h in hosts) or not hosts:
        return None
    last = max(hosts, key=lambda h: _epoch(h.get("last_heartbeat"), now) or 0.0)
    return f"no worker alive: the last heartbeat was {_ago(last, now)} ago from {last['name']}"


def waiting_reason(layer: Mapping[str, Any], lines: Sequence[HostLine], farm: Farm, cap: str | None) -> str | None:
    """Why the layer's WAITING frames are not claimed (None: some host could run one now,
    or nothing certain: a host whose worker publishes no dispatch state)."""
    blocker = _farm_static(layer, farm.hosts)
    if blocker:
        return blocker
    statics = {h["name"]: _static(layer, h) for h in farm.hosts}
    fits = [ln for ln in lines if statics.get(ln.host) is None]
    if not fits:
        return "no host fits: " + _cap_list([f"{name}: {why[1]}" for name, why in statics.items() if why])
    dead = _no_worker_alive(farm.hosts, farm.now)
    if dead:
        return dead
    available = [ln for ln in fits if ln.check not in AVAILABILITY]
    if not available:
        if len(fits) == 1:
            return f"the only fitting host {fits[0].host} {_as_state(fits[0])}"
        return "no fitting host takes work now: " + _cap_list([f"{ln.host} {_as_state(ln)}" for ln in fits])
    if cap:
        return cap
    if any(ln.check in ("ok", "unknown") for ln in available):
        return None
    reserving = [ln for ln in available if ln.check == "reserving"]
    if reserving:
        return reserving[0].reason
    if len(available) == 1:
        return f"on {available[0].host}: {available[0].reason}"
    return _cap_list([f"on {ln.host}: {ln.reason}" for ln in available])


def _as_state(line: HostLine) -> str:
    # "is DOWN (...)", "is locked by ...", "is outside the host's schedule ...", "runs only the work of ..."
    return line.reason if line.check in ("user", "proof") else f"is {line.reason}"


def _waits_of(job: Mapping[str, Any], layer: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What this layer's frames wait on, as (target job, layer, frame, how): from the job's
    dependency records (store.list_depends) still waiting, else from the layer's spec."""
    records = job.get("depends")
    if records is None:
        return [
            {"job": None, "layer": d.get("layer"), "frame": d.get("frame"), "how": d.get("type", "layer")}
            for d in layer.get("depends") or []
            if d.get("job") is None
        ]
    out = []
    for d in records:
        if d["state"] != "waiting" or d["layer"] not in (None, layer["name"]):
            continue
        how = {"frame-by-frame": "frame", "previous-frame": "previous"}.get(
            d["type"], "any" if d["any_frame"] else "layer"
        )
        other = None if d["on_job"]["id"] == job["id"] else d["on_job"]
        out.append({"job": other, "layer": d["on_layer"], "frame": d["on_frame"], "how": how})
    return out


_HOW = {"frame": " frame by frame", "previous": " (previous frame)", "any": " (any frame)", "layer": ""}


def depend_reason(
    store: Any, job: Mapping[str, Any], layer: Mapping[str, Any], depend: int, counts: Mapping[str, Mapping[str, int]]
) -> str | None:
    """What the layer's DEPEND frames wait on: the upstream layers (with progress) and their
    DEAD frames, which need a retry before anything continues, and their EATEN frames,
    which (OpenCue's rule) satisfy nothing unless depend.satisfy_on_eaten is set; and
    other jobs, their layers and frames."""
    if not depend:
        return None
    parts, dead_parts = [], []
    eaten_release: bool | None = None  # the store setting, read only when it matters
    for dep in _waits_of(job, layer):
        up, how = dep["layer"], dep["how"]
        if dep["job"] is not None:
            other = f"job {dep['job']['id']} {dep['job']['name']}"
            if up is None:
                parts.append(other)
            else:
                parts.append(
                    f"{'frame ' + str(dep['frame']) + ' of ' if dep['frame'] is not None else ''}"
                    f"layer {up}{_HOW.get(how, '')} of {other}"
                )
            continue
        if up is None:
            continue
        c = counts.get(up, {})
        total = sum(c.values())
        if c.get(m.EATEN) and eaten_release is None:
            eaten_release = any(s["name"] == m.SATISFY_ON_EATEN and s["value"] for s in store.settings())
        if dep["frame"] is not None:
            parts.append(f"frame {dep['frame']} of layer {up}")
            continue
        done = c.get(m.SUCCEEDED, 0) + (c.get(m.EATEN, 0) if eaten_release else 0)
        parts.append(f"layer {up}{_HOW.get(how, '')} ({done}/{total} done)")
        for state in (m.DEAD, m.EATEN):
            if not c.get(state) or (state == m.EATEN and eaten_release):
                continue
            if state == m.EATEN and how == "frame" and job.get("eaten_dependencies") == 0:
                continue  # frame by frame: none of this job's waiting frames needs an eaten one
            frames, n = store.list_frames(job=job["id"], layer=up, state=state, limit=_LIST_LIMIT)
            ids = " ".join(str(f["id"]) for f in frames)
            names = ", ".join(f"{f['name']} (#{f['id']})" for f in frames) + (
                f" +{n - len(frames)} more" if n > len(frames) else ""
            )
            if state == m.DEAD:
                dead_parts.append(
                    f"layer {up} has DEAD frames {names}: retry them to continue (`cuectl frame retry {ids}`)"
                )
            else:
                dead_parts.append(
                    f"waits on eaten frame(s) of layer {up}: {names} (OpenCue's rule: an eaten "
                    f"frame satisfies no dependency); `cuectl admin setting set "
                    f"{m.SATISFY_ON_EATEN} true` or retry them (`cuectl frame retry {ids}`)"
                )
    if not parts:
        return f"{depend} frame(s) waiting on dependencies"
    text = f"{_plural(depend, 'frame')} wait{'s' if depend == 1 else ''} on {', '.join(parts)}"
    return "; ".join([text, *dead_parts])


# --------------------------------------------------------------------------- one job

_COUNT_STATES = (m.WAITING, m.DEPEND, m.RUNNING, m.SUCCEEDED, m.DEAD, m.EATEN)


def layer_counts(
    store: Any, job: Mapping[str, Any], states: Sequence[str] = _COUNT_STATES
) -> dict[str, dict[str, int]]:
    """layer name -> frames per state (only states with frames)."""
    layers = job.get("layers") or []
    if len(layers) == 1:
        return {layers[0]["name"]: {s: n for s, n in job["frame_counts"].items() if n and s in states}}
    out: dict[str, dict[str, int]] = {}
    for layer in layers:
        c: dict[str, int] = {}
        for state in states:
            if job["frame_counts"].get(state):
                _, n = store.list_frames(job=job["id"], layer=layer["name"], state=state, limit=1)
                if n:
                    c[state] = int(n)
        out[layer["name"]] = c
    return out


def _cap_reached(store: Any, layer_id: int) -> str | None:
    return store.cap_reached(layer_id)


def explain_loaded(
    store: Any,
    job: Mapping[str, Any],
    farm: Farm,
    *,
    unproven: str | None = None,
    hosts_lines: bool = True,
    caps: Mapping[int, str | None] | None = None,
) -> JobExplanation:
    """``explain_job`` for a job already read with ``store.get_job`` (layers included);
    ``caps``: its layers' ``cap_reached``, read already (``Store.caps_reached``)."""
    counts_needed = _COUNT_STATES if hosts_lines else (m.WAITING, m.DEPEND, m.SUCCEEDED, m.EATEN, m.DEAD)
    counts = layer_counts(store, job, counts_needed)
    layers: list[LayerExplanation] = []
    for layer in job.get("layers") or []:
        c = counts.get(layer["name"], {})
        out = LayerExplanation(id=layer["id"], name=layer["name"], counts=c)
        waiting, depend = c.get(m.WAITING, 0), c.get(m.DEPEND, 0)
        if waiting or depend:
            if not waiting:
                out.cap = None
            elif caps is not None and layer["id"] in caps:
                out.cap = caps[layer["id"]]
            else:
                out.cap = _cap_reached(store, layer["id"])
            out.hosts = [
                explain_host(layer, h, user=job["user"], farm=farm, cap=out.cap, unproven=unproven) for h in farm.hosts
            ]
            if waiting:
                out.waiting_reason = waiting_reason(layer, out.hosts, farm, out.cap)
            else:  # only DEPEND frames: still say what would stop them once released
                out.waiting_reason = _farm_static(layer, farm.hosts)
            out.depend_reason = depend_reason(store, job, layer, depend, counts)
            if not hosts_lines:
                out.hosts = []
        out.reason = "; ".join(r for r in (out.waiting_reason, out.depend_reason) if r) or None
        layers.append(out)
    summary = {k: job[k] for k in ("id", "name", "user", "priority", "state", "paused", "frame_counts") if k in job}
    return JobExplanation(job=summary, reason=short_reason(job, layers, unproven), layers=layers, at=farm.now)


def short_reason(job: Mapping[str, Any], layers: Sequence[LayerExplanation], unproven: str | None) -> str | None:
    """``pending_reason``: why the job's waiting frames are not running, one line."""
    counts = job["frame_counts"]
    if not counts.get(m.WAITING) and not counts.get(m.DEPEND):
        return None
    if job["paused"]:
        return "job is paused (`cuectl job resume`)"
    reasons = [f"root workers will not run it as {job['user']}: {unproven}"] if unproven else []
    reasons += [f"layer {layer.name}: {layer.reason}" for layer in layers if layer.reason]
    return "; ".join(reasons) or None


def explain_job(store: Any, ref: str | int, *, now: float | None = None) -> JobExplanation:
    """Why each layer of job ``ref`` (id or unique name) waits, per host. NotFound/Conflict."""
    job = store.get_job(ref)
    farm = Farm.read(store, store.clock() if now is None else now)
    out = explain_loaded(store, job, farm, unproven=identity.job_proof_problem(job, store.receipt_dir))
    out.gpu_events = [e.to_json() for e in store.gpu_events(job_id=job["id"], limit=GPU_EVENTS_SHOWN)]
    return out


#: How many of a job's latest GPU events ``job why`` shows.
GPU_EVENTS_SHOWN = 20


def frame_reasons(store: Any, frames: list[dict[str, Any]], *, now: float | None = None) -> list[dict[str, Any]]:
    """Fill ``pending_reason`` of WAITING and DEPEND frames (``frame list``; in place,
    returned): their layer's reason — what its DEPEND frames wait on for DEPEND frames,
    why none is claimed for WAITING ones (or the retry back-off still running)."""
    when = store.clock() if now is None else now
    farm: Farm | None = None
    by_job: dict[int, dict[str, LayerExplanation]] = {}
    paused: dict[int, bool] = {}
    for f in frames:
        if f["state"] not in (m.WAITING, m.DEPEND):
            f.setdefault("pending_reason", None)
            continue
        if f["job_id"] not in by_job:
            job = store.get_job(f["job_id"])
            farm = farm or Farm.read(store, when)
            unproven = identity.job_proof_problem(job, store.receipt_dir)
            by_job[f["job_id"]] = {
                x.name: x for x in explain_loaded(store, job, farm, hosts_lines=False, unproven=unproven).layers
            }
            paused[f["job_id"]] = bool(job["paused"])
        if paused[f["job_id"]]:
            f["pending_reason"] = "job is paused (`cuectl job resume`)"
            continue
        layer = by_job[f["job_id"]].get(f["layer"])
        reason = None
        if layer is not None:
            reason = layer.depend_reason if f["state"] == m.DEPEND else layer.waiting_reason
        oom = f.get("gpu_oom_bytes") or 0
        if f["state"] == m.WAITING and oom and layer is not None and _oom_text(oom) not in (reason or ""):
            reason = _oom_text(oom) + (f"; {reason}" if reason else "")
        retry_at = _epoch(f.get("retry_at"), when)
        if f["state"] == m.WAITING and retry_at is not None and retry_at > when:
            reason = f"retry back-off until {f['retry_at']}" + (f"; {reason}" if reason else "")
        f["pending_reason"] = reason
    return frames
