"""The worker: register the host, claim frames that fit, lease devices, launch, report.

``Worker.loop()`` does one iteration (finish what ended, heartbeat, reap, claim what
fits); ``supervise()`` is the tiny driver around it that sleeps, wakes on child exits and
signals, and decides when to stop. Keeping the iteration separate makes the worker easy to
test and to reason about: every step is a short, fenced store call.

Crash safety: a device is leased (a kernel lock, inherited by the frame process) before
its frame is claimed, so if the worker dies anywhere the device stays leased until the
frame's processes are gone. A restarted worker reads the run files it left in its state
directory, kills still-running orphans, and only then requeues their frames — a frame
never runs twice at once on its host. Other hosts requeue a silent worker's frames once
their lease expires (``reap``); the store's attempt fencing discards late reports.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import heapq
import json
import os
import select
import signal
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from cuectl import __version__, config
from cuectl.errors import Conflict, CuectlError, StoreError, StoreGone, StoreStalled
from cuectl.gpu.device import Device
from cuectl.run import failure as failures
from cuectl.run import launch, logs
from cuectl.run.devicefilter import foreign_use
from cuectl.run.hostschedule import Schedule
from cuectl.run.lease import (DeviceLock, held_uuids, isolation_env, isolation_key, queued_reservations,
                              try_lock_all, update_holder)
from cuectl.run.lease.locks import lock_path, pid_alive, read_record
from cuectl.run.usage import UsageTracker
from cuectl.sched import identity
from cuectl.sched import model as m
from cuectl.sched.match import CpuPool, GpuRequest, cpu_fits, device_fits_statically, select_devices, tags_fit
from cuectl.sched.store import ClaimedFrame, FrameResult, HostInfo, HostShape, LiveUsage, RunnableLayer, Store
from cuectl.units import format_bytes, iso


@dataclass(frozen=True)
class WorkerOptions:
    name: str
    lock_dir: Path
    state_dir: Path  # host-local: run files of this worker's frames
    log_dir: str
    cores: float
    memory_bytes: int
    poll_s: float = 1.0
    sample_interval_s: float = 10.0
    lease_timeout_s: float = 60.0
    gpu_only: bool = False
    tags: tuple[str, ...] = ()
    max_frames: int | None = None
    until_idle: bool = False
    kill_grace_s: float = 5.0
    crash_at: str | None = None  # test hook: os._exit at a named point (chaos tests)
    # Security (docs/security.md): run only these users' jobs (empty = anyone's), and run
    # each frame as its submitting user (a root worker does, as OpenCue's RQD).
    allowed_users: tuple[str, ...] = ()
    run_as_submitter: bool = False
    log_limit_bytes: int = launch.DEFAULT_LOG_LIMIT  # per attempt, unless the layer sets its own
    # Look for GPUs again this often (0: only on SIGHUP): MIG reconfigured, a GPU fell off the bus.
    rediscover_interval_s: float = 300.0
    # `cuectl worker --probe` reads this file (None: not written): the loop is alive, the store answers.
    heartbeat_file: Path | None = None
    # GPU-aware NIMBY: a device that a process not of cuectl's uses above either figure gets
    # no new frame until that use is gone (None: that check off).
    nimby_memory_bytes: int | None = None
    nimby_util_pct: float | None = None
    # When this worker takes new frames (``--available``; None: always).
    schedule: Schedule | None = None
    # How long the highest-priority GPU frame that does not fit yet may hold the free devices
    # it could use (a reservation) before backfill gets them again for as long (0: never reserve).
    reservation_timeout_s: float = 1800.0


#: ``sampler(uuids, pids)``: live values of those devices (``cuectl.gpu.Discovery.sample``).
Sampler = Callable[[Sequence[str], Sequence[int]], dict]


@dataclass(frozen=True)
class Inventory:
    """What one discovery found: the devices to lease and how to sample them, and what each
    backend had to say about devices it could not offer (backend name -> why), so that a
    device missing from the next inventory can be explained."""

    devices: tuple[Device, ...]
    sampler: Sampler | None = None
    problems: Mapping[str, str] = field(default_factory=dict)


@dataclass
class RunningFrame:
    claim: ClaimedFrame
    proc: launch.FrameProcess
    locks: list[DeviceLock]
    devices: tuple[Device, ...]
    usage: UsageTracker
    runfile: Path
    user_action: str | None = None
    lost: bool = False
    next_sample: float = 0.0
    # Every pid seen in the frame's tree: the final sample, taken after the frame exited,
    # still attributes per-process values reported for them (a backend lags a little).
    seen_pids: set[int] = field(default_factory=set)


@dataclass
class Pending:
    """A finished attempt whose report the store has not recorded yet: it goes with the
    iteration's next claim, else on its own at the iteration's end (``Worker.loop``), and
    waits for a later iteration while the store is busy or unreachable."""

    frame_id: int
    attempt: int
    result: FrameResult
    # Its place in this iteration's ``LoopStats.ended`` (whose state the report fills in);
    # None once the iteration that ended it is over.
    ended: int | None = None


@dataclass
class LoopStats:
    claimed: int = 0
    finished: int = 0
    reaped: int = 0
    # (claim, how it ended, the state the store gave it — None while the report waits)
    ended: list[tuple[ClaimedFrame, "launch.ExitInfo", str | None]] = field(default_factory=list)


@dataclass
class Worker:
    store: Store
    opts: WorkerOptions
    devices: Sequence[Device]
    sampler: Sampler | None = None
    # Finds the GPUs again (``--rediscover-interval``, SIGHUP); None: the inventory is fixed.
    rediscover: Callable[[], Inventory] | None = None
    # Devices found before that the last discovery did not find: uuid -> what `host show`
    # says (uuid, model, index, since, reason). They get no new frames; a frame already
    # running on one is left to finish or fail on its own.
    unavailable: dict[str, dict[str, Any]] = field(default_factory=dict)
    running: dict[int, RunningFrame] = field(default_factory=dict)
    pending: list[Pending] = field(default_factory=list)
    draining: bool = False
    claimed_total: int = 0
    stats: LoopStats = field(default_factory=LoopStats)
    _next_heartbeat: float = 0.0
    _next_reap: float = 0.0
    _nothing_fits: bool = False
    # Every local device's latest values and when they were read (uuid -> entry of the live
    # doc, ``sampled_at`` in epoch seconds until published), from whichever sample saw it
    # last: the interval's sample of all devices, a frame's own, a dispatch pass's.
    _device_values: dict[str, dict[str, Any]] = field(default_factory=dict)
    _next_device_sample: float = 0.0  # when the next sample of every device is due
    # When the latest sample of every device was taken, and the one whose values the store
    # has (a heartbeat or a publish between heartbeats sent it): see ``_sample``.
    _tick_at: float = 0.0
    _tick_published_at: float = 0.0
    # What readers cannot check against the store in the dispatch state last published (see
    # ``_dispatch_news``); None: no dispatch state published yet.
    _dispatch_sent: tuple[Any, ...] | None = None
    # The store failed the last call (live write, heartbeat, claim): no live-usage write, an
    # optional extra, until a call gets through.
    _live_paused: bool = False
    # Told about store trouble the loop rides out (busy, unreachable): the CLI prints it.
    warn: Callable[[str], None] | None = None
    # Told about lifecycle events (draining, orphans recovered, store back): the CLI prints them.
    say: Callable[[str], None] | None = None
    store_errors: int = 0
    _store_down_since: float | None = None  # wall clock of the first failed call of an outage
    _store_down_calls: int = 0
    # An outage (docs/reliability.md, "Disk full"): its start on the monotonic clock, when
    # the store may be called again (back-off, STORE_RETRY_FIRST_S doubling to
    # STORE_RETRY_MAX_S), its latest error, and the error last warned about (one line each).
    _store_down_mono: float | None = None
    _store_retry_at: float | None = None
    _store_error: str | None = None
    _store_warned: str | None = None
    drain_started: float | None = None  # monotonic time of the first stop signal
    # The state directory's worker lock (see ``prepare``): held for the worker's life.
    _state_lock_fd: int = -1
    # Jobs whose submitter this root worker could not prove: job id -> why (never run);
    # and the proofs it checked, keyed by everything they depend on (a row changed since
    # is checked afresh), so the dispatch path reads each receipt once, not per frame.
    unproven: dict[int, str] = field(default_factory=dict)
    _proven: set[tuple[Any, ...]] = field(default_factory=set)
    _next_rediscover: float | None = None
    _rediscover_asked: bool = False  # SIGHUP: look again at the next iteration
    _register_due: bool = False  # the inventory changed: the store's copy must follow
    _registered: bool = False  # this process registered its host (so it may sign it off)
    # Monotonic start of the loop iteration under way, None between them (ExitWatch).
    busy_since: float | None = None
    # The first heartbeat always sends the unavailable list (empty or not), so that what a
    # previous worker of this host reported is replaced; later ones only while it matters.
    _unavailable_sent: bool = True
    _store_ok_at: float | None = None  # wall clock of the last store call that got through
    _next_heartbeat_file: float = 0.0
    # Dispatch memory: whether each layer could ever run on this host (layer requests never
    # change; cleared when the inventory does), the reservation held for the first GPU layer
    # that does not fit yet, and layers whose reservation ran out (layer id -> until when).
    _static_fit: dict[int, bool] = field(default_factory=dict)
    _reservation: dict[str, Any] | None = None
    _said_reservation: int | None = None  # the layer the last reservation line was about
    _next_device_view: float = 0.0  # when an idle pass next samples the devices for the live doc
    # The devices as the last pass that sampled them saw them: (devices, busy, foreign use).
    _last_look: tuple[Sequence[Device], set[str], Mapping[str, str]] = ((), set(), {})
    _reserve_cooldown: dict[int, float] = field(default_factory=dict)
    # What this host's dispatch looked like at the last pass (the heartbeat publishes it for
    # pending reasons and `cuectl job why`).
    _dispatch: dict[str, Any] = field(default_factory=dict)
    # Waiting layers this host can never run because they ask for more cores or memory
    # than it has: `--until-idle` says so and exits 1 rather than 0.
    too_big: dict[int, str] = field(default_factory=dict)
    # The cgroup OOM-kill counter when each running frame started (kernel OOM evidence).
    _oom_counts: dict[int, int | None] = field(default_factory=dict)
    # This process's memory cgroup (failures.own_cgroup_dir), looked up once: reading and
    # parsing /proc/self/mountinfo for every frame was a quarter of the worker's CPU per
    # no-op frame. False: not looked up yet.
    _cgroup_dir: Path | None | bool = False
    # The environment frames start from (config.inherited_environ), copied once: decoding
    # os.environ for every frame cost ~0.8 ms of CPU.
    _base_env: dict[str, str] | None = None
    # The environment every frame of a layer shares on the same devices (launch.EnvTemplate),
    # keyed by everything it is made of (``_frame_env``).
    _env_templates: dict[tuple[Any, ...], launch.EnvTemplate] = field(default_factory=dict)
    _log_root_path: Path | None = None
    _oom_read: tuple[float, int | None] = (-1e18, None)  # (monotonic time, counter) of the last reading
    _deliverer: Any = None  # run/notify.py Deliverer, made on first use
    _runfiles: "RunFiles | None" = None
    # Accounts frames run as (RunAs.lookup), looked up again after RUN_AS_TTL_S: reading
    # /etc/passwd and /etc/group for every frame was ~5 % of a no-op frame's cost.
    _run_as: dict[str, tuple[float, launch.RunAs]] = field(default_factory=dict)
    # Jobs whose OpenCue log link (logs.rqlog_name) could not be made, already warned about:
    # one line per job, not one per frame.
    _rqlog_warned: set[int] = field(default_factory=set)

    # -- start-up ------------------------------------------------------------------------
    @property
    def worker_id(self) -> str:
        return f"{self.opts.name}:{os.getpid()}"

    @property
    def runfiles(self) -> "RunFiles":
        if self._runfiles is None:
            self._runfiles = RunFiles(self.opts.state_dir)
        return self._runfiles

    def release_runfiles(self, *, delete_blank: bool = True) -> None:
        """Close the run files' descriptors and, with ``delete_blank`` (stopping), delete the
        blank slots: a frame still running keeps its run file, for the next worker's
        recovery. Recovery, which has just deleted the files itself, only closes them."""
        if self._runfiles is None:
            return
        if delete_blank:
            self._runfiles.remove_free()
        self._runfiles.close()  # a later write opens its slot afresh

    def vendors(self) -> set[str]:
        return {d.vendor for d in self.devices}

    def register(self, now: float) -> None:
        self.store.register_host(HostInfo(
            name=self.opts.name, cores=self.opts.cores, memory_bytes=self.opts.memory_bytes,
            gpus=[d.to_json() for d in self.devices], tags=self.opts.tags, worker_pid=os.getpid(),
            version=__version__), now=now)
        self._register_due = False
        self._registered = True
        self._store_ok_at = time.time()

    def sign_off(self) -> None:
        """The worker is stopping: mark its host DOWN now, so that `host list` and pending
        reasons do not show a stopped worker as alive for HOST_DOWN_AFTER_S, and `host
        forget` need not wait. Best effort: a store that does not answer leaves the host to
        read DOWN after that silence, as a killed worker's does."""
        if not self._registered:
            return
        try:
            self.store.sign_off_host(self.opts.name, os.getpid(), now=self.store.clock())
        except StoreError:
            pass

    def write_heartbeat_file(self, *, force: bool = False) -> None:
        """For ``cuectl worker --probe`` (liveness and readiness probes): at most once a
        second, the wall-clock time of this iteration and of the last store call that got
        through. A loop that stops (hung, SIGSTOPped, dead) stops refreshing it."""
        path = self.opts.heartbeat_file
        wall = time.time()
        if path is None or (wall < self._next_heartbeat_file and not force):
            return
        self._next_heartbeat_file = wall + 1.0
        write_heartbeat(path, name=self.opts.name, store_ok_at=self._store_ok_at)

    def ask_rediscover(self) -> None:
        """SIGHUP: find the GPUs again at the next iteration (safe in a signal handler)."""
        self._rediscover_asked = True

    def prepare(self) -> None:
        """Become this host name's one worker: take the state directory's worker lock (or
        raise ``WorkerAlreadyRunning``) and, on Linux, become a child subreaper so that
        processes a frame leaves behind are re-parented to us and can be put down.
        Idempotent; ``recover`` calls it, the CLI calls it before registering the host."""
        if self._state_lock_fd < 0:
            self._state_lock_fd = hold_state_dir(self.opts.state_dir, self.opts.name)
            launch.become_subreaper(reap_zombies=True)

    def recover(self, now: float) -> list[int]:
        """Deal with frames a previous worker of this host left RUNNING.

        Only a worker that holds the state directory's lock recovers, so every run file
        found there belongs to a worker that is provably dead (the kernel dropped its lock).
        Orphans that still run are killed (their group, and with it the inherited device
        lease) before their frames are requeued, so no frame runs twice at the same time.
        Frames the store lists as RUNNING here without a run file are requeued only when
        the worker that claimed them is gone (its pid is not alive): a live process with that
        pid might be another worker of the same name (a misconfiguration), whose frames the
        store reaps anyway once nobody heartbeats them.
        """
        self.prepare()
        runfiles = {}
        for path in self.opts.state_dir.glob("*.json"):
            try:
                info = json.loads(path.read_text())
                runfiles[int(info["frame_id"])] = (path, info)
            except (OSError, ValueError, KeyError):
                path.unlink(missing_ok=True)
        requeued = []
        for path, info in runfiles.values():
            if info.get("pgid") and _same_process(info):  # a run file of an older cuectl
                launch.kill_process_group(int(info["pgid"]), grace=self.opts.kill_grace_s)
            # The orphan's processes — its group and whatever left it (setsid, double
            # forks: re-parented to init when we died) — by the frame environment.
            if info.get("log_path"):
                launch.kill_by_env({"CUE_FRAME_ID": str(info["frame_id"]), "CUE_ATTEMPT": str(info["attempt"]),
                                    "CUE_LOG_PATH": str(info["log_path"])}, grace=self.opts.kill_grace_s)
        for frame in self.store.running_on_host(self.opts.name):
            if frame["id"] not in runfiles and _claimer_may_live(frame.get("worker")):
                continue
            if self.store.requeue_frame(frame["id"], frame["attempts"], now=now, reason="orphaned"):
                requeued.append(frame["id"])
        for path, _ in runfiles.values():
            path.unlink(missing_ok=True)
        self.release_runfiles(delete_blank=False)  # (slots this process opened before recovering: made afresh)
        # Notifications a previous worker of this host claimed and may not have delivered:
        # it is dead (we hold the lock), so they are due again now rather than at claim expiry.
        self.store.release_notifications(f"{self.opts.name}:", keep=self.worker_id)
        if (runfiles or requeued) and self.say:
            ids = ", ".join(str(i) for i in sorted(requeued)) or "none"
            self.say(f"recovered after a restart: {len(runfiles)} run file(s) of a previous worker of "
                     f"{self.opts.name} cleaned up (orphaned processes killed); requeued frame(s) {ids}")
        return requeued

    def host_locked(self) -> bool:
        """Is this host locked (``cuectl host lock``)? A locked host claims nothing."""
        entry = self.store.host_inventories().get(self.opts.name)
        return bool(entry and entry[1])

    # -- one iteration ---------------------------------------------------------------------
    def loop(self, now: float | None = None) -> LoopStats:
        """One iteration: refresh the heartbeat file (and the inventory when due), report
        ended frames, heartbeat, reap, claim. Never blocks long."""
        self.stats = LoopStats()
        # The store's clock (the database server's on PostgreSQL): leases and heartbeats are
        # measured on it, and every deadline of this loop with them.
        now = self.store.clock() if now is None else now
        self.write_heartbeat_file()
        if self._rediscover_due(now):
            self.refresh_inventory(now)
        for p in self.pending:
            p.ended = None  # (last iteration's stats are gone)
        self._collect_finished()
        if self._sample_due(now):
            self._sample(now)  # (no store write while the store is down: _live_paused)
        if self.store_waiting():
            # The store failed and its back-off is not over: no store call this iteration.
            # Frames that end meanwhile keep their results in `pending`.
            return self.stats
        if now >= self._next_heartbeat:
            self._heartbeat(now)
        try:
            if self.pending and self._store_down_since is not None:
                # The store answers again: the results that waited go first, before a reap
                # could requeue their frames (their leases ran out while it was down).
                self._flush_pending()
            if self._register_due:
                self.register(now)
            if now >= self._next_reap:
                self._next_reap = now + max(0.5, self.opts.lease_timeout_s / 2)
                self.stats.reaped = len(self.store.reap(now=now))
                self.store.sweep_depends(now=now)  # what a user's transaction could not release
            if not self.draining and not self._reached_max():
                self._claim_all(now)
                self._store_ok_at = time.time()
                if self._dispatch_news():
                    self._publish(now)  # what readers cannot check changed: publish it now
            self._flush_pending()  # the reports no claim took along
            self._deliver_notifications(now)
            self._live_paused = False
            if self._store_down_since is not None:
                if self.say:
                    self.say(f"store back after {time.time() - self._store_down_since:.1f} s "
                             f"({self._store_down_calls} failed iteration(s))")
                self._store_down_since, self._store_down_calls = None, 0
                self._store_down_mono = self._store_retry_at = self._store_error = self._store_warned = None
        except StoreGone:
            raise  # nothing more can be recorded: the supervisor stops the worker
        except StoreError as exc:
            self._store_failed(exc)
        return self.stats

    def _store_failed(self, exc: StoreError) -> None:
        """Busy, unreachable or full store: running frames go on, their results wait in
        `pending`, claiming resumes once it answers. It is asked again after a back-off that
        doubles from STORE_RETRY_FIRST_S to STORE_RETRY_MAX_S, not at every iteration (a full
        disk was retried 2 to 40 times a second, by --poll, for as long as it lasted), and the
        warning is one line per outage (again only if the error changes), not one per try."""
        self._nothing_fits = False
        self._live_paused = True
        self.store_errors += 1
        if self._store_down_since is None:
            self._store_down_since, self._store_down_mono = time.time(), time.monotonic()
        self._store_down_calls += 1
        delay = min(STORE_RETRY_MAX_S, STORE_RETRY_FIRST_S * 2 ** min(self._store_down_calls - 1, 16))
        self._store_retry_at = time.monotonic() + delay
        self._store_error = exc.message
        if exc.message != self._store_warned:
            self._store_warned = exc.message
            if self.warn:
                self.warn(f"store unavailable, retrying (back-off up to {STORE_RETRY_MAX_S:g} s; frames keep "
                          f"running, their results wait here): {exc.message}")

    def store_waiting(self) -> bool:
        """Is the store down and its back-off not over (no store call now)?"""
        return self._store_retry_at is not None and time.monotonic() < self._store_retry_at

    def stranded(self) -> bool:
        """Draining, with frames running or results unrecorded, while the store has been
        down for a whole lease since the stop signal (or since it went down, if later): by
        then the store counts those frames lost anyway, and waiting longer for it would
        keep a stopping worker up for as long as the outage lasts."""
        if not self.draining or self._store_down_mono is None or not (self.running or self.pending):
            return False
        since = max(self.drain_started or 0.0, self._store_down_mono)
        return time.monotonic() - since >= self.opts.lease_timeout_s

    def stop_without_store(self) -> None:
        """Give up on a store that stayed down while draining (``stranded``): stop the
        frames still running, and raise one error naming what could not be recorded. The
        next worker of this host requeues those frames at start (``recover``: RUNNING here,
        claimed by a worker that is gone), or any worker once their lease expires."""
        stopped = sorted(self.running)
        for rf in list(self.running.values()):
            rf.proc.kill_and_wait(grace=min(self.opts.kill_grace_s, 2.0), reason="worker stopping: store unavailable")
            for lock in rf.locks:
                lock.release()
            self.runfiles.clear(rf.runfile)
            self._oom_counts.pop(rf.claim.frame_id, None)
        self.running.clear()
        unrecorded = sorted({p.frame_id for p in self.pending})
        self.pending.clear()
        lost = []
        if unrecorded:
            lost.append(f"result(s) of frame(s) {', '.join(map(str, unrecorded))} not recorded")
        if stopped:
            lost.append(f"running frame(s) {', '.join(map(str, stopped))} stopped")
        down = time.monotonic() - (self._store_down_mono or time.monotonic())
        raise StoreError(f"stopping with the store unavailable for {down:.0f} s ({self._store_error}): "
                         f"{' and '.join(lost) or 'nothing lost'}; the next worker of host {self.opts.name} "
                         "requeues them when it starts (any worker once their lease expires)")

    def _reached_max(self) -> bool:
        return self.opts.max_frames is not None and self.claimed_total >= self.opts.max_frames

    # -- notifications (run/notify.py) -----------------------------------------------------
    def _deliver_notifications(self, now: float) -> None:
        """Record deliveries that ended; every few seconds (at once when a frame ended here
        this iteration: it may have finished its job) claim and start due ones. Not while
        draining. Deliveries run in the background: this never blocks."""
        if self._deliverer is None:
            from cuectl.run.notify import Deliverer

            self._deliverer = Deliverer(self.store, deliverer_id=self.worker_id,
                                        run_as_submitter=self.opts.run_as_submitter, warn=self.warn,
                                        on_claimed=lambda: self._crash_point("notify_claimed"))
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
        return any(state not in (m.SUCCEEDED, m.WAITING) or claim.job_id not in running_jobs
                   for claim, _info, state in self.stats.ended)

    def _delivering(self) -> bool:
        return bool(self._deliverer is not None and self._deliverer.inflight)

    # -- the inventory ---------------------------------------------------------------------
    def _rediscover_due(self, now: float) -> bool:
        if self.rediscover is None:
            return False
        interval = self.opts.rediscover_interval_s
        if self._next_rediscover is None:  # the first iteration: the inventory is fresh
            self._next_rediscover = now + interval if interval > 0 else float("inf")
        return self._rediscover_asked or now >= self._next_rediscover

    def refresh_inventory(self, now: float) -> None:
        """Find the GPUs again. A device that is no longer found (fell off the bus, MIG
        reconfigured, its backend failed) leaves the inventory, so no new frame gets it, and
        is listed in ``unavailable`` for `host show`; one that comes back rejoins. Frames
        already running keep their devices and their locks: they finish or fail on their own."""
        assert self.rediscover is not None
        self._rediscover_asked = False
        interval = self.opts.rediscover_interval_s
        self._next_rediscover = now + interval if interval > 0 else float("inf")
        try:
            inventory = self.rediscover()
        except CuectlError as exc:  # e.g. a fake GPU file being edited: keep what we have
            if self.warn:
                self.warn(f"GPU re-discovery failed, keeping the current inventory: {exc.message}")
            return
        found = {d.uuid for d in inventory.devices}
        for d in self.devices:
            if d.uuid not in found:
                why = inventory.problems.get(d.backend)
                self.unavailable[d.uuid] = {"uuid": d.uuid, "model": d.model, "index": d.index, "since": iso(now),
                                            "reason": f"{d.backend}: {why}" if why else None}
                if self.warn:
                    self.warn(f"GPU {d.index} {d.uuid} ({d.model}) is gone{f' ({why})' if why else ''}: "
                              "no new frames will use it")
        known = {d.uuid for d in self.devices}
        for d in inventory.devices:
            back = self.unavailable.pop(d.uuid, None) is not None
            if (back or d.uuid not in known) and self.warn:
                self.warn(f"GPU {d.index} {d.uuid} ({d.model}) {'is back' if back else 'found'}")
        changed = _identity(inventory.devices) != _identity(self.devices)
        if changed:
            self._static_fit.clear()
        self.devices = list(inventory.devices)
        self.sampler = inventory.sampler
        if changed:
            self._register_due = True   # the store's inventory (host show, pending reasons)
            self._next_heartbeat = now  # and the unavailable list, at once

    def _live_doc(self) -> dict[str, Any] | None:
        """What the heartbeat stores as the host's live values: every device's latest sample
        with its own time (each device always, never only the last tick's), the sampling
        interval that readers judge their age by, the dispatch state, and the devices that
        are unavailable now (while there are any, and once after)."""
        doc: dict[str, Any] = {}
        if self._device_values:
            wanted = {d.uuid for d in self.devices} | {u for r in self.running.values() for u in r.claim.gpu_uuids}
            entries = [v for u, v in self._device_values.items() if u in wanted]
            if entries:
                doc = {"at": max(v["sampled_at"] for v in entries), "sample_interval_s": self.opts.sample_interval_s,
                       "devices": [{**v, "sampled_at": iso(v["sampled_at"])} for v in entries]}
        if self._dispatch:
            doc["dispatch"] = self._dispatch
        if not self.unavailable and not self._unavailable_sent:
            return doc or None
        return {**doc, "unavailable": list(self.unavailable.values())}

    # -- claiming --------------------------------------------------------------------------
    def _free_cpu(self) -> CpuPool:
        used_cores = sum(r.claim.cores for r in self.running.values() if r.claim.gpus == 0)
        used_mem = sum(r.claim.memory_bytes for r in self.running.values() if r.claim.gpus == 0)
        return CpuPool(cores=self.opts.cores - used_cores, memory_bytes=self.opts.memory_bytes - used_mem)

    def _claim_all(self, now: float) -> None:
        """One dispatch pass: walk the runnable layers once, in dispatch order (however many
        this host cannot run sort first), and claim from each as much as fits. The first GPU
        layer that could run here but does not fit yet holds the free devices it could use
        (a reservation): lower layers may only backfill onto other devices."""
        self._nothing_fits = False
        devices_now: list[Device] | None = None
        busy: set[str] = set()
        foreign: dict[str, str] = {}
        reserved: set[str] = set()
        reserving: dict[str, Any] | None = None
        closed = self._closed_reason(now)
        if closed is None:
            for layer in self._runnable():
                if self._reached_max():
                    break
                if not self._accepts(layer) or not self._could_ever_run(layer):
                    continue
                if layer.gpus <= 0:
                    while not self._reached_max() and not self.opts.gpu_only and (room := self._cpu_room(layer)):
                        if not self._claim(layer, [], now, count=room):
                            break
                    continue
                if devices_now is None:
                    devices_now = self._live_devices(now)
                while not self._reached_max():
                    busy, foreign = self._busy(devices_now)
                    result = select_devices(GpuRequest.from_record(layer), devices_now, busy=busy | reserved)
                    if not result.devices:
                        # Only a multi-GPU frame can starve: a 1-GPU frame comes first in the
                        # next pass and takes the first device it can use that frees up.
                        if reserving is None and result.could_ever_fit and layer.gpus > 1:
                            reserving = self._reserve(layer, devices_now, busy, now)
                            if reserving is not None:
                                reserved |= set(reserving["uuids"])
                        break
                    if not self._claim_gpu(layer, result.devices, now):
                        break
        if reserving is None:
            if self._reservation is not None:
                self._next_heartbeat = min(self._next_heartbeat, now)  # and as it ends
            self._reservation = None
        if devices_now is None and self.devices and now >= self._next_device_view:
            # No GPU layer looked at the devices this pass: look anyway, at the heartbeat's
            # pace, so what the host publishes (NIMBY, leases) stays true while idle.
            devices_now = self._live_devices(now)
            busy, foreign = self._busy(devices_now)
        if devices_now is not None:
            self._next_device_view = now + max(1.0, self.opts.lease_timeout_s / 4)
        self._say_reservation(reserving)
        self._nothing_fits = True
        self._publish_dispatch(now, devices_now, busy, foreign, reserving, closed)

    def _say_reservation(self, reserving: Mapping[str, Any] | None) -> None:
        """One line when this host starts holding GPUs for a frame, and when it stops."""
        now_id = reserving["layer_id"] if reserving else None
        if now_id == self._said_reservation:
            return
        if self.say and reserving is not None:
            self.say(f"reserving GPUs for job {reserving['job_id']} ({reserving['job']}) layer {reserving['layer']}: "
                     f"needs {reserving['needs']}, {reserving['free']} free now; no lower-priority frame starts on "
                     "them meanwhile")
        elif self.say and self._said_reservation is not None:
            self.say("reservation released" + (" (its time ran out: backfilling)"
                                               if self._said_reservation in self._reserve_cooldown else ""))
        self._said_reservation = now_id

    def _runnable(self, *, all_sizes: bool = False) -> Iterator[RunnableLayer]:
        """Every runnable layer in dispatch order, a page at a time (read lazily: a pass that
        fills this host early reads no further), less those too big for this host by size
        alone unless ``all_sizes`` (the store leaves them out)."""
        after = None
        shape = None if all_sizes else self._shape()
        while True:
            page = self.store.runnable_layers(limit=RUNNABLE_PAGE, after=after, host=shape)
            yield from page
            if len(page) < RUNNABLE_PAGE:
                return
            after = page[-1].order_key

    def _shape(self) -> HostShape:
        """This host by size, for the store to leave out layers it could never run."""
        memory = [d.memory_total_bytes for d in self.devices if d.memory_total_bytes is not None]
        unknown = any(d.memory_total_bytes is None for d in self.devices)
        return HostShape(gpus=len(self.devices), gpu_memory_max_bytes=(1 << 62) if unknown else max(memory, default=0),
                         cores=self.opts.cores, memory_bytes=self.opts.memory_bytes, gpu_only=self.opts.gpu_only)

    def _could_ever_run(self, layer: RunnableLayer) -> bool:
        """Could this host ever run the layer (GPU model, count and memory; cores and host
        memory; --gpu-only)? Remembered per layer: a layer's request never changes."""
        fit = self._static_fit.get(layer.layer_id)
        if fit is None:
            if layer.gpus > 0:
                fit = select_devices(GpuRequest.from_record(layer), self.devices).could_ever_fit
            else:
                fit = not self.opts.gpu_only and cpu_fits(
                    layer.cores, layer.memory_bytes, CpuPool(self.opts.cores, self.opts.memory_bytes)) is None
            if len(self._static_fit) > 100_000:
                self._static_fit.clear()
            self._static_fit[layer.layer_id] = fit
        return fit

    def _busy(self, devices: Sequence[Device]) -> tuple[set[str], dict[str, str]]:
        """Devices nothing new may start on now: this worker's frames, anyone's lease, what
        queued `cuectl run --wait` callers are about to take, and (NIMBY) devices another
        program uses; the last with why."""
        mine = {u for r in self.running.values() for u in r.claim.gpu_uuids}
        leased = mine | held_uuids(self.opts.lock_dir, devices)
        # Devices that `cuectl run --wait` / lease(wait=True) callers queued for are left
        # to them: they asked first, and a busy farm would otherwise starve them.
        busy = leased | queued_reservations(self.opts.lock_dir, devices)
        foreign: dict[str, str] = {}
        if self.opts.nimby_memory_bytes is not None or self.opts.nimby_util_pct is not None:
            foreign = foreign_use(devices, leased, max_memory_bytes=self.opts.nimby_memory_bytes,
                                  max_util_pct=self.opts.nimby_util_pct)
        return busy | set(foreign), foreign

    def _reserve(self, layer: RunnableLayer, devices: Sequence[Device], busy: set[str],
                 now: float) -> dict[str, Any] | None:
        """Hold the free devices ``layer`` could use until enough are free for its next frame
        (None: it may not reserve: reservations off, its time ran out, or a cap holds it back
        anyway). Bounded by ``reservation_timeout_s``, after which it backfills as long."""
        timeout = self.opts.reservation_timeout_s
        if timeout <= 0 or self._reserve_cooldown.get(layer.layer_id, 0.0) > now:
            return None
        held = self._reservation
        if held is None or held["layer_id"] != layer.layer_id:
            if self.store.cap_reached(layer.layer_id):
                return None  # a limit or quota stops it whatever is free: holding devices helps nobody
            held = {"layer_id": layer.layer_id, "since": now}
            # Pending reasons name a reservation from the heartbeat: publish it as it
            # starts (as inventory changes are), not up to a quarter lease later.
            self._next_heartbeat = min(self._next_heartbeat, now)
        if now - held["since"] > timeout:
            self._reserve_cooldown[layer.layer_id] = now + timeout
            return None
        request = GpuRequest.from_record(layer)
        parents = {d.mig_parent_uuid for d in devices if d.mig_parent_uuid}  # a card split into MIG is not leasable
        usable = [d for d in devices if d.uuid not in parents and device_fits_statically(request, d) is None]
        free = [d.uuid for d in usable if d.uuid not in busy]
        self._reservation = {
            **held, "job_id": layer.job_id, "job": layer.job, "layer": layer.layer, "priority": layer.priority,
            "needs": _describe_need(request), "free": len(free), "uuids": free, "until": held["since"] + timeout}
        return self._reservation

    def _claim_gpu(self, layer: RunnableLayer, devices: Sequence[Device], now: float) -> bool:
        locks = try_lock_all(self.opts.lock_dir, list(devices), holder=f"{self.opts.name} claiming")
        if locks is None:  # someone (e.g. `cuectl run`) took one between the probe and now
            return False
        self._crash_point("after_lock")
        try:
            return self._claim(layer, locks, now, devices=devices)
        finally:
            if not any(r.locks is locks for r in self.running.values()):
                for lock in locks:
                    lock.release()

    def _closed_reason(self, now: float) -> str | None:
        """Why this worker takes no new frame now: outside its ``--available`` schedule."""
        if self.opts.schedule is None:
            return None
        from datetime import datetime

        return self.opts.schedule.closed_reason(datetime.now())

    def _publish_dispatch(self, now: float, devices: Sequence[Device] | None, busy: set[str],
                          foreign: Mapping[str, str], reservation: Mapping[str, Any] | None,
                          closed: str | None) -> None:
        """What the heartbeat publishes of this pass (docs/scheduling.md): enough for
        pending reasons and `cuectl job why` to name the cause of a wait."""
        free_cpu = self._free_cpu()
        schedule = None
        if self.opts.schedule is not None:
            schedule = {"text": self.opts.schedule.describe(), "open": closed is None, "reason": closed}
        frames = {u: r.claim for r in self.running.values() for u in r.claim.gpu_uuids}
        held = set(reservation["uuids"]) if reservation else set()
        states: dict[str, dict[str, Any]] = {}
        if devices is None:  # not looked at this pass: the last look stands (see _claim_all)
            devices, busy, foreign = self._last_look
        else:  # what others hold (our own frames are told from `running` whenever published)
            busy = busy - set(frames)
            self._last_look = (devices, busy, foreign)
        for d in devices:
            state, holder, frame_id = "free", None, None
            if d.uuid in frames:
                claim = frames[d.uuid]
                state, holder = "frame", f"frame {claim.frame_id} (job {claim.job})"
                frame_id = claim.frame_id
            elif d.uuid in foreign:
                state, holder = "nimby", foreign[d.uuid]
            elif d.uuid in busy:
                state, holder = "lease", _lease_holder(self.opts.lock_dir, d.uuid)
            elif d.uuid in held:
                state = "reserved"
            # frame_id: readers drop a holder whose frame is no longer RUNNING (it ended since).
            states[d.uuid] = {"state": state, "holder": holder, "frame_id": frame_id,
                              "memory_free_bytes": d.memory_free_bytes}
        self._dispatch = {
            "at": now, "accepting": closed is None and not self.draining, "schedule": schedule,
            "allowed_users": list(self.opts.allowed_users), "gpu_only": self.opts.gpu_only,
            # A root worker runs only jobs proven their user's (readers say so for unproven ones).
            "run_as_submitter": self.opts.run_as_submitter,
            "cores": self.opts.cores, "cores_free": free_cpu.cores, "memory_bytes": self.opts.memory_bytes,
            "memory_free_bytes": free_cpu.memory_bytes, "devices": states,
            "reservation": dict(reservation) if reservation else None}

    def _dispatch_news(self) -> bool:
        """Is this the first dispatch state, or did the pass change what a reader cannot
        check against the store (a lease, another program on a device)? Then the heartbeat
        publishes it now, not up to a quarter lease later: a pending reason must not name a
        `cuectl run` that has ended. Frames starting and ending are no news: readers check
        those holders against the store's RUNNING frames."""
        states = self._dispatch.get("devices")
        if not isinstance(states, Mapping):
            return False
        key = tuple(sorted((u, x["state"], str(x["holder"])) for u, x in states.items()
                           if x["state"] in ("lease", "nimby")))
        if key == self._dispatch_sent:
            return False
        self._dispatch_sent = key
        return True

    def _accepts(self, layer: RunnableLayer) -> bool:
        """Tags, the users whose work this worker agreed to run, and (a root worker) proof
        that the job's user really submitted it: a label alone never makes anyone root."""
        if self.opts.allowed_users and layer.user not in self.opts.allowed_users:
            return False
        if self.opts.run_as_submitter and self._unproven(layer):
            return False
        return tags_fit(layer.tags, self.opts.tags)

    def _check_layer(self, claim: ClaimedFrame) -> None:
        """Raise ``Unproven`` unless this layer is what its user submitted (read once per
        distinct layer content: every field the receipt's digest covers is in the key, so
        a row changed since is checked afresh; the digest itself, a hash of its JSON, is
        computed only then)."""
        key = (claim.job_id, claim.user, claim.submitted_by, claim.receipt, claim.layer, claim.command,
               tuple(sorted(claim.env.items())), claim.layer_range, claim.chunk, claim.cwd, claim.job,
               claim.show, claim.shot)
        if key in self._proven:
            return
        # The frame's tokens and CUE_* values are made of this claim's fields: once they
        # match the receipt, the worker runs what its user submitted (a job renamed in
        # the store to `$(...)` is refused, never expanded into `sh -c '... #JOB#'`).
        identity.check_layer(user=claim.user, job_id=claim.job_id, layer=claim.layer, command=claim.command,
                             env=claim.env, frame_range=claim.layer_range, chunk=claim.chunk,
                             submitted_by=claim.submitted_by, receipt=claim.receipt, spool=self.store.receipt_dir,
                             cwd=claim.cwd, job_name=claim.job, show=claim.show, shot=claim.shot)
        self._proven.add(key)

    def _unproven(self, layer: RunnableLayer) -> str | None:
        key = (layer.job_id, layer.user, layer.submitted_by, layer.receipt)
        if key in self._proven:
            return None
        if layer.job_id not in self.unproven:
            problem = identity.proof_problem(user=layer.user, job_id=layer.job_id, submitted_by=layer.submitted_by,
                                             receipt=layer.receipt, spool=self.store.receipt_dir)
            if problem is None:
                self._proven.add(key)  # the layer's digest is checked again at launch
                return None
            self.unproven[layer.job_id] = problem
            if self.warn:
                self.warn(f"not running job {layer.job_id} ({layer.job}) as {layer.user}: {problem}")
        return self.unproven[layer.job_id]

    def _cpu_room(self, layer: RunnableLayer) -> int:
        """How many frames of this CPU layer fit the free CPU pool now (at most
        CLAIM_BATCH, and what ``--max-frames`` leaves)."""
        free = self._free_cpu()
        limit = CLAIM_BATCH
        if self.opts.max_frames is not None:
            limit = min(limit, self.opts.max_frames - self.claimed_total)
        room = 0
        while room < limit and cpu_fits(layer.cores, layer.memory_bytes, free) is None:
            free = CpuPool(cores=free.cores - layer.cores, memory_bytes=free.memory_bytes - max(0, layer.memory_bytes))
            room += 1
        return room

    def _claim(self, layer: RunnableLayer, locks: list[DeviceLock], now: float,
               devices: Sequence[Device] = (), count: int = 1) -> bool:
        """Claim a frame of ``layer`` on ``devices`` holding ``locks`` — or, for a CPU layer,
        up to ``count`` frames — and launch it; whether all were claimed."""
        uuids = [d.uuid for d in devices]
        if self.pending or count > 1:
            # The frames that ended go with these claims: one transaction (one commit on
            # SQLite) for the slots' old frames and their new ones. If it fails they stay pending.
            reports = list(self.pending)
            states, claims = self.store.complete_and_claim_many(
                [(p.frame_id, p.attempt, p.result) for p in reports], layer.layer_id, count,
                reported_at=self.store.clock(), host=self.opts.name, worker=self.worker_id, gpu_uuids=uuids,
                now=now, lease_s=self.opts.lease_timeout_s, log_dir=self.opts.log_dir)
            del self.pending[:len(reports)]
            for p, state in zip(reports, states):
                self._reported(p.ended, state)
        else:
            claim = self.store.claim_frame(layer.layer_id, host=self.opts.name, worker=self.worker_id,
                                           gpu_uuids=uuids, now=now, lease_s=self.opts.lease_timeout_s,
                                           log_dir=self.opts.log_dir)
            claims = [claim] if claim is not None else []
        for claim in claims:
            self._crash_point("after_claim")
            self.claimed_total += 1
            self.stats.claimed += 1
            self._launch(claim, locks, tuple(devices), now)
        return len(claims) == count

    def _live_devices(self, now: float) -> list[Device]:
        """The inventory with live free memory (one batch sample), so busy cards are skipped;
        the sample is also what the host publishes of each device until a later one."""
        if not self.devices or self.sampler is None:
            return list(self.devices)
        try:
            samples = self.sampler([d.uuid for d in self.devices], [])
        except Exception:  # a flaky backend must not stop dispatch: use static values
            return list(self.devices)
        self._note_samples(samples, now)
        out = []
        for d in self.devices:
            s = samples.get(d.uuid)
            if s is not None and s.memory_free_bytes is not None:
                d = replace(d, memory_free_bytes=s.memory_free_bytes, utilization_pct=s.utilization_pct)
            out.append(d)
        return out

    # -- launching -------------------------------------------------------------------------
    def _launch(self, claim: ClaimedFrame, locks: list[DeviceLock], devices: tuple[Device, ...], now: float) -> None:
        log_path = Path(claim.log_path)  # one Path a frame: each costs a parse (hot path)
        ctx = launch.FrameContext(
            job=claim.job, job_id=str(claim.job_id), layer=claim.layer, layer_id=str(claim.layer_id),
            frame_id=str(claim.frame_id), frame_number=claim.number, frames=claim.frames,
            layer_range=claim.layer_range, chunk=claim.chunk, attempt=claim.attempt, cores=claim.cores,
            memory_bytes=claim.memory_bytes,
            gpu_memory_bytes=min((d.memory_total_bytes or 0 for d in devices), default=None) if devices else None,
            log_path=log_path, user=claim.user, show=claim.show or "", shot=claim.shot or "")
        runfile: Path | None = None
        try:
            if type(claim.number) is not int:  # SQLite keeps any value in an INTEGER column
                raise _BadRow(f"frame {claim.frame_id} of job {claim.job_id} has the number {claim.number!r} "
                              "in the store, not an integer (the row was edited): refused")
            if self.opts.run_as_submitter:
                self._check_layer(claim)
            run_as = self._lookup_run_as(claim.user) if self.opts.run_as_submitter else None
            argv = launch.substitute_tokens(claim.command, ctx)
            env = self._frame_env(claim, ctx, devices, run_as)
            # Before the frame exists: a worker killed at any point after this leaves a run
            # file naming every process the frame will start (by its environment).
            if claim.cwd is not None and not os.path.isdir(claim.cwd):
                raise _NoDirectory(f"working directory {claim.cwd} does not exist on host {self.opts.name}")
            runfile = self.runfiles.write(claim, str(log_path))
            rqlog = self._rqlog(claim)
            proc = launch.FrameProcess.start(
                argv, env=env, log_path=log_path, pass_fds=[lk.fd for lk in locks], cwd=claim.cwd,
                timeout_s=claim.timeout_s, grace=self.opts.kill_grace_s, run_as=run_as,
                header=launch.log_header(str(claim.frame_id), claim.attempt, self.opts.name),
                log_root=self._log_root(), log_limit=claim.log_limit_bytes or self.opts.log_limit_bytes,
                footer=(str(claim.frame_id), claim.attempt), rqlog=rqlog)
        except Exception as exc:  # bad command/env, unknown user, unwritable log: fail this attempt
            for lock in locks:
                lock.release()
            if runfile is not None:
                self.runfiles.clear(runfile)
            message = getattr(exc, "message", None) or str(exc)
            if isinstance(exc, _BadRow) and self.warn:
                self.warn(message)
            _log_failure(Path(claim.log_path), f"cuectl: frame not started: {message}", self._rqlog(claim))
            why = failures.classify(exit_code=126, exit_signal=None, timed_out=False, launch_error=message)
            # A directory missing here may exist on another host (a share not mounted yet):
            # a failure like any other, retried, rather than one that never could succeed.
            permanent = bool(why and why.permanent) and not isinstance(exc, _NoDirectory)
            self._report(claim.frame_id, claim.attempt, FrameResult(
                exit_code=126, started_at=now, ended_at=time.time(), usage={"error": message},
                failure_kind=why.kind if why else "launch", failure=why.text if why else message,
                permanent=permanent))
            return
        for lock in locks:
            update_holder(lock, pid=proc.pid, holder=f"frame {claim.frame_id}")
        tracker = UsageTracker([d.uuid for d in devices], proc_started(proc, now))
        rf = RunningFrame(claim=claim, proc=proc, locks=locks, devices=devices, usage=tracker, runfile=runfile,
                          next_sample=now)  # sample at once: short frames get data too
        self.running[claim.frame_id] = rf
        self._oom_counts[claim.frame_id] = self._oom_kills()
        self._crash_point("after_launch")

    def _frame_env(self, claim: ClaimedFrame, ctx: launch.FrameContext, devices: tuple[Device, ...],
                   run_as: launch.RunAs | None) -> dict[str, str]:
        """The frame's environment (``launch.frame_env``), from the template its layer's
        frames share on these devices: made for the first of them, kept under everything
        it is made of, so a change to any (a layer edited, another account, the inventory)
        makes a new one. Raises as ``frame_env`` does."""
        vendors = self.vendors()
        run_env = run_as.env() if run_as else {}
        key: tuple[Any, ...] | None
        try:
            key = (claim.layer_id, claim.job_id, claim.job, claim.layer, claim.user, ctx.show, ctx.shot,
                   claim.layer_range, claim.chunk, claim.cores, claim.memory_bytes, ctx.gpu_memory_bytes,
                   tuple(run_env.items()), tuple(claim.env.items()),
                   isolation_key(devices, all_vendors_present=vendors))
            template = self._env_templates.get(key)
        except (TypeError, AttributeError):  # a hostile row's env (not a mapping of strings): made afresh, refused
            key, template = None, None
        if template is None:
            if self._base_env is None:
                self._base_env = launch.frame_base(config.inherited_environ())
            template = launch.env_template(ctx, layer_env={**run_env, **claim.env},
                                           isolation=isolation_env(list(devices), all_vendors_present=vendors),
                                           base=self._base_env)
            if key is not None:
                if len(self._env_templates) >= ENV_TEMPLATES_KEPT:
                    self._env_templates.clear()  # many layers over a long life: start again
                self._env_templates[key] = template
        return template.env(ctx)

    def _rqlog(self, claim: ClaimedFrame) -> launch.RqlogLink | None:
        """The OpenCue-named link for the claim's log (CueGUI opens logs by those names); None
        when the job's name cannot be a file name (logs.rqlog_name): that job has no links."""
        if type(claim.number) is not int:  # a hostile row, refused at launch: no name to link
            return None
        name = logs.rqlog_name(claim.job, launch.frame_name(claim.number, claim.layer))
        if name is None:
            return None
        job_id = claim.job_id
        return launch.RqlogLink(name, lambda message: self._warn_rqlog(job_id, message))

    def _warn_rqlog(self, job_id: int, message: str) -> None:
        """Say once per job that its OpenCue log links cannot be made (a link planted in place
        of ``rqlog/``, a full disk): the frames run on, only CueGUI cannot show their logs."""
        if job_id in self._rqlog_warned:
            return
        if len(self._rqlog_warned) >= 4096:  # a worker lives for months: keep the memory bounded
            self._rqlog_warned.clear()
        self._rqlog_warned.add(job_id)
        if self.warn:
            self.warn(f"job {job_id}: {message} (CueGUI cannot open its logs; the frames run as ever)")

    def _log_root(self) -> Path:
        """``--log-dir`` as a Path, made once (each costs a parse; this is the hot path)."""
        if self._log_root_path is None:  # (the options are frozen)
            self._log_root_path = Path(self.opts.log_dir)
        return self._log_root_path

    def _lookup_run_as(self, user: str) -> launch.RunAs:
        """The account ``user`` (uid, groups, home), as the system said at most
        RUN_AS_TTL_S ago; a user that does not exist is asked about again every time."""
        clock = time.monotonic()
        cached = self._run_as.get(user)
        if cached is not None and clock - cached[0] < RUN_AS_TTL_S:
            return cached[1]
        if len(self._run_as) > 1024:  # many users over a long life: start again
            self._run_as.clear()
        run_as = launch.RunAs.lookup(user)
        self._run_as[user] = (clock, run_as)
        return run_as

    # -- finishing -------------------------------------------------------------------------
    def _collect_finished(self) -> None:
        for frame_id, rf in list(self.running.items()):
            info = rf.proc.poll()
            if info is None:
                continue
            self._finish(rf, info)
            del self.running[frame_id]

    def _finish(self, rf: RunningFrame, info: launch.ExitInfo) -> None:
        if rf.devices and self.sampler is not None:
            self._sample_frames([rf], info.ended_at)
        for lock in rf.locks:
            lock.release()
        self.runfiles.clear(rf.runfile)
        if rf.lost:
            return  # the store gave this attempt to someone else; our report would be fenced anyway
        usage = rf.usage.summary(info.ended_at)
        if rf.devices:
            usage["gpu_models"] = [d.model for d in rf.devices]
        why = self._why_failed(rf, info)
        result = FrameResult(exit_code=info.exit_code, exit_signal=info.exit_signal, timed_out=info.timed_out,
                             started_at=info.started_at, ended_at=info.ended_at, max_rss_bytes=info.max_rss_bytes,
                             cpu_seconds=info.cpu_seconds, user_action=rf.user_action, usage=usage,
                             failure_kind=why.kind if why else None, failure=why.text if why else None,
                             permanent=bool(why and why.permanent))
        self._crash_point("before_complete")
        # Recorded with this iteration's next claim, or at its end (``loop``).
        self.pending.append(Pending(rf.claim.frame_id, rf.claim.attempt, result, ended=len(self.stats.ended)))
        self.stats.finished += 1
        self.stats.ended.append((rf.claim, info, None))

    def _why_failed(self, rf: RunningFrame, info: launch.ExitInfo) -> failures.Failure | None:
        """Why the attempt failed, from its exit, its log's tail (GPU out of memory) and the
        kernel's OOM-kill counter (it rose while the frame ran: the OOM killer)."""
        before = self._oom_counts.pop(rf.claim.frame_id, None)  # (popped for every frame: no leak)
        if info.exit_code == 0 and not info.timed_out and not info.exit_signal and rf.user_action is None:
            return failures.log_lost() if info.log_lost else None
        after = self._oom_kills(fresh=True) if before is not None else None
        oom = before is not None and after is not None and after > before
        why = failures.classify(exit_code=info.exit_code, exit_signal=info.exit_signal, timed_out=info.timed_out,
                                user_action=rf.user_action, oom_killed=oom, timeout_s=rf.claim.timeout_s,
                                log_tail=failures.read_log_tail(Path(rf.claim.log_path)))
        if why is not None and info.log_lost:  # the attempt says so too, not only its log
            why = failures.Failure(why.kind, f"{why.text}; {failures.log_lost().text}", why.permanent)
        return why

    def _oom_kills(self, *, fresh: bool = False) -> int | None:
        """The kernel's OOM-kill counter of this worker's memory cgroup (None: none). Frames
        launched in one dispatch pass share one reading (it is the cgroup's counter, not the
        frame's); ``fresh`` reads it now (a failed frame's "after")."""
        if self._cgroup_dir is False:
            self._cgroup_dir = failures.own_cgroup_dir()
        if not isinstance(self._cgroup_dir, Path):
            return None
        clock = time.monotonic()
        if fresh or clock - self._oom_read[0] > 0.05:
            self._oom_read = (clock, failures.oom_kill_count(self._cgroup_dir))
        return self._oom_read[1]

    def _report(self, frame_id: int, attempt: int, result: FrameResult, ended: int | None = None) -> str | None:
        try:
            state = self.store.complete_frame(frame_id, attempt, result, now=self.store.clock())
        except StoreError:
            # The store is busy or unreachable: keep the result and retry next iteration
            # (the frame's lease is still extended by our heartbeats meanwhile).
            self.pending.append(Pending(frame_id, attempt, result, ended))
            return None
        self._reported(ended, state)
        return state

    def _reported(self, ended: int | None, state: str | None) -> None:
        """A report is recorded: what this iteration says of its frame (``ended``: its place
        in ``stats.ended``, None if another iteration ended it) gets the new state."""
        if ended is not None:
            claim, info, _ = self.stats.ended[ended]
            self.stats.ended[ended] = (claim, info, state)

    def _flush_pending(self) -> None:
        """Record the waiting results, oldest first; a store error is raised (the loop's
        outage handling: back-off, one warning) with the rest still waiting. It used to be
        swallowed here, so a store that took claims and heartbeats but not results looked
        healthy while the results waited for ever."""
        while self.pending:
            p = self.pending[0]
            state = self.store.complete_frame(p.frame_id, p.attempt, p.result, now=self.store.clock())
            del self.pending[0]
            self._reported(p.ended, state)

    # -- heartbeats, user actions, sampling -------------------------------------------------
    def _heartbeat(self, now: float) -> None:
        self._next_heartbeat = now + max(0.2, self.opts.lease_timeout_s / 4)
        ids = list(self.running) + [p.frame_id for p in self.pending]
        attempts = {fid: rf.claim.attempt for fid, rf in self.running.items()}
        attempts.update({p.frame_id: p.attempt for p in self.pending})
        live = self._live_doc()
        try:
            actions = self.store.heartbeat(self.opts.name, ids, now=now, lease_s=self.opts.lease_timeout_s,
                                           live=live, attempts=attempts)
        except StoreError:
            self._live_paused = True
            return  # try again next time; frames keep running
        self._live_paused = False
        self._store_ok_at = time.time()
        self._tick_published_at = self._tick_at
        self._unavailable_sent = bool(live and live.get("unavailable"))
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

    def _publish(self, now: float) -> None:
        """Store the live doc now, between heartbeats: the host row alone (the frames'
        leases keep the heartbeat's pace), so publishing each sampling tick or a dispatch
        change costs one row."""
        live = self._live_doc()
        try:
            self.store.heartbeat(self.opts.name, [], now=now, lease_s=self.opts.lease_timeout_s, live=live)
        except StoreError:
            self._live_paused = True  # the next heartbeat tries again
            return
        self._store_ok_at = time.time()
        self._tick_published_at = self._tick_at
        self._unavailable_sent = bool(live and live.get("unavailable"))

    def _sample_due(self, now: float) -> bool:
        """Is a sample due: every device's (each interval, frames or not), or a frame's first?"""
        if self.devices and self.sampler is not None and now >= self._next_device_sample:
            return True
        return bool(self.running) and now >= min(r.next_sample for r in self.running.values())

    def _sample(self, now: float) -> None:
        """Each interval, one sampler call reads every local device and the processes of
        every running frame (so idle devices, and what others run on them, are seen too), and
        the heartbeat publishes the result at once; in between, a frame just started gets one
        sample of its own devices (short frames get data too)."""
        interval = self.opts.sample_interval_s
        tick = bool(self.devices) and self.sampler is not None and now >= self._next_device_sample
        due = [rf for rf in self.running.values() if tick or now >= rf.next_sample]
        for rf in due:
            rf.next_sample = now + interval
        sampled = [rf for rf in due if rf.devices]
        if tick:
            self._next_device_sample = now + interval
            self._tick_at = now
            self._sample_frames(sampled, now, every_device=True)
            # Readers take a value older than two intervals for unknown. The heartbeat
            # carries the latest sample; between heartbeats the host row alone is written
            # only when the values the store has would be more than 1.5 intervals old at the
            # next heartbeat. Publishing every tick wrote the host row twice as often as
            # the heartbeats do (8 writes a minute against 4 at the defaults); this is 6.
            if (now < self._next_heartbeat and not self._live_paused
                    and self._next_heartbeat - self._tick_published_at > 1.5 * interval):
                self._publish(now)
        else:
            self._sample_frames(sampled, now)
        self._publish_live(sampled, now)

    def _publish_live(self, frames: Sequence[RunningFrame], now: float) -> None:
        """Write the latest values and the series so far of the frames just sampled: one
        transaction per sampling tick for all of them (docs/accounting.md, live values).
        The sample taken at a frame's start is not written: a frame shorter than one
        interval costs no store write beyond its completion, which stores the series."""
        live = []
        for rf in frames:
            if rf.lost or rf.proc.finished or rf.usage.last_at != now or rf.usage.samples_taken < 2:
                continue
            util, mem = rf.usage.current()
            live.append(LiveUsage(frame_id=rf.claim.frame_id, attempt=rf.claim.attempt, sampled_at=now,
                                  util_pct=util, memory_used_bytes=mem, samples=rf.usage.series_json()))
        if not live or self._live_paused:
            return
        try:
            self.store.record_live_usage(self.opts.name, live, now=now)
        except StoreError:
            # Best effort: a later tick writes the series again, the completion in full. Not
            # before another store call gets through, though: each call to a lost server
            # waits for it, and the loop must keep noticing frames that end.
            self._live_paused = True

    def _sample_frames(self, frames: Sequence[RunningFrame], now: float, *, every_device: bool = False) -> None:
        """Sample the devices of ``frames`` (and, ``every_device``, all local devices) with
        the frames' processes, in one sampler call."""
        if (not frames and not every_device) or self.sampler is None:
            return
        uuids = sorted({u for rf in frames for u in rf.claim.gpu_uuids}
                       | ({d.uuid for d in self.devices} if every_device else set()))
        if not uuids:
            return
        pids: set[int] = set()
        frame_pids = {}
        table = launch.process_table() if any(not rf.proc.finished for rf in frames) else {}
        for rf in frames:
            if not rf.proc.finished:
                rf.seen_pids |= rf.proc.pids(table)
            frame_pids[rf.claim.frame_id] = set(rf.seen_pids)
            pids |= frame_pids[rf.claim.frame_id]
        try:
            samples = self.sampler(uuids, sorted(pids))
        except Exception:
            return
        for rf in frames:
            rf.usage.add(samples, frame_pids[rf.claim.frame_id], now)
        self._note_samples(samples, now)

    def _note_samples(self, samples: Mapping[str, Any], now: float) -> None:
        """Keep each sampled device's values with the time they were read and the frame of
        this worker that held the device then (a reader must not take a frame's own use, seen
        just before it ended, for another program's)."""
        holders = {u: fid for fid, r in self.running.items() for u in r.claim.gpu_uuids}
        for s in samples.values():
            self._device_values[s.uuid] = {
                "uuid": s.uuid, "utilization_pct": s.utilization_pct, "memory_used_bytes": s.memory_used_bytes,
                "memory_free_bytes": s.memory_free_bytes, "sampled_at": now, "frame_id": holders.get(s.uuid)}

    # -- stopping --------------------------------------------------------------------------
    def drain(self, why: str = "asked to stop") -> None:
        """First SIGTERM/SIGINT: claim nothing more; running frames finish. While the store
        is down, for one lease at most (``stranded``)."""
        if not self.draining and self.say:
            waits = f"; {len(self.pending)} result(s) wait for the store" if self.pending else ""
            if self._store_down_mono is not None:
                waits += (f"; the store is unavailable: if it does not answer within {self.opts.lease_timeout_s:g} s, "
                          "running frames are stopped and the worker exits")
            self.say(f"draining ({why}): claiming no more frames; {len(self.running)} running frame(s) "
                     f"finish first{waits} (signal again to stop them now)")
        if not self.draining:
            self.drain_started = time.monotonic()
        self.draining = True

    def abort(self) -> None:
        """Second signal: kill running frames and give them back to the queue."""
        if (self.running or self.pending) and self.say:
            unrecorded = (f"; {len(self.pending)} result(s) the store has not recorded are left to the next "
                          "worker's recovery (requeued)") if self.pending else ""
            self.say(f"stopping: killing {len(self.running)} running frame(s) and requeueing them{unrecorded}")
        now = self.store.clock()
        for rf in list(self.running.values()):
            rf.proc.kill_and_wait(grace=min(self.opts.kill_grace_s, 2.0), reason="worker stopping")
            for lock in rf.locks:
                lock.release()
            self.runfiles.clear(rf.runfile)
            try:
                self.store.requeue_frame(rf.claim.frame_id, rf.claim.attempt, now=now, reason="worker stopped")
            except StoreError:
                pass  # the lease expires and another worker reaps it
        self.running.clear()

    def is_idle(self) -> bool:
        """``--until-idle``: nothing running here, nothing waiting that this host could
        ever run, and nothing running anywhere that could release more work. Waiting layers
        that ask for more cores or memory than this host has are noted in ``too_big``."""
        if self.running or self.pending or self._delivering():
            return False
        if not self._nothing_fits and not self.draining and not self._reached_max():
            return False
        if self.draining or self._reached_max():
            return True
        self.too_big = {}
        for layer in self._runnable(all_sizes=True):  # (too big ones too: they are reported)
            if not self._accepts(layer):
                continue
            if self._could_ever_run(layer):
                return False
            if layer.gpus <= 0 and not self.opts.gpu_only:
                why = cpu_fits(layer.cores, layer.memory_bytes, CpuPool(self.opts.cores, self.opts.memory_bytes))
                if why is not None:
                    self.too_big[layer.layer_id] = (f"job {layer.job_id} ({layer.job}) layer {layer.layer} needs "
                                                    f"{_cpu_need(layer)}; this host has {self.opts.cores:g} "
                                                    f"cores and {format_bytes(self.opts.memory_bytes)}")
        return self.store.running_count() == 0

    def done(self) -> bool:
        if self.draining or self._reached_max():
            return not self.running and not self.pending and not self._delivering()
        return False

    def _crash_point(self, name: str) -> None:
        if self.opts.crash_at == name:
            os._exit(99)  # chaos tests: die exactly here, like a SIGKILL would


