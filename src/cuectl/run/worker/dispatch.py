"""Dispatch decisions: which runnable layers this host takes and how many of their frames —
static fit (remembered per layer), CPU room, free devices (this worker's frames, anyone's
lease, queued `cuectl run --wait` callers, NIMBY), the reservation the first multi-GPU layer
that does not fit yet holds and the backfill around it — and the state of all that which
the heartbeat publishes for pending reasons and `cuectl job why` (docs/scheduling.md).
Decisions are frozen values (``Reservation``, ``DeviceState``, ``DispatchState``, ``Look``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from cuectl.gpu.device import Device
from cuectl.run.devicefilter import foreign_use
from cuectl.run.lease import DeviceLock, held_uuids, queued_reservations, try_lock_all
from cuectl.run.lease.locks import lock_path, read_record
from cuectl.sched.match import CpuPool, GpuRequest, cpu_fits, device_fits_statically, select_devices
from cuectl.sched.store import HostShape, RunnableLayer
from cuectl.sched.store.lifecycle import bigger_devices
from cuectl.units import format_bytes

from . import shares

if TYPE_CHECKING:
    from cuectl.run.worker.core import Worker

#: Runnable layers read per page; a dispatch pass reads on until it has seen them all.
RUNNABLE_PAGE = 500

#: CPU frames of one layer claimed in one store transaction at most (as many as fit the
#: free cores; a pass claims on until none fit).
CLAIM_BATCH = 8


@dataclass(frozen=True)
class Reservation:
    """The free devices the first GPU layer that could run here but does not fit yet holds
    until enough are free for its next frame (lower layers backfill onto the others)."""

    layer_id: int
    since: float
    job_id: int
    job: str
    layer: str
    priority: int
    needs: str  # ``4 × NVIDIA 'A100'``
    free: int
    uuids: tuple[str, ...]
    until: float

    def to_json(self) -> dict[str, Any]:
        return {
            "layer_id": self.layer_id,
            "since": self.since,
            "job_id": self.job_id,
            "job": self.job,
            "layer": self.layer,
            "priority": self.priority,
            "needs": self.needs,
            "free": self.free,
            "uuids": list(self.uuids),
            "until": self.until,
        }


@dataclass(frozen=True)
class Look:
    """The devices as a pass saw them: live values, those nothing new may start on, and
    those another program uses (NIMBY: uuid -> why)."""

    devices: tuple[Device, ...] = ()
    busy: frozenset[str] = frozenset()
    foreign: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DeviceState:
    state: str  # free, frame, nimby, lease, reserved
    holder: str | None
    frame_id: int | None  # readers drop a holder whose frame is no longer RUNNING
    memory_free_bytes: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "holder": self.holder,
            "frame_id": self.frame_id,
            "memory_free_bytes": self.memory_free_bytes,
        }


@dataclass(frozen=True)
class DispatchState:
    """What this host's dispatch looked like at the last pass (the heartbeat publishes it)."""

    at: float
    accepting: bool
    schedule: Mapping[str, Any] | None
    allowed_users: tuple[str, ...]
    gpu_only: bool
    run_as_submitter: bool  # a root worker runs only jobs proven their user's
    cores: float
    cores_free: float
    memory_bytes: int
    memory_free_bytes: int
    devices: Mapping[str, DeviceState]
    reservation: Reservation | None

    def news_key(self) -> tuple[Any, ...]:
        """What readers cannot check against the store: leases and other programs' use."""
        return tuple(
            sorted((u, x.state, str(x.holder)) for u, x in self.devices.items() if x.state in ("lease", "nimby"))
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "accepting": self.accepting,
            "schedule": dict(self.schedule) if self.schedule is not None else None,
            "allowed_users": list(self.allowed_users),
            "gpu_only": self.gpu_only,
            "run_as_submitter": self.run_as_submitter,
            "cores": self.cores,
            "cores_free": self.cores_free,
            "memory_bytes": self.memory_bytes,
            "memory_free_bytes": self.memory_free_bytes,
            "devices": {u: s.to_json() for u, s in self.devices.items()},
            "reservation": self.reservation.to_json() if self.reservation else None,
        }


