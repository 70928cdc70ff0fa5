"""Sick GPUs out of service (docs/gpu-health.md, "Sick GPUs out of service").

At each sampling tick the worker reads every device's health from its backend
(``Backend.health``: gone, Xid events, uncorrectable ECC errors, pending page retirement or
row remapping) and takes a sick device out of service on this host — never the whole host:

- ``lost`` (the backend says the device is gone) and ``drained`` (a critical Xid, one of
  ``WorkerOptions.gpu_xid_drain``; a condition that lasts until a reset) are written to the
  store's ``device_states`` with the reason (``Xid 79: GPU has fallen off the bus``) and
  recorded as GPU events (``xid``, ``lost``, ``ecc``, ``drained``, ``suspect``);
- no new frame starts on it (``out_of_service``: ``Dispatcher.busy``) and no lease takes it
  (run/lease reads the store's states); the frame running on it is stopped and ends
  ``device-failed``, which the store does not count against its retries: it waits again at
  once and runs on a healthy device;
- a device drained automatically comes back only by ``cuectl gpu undrain``: Xid 79 and
  uncorrectable ECC errors need a reset of the GPU, which the worker cannot see happen, and
  a device that fails and comes back by itself would take frame after frame down with it.
  After an undrain, conditions that were there already (a pending remap the admin accepted)
  drain it again only if they change.

Drains by hand (``gpu drain``) are Slurm's: no new work, the running frame finishes.

The suspect rule (``--gpu-suspect-jobs K``, default 3, 0 off): a device is drained with
``suspect: K jobs failed here and succeeded elsewhere`` when attempts of K different jobs
failed on it (exit status or signal) within a day, and each of those jobs has an attempt
that succeeded on another device. Only attempts since the device's last undrain count.

The store may be down: decisions are kept here and written when it answers; the devices stay
out of service meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from cuectl.errors import InvalidInput, StoreError
from cuectl.gpu.device import Device, DeviceHealth, xid_text
from cuectl.run import failure as failures
from cuectl.sched.store import DeviceState, GpuEvent

if TYPE_CHECKING:
    from cuectl.run.worker.core import Worker

#: How far back the suspect rule looks. Each tick reads only the failures since the last
#: one (an index range on attempts.ended_at), and asks about other devices' successes only
#: for a device with K failed jobs.
SUSPECT_WINDOW_S = 24 * 3600.0


def xid_codes(values: Sequence[str], flag: str) -> frozenset[int]:
    """``--gpu-xid-drain 13,31 --gpu-xid-drain 43`` -> {13, 31, 43}; anything else is
    ``InvalidInput``."""
    codes = set()
    for value in values:
        for part in str(value).split(","):
            text = part.strip()
            if not text.isdigit() or not 0 < int(text) < 1 << 16:
                raise InvalidInput(f"{flag}: {text!r} is not an Xid code (a number such as 79)")
            codes.add(int(text))
    return frozenset(codes)


@dataclass
class Decision:
    """A device this worker took out of service, and why."""

    state: str  # drained | lost
    reason: str
    at: float
    stored: bool = False


@dataclass
class Health:
    worker: "Worker"
    # This host's device states as the store last gave them (uuid -> state).
    states: dict[str, DeviceState] = field(default_factory=dict)
    # What this worker decided (uuid -> decision), until an undrain in the store ends it.
    sick: dict[str, Decision] = field(default_factory=dict)
    # Conditions that last until a reset, as they were when the device was last undrained
    # (or first read with an ``ok`` row): they do not drain it again unless they change.
    accepted: dict[str, tuple[str, ...]] = field(default_factory=dict)
    problems: dict[str, tuple[str, ...]] = field(default_factory=dict)  # the latest reading's
    events: list[GpuEvent] = field(default_factory=list)  # not recorded yet (store down)
    # The suspect rule: uuid -> job id -> when its attempt failed there; read from the store
    # after ``evidence_until`` (the newest failure read so far).
    evidence: dict[str, dict[int, float]] = field(default_factory=dict)
    evidence_until: float | None = None
    states_read: bool = False
    user: str | None = None
    # What the lock directory says is out of service (run/lease/outofservice.py), as last
    # written; None: not written yet (the first tick clears what an earlier worker left).
    published: dict[str, str] | None = None

    # -- what the rest of the worker asks --------------------------------------------------
    def out_of_service(self) -> set[str]:
        """Devices nothing new may start on: drained or lost, in the store or by this worker."""
        return {u for u, s in self.states.items() if not s.in_service} | set(self.sick)

    def live_doc(self) -> dict[str, Any]:
        """What the heartbeat adds to the host's live doc: the user this worker runs as (the
        host's owner, who may drain its devices by hand on a SQLite store)."""
        if self.user is None:
            try:
                self.user = self.worker.store.actor().name
            except StoreError:
                return {}
        return {"worker_user": self.user}

    # -- each sampling tick ----------------------------------------------------------------
    def check(self, now: float) -> None:
        """Read every device's health, take sick ones out of service, stop the frames on
        them, and bring the store up to date (when it answers)."""
        w = self.worker
        readings: dict[str, DeviceHealth] = {}
        reader = getattr(w, "health_reader", None)
        if reader is not None and w.devices:
            try:
                readings = reader([d.uuid for d in w.devices])
            except Exception:  # a flaky backend must not stop the worker: no signal this time
                readings = {}
        for d in w.devices:
            h = readings.get(d.uuid)
            if h is not None and h.known:
                self._judge(d, h, now)
        if not w.link.waiting():
            self._sync(now)
        self._stop_frames()
        self._publish()

    def _judge(self, d: Device, h: DeviceHealth, now: float) -> None:
        opts = self.worker.opts
        for code in h.xids:
            self._event("xid", d, now, xid_text(code))
        self.problems[d.uuid] = h.problems
        if d.uuid in self.sick and self.sick[d.uuid].state == "lost":
            return
        if h.lost:
            self._event("lost", d, now, h.lost)
            self._take_out(d, "lost", h.lost, now)
            return
        critical = [x for x in h.xids if x in opts.gpu_xid_drain]
        if critical:
            self._take_out(d, "drained", xid_text(critical[0]), now)
            return
        new = [p for p in h.problems if p not in self.accepted.get(d.uuid, ())]
        if new and d.uuid not in self.sick:
            self._event("ecc", d, now, new[0])
            self._take_out(d, "drained", new[0], now)

    def _take_out(self, d: Device, state: str, reason: str, now: float) -> None:
        old = self.sick.get(d.uuid)
        if old is not None and old.state == state:
            return  # drained already: its first reason stands
        self.sick[d.uuid] = Decision(state, reason, now)
        self._event("drained", d, now, f"{state}: {reason}")
        self.worker.tell_warn(
            f"GPU {d.index} {d.uuid} ({d.model}) {'is lost' if state == 'lost' else 'drained'}: {reason}; "
            "no new frames go to it until `cuectl gpu undrain`"
        )

    def _event(self, kind: str, d: Device, now: float, detail: str) -> None:
        self.events.append(GpuEvent(kind=kind, at=now, device_uuid=d.uuid, device_index=d.index, detail=detail))

    def _stop_frames(self) -> None:
        """Stop the frames on devices this worker found sick: they end ``device-failed``."""
        w = self.worker
        if not self.sick:
            return
        index = {d.uuid: d.index for d in w.devices}
        for rf in list(w.running.values()):
            for u in rf.claim.gpu_uuids:
                decision = self.sick.get(u)
                if decision is not None:
                    where = f"GPU {index[u]} ({u})" if u in index else u
                    w.frames.stop(
                        rf, failures.Failure("device-failed", f"device failed: {decision.reason} on {where}", False)
                    )
                    break

    def _publish(self) -> None:
        """Tell leases (``cuectl run``, ``cuectl.lease()``) which devices are out of service:
        a file per device beside the locks (run/lease/outofservice.py)."""
        from cuectl.run.lease import outofservice

        w = self.worker
        out = {u: s.reason or s.state for u, s in self.states.items() if not s.in_service}
        out.update({u: d.reason for u, d in self.sick.items()})
        mine = {d.uuid for d in w.devices}
        out = {u: why for u, why in out.items() if u in mine}
        if out == self.published:
            return
        owned = mine | set(self.published or {})
        if outofservice.publish(w.opts.lock_dir, owned, out):
            self.published = out

    # -- the store -------------------------------------------------------------------------
    def _sync(self, now: float) -> None:
        """Write what was decided and seen, then read this host's states (a drain or undrain
        by hand; an undrain ends this worker's own drain). Best effort: what fails is tried
        again at the next tick."""
        w = self.worker
        try:
            self._write(now)
            states = {s.uuid: s for s in w.store.device_states(w.opts.name)}
        except StoreError:
            return
        for u, decision in list(self.sick.items()):
            s = states.get(u)
            if decision.stored and (s is None or (s.in_service and (s.since or 0.0) >= decision.at)):
                # Undrained since: back in service. What lasts until a reset is accepted as
                # it is now; evidence before the undrain no longer counts.
                del self.sick[u]
                self.accepted[u] = self.problems.get(u, ())
                self.evidence.pop(u, None)
        if not self.states_read:
            # First read: an ``ok`` row is an admin's undrain; accept what lasts as it is.
            for u, s in states.items():
                if s.in_service and u not in self.sick:
                    self.accepted.setdefault(u, self.problems.get(u, ()))
            self.states_read = True
        self.states = states
        try:
            self._suspects(now)
            self._write(now)
        except StoreError:
            return

    def _write(self, now: float) -> None:
        w = self.worker
        host = w.opts.name
        for u, decision in self.sick.items():
            if not decision.stored:
                w.store.set_device_state(host, u, decision.state, decision.reason, now=now)
                decision.stored = True
        if self.events:
            w.store.record_gpu_events(host, self.events)
            self.events = []

    def _suspects(self, now: float) -> None:
        w = self.worker
        k = w.opts.gpu_suspect_jobs
        if k <= 0 or not w.devices:
            return
        host = w.opts.name
        since = max(self.evidence_until or 0.0, now - SUSPECT_WINDOW_S)
        for job_id, uuids, ended in w.store.failed_attempts(host, since):
            for u in uuids:
                self.evidence.setdefault(u, {})[job_id] = ended
            self.evidence_until = max(self.evidence_until or 0.0, ended)
        out = self.out_of_service()
        for d in w.devices:
            jobs = self.evidence.get(d.uuid, {})
            undrained = self.states.get(d.uuid)
            floor = max(now - SUSPECT_WINDOW_S, (undrained.since or 0.0) if undrained else 0.0)
            for job_id in [j for j, at in jobs.items() if at < floor]:
                del jobs[job_id]
            if d.uuid in out or len(jobs) < k:
                continue
            elsewhere = w.store.jobs_succeeded_elsewhere(sorted(jobs), host, d.uuid)
            if len(elsewhere) >= k:
                shown = ", ".join(map(str, sorted(elsewhere)[:10]))
                self._event("suspect", d, now, f"jobs {shown} failed here and succeeded elsewhere")
                why = f"suspect: {len(elsewhere)} jobs failed here and succeeded elsewhere"
                self._take_out(d, "drained", why, now)
