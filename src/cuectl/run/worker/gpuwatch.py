"""What runs on this host's GPUs, and whose it is (docs/gpu-health.md).

At each sample of every device the backend lists every process on each device (NVML's
running-process lists, nvidia-smi's compute apps, the fake backend's ``processes``). Each is
mapped to its owner: a frame of this worker (its process group and descendants, escaped
ones included: ``FrameProcess.pids``), an ad-hoc lease (``cuectl run``, ``cuectl.lease()``:
the lease holder's pid and its descendants, from the device's lock record), or nobody
(foreign). From that map:

- **escape**: a frame's process on a device the frame does not hold: an event on the
  attempt, a warning at the end of its log, and under ``gpu_escape: kill`` the frame is
  stopped (failure ``gpu-escape``);
- **foreign**: another program's memory on a device a frame or lease holds: an event (the
  NIMBY rule keeps new frames off such devices, dispatch.py);
- **idle**: a frame whose every device stays under ``gpu_idle_util`` % for
  ``gpu_idle_limit_s``: an event, a warning, the job's ``gpu_idle`` notification, and under
  ``gpu_idle_action: kill`` the frame is stopped (failure ``gpu-idle``); the device-seconds
  held idle go to the attempt (``gpu_idle_seconds``, ``cuectl admin report``).

Each event is recorded once (per attempt, device and pid) and sent to the store in one call
per sample; the map itself is published with the host's devices for ``cuectl top`` and the
web monitor. Nothing here costs a process-table pass unless a device shows a process no
frame of this worker is known to own.
"""

from __future__ import annotations

import os
import pwd
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Sequence

from cuectl.errors import StoreError
from cuectl.gpu.device import Device, DeviceSample
from cuectl.run import failure as failures
from cuectl.run import launch
from cuectl.run.lease import held_uuids
from cuectl.run.lease.locks import lock_path, read_record
from cuectl.run.lease.shares import share_infos
from cuectl.sched.store import GpuEvent
from cuectl.units import format_bytes, format_duration

from .running import RunningFrame

if TYPE_CHECKING:
    from cuectl.run.worker.core import Worker

#: Events kept for the store while it is away; older ones are dropped (a flood of foreign
#: processes must not grow the worker without bound).
MAX_UNSENT = 1000
#: How many ancestors are walked to find a process's lease holder.
MAX_ANCESTRY = 64
#: Samples between two passes over /proc for the same processes no frame owns.
RECHECK_EVERY = 6
# Owners of a process on a device.
FRAME, LEASE, FOREIGN = "frame", "lease", "foreign"


class OwnedProcess(NamedTuple):
    """One process on one device and whose it is (a tuple: a sample of 8 busy devices makes
    hundreds of these each interval)."""

    pid: int
    user: str | None
    memory_bytes: int | None
    utilization_pct: float | None
    owner: str  # FRAME, LEASE or FOREIGN
    frame_id: int | None = None
    holder: str | None = None  # "frame 12 (job shot)", "cuectl run pid 4242 (ada)"

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "user": self.user,
            "memory_bytes": self.memory_bytes,
            "utilization_pct": self.utilization_pct,
            "owner": self.owner,
            "frame_id": self.frame_id,
            "holder": self.holder,
        }


@dataclass(frozen=True)
class Lease:
    """A device lease not of this worker's frames, from its lock record."""

    pid: int
    label: str