@dataclass
class Dispatcher:
    worker: "Worker"
    nothing_fits: bool = False  # the last pass ended with nothing more to claim (``Worker.is_idle``)
    # Whether each layer could ever run on this host (layer requests never change; cleared
    # when the inventory does), the reservation held for the first GPU layer that does not
    # fit yet, and layers whose reservation ran out (layer id -> until when).
    static_fit: dict[int, bool] = field(default_factory=dict)
    reservation: Reservation | None = None
    said_reservation: int | None = None  # the layer the last reservation line was about
    reserve_cooldown: dict[int, float] = field(default_factory=dict)
    next_device_view: float = 0.0  # when an idle pass next samples the devices for the live doc
    last_look: Look = field(default_factory=Look)  # the last pass that sampled the devices
    state: DispatchState | None = None
    # What readers cannot check against the store in the state last published (``news``);
    # None: no dispatch state published yet.
    sent: tuple[Any, ...] | None = None

    def inventory_changed(self) -> None:
        self.static_fit.clear()

    def free_cpu(self) -> CpuPool:
        w = self.worker
        running = w.running.values()
        used_cores = sum(r.claim.cores for r in running if r.claim.gpus == 0)
        used_mem = sum(r.claim.memory_bytes for r in running if r.claim.gpus == 0)
        return CpuPool(cores=w.opts.cores - used_cores, memory_bytes=w.opts.memory_bytes - used_mem)

    def claim_all(self, now: float) -> None:
        """One dispatch pass: walk the runnable layers once, in dispatch order (however many
        this host cannot run sort first), and claim from each as much as fits. The first GPU
        layer that could run here but does not fit yet holds the free devices it could use
        (a reservation): lower layers may only backfill onto other devices."""
        w = self.worker
        self.nothing_fits = False
        devices_now: list[Device] | None = None
        busy: set[str] = set()
        foreign: dict[str, str] = {}
        reserved: set[str] = set()
        reserving: Reservation | None = None
        closed = self.closed_reason(now)
        if closed is None:
            for layer in self.runnable():
                if w.reached_max():
                    break
                if not w.proofs.accepts(layer) or not self.could_ever_run(layer):
                    continue
                if layer.gpus <= 0:
                    while not w.reached_max() and not w.opts.gpu_only and (room := self.cpu_room(layer)):
                        if not self.claim(layer, [], now, count=room):
                            break
                    continue
                if devices_now is None:
                    devices_now = w.sampling.live_devices(now)
                # Frames that ran out of GPU memory and asked for bigger devices get only those.
                offered = bigger_devices(devices_now, layer.gpu_oom_bytes)
                if layer.gpu_share_bytes:  # part of one device by memory budget (shares.py)
                    shares.claim_shares(self, layer, offered, reserved, now)
                    continue
                while not w.reached_max():
                    busy, foreign = self.busy(devices_now)
                    result = select_devices(GpuRequest.from_record(layer), offered, busy=busy | reserved)
                    if not result.devices:
                        # Only a multi-GPU frame can starve: a 1-GPU frame comes first in the
                        # next pass and takes the first device it can use that frees up.
                        if reserving is None and result.could_ever_fit and layer.gpus > 1:
                            reserving = self.reserve(layer, offered, busy, now)
                            if reserving is not None:
                                reserved |= set(reserving.uuids)
                        break
                    if not self.claim_gpu(layer, result.devices, now):
                        break
        if reserving is None:
            if self.reservation is not None:
                w.next_heartbeat = min(w.next_heartbeat, now)  # and as it ends
            self.reservation = None
        if devices_now is None and w.devices and now >= self.next_device_view:
            # No GPU layer looked at the devices this pass: look anyway, at the heartbeat's
            # pace, so what the host publishes (NIMBY, leases) stays true while idle.
            devices_now = w.sampling.live_devices(now)
            busy, foreign = self.busy(devices_now)
        if devices_now is not None:
            self.next_device_view = now + max(1.0, w.opts.lease_timeout_s / 4)
        self.say_reservation(reserving)
        self.nothing_fits = True
        self.publish_state(now, devices_now, busy, foreign, reserving, closed)

    def say_reservation(self, reserving: Reservation | None) -> None:
        """One line when this host starts holding GPUs for a frame, and when it stops."""
        now_id = reserving.layer_id if reserving else None
        if now_id == self.said_reservation:
            return
        w = self.worker
        if reserving is not None:
            w.tell_say(
                f"reserving GPUs for job {reserving.job_id} ({reserving.job}) layer {reserving.layer}: "
                f"needs {reserving.needs}, {reserving.free} free now; no lower-priority frame starts on "
                "them meanwhile"
            )
        elif self.said_reservation is not None:
            w.tell_say(
                "reservation released"
                + (" (its time ran out: backfilling)" if self.said_reservation in self.reserve_cooldown else "")
            )
        self.said_reservation = now_id

    def runnable(self, *, all_sizes: bool = False) -> Iterator[RunnableLayer]:
        """Every runnable layer in dispatch order, a page at a time (read lazily: a pass that
        fills this host early reads no further), less those too big for this host by size
        alone unless ``all_sizes`` (the store leaves them out)."""
        after = None
        shape = None if all_sizes else self.shape()
        store = self.worker.store
        while True:
            page = store.runnable_layers(limit=RUNNABLE_PAGE, after=after, host=shape)
            yield from page
            if len(page) < RUNNABLE_PAGE:
                return
            after = page[-1].order_key

    def shape(self) -> HostShape:
        """This host by size, for the store to leave out layers it could never run."""
        w = self.worker
        memory = [d.memory_total_bytes for d in w.devices if d.memory_total_bytes is not None]
        unknown = any(d.memory_total_bytes is None for d in w.devices)
        return HostShape(
            gpus=len(w.devices),
            gpu_memory_max_bytes=(1 << 62) if unknown else max(memory, default=0),
            cores=w.opts.cores,
            memory_bytes=w.opts.memory_bytes,
            gpu_only=w.opts.gpu_only,
        )

    def could_ever_run(self, layer: RunnableLayer) -> bool:
        """Could this host ever run the layer (GPU model, count and memory; cores and host
        memory; --gpu-only)? Remembered per layer: a layer's request never changes."""
        fit = self.static_fit.get(layer.layer_id)
        if fit is None:
            w = self.worker
            if layer.gpu_share_bytes:
                fit = shares.could_fit(layer, w.devices)
            elif layer.gpus > 0:
                fit = select_devices(GpuRequest.from_record(layer), w.devices).could_ever_fit
            else:
                fit = (
                    not w.opts.gpu_only
                    and cpu_fits(layer.cores, layer.memory_bytes, CpuPool(w.opts.cores, w.opts.memory_bytes)) is None
                )
            if len(self.static_fit) > 100_000:
                self.static_fit.clear()
            self.static_fit[layer.layer_id] = fit
        return fit

    def busy(self, devices: Sequence[Device], *, for_share: bool = False) -> tuple[set[str], dict[str, str]]:
        """Devices nothing new may start on now: this worker's frames, anyone's lease, what
        queued `cuectl run --wait` callers are about to take, and (NIMBY) devices another
        program uses; the last with why. ``for_share``: for a share of a device
        (``gpu_share``), which shares do not keep out (their ledger says if it fits)."""
        w = self.worker
        opts = w.opts
        mine = {u for r in w.running.values() if not (for_share and r.claim.gpu_share_bytes) for u in r.claim.gpu_uuids}
        leased = mine | held_uuids(opts.lock_dir, devices, shares=not for_share)
        # Devices that `cuectl run --wait` / lease(wait=True) callers queued for are left
        # to them: they asked first, and a busy farm would otherwise starve them.
        busy = leased | queued_reservations(opts.lock_dir, devices) | w.health.out_of_service()
        foreign: dict[str, str] = {}
        if opts.nimby_memory_bytes is not None or opts.nimby_util_pct is not None:
            foreign = foreign_use(
                devices, leased, max_memory_bytes=opts.nimby_memory_bytes, max_util_pct=opts.nimby_util_pct
            )
            # Which processes, as the last sample of every device saw them (gpuwatch.py).
            foreign = {u: why + w.gpuwatch.foreign_detail(u) for u, why in foreign.items()}
        return busy | set(foreign), foreign

    def reserve(
        self, layer: RunnableLayer, devices: Sequence[Device], busy: set[str], now: float
    ) -> Reservation | None:
        """Hold the free devices ``layer`` could use until enough are free for its next frame
        (None: it may not reserve: reservations off, its time ran out, or a cap holds it back
        anyway). Bounded by ``reservation_timeout_s``, after which it backfills as long."""
        w = self.worker
        timeout = w.opts.reservation_timeout_s
        if timeout <= 0 or self.reserve_cooldown.get(layer.layer_id, 0.0) > now:
            return None
        held = self.reservation
        since = held.since if held is not None and held.layer_id == layer.layer_id else None
        if since is None:
            if w.store.cap_reached(layer.layer_id):
                return None  # a limit or quota stops it whatever is free: holding devices helps nobody
            since = now
            # Pending reasons name a reservation from the heartbeat: publish it as it
            # starts (as inventory changes are), not up to a quarter lease later.
            w.next_heartbeat = min(w.next_heartbeat, now)
        if now - since > timeout:
            self.reserve_cooldown[layer.layer_id] = now + timeout
            return None
        request = GpuRequest.from_record(layer)
        parents = {d.mig_parent_uuid for d in devices if d.mig_parent_uuid}  # a card split into MIG is not leasable
        usable = [d for d in devices if d.uuid not in parents and device_fits_statically(request, d) is None]
        free = tuple(d.uuid for d in usable if d.uuid not in busy)
        self.reservation = Reservation(
            layer_id=layer.layer_id,
            since=since,
            job_id=layer.job_id,
            job=layer.job,
            layer=layer.layer,
            priority=layer.priority,
            needs=_describe_need(request),
            free=len(free),
            uuids=free,
            until=since + timeout,
        )
        return self.reservation

    def claim_gpu(self, layer: RunnableLayer, devices: Sequence[Device], now: float) -> bool:
        w = self.worker
        locks = try_lock_all(w.opts.lock_dir, list(devices), holder=f"{w.opts.name} claiming")
        if locks is None:  # someone (e.g. `cuectl run`) took one between the probe and now
            return False
        w.crash_point("after_lock")
        try:
            return self.claim(layer, locks, now, devices=devices)
        finally:
            if not any(r.locks is locks for r in w.running.values()):
                for lock in locks:
                    lock.release()

    def closed_reason(self, now: float) -> str | None:
        """Why this worker takes no new frame now: outside its ``--available`` schedule."""
        schedule = self.worker.opts.schedule
        if schedule is None:
            return None
        from datetime import datetime

        return schedule.closed_reason(datetime.now())

    def publish_state(
        self,
        now: float,
        devices: Sequence[Device] | None,
        busy: set[str],
        foreign: Mapping[str, str],
        reservation: Reservation | None,
        closed: str | None,
    ) -> None:
        """What the heartbeat publishes of this pass (docs/scheduling.md): enough for
        pending reasons and `cuectl job why` to name the cause of a wait."""
        w = self.worker
        opts = w.opts
        free_cpu = self.free_cpu()
        schedule = None
        if opts.schedule is not None:
            schedule = {"text": opts.schedule.describe(), "open": closed is None, "reason": closed}
        frames = {u: r.claim for r in w.running.values() for u in r.claim.gpu_uuids}
        held = set(reservation.uuids) if reservation else set()
        states: dict[str, DeviceState] = {}
        if devices is None:  # not looked at this pass: the last look stands (see claim_all)
            look = self.last_look
        else:  # what others hold (our own frames are told from `running` whenever published)
            look = self.last_look = Look(tuple(devices), frozenset(busy - set(frames)), foreign)
        for d in look.devices:
            state, holder, frame_id = "free", None, None
            if d.uuid in frames:
                claim = frames[d.uuid]
                state, holder = "frame", f"frame {claim.frame_id} (job {claim.job})"
                frame_id = claim.frame_id
            elif d.uuid in look.foreign:
                state, holder = "nimby", look.foreign[d.uuid]
            elif d.uuid in look.busy:
                state, holder = "lease", _lease_holder(opts.lock_dir, d.uuid)
            elif d.uuid in held:
                state = "reserved"
            states[d.uuid] = DeviceState(state, holder, frame_id, d.memory_free_bytes)
        self.state = DispatchState(
            at=now,
            accepting=closed is None and not w.draining,
            schedule=schedule,
            allowed_users=tuple(opts.allowed_users),
            gpu_only=opts.gpu_only,
            run_as_submitter=opts.run_as_submitter,
            cores=opts.cores,
            cores_free=free_cpu.cores,
            memory_bytes=opts.memory_bytes,
            memory_free_bytes=free_cpu.memory_bytes,
            devices=states,
            reservation=reservation,
        )

    def news(self) -> bool:
        """Is this the first dispatch state, or did the pass change what a reader cannot
        check against the store (a lease, another program on a device)? Then the heartbeat
        publishes it now, not up to a quarter lease later: a pending reason must not name a
        `cuectl run` that has ended. Frames starting and ending are no news: readers check
        those holders against the store's RUNNING frames."""
        if self.state is None:
            return False
        key = self.state.news_key()
        if key == self.sent:
            return False
        self.sent = key
        return True

    def cpu_room(self, layer: RunnableLayer) -> int:
        """How many frames of this CPU layer fit the free CPU pool now (at most
        CLAIM_BATCH, and what ``--max-frames`` leaves)."""
        w = self.worker
        free = self.free_cpu()
        limit = CLAIM_BATCH
        if w.opts.max_frames is not None:
            limit = min(limit, w.opts.max_frames - w.claimed_total)
        room = 0
        while room < limit and cpu_fits(layer.cores, layer.memory_bytes, free) is None:
            free = CpuPool(cores=free.cores - layer.cores, memory_bytes=free.memory_bytes - max(0, layer.memory_bytes))
            room += 1
        return room

    def claim(
        self, layer: RunnableLayer, locks: list[DeviceLock], now: float, devices: Sequence[Device] = (), count: int = 1
    ) -> bool:
        """Claim a frame of ``layer`` on ``devices`` holding ``locks`` — or, for a CPU layer,
        up to ``count`` frames — and launch it; whether all were claimed."""
        w = self.worker
        opts, store, link = w.opts, w.store, w.link
        uuids = [d.uuid for d in devices]
        if link.pending or count > 1:
            # The frames that ended go with these claims: one transaction (one commit on
            # SQLite) for the slots' old frames and their new ones. If it fails they stay pending.
            reports = list(link.pending)
            states, claims = store.complete_and_claim_many(
                [(p.frame_id, p.attempt, p.result) for p in reports],
                layer.layer_id,
                count,
                reported_at=store.clock(),
                host=opts.name,
                worker=w.worker_id,
                gpu_uuids=uuids,
                now=now,
                lease_s=opts.lease_timeout_s,
                log_dir=opts.log_dir,
            )
            del link.pending[: len(reports)]
            for p, state in zip(reports, states):
                link.reported(p.ended, state)
        else:
            claim = store.claim_frame(
                layer.layer_id,
                host=opts.name,
                worker=w.worker_id,
                gpu_uuids=uuids,
                now=now,
                lease_s=opts.lease_timeout_s,
                log_dir=opts.log_dir,
            )
            claims = [claim] if claim is not None else []
        for claim in claims:
            w.crash_point("after_claim")
            w.claimed_total += 1
            w.stats.claimed += 1
            w.frames.start(claim, locks, tuple(devices), now)
        return len(claims) == count


def _describe_need(request: GpuRequest) -> str:
    """``4 × NVIDIA 'A100'`` — what a reservation waits for, short."""
    parts = [f"{request.gpus} \u00d7 {request.gpu_vendor or 'GPU'}"]
    if request.gpu_models:
        parts.append(" or ".join(repr(name) for name in request.gpu_models))
    if request.gpu_memory_min_bytes:
        parts.append(f">= {format_bytes(request.gpu_memory_min_bytes)}")
    return " ".join(parts)


def cpu_need(layer: RunnableLayer) -> str:
    text = f"{layer.cores:g} cores"
    return text + (f" and {format_bytes(layer.memory_bytes)}" if layer.memory_bytes else "")


def _lease_holder(lock_dir: Path, uuid: str) -> str | None:
    """Who holds a device's lease, from its lock record: ``cuectl run pid 4242 (ada)``."""
    record = read_record(lock_path(lock_dir, uuid))
    if not record:
        return "a lease (holder unknown)"
    what = record.get("label") or record.get("holder") or record.get("kind") or "lease"
    who = f" ({record['user']})" if record.get("user") else ""
    return f"{what} pid {record.get('pid')}{who}"
