"""``Worker``: one host's worker, and ``Worker.loop()``, one short iteration of it (finish
what ended, heartbeat, reap, claim what fits). The concerns behind it are collaborators of
their own: ``link`` (the store as the worker sees it: storeview.py), ``frames`` (the running
frames: running.py), ``sampling`` (sampling.py), ``dispatch`` (dispatch.py), ``proofs``
(proofs.py), ``inventory`` (inventory.py) and ``recovery`` (recovery.py)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence, cast

from cuectl.errors import StoreError, StoreGone
from cuectl.gpu.device import Device
from cuectl.run import launch
from cuectl.sched import model as m
from cuectl.sched.match import CpuPool, cpu_fits
from cuectl.sched.store import ClaimedFrame
from cuectl.units import format_bytes

from .dispatch import Dispatcher, cpu_need
from .gpuwatch import GpuWatch
from .health import Health
from .inventory import HostInventory
from .options import HealthReader, Inventory, Sampler, WorkerOptions
from .proofs import Proofs
from .recovery import Recovery, RunFiles
from .running import FrameTable, RunningFrame
from .sampling import Sampling
from .storeview import Pending, StoreView, WorkerStore

if TYPE_CHECKING:
    from cuectl.sched.store import Store


@dataclass
class LoopStats:
    claimed: int = 0
    finished: int = 0
    reaped: int = 0
    # (claim, how it ended, the state the store gave it — None while the report waits)
    ended: list[tuple[ClaimedFrame, "launch.ExitInfo", str | None]] = field(default_factory=list)


@dataclass
class Worker:
    store: WorkerStore
    opts: WorkerOptions
    devices: Sequence[Device]
    sampler: Sampler | None = None
    # Reads each device's health (run/worker/health.py); None: the backend cannot tell.
    health_reader: HealthReader | None = None
    # Finds the GPUs again (``--rediscover-interval``, SIGHUP); None: the inventory is fixed.
    rediscover: Callable[[], Inventory] | None = None
    # Devices found before that the last discovery did not find: uuid -> what `host show`
    # says (uuid, model, index, since, reason). They get no new frames; a frame already
    # running on one is left to finish or fail on its own.
    unavailable: dict[str, dict[str, Any]] = field(default_factory=dict)
    draining: bool = False
    claimed_total: int = 0
    stats: LoopStats = field(default_factory=LoopStats)
    # Told about store trouble the loop rides out (busy, unreachable): the CLI prints it.
    warn: Callable[[str], None] | None = None
    # Told about lifecycle events (draining, orphans recovered, store back): the CLI prints them.
    say: Callable[[str], None] | None = None
    drain_started: float | None = None  # monotonic time of the first stop signal
    # Monotonic start of the loop iteration under way, None between them (ExitWatch).
    busy_since: float | None = None
    # Waiting layers this host can never run because they ask for more cores or memory
    # than it has: `--until-idle` says so and exits 1 rather than 0.
    too_big: dict[int, str] = field(default_factory=dict)
    next_heartbeat: float = 0.0
    next_reap: float = 0.0
    _next_heartbeat_file: float = 0.0
    _deliverer: Any = None  # run/notify.py Deliverer, made on first use

    def __post_init__(self) -> None:
        self.link = StoreView(self)
        self.frames = FrameTable(self)
        self.sampling = Sampling(self)
        self.gpuwatch = GpuWatch(self)
        self.dispatch = Dispatcher(self)
        self.proofs = Proofs(self.store, lambda: self.opts, self.tell_warn)
        self.inventory = HostInventory(self)
        self.recovery = Recovery(self)
        self.health = Health(self)  # sick devices out of service (docs/gpu-health.md)

    # -- what the collaborators share ------------------------------------------------------
    @property
    def running(self) -> dict[int, RunningFrame]:
        return self.frames.running

    @property
    def pending(self) -> list[Pending]:
        return self.link.pending

    @property
    def store_errors(self) -> int:
        return self.link.errors

    @property
    def unproven(self) -> dict[int, str]:
        return self.proofs.unproven

    @property
    def worker_id(self) -> str:
        return f"{self.opts.name}:{os.getpid()}"

    @property
    def runfiles(self) -> RunFiles:
        return self.frames.runfiles

    def tell_warn(self, message: str) -> None:
        if self.warn:
            self.warn(message)

    def tell_say(self, message: str) -> None:
        if self.say:
            self.say(message)

    def vendors(self) -> set[str]:
        return {d.vendor for d in self.devices}

    def reached_max(self) -> bool:
        return self.opts.max_frames is not None and self.claimed_total >= self.opts.max_frames

    def crash_point(self, name: str) -> None:
        if self.opts.crash_at == name:
            os._exit(99)  # chaos tests: die exactly here, like a SIGKILL would

    # -- start-up --------------------------------------------------------------------------
    def prepare(self) -> None:
        """Become this host name's one worker (recovery.py: the state directory's lock)."""
        self.recovery.prepare()

    def recover(self, now: float) -> list[int]:
        """Deal with frames a previous worker of this host left RUNNING (recovery.py)."""
        return self.recovery.recover(now)

    def register(self, now: float) -> None:
        self.inventory.register(now)

    def sign_off(self) -> None:
        self.inventory.sign_off()

    def release_runfiles(self, *, delete_blank: bool = True) -> None:
        self.frames.release_runfiles(delete_blank=delete_blank)

    def ask_rediscover(self) -> None:
        """SIGHUP: find the GPUs again at the next iteration (safe in a signal handler)."""
        self.inventory.rediscover_asked = True

    def refresh_inventory(self, now: float) -> None:
        self.inventory.refresh(now)

    def host_locked(self) -> bool:
        """Is this host locked (``cuectl host lock``)? A locked host claims nothing."""
        entry = self.store.host_inventories().get(self.opts.name)
        return bool(entry and entry[1])

    def write_heartbeat_file(self, *, force: bool = False) -> None:
        """For ``cuectl worker --probe`` (liveness and readiness probes): at most once a
        second, the wall-clock time of this iteration and of the last store call that got
        through. A loop that stops (hung, SIGSTOPped, dead) stops refreshing it."""
        path = self.opts.heartbeat_file
        wall = time.time()
        if path is None or (wall < self._next_heartbeat_file and not force):
            return
        self._next_heartbeat_file = wall + 1.0
        write_heartbeat(path, name=self.opts.name, store_ok_at=self.link.ok_at)

    # -- one iteration ---------------------------------------------------------------------
    def loop(self, now: float | None = None) -> LoopStats:
        """One iteration: refresh the heartbeat file (and the inventory when due), report
        ended frames, heartbeat, reap, claim. Never blocks long."""
        self.stats = LoopStats()
        link = self.link
        # The store's clock (the database server's on PostgreSQL): leases and heartbeats are
        # measured on it, and every deadline of this loop with them.
        now = self.store.clock() if now is None else now
        self.write_heartbeat_file()
        if self.inventory.due(now):
            self.refresh_inventory(now)
        for p in link.pending:
            p.ended = None  # (last iteration's stats are gone)
        self.frames.collect_finished()
        if self.sampling.due(now):
            self.sampling.sample(now)  # (no store write while the store is down: live_paused)
        if link.waiting():
            # The store failed and its back-off is not over: no store call this iteration.
            # Frames that end meanwhile keep their results in `pending`.
            return self.stats
        if now >= self.next_heartbeat:
            self._heartbeat(now)
        try:
            if link.pending and link.down:
                # The store answers again: the results that waited go first, before a reap
                # could requeue their frames (their leases ran out while it was down).
                link.flush()
            if self.inventory.register_due:
                self.register(now)
            if now >= self.next_reap:
                self.next_reap = now + max(0.5, self.opts.lease_timeout_s / 2)
                self.stats.reaped = len(self.store.reap(now=now))
                self.store.sweep_depends(now=now)  # what a user's transaction could not release
            if not self.draining and not self.reached_max():
                self.dispatch.claim_all(now)
                link.ok_at = time.time()
                if self.dispatch.news():
                    self.publish(now)  # what readers cannot check changed: publish it now
            link.flush()  # the reports no claim took along
            self._deliver_notifications(now)
            link.answered()
        except StoreGone:
            raise  # nothing more can be recorded: the supervisor stops the worker
        except StoreError as exc:
            self.dispatch.nothing_fits = False
            link.failed(exc)
        return self.stats

    def store_waiting(self) -> bool:
        """Is the store down and its back-off not over (no store call now)?"""
        return self.link.waiting()

    def wake_in(self, now: float) -> float:
        """How long the supervisor may sleep before an iteration is due anyway (``--poll``,
        the heartbeat, the store's back-off, a sample), at ``now`` on the store's clock."""
        timeout = self.opts.poll_s
        due = self.next_heartbeat - now
        if self.link.retry_at is not None:  # the store is down: no heartbeat before its back-off ends
            due = max(due, self.link.retry_at - time.monotonic())
        timeout = max(0.0, min(timeout, due))
        if self.running:
            timeout = min(timeout, max(0.0, min(rf.next_sample for rf in self.running.values()) - now))
        if self.devices and self.sampler is not None:  # every device is sampled each interval
            timeout = min(timeout, max(0.0, self.sampling.next_device_sample - now))
        return timeout

    # -- notifications (run/notify.py) -----------------------------------------------------
    def _deliver_notifications(self, now: float) -> None:
        """Record deliveries that ended; every few seconds (at once when a frame ended here
        this iteration: it may have finished its job) claim and start due ones. Not while
        draining. Deliveries run in the background: this never blocks."""
        if self._deliverer is None:
            from cuectl.run.notify import Deliverer

            self._deliverer = Deliverer(
                cast("Store", self.store),
                deliverer_id=self.worker_id,
                run_as_submitter=self.opts.run_as_submitter,
                warn=self.warn,
                on_claimed=lambda: self.crash_point("notify_claimed"),
            )
        if self.stats.finished and self._may_have_notified():  # after this iteration's `now`
            self._deliverer.step(self.store.clock(), claim=not self.draining, force=True)
        else:
            self._deliverer.step(now, claim=not self.draining)

    def _may_have_notified(self) -> bool:
        """Could the frames that ended this iteration have queued a notification — a frame
        that died, a job that ended? Not if each succeeded (or waits for a retry) and this
        worker still runs another frame of its job, which is then not over: no store read for
        it (one a frame on a busy worker; the regular claim every few seconds still runs)."""
        running_jobs = {rf.claim.job_id for rf in self.running.values()}
        return any(
            state not in (m.SUCCEEDED, m.WAITING) or claim.job_id not in running_jobs
            for claim, _info, state in self.stats.ended
        )

    def _delivering(self) -> bool:
        return bool(self._deliverer is not None and self._deliverer.inflight)

    # -- heartbeats and what they publish ---------------------------------------------------
    def _live_doc(self) -> dict[str, Any] | None:
        """What the heartbeat stores as the host's live values: every device's latest sample
        (sampling.py), the dispatch state, and the devices that are unavailable now (while
        there are any, and once after)."""
        doc = self.sampling.live_entries()
        doc.update(self.health.live_doc())
        state = self.dispatch.state
        if state is not None:
            doc["dispatch"] = state.to_json()
        return self.inventory.unavailable_doc(doc)

    def _heartbeat(self, now: float) -> None:
        self.next_heartbeat = now + max(0.2, self.opts.lease_timeout_s / 4)
        pending = self.link.pending
        ids = list(self.running) + [p.frame_id for p in pending]
        attempts = {fid: rf.claim.attempt for fid, rf in self.running.items()}
        attempts.update({p.frame_id: p.attempt for p in pending})
        live = self._live_doc()
        try:
            actions = self.store.heartbeat(
                self.opts.name, ids, now=now, lease_s=self.opts.lease_timeout_s, live=live, attempts=attempts
            )
        except StoreError:
            self.link.live_paused = True
            return  # try again next time; frames keep running
        self.link.live_paused = False
        self._published(live)
        for frame_id, action in actions.items():
            rf = self.running.get(frame_id)
            if rf is None or action is None or rf.user_action or rf.lost:
                continue
            if action == "lost":
                rf.lost = True
                rf.proc.kill(grace=self.opts.kill_grace_s, reason="frame reassigned by the store")
            else:
                rf.user_action = action
                rf.proc.kill(grace=self.opts.kill_grace_s, reason=f"user asked to {action}")

    def publish(self, now: float) -> None:
        """Store the live doc now, between heartbeats: the host row alone (the frames'
        leases keep the heartbeat's pace), so publishing each sampling tick or a dispatch
        change costs one row."""
        live = self._live_doc()
        try:
            self.store.heartbeat(self.opts.name, [], now=now, lease_s=self.opts.lease_timeout_s, live=live)
        except StoreError:
            self.link.live_paused = True  # the next heartbeat tries again
            return
        self._published(live)

    def _published(self, live: dict[str, Any] | None) -> None:
        self.link.ok_at = time.time()
        self.sampling.tick_published_at = self.sampling.tick_at
        self.inventory.unavailable_sent = bool(live and live.get("unavailable"))

    # -- stopping --------------------------------------------------------------------------
    def stranded(self) -> bool:
        """Draining, with frames running or results unrecorded, while the store has been
        down for a whole lease since the stop signal (or since it went down, if later): by
        then the store counts those frames lost anyway, and waiting longer for it would
        keep a stopping worker up for as long as the outage lasts."""
        link = self.link
        if not self.draining or link.down_mono is None or not (self.running or link.pending):
            return False
        since = max(self.drain_started or 0.0, link.down_mono)
        return time.monotonic() - since >= self.opts.lease_timeout_s

    def stop_without_store(self) -> None:
        """Give up on a store that stayed down while draining (``stranded``): stop the
        frames still running, and raise one error naming what could not be recorded. The
        next worker of this host requeues those frames at start (``recover``: RUNNING here,
        claimed by a worker that is gone), or any worker once their lease expires."""
        link = self.link
        stopped = self.frames.stop_all("worker stopping: store unavailable", requeue=False)
        unrecorded = sorted({p.frame_id for p in link.pending})
        link.pending.clear()
        lost = []
        if unrecorded:
            lost.append(f"result(s) of frame(s) {', '.join(map(str, unrecorded))} not recorded")
        if stopped:
            lost.append(f"running frame(s) {', '.join(map(str, stopped))} stopped")
        down = time.monotonic() - (link.down_mono or time.monotonic())
        raise StoreError(
            f"stopping with the store unavailable for {down:.0f} s ({link.error}): "
            f"{' and '.join(lost) or 'nothing lost'}; the next worker of host {self.opts.name} "
            "requeues them when it starts (any worker once their lease expires)"
        )

    def drain(self, why: str = "asked to stop") -> None:
        """First SIGTERM/SIGINT: claim nothing more; running frames finish. While the store
        is down, for one lease at most (``stranded``)."""
        if not self.draining:
            pending = self.link.pending
            waits = f"; {len(pending)} result(s) wait for the store" if pending else ""
            if self.link.down_mono is not None:
                waits += (
                    f"; the store is unavailable: if it does not answer within {self.opts.lease_timeout_s:g} s, "
                    "running frames are stopped and the worker exits"
                )
            self.tell_say(
                f"draining ({why}): claiming no more frames; {len(self.running)} running frame(s) "
                f"finish first{waits} (signal again to stop them now)"
            )
            self.drain_started = time.monotonic()
        self.draining = True

    def abort(self) -> None:
        """Second signal: kill running frames and give them back to the queue."""
        pending = self.link.pending
        if self.running or pending:
            unrecorded = (
                (
                    f"; {len(pending)} result(s) the store has not recorded are left to the next "
                    "worker's recovery (requeued)"
                )
                if pending
                else ""
            )
            self.tell_say(f"stopping: killing {len(self.running)} running frame(s) and requeueing them{unrecorded}")
        self.frames.stop_all("worker stopping", requeue=True)

    def is_idle(self) -> bool:
        """``--until-idle``: nothing running here, nothing waiting that this host could
        ever run, and nothing running anywhere that could release more work. Waiting layers
        that ask for more cores or memory than this host has are noted in ``too_big``."""
        if self.running or self.link.pending or self._delivering():
            return False
        if not self.dispatch.nothing_fits and not self.draining and not self.reached_max():
            return False
        if self.draining or self.reached_max():
            return True
        self.too_big = {}
        opts = self.opts
        for layer in self.dispatch.runnable(all_sizes=True):  # (too big ones too: they are reported)
            if not self.proofs.accepts(layer):
                continue
            if self.dispatch.could_ever_run(layer):
                return False
            if layer.gpus <= 0 and not opts.gpu_only:
                why = cpu_fits(layer.cores, layer.memory_bytes, CpuPool(opts.cores, opts.memory_bytes))
                if why is not None:
                    self.too_big[layer.layer_id] = (
                        f"job {layer.job_id} ({layer.job}) layer {layer.layer} needs "
                        f"{cpu_need(layer)}; this host has {opts.cores:g} "
                        f"cores and {format_bytes(opts.memory_bytes)}"
                    )
        return self.store.running_count() == 0

    def done(self) -> bool:
        if self.draining or self.reached_max():
            return not self.running and not self.link.pending and not self._delivering()
        return False


def write_heartbeat(path: Path, *, name: str, store_ok_at: float | None) -> None:
    """Replace the heartbeat file atomically (a probe never reads half of it). Best effort:
    a full disk must not stop the loop; the probe then sees the file go stale."""
    doc = {"name": name, "pid": os.getpid(), "at": time.time(), "store_ok_at": store_ok_at}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