@dataclass
class GpuWatch:
    worker: "Worker"
    # uuid -> the processes on it at the last sample of every device, with their owners.
    processes: dict[str, tuple[OwnedProcess, ...]] = field(default_factory=dict)
    unsent: list[GpuEvent] = field(default_factory=list)
    # Events already told (per attempt, device and pid; foreign ones per device and pid while
    # they stay): each is recorded once.
    told: set[tuple[Any, ...]] = field(default_factory=set)
    users: dict[int, str | None] = field(default_factory=dict)  # uid -> name, looked up once
    # pid -> who runs it, for the pids of the last sample: a process is looked up once, not
    # at every sample (a stat of /proc/<pid> each was most of the map's cost).
    pid_users: dict[int, str | None] = field(default_factory=dict)
    # The pids no frame was known to own at the last pass over /proc, and what they were
    # found to be then (pid -> lease, or None: foreign): while a sample shows the same ones
    # (another program that stays, a lease that goes on), that answer stands, and the pass
    # is made again only every RECHECK_EVERY samples.
    strangers: frozenset[int] = frozenset()
    stranger_leases: dict[int, Lease | None] = field(default_factory=dict)
    since_pass: int = 0
    lease_uuids: dict[int, set[str]] = field(default_factory=dict)  # lease holder pid -> its devices
    # Ad-hoc leases held idle: holder pid -> (since when, told already) (``idle_leases``).
    lease_idle: dict[int, tuple[float, bool]] = field(default_factory=dict)

    # -- the map --------------------------------------------------------------------------------
    def observe(self, samples: Mapping[str, DeviceSample], now: float) -> None:
        """One sample of every device (with every process): map the processes to owners,
        record what is wrong, apply the policies, send the events."""
        w = self.worker
        frames = [rf for rf in w.running.values() if not rf.lost]
        owner_of: dict[int, RunningFrame] = {pid: rf for rf in frames for pid in rf.seen_pids}
        on_devices = {p.pid for s in samples.values() for p in s.processes}
        leases: dict[int, Lease] = {}
        table: dict[int, tuple[int, int, bool]] | None = None
        unknown = frozenset(on_devices - set(owner_of))
        self.since_pass += 1
        if unknown and (unknown != self.strangers or self.since_pass >= RECHECK_EVERY):
            # Someone else's process, or a frame's not seen yet (a CPU frame is not sampled
            # on its own): one pass over the machine's processes settles whose.
            table = launch.process_table()
            for rf in frames:
                if not rf.proc.finished:
                    for pid in rf.proc.pids(table):
                        owner_of.setdefault(pid, rf)
                        rf.seen_pids.add(pid)  # known from now on, without a pass
            leases = self.leases()
            self.strangers = frozenset(unknown - set(owner_of))
            self.stranger_leases = {pid: _lease_of(pid, leases, table) for pid in self.strangers}
            self.since_pass = 0
        elif unknown:  # the same strangers as at the last pass: the same answer
            leases = {lease.pid: lease for lease in self.stranger_leases.values() if lease is not None}
        by_uuid = {d.uuid: d for d in w.devices}
        known, self.pid_users = self.pid_users, {}
        labels = {rf.claim.frame_id: f"frame {rf.claim.frame_id} (job {rf.claim.job})" for rf in frames}
        mapped: dict[str, tuple[OwnedProcess, ...]] = {}
        for uuid, sample in samples.items():
            mapped[uuid] = tuple(self.owned(p, owner_of, leases, table, known, labels) for p in sample.processes)
        self.processes = mapped
        holders = {u: rf for rf in frames for u in rf.claim.gpu_uuids}
        for uuid, procs in mapped.items():
            device = by_uuid.get(uuid)
            for proc in procs:
                if proc.owner == FRAME and proc.frame_id is not None:
                    owner = w.running.get(proc.frame_id)
                    if owner is not None and not _holds(owner, uuid, by_uuid):
                        self.escape(owner, device, uuid, proc, now)
                elif proc.owner == FOREIGN and (proc.memory_bytes or 0) > 0:
                    held_by = holders.get(uuid)
                    if held_by is not None or any(uuid in self.lease_devices(lease) for lease in leases.values()):
                        self.foreign(held_by, device, uuid, proc, now)
        for rf in frames:
            self.idle(rf, samples, now)
        if w.opts.gpu_idle_limit_s is not None:
            self.idle_leases(samples, leases if table is not None else self.leases(), now)
        self.flush()

    def owned(
        self,
        proc: Any,
        owner_of: Mapping[int, RunningFrame],
        leases: Mapping[int, Lease],
        table: Mapping[int, tuple[int, int, bool]] | None,
        known: Mapping[int, str | None],
        labels: Mapping[int, str],
    ) -> OwnedProcess:
        pid = proc.pid
        user = known[pid] if pid in known else self.user_of(pid)
        self.pid_users[pid] = user
        memory, util = proc.memory_used_bytes, proc.utilization_pct
        rf = owner_of.get(pid)
        if rf is not None:
            frame_id = rf.claim.frame_id
            return OwnedProcess(pid, user, memory, util, FRAME, frame_id, labels.get(frame_id))
        lease = self.stranger_leases.get(pid) if table is None else _lease_of(pid, leases, table)
        if lease is not None:
            return OwnedProcess(pid, user, memory, util, LEASE, None, lease.label)
        return OwnedProcess(pid, user, memory, util, FOREIGN)

    def leases(self) -> dict[int, Lease]:
        """Holder pid -> lease, for the devices leased now by anyone but this worker's frames."""
        w = self.worker
        mine = {u for rf in w.running.values() for u in rf.claim.gpu_uuids}
        out: dict[int, Lease] = {}
        self.lease_uuids = {}
        for uuid in held_uuids(w.opts.lock_dir, w.devices) - mine:
            record = read_record(lock_path(w.opts.lock_dir, uuid)) or {}
            pid = record.get("pid")
            # A lock record is written by whoever holds the lock: the pid counts only if that
            # process really has the device's lock file open (a record naming someone
            # else's process must not make it a lease, nor get it signalled).
            if type(pid) is not int or pid <= 0 or not _has_open(pid, lock_path(w.opts.lock_dir, uuid)):
                continue
            what = record.get("label") or record.get("holder") or record.get("kind") or "lease"
            who = f" ({record['user']})" if isinstance(record.get("user"), str) else ""
            out[pid] = Lease(pid, f"{what} pid {pid}{who}")
            self.lease_uuids.setdefault(pid, set()).add(uuid)
        # Shares of a device (gpu_share) keep their holders in the device's ledger.
        for info, _budget in share_infos(w.opts.lock_dir, w.devices):
            # (a frame's own share: its processes are the frame's first)
            if info.pid is None or info.pid <= 0 or not _has_open(info.pid, lock_path(w.opts.lock_dir, info.uuid)):
                continue
            who = f" ({info.user})" if info.user else ""
            out.setdefault(
                info.pid, Lease(info.pid, f"{info.label or info.holder or 'share'} pid {info.pid}{who}, a share")
            )
            self.lease_uuids.setdefault(info.pid, set()).add(info.uuid)
        return out

    def lease_devices(self, lease: Lease) -> set[str]:
        return self.lease_uuids.get(lease.pid, set())

    def user_of(self, pid: int) -> str | None:
        """Who runs ``pid`` (None: gone, or in another PID namespace)."""
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            return None
        if uid not in self.users:
            if len(self.users) > 4096:
                self.users.clear()
            try:
                self.users[uid] = pwd.getpwuid(uid).pw_name
            except KeyError:
                self.users[uid] = str(uid)
        return self.users[uid]

    # -- what is wrong ------------------------------------------------------------------------
    def escape(self, rf: RunningFrame, device: Device | None, uuid: str, proc: OwnedProcess, now: float) -> None:
        claim = rf.claim
        key = ("escape", claim.frame_id, claim.attempt, uuid, proc.pid)
        if key in self.told:
            return
        self.told.add(key)
        where = _device_name(device, uuid)
        memory = f", {format_bytes(proc.memory_bytes)}" if proc.memory_bytes else ""
        detail = f"pid {proc.pid} on {where}, which frame {claim.frame_id} was not given{memory}"
        self.add(_process_event("escape", now, device, uuid, proc, detail, rf))
        rf.proc.add_footer_note(f"GPU escape: {detail}")
        policy = claim.gpu_escape or self.worker.opts.gpu_escape
        if policy == "kill":
            self.worker.frames.stop(rf, failures.Failure("gpu-escape", f"GPU escape: {detail}", False))
        else:
            self.worker.tell_warn(f"frame {claim.frame_id} (job {claim.job}): GPU escape: {detail}")

    def foreign(
        self, rf: RunningFrame | None, device: Device | None, uuid: str, proc: OwnedProcess, now: float
    ) -> None:
        holder = rf.claim.frame_id if rf is not None else None
        key = ("foreign", uuid, proc.pid, holder)
        if key in self.told:
            return
        self.told.add(key)
        who = f" ({proc.user})" if proc.user else ""
        held = f"frame {rf.claim.frame_id}" if rf is not None else "a lease"
        detail = (
            f"pid {proc.pid}{who} holds {format_bytes(proc.memory_bytes or 0)} on {_device_name(device, uuid)}, "
            f"which {held} holds: not run by cuectl"
        )
        self.add(_process_event("foreign", now, device, uuid, proc, detail, rf))

    def idle(self, rf: RunningFrame, samples: Mapping[str, DeviceSample], now: float) -> None:
        """Track how long every device of ``rf`` has been under its idle threshold."""
        claim = rf.claim
        w = self.worker
        limit = claim.gpu_idle_limit_s if claim.gpu_idle_limit_s is not None else w.opts.gpu_idle_limit_s
        if limit is None or not claim.gpu_uuids or rf.proc.finished:
            return
        threshold = claim.gpu_idle_util if claim.gpu_idle_util is not None else w.opts.gpu_idle_util
        watch = rf.watch
        if not _all_idle(samples, claim.gpu_uuids, threshold):
            # In use (or unknown: MIG instances report none): the stretch ends; what it
            # held idle past the limit was counted as it went.
            watch.pop("idle_since", None)
            watch.pop("idle_told", None)
            return
        since = watch.setdefault("idle_since", min(now, max(rf.usage.started_at, now - w.opts.sample_interval_s)))
        if now - since < limit:
            return
        counted_to = max(watch.get("idle_counted_to", since), since)
        watch["idle_seconds"] = watch.get("idle_seconds", 0.0) + (now - counted_to) * len(claim.gpu_uuids)
        watch["idle_counted_to"] = now
        if watch.get("idle_told"):
            return
        watch["idle_told"] = True
        devices = ", ".join(_device_name(_device(w.devices, u), u) for u in claim.gpu_uuids)
        detail = f"every device ({devices}) under {threshold:g} % for {format_duration(now - since)} (limit {format_duration(limit)})"
        self.add(
            GpuEvent(
                kind="idle",
                at=now,
                device_uuid=claim.gpu_uuids[0],
                device_index=_index(w.devices, claim.gpu_uuids[0]),
                detail=detail,
                frame_id=claim.frame_id,
                attempt=claim.attempt,
            )
        )
        rf.proc.add_footer_note(f"GPU idle: {detail}")
        action = claim.gpu_idle_action or w.opts.gpu_idle_action
        if action == "kill":
            w.frames.stop(rf, failures.Failure("gpu-idle", f"GPU idle: {detail}", False))
        else:
            w.tell_warn(f"frame {claim.frame_id} (job {claim.job}): GPU idle: {detail}")
        # The store tells the job's owner with the event (its notifications' ``gpu_idle``).

    def idle_leases(self, samples: Mapping[str, DeviceSample], leases: Mapping[int, Lease], now: float) -> None:
        """The farm's idle rule (``cuectl worker --gpu-idle-limit``) for ad-hoc leases of
        this host's devices (`cuectl run`, `cuectl.lease()`), which carry no rule of their
        own: an ``idle`` event (no frame) when every device a holder leases stays under the
        threshold for the limit, and under ``--gpu-idle-action kill`` a SIGTERM to the
        holder, as `cuectl run` forwards to its command (when this worker may signal it:
        root, or the same user)."""
        w = self.worker
        limit, threshold = w.opts.gpu_idle_limit_s, w.opts.gpu_idle_util
        assert limit is not None
        seen: dict[int, tuple[float, bool]] = {}
        for pid, lease in leases.items():
            uuids = sorted(self.lease_devices(lease))
            if not _all_idle(samples, uuids, threshold):
                continue  # in use, or unknown: not idle
            since, told = self.lease_idle.get(pid, (now, False))
            seen[pid] = (since, told)
            if told or now - since < limit:
                continue
            devices = ", ".join(_device_name(_device(w.devices, u), u) for u in uuids)
            detail = (
                f"{lease.label} held {devices} under {threshold:g} % for {format_duration(now - since)} "
                f"(limit {format_duration(limit)})"
            )
            if w.opts.gpu_idle_action == "kill":
                try:
                    os.kill(pid, signal.SIGTERM)
                    detail += ": stopped (SIGTERM)"
                except OSError as exc:
                    detail += f": could not be stopped ({exc.strerror or exc})"
            self.add(
                GpuEvent(
                    kind="idle",
                    at=now,
                    device_uuid=uuids[0],
                    device_index=_index(w.devices, uuids[0]),
                    pid=pid,
                    detail=detail,
                )
            )
            w.tell_warn(f"GPU idle: {detail}")
            seen[pid] = (since, True)
        self.lease_idle = seen

    @staticmethod
    def idle_seconds(rf: RunningFrame) -> float | None:
        """The device-seconds ``rf`` held idle past its limit (None: no idle rule applied)."""
        value = rf.watch.get("idle_seconds")
        return round(float(value), 3) if value is not None else None

    def held_idle(self) -> set[str]:
        """The devices held idle now by a frame of this worker (past its limit)."""
        return {u for rf in self.worker.running.values() if rf.watch.get("idle_told") for u in rf.claim.gpu_uuids}

    # -- sending --------------------------------------------------------------------------------
    def add(self, event: GpuEvent) -> None:
        self.unsent.append(event)
        if len(self.unsent) > MAX_UNSENT:
            del self.unsent[: len(self.unsent) - MAX_UNSENT]

    def flush(self) -> None:
        """Send the events not recorded yet (best effort: kept for the next sample while the
        store is away)."""
        if not self.unsent or self.worker.link.live_paused:
            return
        try:
            self.worker.store.record_gpu_events(self.worker.opts.name, list(self.unsent))
        except StoreError:
            return
        self.unsent.clear()

    def forget(self, frame_id: int) -> None:
        """A frame ended: drop what was told about it (the set stays small)."""
        self.told = {
            k
            for k in self.told
            if not (k[0] == "escape" and k[1] == frame_id) and not (k[0] == "foreign" and k[3] == frame_id)
        }

    def foreign_detail(self, uuid: str, most: int = 3) -> str:
        """The processes not run by cuectl on ``uuid`` at the last sample, for a NIMBY reason:
        ``; pid 777 (bob) 3.0 GiB, pid 778 (bob) 1.0 GiB`` (the biggest first; empty: none seen)."""
        procs = sorted(
            (p for p in self.processes.get(uuid, ()) if p.owner == FOREIGN),
            key=lambda p: -(p.memory_bytes or 0),
        )
        if not procs:
            return ""
        shown = [
            f"pid {p.pid}"
            + (f" ({p.user})" if p.user else "")
            + (f" {format_bytes(p.memory_bytes)}" if p.memory_bytes else "")
            for p in procs[:most]
        ]
        more = f" and {len(procs) - most} more" if len(procs) > most else ""
        return "; " + ", ".join(shown) + more

    def process_entries(self, uuid: str) -> list[dict[str, Any]]:
        """The device's processes as the live doc publishes them (``cuectl top``, the web)."""
        return [p.to_json() for p in self.processes.get(uuid, ())]


