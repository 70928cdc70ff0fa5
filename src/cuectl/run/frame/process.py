"""The frame process: one attempt running in its own session and process group
(:class:`FrameProcess`), its timeout and kill escalation, the processes it leaves behind,
RSS and CPU sampling, and how it ended (:class:`ExitInfo`, rusage)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from cuectl.errors import InvalidInput
from cuectl.run import procs
from cuectl.run.frame.start import CannotEnter, RunAs, Spawned, _start_child
from cuectl.run.framelog.write import (
    DEFAULT_LOG_LIMIT,
    RqlogLink,
    _append_log,
    _LogCap,
    _open_log_fds,
    _write_line,
    log_footer,
)
from cuectl.run.procs import (
    _LEADERS,
    _STRAGGLER_GIVE_UP_S,
    _WAIT_MAX_SLEEP_S,
    _WAIT_MIN_SLEEP_S,
    DEFAULT_GRACE_S,
    _descendants,
    _env_value,
    _group_pids,
    _signal_group,
    _signal_pids,
    file_ids,
    holds_file,
    leftover_children,
    process_group_alive,
    process_table,
)

if TYPE_CHECKING:
    from cuectl.run.procs import ProcessTable

DEFAULT_SAMPLE_INTERVAL_S = 1.0
# Shell conventions, so a frame that could not start reads like one that `sh` failed to run.
EXIT_NOT_FOUND = 127
EXIT_CANNOT_EXECUTE = 126


@dataclass(frozen=True)
class ExitInfo:
    """How a frame attempt ended.

    ``exit_code`` for a normal exit, else ``exit_signal`` (and ``exit_code`` None) when the
    leader died of a signal. ``killed``: cuectl signalled the frame before it exited (a user
    kill or a timeout); ``timed_out`` implies ``killed``. Times are epoch seconds.
    ``max_rss_bytes``: the largest of (a) the peak of sampled whole-tree RSS (a sum over
    processes, so shared pages count once per process), (b) the largest per-process peak
    (Linux ``VmHWM``) seen in those samples, and (c) the kernel's ``ru_maxrss`` of the leader
    and the descendants it waited for — (c) only when it exceeds the worker's own peak at
    spawn time, because a child's ru_maxrss starts from its parent's size. A spike between
    samples in a frame smaller than the worker can therefore be missed; None when nothing
    was measured. ``cpu_seconds``: user+system from the leader's rusage (on Linux this
    includes the descendants it waited for), or the last sample if larger (orphans that were
    reparented to init are only seen while sampled).
    """

    exit_code: int | None
    exit_signal: int | None
    timed_out: bool
    killed: bool
    started_at: float
    ended_at: float
    max_rss_bytes: int | None
    cpu_seconds: float | None
    kill_reason: str | None = None
    # The log's filesystem was full when the attempt ended: some of its output never
    # reached the log (``_LogCap.space_lost``), whatever the exit status says.
    log_lost: bool = False

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0 and not self.killed


class FrameProcess:
    """One frame attempt running in its own session and process group.

    Drive it with :meth:`poll` (non-blocking) or :meth:`wait`: timeouts, kill escalation and
    RSS sampling happen inside those calls, so a worker loop polling several frames needs no
    extra threads. We reap the leader ourselves with ``os.wait4`` (for its rusage); nothing
    else in the worker may ``waitpid(-1)``. Methods are serialised by a lock, so a signal
    handler thread may call :meth:`kill` while the main loop polls.

    When the leader exits, any processes left in its group (``cmd &`` in a script) are
    TERMed and, after the grace period, KILLed before the frame counts as finished — they
    may hold the inherited device lease, and a finished frame must not keep using a GPU.
    """

    pid: int
    pgid: int

    def __init__(
        self,
        *,
        popen: subprocess.Popen[bytes] | Spawned | None,
        log_path: Path,
        timeout_s: float | None,
        grace: float,
        sample_interval: float,
        started_at: float,
        spawner_maxrss: int = 0,
        immediate: ExitInfo | None = None,
        log_cap: _LogCap | None = None,
        footer: tuple[str, int] | None = None,
    ) -> None:
        self._popen = popen
        self.pid = popen.pid if popen is not None else 0
        # start_new_session=True: the child called setsid() before exec, so pgid == pid.
        self.pgid = self.pid
        self.log_path = _as_path(log_path)
        self._timeout_s = timeout_s
        self._grace = grace
        self._sample_interval = sample_interval
        self._started_at = started_at
        self._spawner_maxrss = spawner_maxrss
        self._t0 = time.monotonic()
        self._lock = threading.RLock()
        self._result = immediate
        # Leader status once reaped: (raw wait status or None if lost, rusage or None, time).
        self._reaped: tuple[int | None, object | None, float] | None = None
        # When another thread saw the leader exit (``note_exit``) before the owner reaped
        # it: a worker held up in a store call reaps late, and the frame's end is this.
        self.exit_seen_at: float | None = None
        self._killed = False
        self._timed_out = False
        self._kill_reason: str | None = None
        self._term_sent_at: float | None = None  # monotonic
        self._kill_deadline: float | None = None  # monotonic: SIGKILL due
        self._kill_sent_at: float | None = None
        # The first sample is taken once the frame is 0.1 s old (see _maybe_sample): a tree
        # walk scans /proc (milliseconds on a busy host), which would dominate frames that
        # finish in a few milliseconds; their peak RSS comes from the kernel's rusage.
        self._last_sample: float = self._t0
        self._sampled = False
        self._peak_rss = 0  # largest sampled sum of the tree's RSS
        self._peak_hwm = 0  # largest per-process high-water mark seen (Linux VmHWM)
        self._last_cpu = 0.0
        self._log_cap = log_cap  # owns a read-write fd of the log while the frame runs
        self._footer = footer  # (frame id, attempt): the log's last line says how it ended
        # Warnings the worker adds before that line (a GPU escape, devices held idle): the
        # end of the log is where a user looks first.
        self._footer_notes: list[str] = []
        # Escapees (see track_strays): the frame's CUE_FRAME_ID, its lease files, and the
        # strays already sent SIGTERM.
        self._marker: str | None = None
        self._lock_ids: frozenset[tuple[int, int]] = frozenset()
        self._termed_strays: set[int] = set()
        if popen is not None and immediate is None:
            _LEADERS[self.pid] = self

    def track_strays(self, *, marker: str | None, lock_fds: Sequence[int] = ()) -> None:
        """How to recognise this frame's processes once they left its session and tree
        (re-parented to this subreaper): ``CUE_FRAME_ID=marker`` in their environment, or
        one of the lease files behind ``lock_fds`` open. Members of the frame's session or
        process group are recognised anyway."""
        self._marker = marker
        self._lock_ids = file_ids(lock_fds)

    # -- start -------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        log_path: Path,
        cwd: str | Path | None = None,
        pass_fds: Sequence[int] = (),
        timeout_s: float | None = None,
        header: str | None = None,
        grace: float = DEFAULT_GRACE_S,
        sample_interval: float = DEFAULT_SAMPLE_INTERVAL_S,
        run_as: "RunAs | None" = None,
        log_root: str | Path | None = None,
        log_limit: int | None = DEFAULT_LOG_LIMIT,
        footer: tuple[str, int] | None = None,
        rqlog: RqlogLink | None = None,
    ) -> "FrameProcess":
        """Spawn ``argv`` with stdin from /dev/null and stdout+stderr appended to ``log_path``.

        ``header`` (see :func:`log_header`) is written before the child starts, so the log
        always says which attempt the following lines belong to. ``pass_fds`` stay open in
        the child — the device lease locks, so a device stays leased until the frame exits
        even if the worker dies. ``timeout_s`` counts from now; on expiry the group is TERMed
        and KILLed ``grace`` s later.

        A command that cannot be executed does not raise: the error goes to the log and the
        returned process has already finished with 127 (command or ``cwd`` not found) or 126
        (anything else: permission denied, not an executable, fork failure), as a shell
        would report it. Failing to open the log itself raises ``OSError``: there would be
        nowhere to say why. ``CannotEnter``: ``run_as`` may not enter ``cwd`` (in the log too).

        The log is opened by :func:`open_frame_log` (``log_root``: the worker's log
        directory; links are never followed) and handed to ``run_as``. ``log_limit``: bytes
        this attempt's log may keep (head and tail, see ``_LogCap``); None: no cap.
        ``footer`` (frame id, attempt): when the attempt ends, :func:`log_footer` is appended
        to the log, after any cut, saying how it ended. ``rqlog``: the OpenCue-named link
        pointed at this log once it is open (CueGUI's view of it; never fails the start).
        """
        argv = list(argv)
        if not argv:
            raise InvalidInput("command: empty argv")
        log_path = _as_path(log_path)
        root = _as_path(log_root) if log_root is not None else log_path.parent.parent
        fd, rw_fd = _open_log_fds(log_path, root, run_as, rw=log_limit is not None, rqlog=rqlog)
        log_cap = _LogCap(rw_fd, log_limit) if rw_fd is not None and log_limit is not None else None
        try:
            if header is not None:
                _write_line(fd, header)
            if log_cap is not None:
                log_cap.started()
            started_at = time.time()
            try:
                popen = _start_child(
                    argv,
                    env,
                    fd,
                    None if cwd is None else str(cwd),
                    tuple(pass_fds),
                    run_as.popen_kwargs() if run_as else {},
                )
                spawner_maxrss = _self_maxrss_bytes()
            except CannotEnter as exc:
                # Raised to the worker ("frame not started"), whose own note could not open
                # a log that already belongs to the frame's user: said here, once.
                _write_line(fd, f"cuectl: frame not started: {exc}")
                raise
            except (OSError, ValueError) as exc:
                code = _exec_failure_code(exc)
                _write_line(fd, f"cuectl: cannot run {argv[0]!r}: {_describe(exc)}")
                ended = time.time()
                info = ExitInfo(code, None, False, False, started_at, ended, None, None)
                line = log_footer(footer[0], footer[1], info) if footer is not None else None
                if log_cap is not None:
                    log_cap.finish(line)
                elif line is not None:
                    _write_line(fd, line)
                return cls(
                    popen=None,
                    log_path=log_path,
                    timeout_s=None,
                    grace=grace,
                    sample_interval=sample_interval,
                    started_at=started_at,
                    immediate=info,
                )
        except BaseException:
            if log_cap is not None:
                os.close(log_cap.fd)
            raise
        finally:
            os.close(fd)  # the child has its own copy (the worker keeps only the cap's)
        proc = cls(
            popen=popen,
            log_path=log_path,
            timeout_s=timeout_s,
            grace=grace,
            sample_interval=sample_interval,
            started_at=started_at,
            spawner_maxrss=spawner_maxrss,
            log_cap=log_cap,
            footer=footer,
        )
        if procs._subreaper:
            proc.track_strays(marker=env.get("CUE_FRAME_ID"), lock_fds=pass_fds)
        return proc

    # -- public state machine ----------------------------------------------------------

    def poll(self) -> ExitInfo | None:
        """Non-blocking: the result once the frame (leader and group) is gone, else None.

        Side effects: reaps the leader, samples RSS/CPU at most every ``sample_interval``,
        starts the kill on timeout, escalates TERM -> KILL when the grace period is over.
        """
        with self._lock:
            if self._result is not None:
                return self._result
            now = time.monotonic()
            if self._reaped is None:
                self._check_log(now)
                self._maybe_sample(now)
                self._try_reap()
            if self._reaped is None:
                if self._timeout_s is not None and now - self._t0 >= self._timeout_s and not self._killed:
                    self._timed_out = True
                    self._begin_kill(self._grace, "timeout", note=f"timeout after {self._timeout_s:g}s")
                self._escalate(now)
                return None
            if self._group_remains(now):
                return None
            self._result = self._build_result()
            self._close_log()
            return self._result

    def note_exit(self) -> None:
        """From another thread, while the owner is busy elsewhere: if the leader has exited
        (a zombie, not reaped: ``WNOWAIT``), note the time, which ``poll`` then records as
        the frame's end instead of the later time it reaps it. Never blocks on the owner."""
        if self.exit_seen_at is not None or self._reaped is not None or self._popen is None:
            return
        if not self._lock.acquire(blocking=False):
            return  # the owner is polling right now: it reaps at once
        try:
            if self._reaped is None and self.exit_seen_at is None:
                seen = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                if seen is not None:
                    self.exit_seen_at = time.time()
        except (ChildProcessError, OSError):
            pass
        finally:
            self._lock.release()

    def wait(self, timeout: float | None = None) -> ExitInfo | None:
        """Poll until finished (the result) or ``timeout`` s passed (None)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = _WAIT_MIN_SLEEP_S
        while True:
            info = self.poll()
            if info is not None:
                return info
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return None
            nap = delay if deadline is None else min(delay, deadline - now)
            time.sleep(max(0.0, nap))
            delay = min(delay * 2, _WAIT_MAX_SLEEP_S)

    def kill(self, *, grace: float = DEFAULT_GRACE_S, reason: str = "killed") -> None:
        """TERM the group now; :meth:`poll` sends KILL once ``grace`` s have passed.

        Idempotent; a second call can only shorten the grace period (``grace=0``: KILL now).
        """
        with self._lock:
            if self._result is not None or self._popen is None:
                return
            if self._reaped is None and not self._killed:
                self._begin_kill(grace, reason, note=reason)
            elif self._term_sent_at is not None:
                self._shorten_grace(grace)
            else:
                # The leader already exited; poll() is about to put down what it left behind.
                self._grace = min(self._grace, grace)
            self._escalate(time.monotonic())

    def kill_and_wait(self, *, grace: float = DEFAULT_GRACE_S, reason: str = "killed") -> ExitInfo:
        """Blocking :meth:`kill`: returns once the whole group is gone."""
        self.kill(grace=grace, reason=reason)
        info = self.wait()
        assert info is not None  # wait() without a timeout only returns a result
        return info

    def add_footer_note(self, line: str) -> None:
        """A one-line warning written just before the footer when the attempt ends (each
        distinct line once)."""
        line = " ".join(line.split())
        if line and line not in self._footer_notes:
            self._footer_notes.append(line)

    @property
    def finished(self) -> bool:
        return self._result is not None

    def pids(self, table: ProcessTable | None = None) -> set[int]:
        """Live pids of the frame: its process group plus descendants that left the group.

        For per-process GPU accounting (NVML lists pids) and for signalling. ``table``: a
        ``process_table()`` snapshot shared by several frames (one is taken if not given).
        """
        if self._popen is None or self._result is not None:
            return set()
        table = process_table() if table is None else table
        members = _group_pids(self.pgid, table)
        if self._reaped is None:
            members |= self._tree_pids(table)
        return members

    def sample_tree(self) -> tuple[int, float]:
        """(RSS bytes of all live processes now, their CPU seconds incl. reaped children).

        CPU adds each live process's user+system and its reaped children's: a dead process's
        time is counted in exactly the one live ancestor that reaped it, so nothing twice.
        """
        rss, cpu, _ = self._measure()
        return rss, cpu

    def _measure(self) -> tuple[int, float, int]:
        """(sum of RSS, CPU seconds, largest per-process peak RSS) over :meth:`pids`."""
        import psutil

        rss, cpu, hwm = 0, 0.0, 0
        for pid in self.pids():
            try:
                proc = psutil.Process(pid)
                with proc.oneshot():
                    rss += proc.memory_info().rss
                    t = proc.cpu_times()
                    cpu += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            hwm = max(hwm, _high_water_rss(pid))
        return rss, cpu, hwm

    # -- internals ---------------------------------------------------------------------

    def _tree_pids(self, table: ProcessTable | None = None) -> set[int]:
        """The unreaped leader and its live descendants (empty if the leader is gone)."""
        table = process_table() if table is None else table
        if self.pid not in table:
            return set()
        return {self.pid} | _descendants(self.pid, table)

    def _check_log(self, now: float) -> None:
        """Keep the log under its cap; stop a frame that keeps writing into a full disk."""
        if self._log_cap is None:
            return
        try:
            full = self._log_cap.check(now)
        except OSError:
            return  # the file vanished or cannot be read back: nothing to cut
        if full and not self._killed:
            self._begin_kill(
                self._grace, "disk full", note=f"{full}: stopping the frame before it fills the disk further"
            )

    def _close_log(self) -> None:
        """The attempt is over: finish the log's cap, and end the log with the footer."""
        lost = self._log_cap is not None and self._result is not None and self._log_cap.space_lost()
        if lost and self._result is not None:
            self._result = replace(self._result, log_lost=True)
        footer = None
        if self._footer is not None and self._result is not None:
            grace = self._grace
            if self._term_sent_at is not None and self._kill_deadline is not None:
                grace = max(0.0, self._kill_deadline - self._term_sent_at)  # as shortened by kill()
            footer = log_footer(
                self._footer[0],
                self._footer[1],
                self._result,
                timeout_s=self._timeout_s,
                grace=grace,
                sigkilled=self._kill_sent_at is not None,
            )
        lines = [f"=== cuectl: warning: {n} ===" for n in self._footer_notes] if footer is not None else []
        if footer is not None:
            lines.append(footer)
        if self._log_cap is not None:
            cap, self._log_cap = self._log_cap, None
            cap.finish(lines or None, lost=lost)
        else:
            for line in lines:
                _append_log(self.log_path, line)

    def __del__(self, _close: Callable[[int], None] = os.close) -> None:
        # os.close bound at definition: at interpreter exit the module's globals may be
        # None already, and a frame object collected then must not print a traceback.
        cap = getattr(self, "_log_cap", None)
        if cap is not None:
            try:
                _close(cap.fd)
            except OSError:
                pass

    def _maybe_sample(self, now: float) -> None:
        # Sample densely while the frame is young (a quarter of its age, at least 0.1 s), so
        # short frames get measured too, settling at ``sample_interval`` (~1 s) for long ones.
        interval = min(self._sample_interval, max(0.1, (now - self._t0) / 4))
        if now - self._last_sample < interval:
            return
        self._last_sample = now
        self._sampled = True
        rss, cpu, hwm = self._measure()
        self._peak_rss = max(self._peak_rss, rss)
        self._peak_hwm = max(self._peak_hwm, hwm)
        self._last_cpu = max(self._last_cpu, cpu)

    def _try_reap(self) -> None:
        assert self._popen is not None
        try:
            pid, status, rusage = os.wait4(self.pid, os.WNOHANG)
        except ChildProcessError:
            # Someone reaped it behind our back (SIGCHLD=SIG_IGN, a stray waitpid(-1)):
            # the frame is over but its status is lost.
            self._reaped = (None, None, time.time())
            self._popen.returncode = -1
            if _LEADERS.get(self.pid) is self:
                del _LEADERS[self.pid]
            return
        if pid == 0:
            return
        self._reaped = (status, rusage, self.exit_seen_at or time.time())
        if _LEADERS.get(self.pid) is self:
            del _LEADERS[self.pid]
        # Tell Popen the child is reaped, so it never waits on a pid that may be reused.
        self._popen.returncode = os.waitstatus_to_exitcode(status)

    def _begin_kill(self, grace: float, reason: str, *, note: str) -> None:
        self._killed = True
        self._kill_reason = reason
        _append_log(self.log_path, f"=== cuectl: {note}: terminating the process group (grace {grace:g}s) ===")
        self._terminate(grace)

    def _terminate(self, grace: float) -> None:
        now = time.monotonic()
        if self._term_sent_at is None:
            self._term_sent_at = now
            self._signal_all(signal.SIGTERM)
        self._kill_deadline = now + max(0.0, grace)

    def _shorten_grace(self, grace: float) -> None:
        deadline = time.monotonic() + max(0.0, grace)
        if self._kill_deadline is None or deadline < self._kill_deadline:
            self._kill_deadline = deadline

    def _escalate(self, now: float) -> None:
        if self._kill_deadline is not None and self._kill_sent_at is None and now >= self._kill_deadline:
            self._kill_sent_at = now
            self._signal_all(signal.SIGKILL)

    def _signal_all(self, sig: int) -> None:
        """Signal the group, and descendants that moved to another group, while we can.

        Only pids that are descendants *right now* are signalled individually (never a pid
        remembered from earlier, which could have been reused by an unrelated process).
        Before the leader is reaped its pid pins the pgid; afterwards the group's remaining
        members do, so ``killpg`` cannot hit a stranger while anything of ours is left.

        The descendants are found *before* the group is signalled: once the leader dies its
        children are re-parented to init at once (reaped or not), and one that had left the
        group would no longer look like ours.

        After the leader exited, processes the frame left that were re-parented to us (we
        are a subreaper: see :meth:`_strays`) are signalled as well.
        """
        if self._reaped is not None:
            strays = self._strays()
            _signal_group(self.pgid, sig)
            _signal_pids(strays, sig)
            if sig == signal.SIGTERM:
                self._termed_strays |= strays
            return
        table = process_table()
        escaped = {pid for pid in self._tree_pids(table) - {self.pid} if table[pid][1] != self.pgid}
        _signal_group(self.pgid, sig)
        for pid in escaped:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                continue

    def _strays(self) -> set[int]:
        """Live processes of this frame re-parented to us (a subreaper) once their parent
        died — ``setsid cmd &``, double forks — with their descendants. Recognised by the
        frame's session or group, ``CUE_FRAME_ID`` in their environment, or a lease file
        of the frame open (:meth:`track_strays`). Empty unless we are a subreaper."""
        if not procs._subreaper or self._popen is None:
            return set()
        return leftover_children(self._owns)

    def _owns(self, pid: int, pgid: int, sid: int) -> bool:
        if sid == self.pgid or pgid == self.pgid:
            return True
        if self._marker is not None and _env_value(pid, "CUE_FRAME_ID") == self._marker:
            return True
        return holds_file(pid, self._lock_ids)

    def _group_remains(self, now: float) -> bool:
        """After the leader exited: True while leftovers of its group, or processes of the
        frame that escaped it (:meth:`_strays`), are being put down."""
        strays = self._strays()
        if not strays and not process_group_alive(self.pgid):
            return False
        if self._term_sent_at is None:
            _append_log(self.log_path, "=== cuectl: frame exited, terminating processes it left running ===")
            self._terminate(self._grace)
        elif strays - self._termed_strays:
            new = strays - self._termed_strays  # re-parented since the TERM went out
            _signal_pids(new, signal.SIGKILL if self._kill_sent_at is not None else signal.SIGTERM)
            self._termed_strays |= new
        self._escalate(now)
        if self._kill_sent_at is not None and now - self._kill_sent_at > _STRAGGLER_GIVE_UP_S:
            _append_log(self.log_path, "=== cuectl: processes survived SIGKILL; giving up on them ===")
            return False
        return True

    def _build_result(self) -> ExitInfo:
        assert self._reaped is not None
        status, rusage, ended_at = self._reaped
        exit_code: int | None = None
        exit_signal: int | None = None
        if status is not None:
            if os.WIFSIGNALED(status):
                exit_signal = os.WTERMSIG(status)
            else:
                exit_code = os.waitstatus_to_exitcode(status)
        max_rss = max(self._peak_rss, self._peak_hwm) or None
        cpu = self._last_cpu if self._sampled else None
        if rusage is not None:
            # The leader's ru_maxrss starts at the *worker's* peak RSS: exec records the
            # high-water mark of the forked copy of our address space before replacing it.
            # So it only says something about the frame when it exceeds what the worker had
            # ever reached at spawn time; otherwise rely on the samples.
            kernel_rss = _maxrss_bytes(rusage.ru_maxrss)  # type: ignore[attr-defined]
            if kernel_rss > self._spawner_maxrss:
                max_rss = max(max_rss or 0, kernel_rss)
            rusage_cpu = rusage.ru_utime + rusage.ru_stime  # type: ignore[attr-defined]
            cpu = max(cpu or 0.0, rusage_cpu)
        return ExitInfo(
            exit_code=exit_code,
            exit_signal=exit_signal,
            timed_out=self._timed_out,
            killed=self._killed,
            started_at=self._started_at,
            ended_at=ended_at,
            max_rss_bytes=max_rss,
            cpu_seconds=cpu,
            kill_reason=self._kill_reason,
        )

    def __repr__(self) -> str:
        state = "finished" if self._result is not None else ("killing" if self._killed else "running")
        return f"<FrameProcess pid={self.pid} {state} log={str(self.log_path)!r}>"


def _maxrss_bytes(ru_maxrss: int) -> int:
    # Linux reports KiB, macOS bytes.
    return int(ru_maxrss) if sys.platform == "darwin" else int(ru_maxrss) * 1024


def _as_path(path: str | Path) -> Path:
    """``path`` as a Path, without the parse of ``Path(p)`` when it is one already (the
    frame start path makes several a frame)."""
    return path if isinstance(path, Path) else Path(path)


def _self_maxrss_bytes() -> int:
    """The worker's own peak RSS: what a freshly exec'd child's ru_maxrss starts from."""
    import resource

    return _maxrss_bytes(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _high_water_rss(pid: int) -> int:
    """Peak RSS of one process since its last exec (Linux ``VmHWM``); 0 where unknown.

    Unlike ru_maxrss it is per address space, so it does not inherit the worker's size, and
    unlike a point sample it remembers a spike between two samples.
    """
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024  # "VmHWM:   51234 kB"
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _exec_failure_code(exc: BaseException) -> int:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return EXIT_NOT_FOUND
    return EXIT_CANNOT_EXECUTE


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        text = exc.strerror or str(exc)
        if exc.filename is not None:
            text += f": {exc.filename!s}"
        return text
    return str(exc)
