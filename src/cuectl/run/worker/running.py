"""The running-frame table: launching a claimed frame (its tokens, environment and account,
cached), the frames that run, finishing them (usage, why an attempt failed: exit, log tail,
kernel OOM evidence) and stopping them all."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cuectl import config
from cuectl.errors import CuectlError, StoreError
from cuectl.gpu.device import Device
from cuectl.run import failure as failures
from cuectl.run import launch, logs
from cuectl.run.lease import DeviceLock, isolation_env, isolation_key, update_holder
from cuectl.run.usage import UsageTracker
from cuectl.sched.store import ClaimedFrame, FrameResult

from . import shares
from .recovery import RunFiles
from .storeview import Pending

if TYPE_CHECKING:
    from cuectl.run.worker.core import Worker

#: How long a root worker trusts what it read of a frame user's account (uid, primary and
#: supplementary groups, home): a removed user or group membership stops applying to new
#: frames within this time (nscd and sssd keep such answers for minutes).
RUN_AS_TTL_S = 10.0
# Environment templates a worker keeps (``FrameTable.frame_env``): one per layer and set of
# devices it ran frames of lately.
ENV_TEMPLATES_KEPT = 256


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
    # Why the worker itself stopped the frame (a GPU policy: an escape, devices held idle, a
    # share over its budget; a sick device): the attempt's failure whatever its exit status
    # says (``FrameTable.stop``). None: not stopped by the worker.
    stopped_for: failures.Failure | None = None
    # What the GPU checks keep between samples for this frame (run/worker/gpuwatch.py).
    watch: dict[str, Any] = field(default_factory=dict)


class _NoDirectory(CuectlError):
    """The frame's working directory does not exist on this host."""


class _BadRow(CuectlError):
    """A claimed row holds what no cuectl writes (a hostile writer of the store): the frame
    fails, the worker goes on."""