class _NoDirectory(CuectlError):
    """The frame's working directory does not exist on this host."""


class _BadRow(CuectlError):
    """A claimed row holds what no cuectl writes (a hostile writer of the store): the frame
    fails, the worker goes on."""


#: Runnable layers read per page; a dispatch pass reads on until it has seen them all.
RUNNABLE_PAGE = 500

#: A store that failed is asked again after this, doubled at each failure up to the max
#: (docs/reliability.md, "Disk full"); the loop goes on meanwhile (frames, logs, signals).
STORE_RETRY_FIRST_S = 0.1
STORE_RETRY_MAX_S = 5.0

#: CPU frames of one layer claimed in one store transaction at most (as many as fit the
#: free cores; a pass claims on until none fit).
CLAIM_BATCH = 8

#: How long a root worker trusts what it read of a frame user's account (uid, primary and
#: supplementary groups, home): a removed user or group membership stops applying to new
#: frames within this time (nscd and sssd keep such answers for minutes).
RUN_AS_TTL_S = 10.0
# Environment templates a worker keeps (``Worker._frame_env``): one per layer and set of
# devices it ran frames of lately.
ENV_TEMPLATES_KEPT = 256


def _describe_need(request: GpuRequest) -> str:
    """``4 × NVIDIA 'A100'`` — what a reservation waits for, short."""
    parts = [f"{request.gpus} \u00d7 {request.gpu_vendor or 'GPU'}"]
    if request.gpu_models:
        parts.append(" or ".join(repr(name) for name in request.gpu_models))
    if request.gpu_memory_min_bytes:
        parts.append(f">= {format_bytes(request.gpu_memory_min_bytes)}")
    return " ".join(parts)