def farm_policy(*, escape: str, idle_limit: str | None, idle_action: str, idle_util: float) -> dict[str, Any]:
    """The worker's ``--gpu-escape``/``--gpu-idle-*`` flags as ``WorkerOptions`` fields,
    checked as the layer keys are (InvalidInput naming the flag)."""
    from cuectl.errors import InvalidInput
    from cuectl.sched.checks import timeout_field
    from cuectl.sched.model import GPU_POLICY_ACTIONS

    out: dict[str, Any] = {}
    for flag, field_name, value in (
        ("--gpu-escape", "gpu_escape", escape),
        ("--gpu-idle-action", "gpu_idle_action", idle_action),
    ):
        text = value.strip().lower()
        if text not in GPU_POLICY_ACTIONS:
            raise InvalidInput(f"{flag}: {value!r} is not one of {', '.join(GPU_POLICY_ACTIONS)}")
        out[field_name] = text
    if not 0 <= idle_util <= 100:
        raise InvalidInput("--gpu-idle-util: expected a percentage from 0 to 100")
    out["gpu_idle_util"] = float(idle_util)
    out["gpu_idle_limit_s"] = timeout_field(idle_limit, "--gpu-idle-limit") if idle_limit is not None else None
    return out


def _all_idle(samples: Mapping[str, DeviceSample], uuids: Sequence[str], threshold: float) -> bool:
    """Is every one of ``uuids`` sampled under ``threshold`` % now? A device not sampled, or
    whose utilisation is unknown (a MIG instance), is not idle; neither is an empty set."""
    utils = [samples[u].utilization_pct if u in samples else None for u in uuids]
    return bool(utils) and all(u is not None and u < threshold for u in utils)