@dataclass
class FrameTable:
    """This worker's running frames (frame id -> ``RunningFrame``) and what launching them
    keeps from one frame to the next."""

    worker: "Worker"
    running: dict[int, RunningFrame] = field(default_factory=dict)
    # The cgroup OOM-kill counter when each running frame started (kernel OOM evidence).
    oom_counts: dict[int, int | None] = field(default_factory=dict)
    # This process's memory cgroup (failures.own_cgroup_dir), looked up once: reading and
    # parsing /proc/self/mountinfo for every frame was a quarter of the worker's CPU per
    # no-op frame. False: not looked up yet.
    cgroup_dir: Path | None | bool = False
    oom_read: tuple[float, int | None] = (-1e18, None)  # (monotonic time, counter) of the last reading
    # The environment frames start from (config.inherited_environ), copied once: decoding
    # os.environ for every frame cost ~0.8 ms of CPU.
    base_env: dict[str, str] | None = None
    # The environment every frame of a layer shares on the same devices (launch.EnvTemplate),
    # keyed by everything it is made of (``frame_env``).
    env_templates: dict[tuple[Any, ...], launch.EnvTemplate] = field(default_factory=dict)
    log_root_path: Path | None = None
    runfiles_made: RunFiles | None = None
    # Accounts frames run as (RunAs.lookup), looked up again after RUN_AS_TTL_S: reading
    # /etc/passwd and /etc/group for every frame was ~5 % of a no-op frame's cost.
    run_as: dict[str, tuple[float, launch.RunAs]] = field(default_factory=dict)
    # Jobs whose OpenCue log link (logs.rqlog_name) could not be made, already warned about:
    # one line per job, not one per frame.
    rqlog_warned: set[int] = field(default_factory=set)

    @property
    def runfiles(self) -> RunFiles:
        if self.runfiles_made is None:
            self.runfiles_made = RunFiles(self.worker.opts.state_dir)
        return self.runfiles_made

    def release_runfiles(self, *, delete_blank: bool = True) -> None:
        """Close the run files' descriptors and, with ``delete_blank`` (stopping), delete the
        blank slots: a frame still running keeps its run file, for the next worker's
        recovery. Recovery, which has just deleted the files itself, only closes them."""
        if self.runfiles_made is None:
            return
        if delete_blank:
            self.runfiles_made.remove_free()
        self.runfiles_made.close()  # a later write opens its slot afresh

    # -- launching -------------------------------------------------------------------------
    def start(self, claim: ClaimedFrame, locks: list[DeviceLock], devices: tuple[Device, ...], now: float) -> None:
        w = self.worker
        opts = w.opts
        log_path = Path(claim.log_path)  # one Path a frame: each costs a parse (hot path)
        ctx = launch.FrameContext(
            job=claim.job,
            job_id=str(claim.job_id),
            layer=claim.layer,
            layer_id=str(claim.layer_id),
            frame_id=str(claim.frame_id),
            frame_number=claim.number,
            frames=claim.frames,
            layer_range=claim.layer_range,
            chunk=claim.chunk,
            attempt=claim.attempt,
            cores=claim.cores,
            memory_bytes=claim.memory_bytes,
            # A share's memory is its budget (gpu_share), not the device's.
            gpu_memory_bytes=(
                claim.gpu_share_bytes or min((d.memory_total_bytes or 0 for d in devices), default=None)
                if devices
                else None
            ),
            log_path=log_path,
            user=claim.user,
            show=claim.show or "",
            shot=claim.shot or "",
        )
        runfile: Path | None = None
        try:
            if type(claim.number) is not int:  # SQLite keeps any value in an INTEGER column
                raise _BadRow(
                    f"frame {claim.frame_id} of job {claim.job_id} has the number {claim.number!r} "
                    "in the store, not an integer (the row was edited): refused"
                )
            if opts.run_as_submitter:
                w.proofs.check_layer(claim)
            run_as = self.lookup_run_as(claim.user) if opts.run_as_submitter else None
            argv = launch.substitute_tokens(claim.command, ctx)
            env = self.frame_env(claim, ctx, devices, run_as)
            # Before the frame exists: a worker killed at any point after this leaves a run
            # file naming every process the frame will start (by its environment).
            if claim.cwd is not None and not os.path.isdir(claim.cwd):
                raise _NoDirectory(f"working directory {claim.cwd} does not exist on host {opts.name}")
            runfile = self.runfiles.write(claim, str(log_path))
            rqlog = self.rqlog(claim)
            proc = launch.FrameProcess.start(
                argv,
                env=env,
                log_path=log_path,
                pass_fds=[fd for lk in locks for fd in lk.share_fds()],
                cwd=claim.cwd,
                timeout_s=claim.timeout_s,
                grace=opts.kill_grace_s,
                run_as=run_as,
                header=launch.log_header(str(claim.frame_id), claim.attempt, opts.name),
                log_root=self.log_root(),
                log_limit=claim.log_limit_bytes or opts.log_limit_bytes,
                footer=(str(claim.frame_id), claim.attempt),
                rqlog=rqlog,
            )
        except Exception as exc:  # bad command/env, unknown user, unwritable log: fail this attempt
            for lock in locks:
                lock.release()
            if runfile is not None:
                self.runfiles.clear(runfile)
            message = getattr(exc, "message", None) or str(exc)
            if isinstance(exc, _BadRow):
                w.tell_warn(message)
            _log_failure(Path(claim.log_path), f"cuectl: frame not started: {message}", self.rqlog(claim))
            why = failures.classify(exit_code=126, exit_signal=None, timed_out=False, launch_error=message)
            # A directory missing here may exist on another host (a share not mounted yet):
            # a failure like any other, retried, rather than one that never could succeed.
            permanent = bool(why and why.permanent) and not isinstance(exc, _NoDirectory)
            w.link.report(
                claim.frame_id,
                claim.attempt,
                FrameResult(
                    exit_code=126,
                    started_at=now,
                    ended_at=time.time(),
                    usage={"error": message},
                    failure_kind=why.kind if why else "launch",
                    failure=why.text if why else message,
                    permanent=permanent,
                ),
            )
            return
        for lock in locks:
            update_holder(lock, pid=proc.pid, holder=f"frame {claim.frame_id}")
        tracker = UsageTracker([d.uuid for d in devices], proc_started(proc, now))
        rf = RunningFrame(
            claim=claim, proc=proc, locks=locks, devices=devices, usage=tracker, runfile=runfile, next_sample=now
        )  # sample at once: short frames get data too
        if claim.gpu_share_bytes:
            tracker.share_fraction = shares.fraction(rf)  # a share counts its part of the device
        self.running[claim.frame_id] = rf
        self.oom_counts[claim.frame_id] = self.oom_kills()
        w.crash_point("after_launch")

    def frame_env(
        self, claim: ClaimedFrame, ctx: launch.FrameContext, devices: tuple[Device, ...], run_as: launch.RunAs | None
    ) -> dict[str, str]:
        """The frame's environment (``launch.frame_env``), from the template its layer's
        frames share on these devices: made for the first of them, kept under everything
        it is made of, so a change to any (a layer edited, another account, the inventory)
        makes a new one. Raises as ``frame_env`` does."""
        vendors = self.worker.vendors()
        run_env = run_as.env() if run_as else {}
        key: tuple[Any, ...] | None
        try:
            key = (
                claim.layer_id,
                claim.job_id,
                claim.job,
                claim.layer,
                claim.user,
                ctx.show,
                ctx.shot,
                claim.layer_range,
                claim.chunk,
                claim.cores,
                claim.memory_bytes,
                ctx.gpu_memory_bytes,
                tuple(run_env.items()),
                tuple(claim.env.items()),
                isolation_key(devices, all_vendors_present=vendors),
                claim.gpu_share_bytes,
            )
            template = self.env_templates.get(key)
        except (TypeError, AttributeError):  # a hostile row's env (not a mapping of strings): made afresh, refused
            key, template = None, None
        if template is None:
            if self.base_env is None:
                self.base_env = launch.frame_base(config.inherited_environ())
            isolation = isolation_env(list(devices), all_vendors_present=vendors)
            if claim.gpu_share_bytes:  # its budget, and MPS's limit where MPS runs (shares.py)
                isolation.update(shares.frame_env(claim.gpu_share_bytes, {**self.base_env, **claim.env}))
            template = launch.env_template(
                ctx,
                layer_env={**run_env, **claim.env},
                isolation=isolation,
                base=self.base_env,
            )
            if key is not None:
                if len(self.env_templates) >= ENV_TEMPLATES_KEPT:
                    self.env_templates.clear()  # many layers over a long life: start again
                self.env_templates[key] = template
        return template.env(ctx)

    def rqlog(self, claim: ClaimedFrame) -> launch.RqlogLink | None:
        """The OpenCue-named link for the claim's log (CueGUI opens logs by those names); None
        when the job's name cannot be a file name (logs.rqlog_name): that job has no links."""
        if type(claim.number) is not int:  # a hostile row, refused at launch: no name to link
            return None
        name = logs.rqlog_name(claim.job, launch.frame_name(claim.number, claim.layer))
        if name is None:
            return None
        job_id = claim.job_id
        return launch.RqlogLink(name, lambda message: self.warn_rqlog(job_id, message))

    def warn_rqlog(self, job_id: int, message: str) -> None:
        """Say once per job that its OpenCue log links cannot be made (a link planted in place
        of ``rqlog/``, a full disk): the frames run on, only CueGUI cannot show their logs."""
        if job_id in self.rqlog_warned:
            return
        if len(self.rqlog_warned) >= 4096:  # a worker lives for months: keep the memory bounded
            self.rqlog_warned.clear()
        self.rqlog_warned.add(job_id)
        self.worker.tell_warn(f"job {job_id}: {message} (CueGUI cannot open its logs; the frames run as ever)")

    def log_root(self) -> Path:
        """``--log-dir`` as a Path, made once (each costs a parse; this is the hot path)."""
        if self.log_root_path is None:  # (the options are frozen)
            self.log_root_path = Path(self.worker.opts.log_dir)
        return self.log_root_path

    def lookup_run_as(self, user: str) -> launch.RunAs:
        """The account ``user`` (uid, groups, home), as the system said at most
        RUN_AS_TTL_S ago; a user that does not exist is asked about again every time."""
        clock = time.monotonic()
        cached = self.run_as.get(user)
        if cached is not None and clock - cached[0] < RUN_AS_TTL_S:
            return cached[1]
        if len(self.run_as) > 1024:  # many users over a long life: start again
            self.run_as.clear()
        run_as = launch.RunAs.lookup(user)
        self.run_as[user] = (clock, run_as)
        return run_as

    # -- finishing -------------------------------------------------------------------------
    def collect_finished(self) -> None:
        for frame_id, rf in list(self.running.items()):
            info = rf.proc.poll()
            if info is None:
                continue
            self.finish(rf, info)
            del self.running[frame_id]

    def finish(self, rf: RunningFrame, info: launch.ExitInfo) -> None:
        w = self.worker
        if rf.devices and w.sampler is not None:
            w.sampling.sample_frames([rf], info.ended_at)
        for lock in rf.locks:
            lock.release()
        self.runfiles.clear(rf.runfile)
        if rf.lost:
            return  # the store gave this attempt to someone else; our report would be fenced anyway
        usage = rf.usage.summary(info.ended_at)
        if rf.devices:
            usage["gpu_models"] = [d.model for d in rf.devices]
            idle = w.gpuwatch.idle_seconds(rf)
            if idle is not None:
                usage["gpu_idle_seconds"] = idle  # held idle past the layer's limit (admin report)
        w.gpuwatch.forget(rf.claim.frame_id)
        why = self.why_failed(rf, info)
        result = FrameResult(
            exit_code=info.exit_code,
            exit_signal=info.exit_signal,
            timed_out=info.timed_out,
            started_at=info.started_at,
            ended_at=info.ended_at,
            max_rss_bytes=info.max_rss_bytes,
            cpu_seconds=info.cpu_seconds,
            user_action=rf.user_action,
            usage=usage,
            failure_kind=why.kind if why else None,
            failure=why.text if why else None,
            permanent=bool(why and why.permanent),
        )
        w.crash_point("before_complete")
        # Recorded with this iteration's next claim, or at its end (``Worker.loop``).
        stats = w.stats
        w.link.pending.append(Pending(rf.claim.frame_id, rf.claim.attempt, result, ended=len(stats.ended)))
        stats.finished += 1
        stats.ended.append((rf.claim, info, None))

    def why_failed(self, rf: RunningFrame, info: launch.ExitInfo) -> failures.Failure | None:
        """Why the attempt failed, from its exit, its log's tail (GPU out of memory) and the
        kernel's OOM-kill counter (it rose while the frame ran: the OOM killer); a frame the
        worker stopped (``stop``) failed for that reason, however it exited."""
        before = self.oom_counts.pop(rf.claim.frame_id, None)  # (popped for every frame: no leak)
        if rf.stopped_for is not None and rf.user_action is None:
            return rf.stopped_for
        if info.exit_code == 0 and not info.timed_out and not info.exit_signal and rf.user_action is None:
            return failures.log_lost() if info.log_lost else None
        after = self.oom_kills(fresh=True) if before is not None else None
        oom = before is not None and after is not None and after > before
        why = failures.classify(
            exit_code=info.exit_code,
            exit_signal=info.exit_signal,
            timed_out=info.timed_out,
            user_action=rf.user_action,
            oom_killed=oom,
            timeout_s=rf.claim.timeout_s,
            log_tail=failures.read_log_tail(Path(rf.claim.log_path)),
        )
        if why is not None and info.log_lost:  # the attempt says so too, not only its log
            why = failures.Failure(why.kind, f"{why.text}; {failures.log_lost().text}", why.permanent)
        return why

    def oom_kills(self, *, fresh: bool = False) -> int | None:
        """The kernel's OOM-kill counter of this worker's memory cgroup (None: none). Frames
        launched in one dispatch pass share one reading (it is the cgroup's counter, not the
        frame's); ``fresh`` reads it now (a failed frame's "after")."""
        if self.cgroup_dir is False:
            self.cgroup_dir = failures.own_cgroup_dir()
        if not isinstance(self.cgroup_dir, Path):
            return None
        clock = time.monotonic()
        if fresh or clock - self.oom_read[0] > 0.05:
            self.oom_read = (clock, failures.oom_kill_count(self.cgroup_dir))
        return self.oom_read[1]

    # -- stopping --------------------------------------------------------------------------
    def stop(self, rf: RunningFrame, failure: failures.Failure) -> bool:
        """Stop one frame for a reason of the worker's own (``failure``: its kind, e.g.
        ``gpu-escape``, and line), as a timeout does: TERM the group, KILL after the grace.
        The attempt ends with that failure (``why_failed``). False when it was already
        stopped or has ended (the first reason stands)."""
        if rf.stopped_for is not None or rf.proc.finished or rf.user_action is not None:
            return False
        rf.stopped_for = failure
        rf.proc.add_footer_note(f"stopped: {failure.text}")
        rf.proc.kill(grace=self.worker.opts.kill_grace_s, reason=failure.kind)
        self.worker.tell_warn(f"frame {rf.claim.frame_id} (job {rf.claim.job}) stopped: {failure.text}")
        return True

    def stop_all(self, reason: str, *, requeue: bool) -> list[int]:
        """Kill every running frame (a short grace), free its devices and run file and, with
        ``requeue``, give it back to the queue (best effort: else its lease expires and
        another worker reaps it); the frames stopped."""
        w = self.worker
        now = w.store.clock() if requeue else 0.0
        stopped = sorted(self.running)
        for rf in list(self.running.values()):
            rf.proc.kill_and_wait(grace=min(w.opts.kill_grace_s, 2.0), reason=reason)
            for lock in rf.locks:
                lock.release()
            self.runfiles.clear(rf.runfile)
            self.oom_counts.pop(rf.claim.frame_id, None)
            if requeue:
                try:
                    w.store.requeue_frame(rf.claim.frame_id, rf.claim.attempt, now=now, reason="worker stopped")
                except StoreError:
                    pass  # the lease expires and another worker reaps it
        self.running.clear()
        return stopped


def _log_failure(path: Path, line: str, rqlog: launch.RqlogLink | None = None) -> None:
    """Best effort: say in the frame's log why it never started (never following a link);
    ``rqlog``: so that CueGUI shows that note as the frame's latest log."""
    launch.append_log_note(path, line, rqlog=rqlog)


def proc_started(proc: launch.FrameProcess, default: float) -> float:
    return getattr(proc, "_started_at", default)