def _cpu_need(layer: RunnableLayer) -> str:
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


def _identity(devices: Sequence[Device]) -> list[tuple[Any, ...]]:
    """What the store's copy of the inventory must follow (live values aside)."""
    return [(d.index, d.uuid, d.vendor, d.model, d.backend, d.memory_total_bytes, d.mig_parent_uuid) for d in devices]


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


def _log_failure(path: Path, line: str, rqlog: launch.RqlogLink | None = None) -> None:
    """Best effort: say in the frame's log why it never started (never following a link);
    ``rqlog``: so that CueGUI shows that note as the frame's latest log."""
    launch.append_log_note(path, line, rqlog=rqlog)


def proc_started(proc: launch.FrameProcess, default: float) -> float:
    return getattr(proc, "_started_at", default)


class RunFiles:
    """The run files of this worker's frames, one per running frame, in the state directory.

    A run file records an attempt about to start. It is written *before* the frame process
    exists, so no pid is known: a restarted worker finds the frame's processes by the
    environment every one of them inherits (``CUE_FRAME_ID``, ``CUE_ATTEMPT`` and
    ``CUE_LOG_PATH``, unique to this store's attempt) and kills the process groups they
    lead (``launch.kill_by_env``).

    The files are slots (``run-0.json``, ``run-1.json``, ...), as many as frames ran at once,
    rewritten in place and blanked when their frame ends, never created and deleted per
    frame: on ext4 a file created after many recent deletions costs the kernel a scan past
    the freed inodes, which made each no-op frame's two file creations (run file and log)
    cost ~0.6 ms of system time. A slot is written with one ``pwrite`` (padded with blanks
    to the slot's size, so no truncation either): a record a crash cut short was written
    before its frame existed, and recovery ignores a run file it cannot read, blank or torn
    (the store requeues the frame)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._free: list[int] = []  # slots blanked, lowest first
        self._slots = 0  # slots this process made
        # Each slot this process opened: its descriptor (kept open) and the file's size in
        # bytes (it never shrinks: shorter records are padded).
        self._open: dict[Path, tuple[int, int]] = {}
        self._paths: dict[int, Path] = {}  # slot -> its path, made once

    def write(self, claim: ClaimedFrame, log_path: str | None = None) -> Path:
        """Record ``claim`` in a free slot; the slot's path (handed back to ``clear``).
        ``log_path``: the claim's, normalised as ``str(Path(...))`` makes it, when known."""
        if self._free:
            slot = heapq.heappop(self._free)
        else:
            slot, self._slots = self._slots, self._slots + 1
        path = self._paths.get(slot)
        if path is None:
            path = self._paths[slot] = self.state_dir / f"run-{slot}.json"
        data = json.dumps({"frame_id": claim.frame_id, "attempt": claim.attempt,
                           "log_path": log_path if log_path is not None else str(Path(claim.log_path)),
                           "worker_pid": os.getpid()}).encode()
        try:
            self._put(path, data)
        except BaseException:
            heapq.heappush(self._free, slot)
            raise
        return path

    def clear(self, path: Path) -> None:
        """The frame of ``path`` ended (or never started): blank its slot for the next one."""
        if path not in self._open:
            return
        with contextlib.suppress(OSError):  # a slot that cannot be blanked is made afresh
            self._put(path, b"")
        heapq.heappush(self._free, int(path.stem.partition("-")[2]))

    def _put(self, path: Path, data: bytes) -> None:
        fd, size = self._open.get(path, (-1, 0))
        if fd < 0:
            # First use in this process: a slot may hold a longer record of an earlier worker
            # (recovery deletes them, but a worker may run without recovering), so it is
            # truncated once; the descriptor then stays open for the worker's life.
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            self._open[path] = (fd, 0)
        padded = data.ljust(size, b" ")
        try:
            if os.pwrite(fd, padded, 0) != len(padded):
                raise OSError(errno.EIO, f"short write to {path}")
        except BaseException:
            self._drop(path)
            raise
        self._open[path] = (fd, max(size, len(padded)))

    def _drop(self, path: Path) -> None:
        fd, _ = self._open.pop(path, (-1, 0))
        if fd >= 0:
            os.close(fd)

    def remove_free(self) -> None:
        """The worker is stopping: delete the blank slots (a slot naming a frame that still
        runs stays, for the next worker's recovery) and close their descriptors."""
        for slot in self._free:
            path = self.state_dir / f"run-{slot}.json"
            if path in self._open:
                with contextlib.suppress(OSError):
                    path.unlink()
                self._drop(path)
        self._free = []

    def close(self) -> None:
        """Close the slots' descriptors (the files stay, blank or naming a running frame)."""
        for path in list(self._open):
            self._drop(path)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