def _process_event(
    kind: str, at: float, device: Device | None, uuid: str, proc: OwnedProcess, detail: str, rf: RunningFrame | None
) -> GpuEvent:
    """A GPU event about one process on one device, on ``rf``'s attempt (None: no frame's)."""
    return GpuEvent(
        kind=kind,
        at=at,
        device_uuid=uuid,
        device_index=device.index if device else None,
        pid=proc.pid,
        memory_bytes=proc.memory_bytes,
        detail=detail,
        frame_id=rf.claim.frame_id if rf is not None else None,
        attempt=rf.claim.attempt if rf is not None else None,
    )


def _holds(rf: RunningFrame, uuid: str, by_uuid: Mapping[str, Device]) -> bool:
    """Does the frame hold ``uuid``: itself, or (MIG) the card of an instance it holds, or an
    instance of a card it holds?"""
    held = rf.claim.gpu_uuids
    if uuid in held:
        return True
    device = by_uuid.get(uuid)
    if device is not None and device.mig_parent_uuid in held:
        return True
    return any(by_uuid[h].mig_parent_uuid == uuid for h in held if h in by_uuid)


def _has_open(pid: int, path: Path) -> bool:
    """Does process ``pid`` have ``path`` open (one of its descriptors)? False when that
    cannot be read (gone, or another user's process for a worker that is not root)."""
    fd_dir = f"/proc/{pid}/fd"
    target = os.fspath(path)
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return False
    for name in names:
        try:
            if os.readlink(f"{fd_dir}/{name}") == target:
                return True
        except OSError:
            continue
    return False


def _lease_of(pid: int, leases: Mapping[int, Lease], table: Mapping[int, tuple[int, int, bool]] | None) -> Lease | None:
    """The lease whose holder is ``pid`` or one of its ancestors."""
    if not leases:
        return None
    seen = 0
    while pid > 1 and seen < MAX_ANCESTRY:
        if pid in leases:
            return leases[pid]
        if table is None or pid not in table:
            return None
        pid = table[pid][0]
        seen += 1
    return None


def _device(devices: Sequence[Device], uuid: str) -> Device | None:
    return next((d for d in devices if d.uuid == uuid), None)


def _index(devices: Sequence[Device], uuid: str) -> int | None:
    device = _device(devices, uuid)
    return device.index if device else None


def _device_name(device: Device | None, uuid: str) -> str:
    return f"GPU {device.index} ({uuid})" if device is not None else uuid