#: In the state directory: the lock a worker holds for its whole life (and its record).
WORKER_LOCK = "worker.lock"


class WorkerAlreadyRunning(Conflict):
    """Another worker holds this host name's state directory on this machine."""


def hold_state_dir(state_dir: Path, name: str) -> int:
    """Take the state directory's worker lock without waiting and return its fd.

    One worker per host name and state directory (as slurmd or HTCondor's startd: one
    daemon per host). The ``flock`` is dropped by the kernel when the worker dies, however
    it dies, so holding it proves that every earlier owner of the run files is gone. The fd
    is close-on-exec and never passed to a frame: an orphaned frame must not keep it.
    Raises ``WorkerAlreadyRunning``, naming the live worker, when another one holds it.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / WORKER_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            record = json.loads(os.pread(fd, 4096, 0) or b"{}")
        except (OSError, ValueError):
            record = {}
        os.close(fd)
        pid = record.get("pid") if isinstance(record, dict) else None
        since = record.get("since") if isinstance(record, dict) else None
        who = f"pid {pid}" if isinstance(pid, int) else "an unknown pid"
        when = f", running since {iso(since)}" if isinstance(since, (int, float)) else ""
        raise WorkerAlreadyRunning(
            f"another cuectl worker ({who}{when}) is already running as host {name!r} on this machine "
            f"(state dir {state_dir})",
            hint="stop it first, or give this worker another --name: workers with different names share "
                 "this host's GPUs through device leases") from None
    except BaseException:
        os.close(fd)
        raise
    data = json.dumps({"pid": os.getpid(), "name": name, "since": time.time()}).encode()
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    except OSError:
        pass  # the record only names us in the refusal above; the lock is what counts
    return fd


def _claimer_may_live(worker: Any) -> bool:
    """Could the worker that claimed a frame (``"name:pid"`` in the store) still be alive on
    this machine? Its pid is ours (we just started: not us) or not alive: it is gone."""
    try:
        pid = int(str(worker).rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return False
    return pid != os.getpid() and pid_alive(pid)


def _same_process(info: dict) -> bool:
    """Is the run file's process still the frame we started (not a recycled pid)?"""
    pid, pgid = int(info.get("pid") or 0), int(info.get("pgid") or 0)
    if pgid <= 1 or not launch.process_group_alive(pgid):
        return False
    try:
        import psutil

        proc = psutil.Process(pid)
        created = info.get("create_time")
        return created is None or abs(proc.create_time() - float(created)) < 0.01
    except Exception:
        # The leader is gone but its group lives on (children of the frame): still ours.
        return True


# -- frames' real end times -----------------------------------------------------------------------
class ExitWatch:
    """Notes when running frames end while the loop is held up (a store call that waits on a
    silent server, a slow pass): the loop reaps a frame only when it gets back, and the end
    it records must be the frame's, not that (a 2 s frame read 8.4 s after an 8 s stall).
    A thread that looks every ``every`` s, and only while one iteration has lasted longer
    than ``after`` s: an idle or quick worker pays a timer wake-up, nothing per frame."""

    def __init__(self, worker: Worker, *, after: float = 0.2, every: float = 0.1) -> None:
        self.worker, self.after, self.every = worker, after, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cuectl-exit-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            since = self.worker.busy_since
            if since is None or time.monotonic() - since < self.after:
                continue
            for rf in list(self.worker.running.values()):
                rf.proc.note_exit()


# -- the supervisor ----------------------------------------------------------------------------
class Supervisor:
    """Drives ``Worker.loop()``: sleeps between iterations, wakes on child exit or signal,
    turns SIGTERM/SIGINT into drain (first) and abort (second), and SIGHUP into a look for
    GPUs that vanished or appeared (at the next iteration)."""

    def __init__(self, worker: Worker, *, on_iteration: Callable[[Worker], None] | None = None) -> None:
        self.worker = worker
        self.signals = 0
        self.last_signal = ""
        self.on_iteration = on_iteration
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    # After a signal, a store call that has waited this long for its server is abandoned
    # (and the store not asked again for STALL_S), so the worker acts within 2 s.
    HUNG_CALL_S = 1.0
    STALL_S = 5.0

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signals += 1
        try:
            self.last_signal = signal.Signals(signum).name
        except ValueError:
            self.last_signal = f"signal {signum}"
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        # The loop acts on it at its next iteration: unless a store call hangs (a server
        # that stopped answering), which the alarm then abandons, so that a worker obeys
        # SIGTERM within 2 s whatever the store does. It keeps watching until the end.
        signal.setitimer(signal.ITIMER_REAL, 0.25, 0.25)

    def _on_hup(self, signum: int, frame: Any) -> None:
        """SIGHUP (`systemctl reload`, `kill -HUP`): find the GPUs again; not a stop signal."""
        self.worker.ask_rediscover()
        try:
            os.write(self._wake_w, b"h")
        except OSError:
            pass

    def _on_alarm(self, signum: int, frame: Any) -> None:
        store = self.worker.store
        since = store.calling_since
        if since is not None and time.monotonic() - since > self.HUNG_CALL_S:
            why = f"did not answer for {self.HUNG_CALL_S:g} s; abandoned the call to act on a signal"
            store.stall(self.STALL_S, why=why)
            raise StoreStalled(f"store {store.url} {why}")

    def install_signals(self, *, hangup_stops: bool = False) -> None:
        """SIGTERM/SIGINT drain (then abort); SIGHUP re-discovers the GPUs, unless
        ``hangup_stops`` (a worker in a terminal: there SIGHUP means the terminal is gone,
        and it drains as on SIGTERM)."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGALRM, self._on_alarm)
        if hasattr(signal, "SIGHUP"):
            signal.signal(signal.SIGHUP, self._on_signal if hangup_stops else self._on_hup)

    def _start(self) -> bool:
        """Register and recover, retrying while the store is busy; False if told to stop."""
        w, delay = self.worker, 0.1
        said: str | None = None
        while True:
            w.write_heartbeat_file(force=True)  # alive while it waits for the store (liveness)
            try:
                w.register(w.store.clock())
                w.recover(w.store.clock())
                w.write_heartbeat_file(force=True)  # registered: ready
                locked = w.host_locked()
            except StoreError as exc:
                if w.warn and exc.message != said:
                    w.warn(f"store unavailable, retrying (back-off up to {STORE_RETRY_MAX_S:g} s): {exc.message}")
                said = exc.message  # one line per error, not one per try
                if self.signals:
                    return False
                time.sleep(delay)
                delay = min(delay * 2, STORE_RETRY_MAX_S)
                continue
            if locked and w.opts.until_idle:
                # Nothing could ever run here: say so instead of exiting 0 having done nothing.
                raise Conflict(f"host {w.opts.name} is locked: an --until-idle worker would run nothing",
                               hint=f"cuectl host unlock {w.opts.name}")
            if locked and w.say:
                w.say(f"host {w.opts.name} is locked: claiming nothing until `cuectl host unlock {w.opts.name}`")
            return True

    def _finished(self) -> bool:
        w = self.worker
        try:
            return w.done() or (w.opts.until_idle and w.is_idle())
        except StoreError:
            return False  # cannot tell now; look again next iteration

    def run(self) -> int:
        watch = ExitWatch(self.worker)
        watch.start()
        try:
            return self._run()
        finally:
            watch.stop()
            # Whatever ended the loop (idle, drained, a second signal, an error), this
            # process no longer works for the host: it signs off (still under the hung-call
            # watch, so a silent store cannot hold a signalled worker's exit).
            self.worker.sign_off()
            signal.setitimer(signal.ITIMER_REAL, 0)  # the hung-call watch ends with the loop
            self.worker.release_runfiles()

    def _run(self) -> int:
        w = self.worker
        if not self._start():
            return 130
        handled = 0
        while True:
            if self.signals > handled:
                handled = self.signals
                if handled == 1:
                    w.drain(self.last_signal or "asked to stop")
                else:
                    w.abort()
                    return 130
            # Every store call of an iteration, `_finished`'s look at the queue too, runs
            # marked busy: a frame that ends while one waits on a silent server keeps its
            # real end time (ExitWatch).
            w.busy_since = time.monotonic()
            try:
                stats = w.loop()
                finished = self._finished()
            except StoreGone:
                w.abort()  # its frames' results could never be recorded: stop them now
                raise
            finally:
                w.busy_since = None
            if self.on_iteration:
                self.on_iteration(w)
            if not finished and w.stranded():
                w.stop_without_store()  # raises: one error line, exit 1
            if finished:
                if w.opts.until_idle and w.too_big and not w.draining and not w._reached_max():
                    # Idle, but work is left that no frame here could ever take: say so
                    # rather than exit 0 as if the queue were done.
                    reasons = list(w.too_big.values())
                    more = f" (and {len(reasons) - 1} more layer(s))" if len(reasons) > 1 else ""
                    raise CuectlError(f"idle, but waiting work can never run on this host: {reasons[0]}{more}",
                                      hint="submit it with fewer --cores/--memory, or run it on a bigger host "
                                           "(`cuectl job why JOB`)")
                return 0
            if stats.claimed or stats.finished:
                continue  # a slot freed or work started: look again at once
            self._sleep(w)

    def _sleep(self, w: Worker) -> None:
        """Wait for a frame to exit, a signal, queued work (the store's NOTIFY, where it has
        one), or the next poll/heartbeat — whichever first."""
        timeout = w.opts.poll_s
        now = w.store.clock()
        due = w._next_heartbeat - now
        if w._store_retry_at is not None:  # the store is down: no heartbeat before its back-off ends
            due = max(due, w._store_retry_at - time.monotonic())
        timeout = max(0.0, min(timeout, due))
        if w.running:
            timeout = min(timeout, max(0.0, min(rf.next_sample for rf in w.running.values()) - now))
        if w.devices and w.sampler is not None:  # every device is sampled each interval
            timeout = min(timeout, max(0.0, w._next_device_sample - now))
        fds = [self._wake_r]
        # PostgreSQL: the store's connection turns readable on NOTIFY, so new work is
        # dispatched at once instead of at the next poll (None: the store cannot tell).
        # A NOTIFY read with the last pass's results no longer makes it readable: the
        # store kept it, and we look at the queue again at once.
        store_fd = w.store.notify_fileno()
        if store_fd is not None:
            fds.append(store_fd)
            w.busy_since = time.monotonic()  # a store call (ExitWatch)
            try:
                if w.store.drain_notifications():
                    timeout = 0.0
            finally:
                w.busy_since = None
        pidfds = []
        for rf in w.running.values():
            if rf.proc.pid and hasattr(os, "pidfd_open"):
                try:
                    pidfds.append(os.pidfd_open(rf.proc.pid))
                except OSError:
                    timeout = min(timeout, 0.05)
            elif w.running:
                timeout = min(timeout, 0.05)
        try:
            ready, _, _ = select.select(fds + pidfds, [], [], timeout)
            if store_fd is not None and store_fd in ready:
                w.store.drain_notifications()
            if self._wake_r in ready:
                try:
                    os.read(self._wake_r, 64)
                except OSError:
                    pass
        finally:
            for fd in pidfds:
                os.close(fd)
