"""Frame launch: command tokens, the frame environment, and one supervised frame process.

This is what the worker uses to turn a claimed frame into a running process (DESIGN §4,
§5 "Leases", "Failure", "Kill"):

* :func:`substitute_tokens` replaces ``#IFRAME#``-style tokens in a layer's command.
* :func:`frame_env` builds the environment: inherited < layer env < ``CUE_*`` < isolation.
* :class:`FrameProcess` spawns the frame in its own session (so its process group is ours to
  kill as a whole), appends stdout+stderr to the frame log, enforces the timeout by TERMing
  the group and KILLing it after a grace period, and reports exit status, peak RSS and CPU
  time.

POSIX only (Linux and macOS); Windows is not supported by the worker.

Limits, on purpose (no cgroups here): a descendant that calls ``setsid()`` or moves itself
to another process group *and* leaves the frame's process tree (double fork) escapes
supervision; everything that stays in the group or in the tree is signalled.
"""

from __future__ import annotations

import errno
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from cuectl import config
from cuectl.errors import InvalidInput
from cuectl.units import iso

__all__ = [
    "DEFAULT_GRACE_S",
    "DEFAULT_SAMPLE_INTERVAL_S",
    "EXIT_CANNOT_EXECUTE",
    "EXIT_NOT_FOUND",
    "ExitInfo",
    "FrameContext",
    "RunAs",
    "FrameProcess",
    "frame_env",
    "frame_name",
    "kill_process_group",
    "log_header",
    "process_group_alive",
    "substitute_tokens",
]

DEFAULT_GRACE_S = 5.0
DEFAULT_SAMPLE_INTERVAL_S = 1.0
# Shell conventions, so a frame that could not start reads like one that `sh` failed to run.
EXIT_NOT_FOUND = 127
EXIT_CANNOT_EXECUTE = 126
LOG_FILE_MODE = 0o640  # DESIGN §3: logs readable by owner and group, never the world
LOG_DIR_MODE = 0o750
# After SIGKILL, a process in uninterruptible sleep (hung NFS, a wedged driver) can linger.
# Stop waiting for such stragglers eventually so one stuck process cannot hang the worker.
_STRAGGLER_GIVE_UP_S = 10.0
_WAIT_MIN_SLEEP_S = 0.01
_WAIT_MAX_SLEEP_S = 0.1


# --------------------------------------------------------------------------------------
# Frame context, tokens, environment
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FrameContext:
    """Everything about one frame attempt that ends up in its command line or environment."""

    job: str
    job_id: str
    layer: str
    layer_id: str
    frame_id: str
    frame_number: int  # first frame of the chunk
    frames: tuple[int, ...]  # the chunk's frames, in dispatch order
    layer_range: str
    chunk: int
    attempt: int  # 1-based
    cores: float
    memory_bytes: int
    # Per-device memory granted (each granted device's total, or the request): CUE_GPU_MEMORY.
    gpu_memory_bytes: int | None
    log_path: Path

    @property
    def chunk_frames(self) -> tuple[int, ...]:
        # A context built without ``frames`` still describes a one-frame chunk.
        return self.frames or (self.frame_number,)

    @property
    def name(self) -> str:
        return frame_name(self.frame_number, self.layer)


def frame_name(number: int, layer: str) -> str:
    """OpenCue's frame name, ``<number zero-padded to 4>-<layer>`` (``0001-render``)."""
    return f"{_zpad(number)}-{layer}"


def _zpad(number: int) -> str:
    # f"{n:04d}": 7 -> "0007", 12345 -> "12345", and -1 -> "-001" (the sign counts in the width,
    # as in Python/C printf; OpenCue's Java String.format("%04d") gives the same).
    return f"{number:04d}"


_TOKEN_RE = re.compile(r"#(IFRAME|FRAME|ZFRAME|FRAME_START|FRAME_END|FRAMESPEC|LAYER|JOB)#")


def _token_values(ctx: FrameContext, needed: set[str]) -> dict[str, str]:
    frames = ctx.chunk_frames
    values = {
        "IFRAME": str(ctx.frame_number),
        "FRAME": _zpad(ctx.frame_number),
        "ZFRAME": _zpad(ctx.frame_number),
        "FRAME_START": str(frames[0]),
        "FRAME_END": str(frames[-1]),
        "LAYER": ctx.layer,
        "JOB": ctx.job,
    }
    if "FRAMESPEC" in needed:
        # Lazy: only commands that use the token pay for (and depend on) the frameset module.
        from cuectl.sched.frameset import compact_range

        values["FRAMESPEC"] = compact_range(list(frames))
    return values


def substitute_tokens(command: Sequence[str] | str, ctx: FrameContext) -> list[str]:
    """Replace command tokens and return the argv to execute.

    * argv list: each element has its tokens replaced; no shell is involved, so values need
      no quoting and a hostile job name is just bytes in one argument.
    * shell string: every value is inserted ``shlex.quote``-d, then the text runs as
      ``["/bin/sh", "-c", text]``. A token therefore always expands to exactly one shell word
      and a name like ``a'b;$(touch X)`` can never run code. Consequence: write tokens
      *unquoted* in shell strings (``echo #JOB#``); inside double quotes the quoting
      characters would appear literally.

    Tokens: ``#IFRAME#`` frame number; ``#FRAME#`` and ``#ZFRAME#`` the number zero-padded to
    4 (``-1`` -> ``-001``); ``#FRAME_START#``/``#FRAME_END#`` first/last frame of the chunk;
    ``#FRAMESPEC#`` the chunk as a compact range; ``#LAYER#``; ``#JOB#``. Replacement is a
    single pass, so a name that itself contains ``#FRAME#`` is not expanded again. Unknown
    ``#WORDS#`` are left alone.
    """
    if isinstance(command, str):
        text = command
        if not text.strip():
            raise InvalidInput("command: empty shell command")
        return ["/bin/sh", "-c", _replace(text, ctx, shlex.quote)]
    argv = list(command)
    if not argv:
        raise InvalidInput("command: empty argv")
    if not all(isinstance(arg, str) for arg in argv):
        raise InvalidInput("command: every argv element must be a string")
    return [_replace(arg, ctx, _identity) for arg in argv]


def _identity(value: str) -> str:
    return value


def _replace(text: str, ctx: FrameContext, quote: Callable[[str], str]) -> str:
    needed = set(_TOKEN_RE.findall(text))
    if not needed:
        return text
    values = _token_values(ctx, needed)
    return _TOKEN_RE.sub(lambda m: quote(values[m.group(1)]), text)


def frame_env(
    ctx: FrameContext,
    *,
    layer_env: Mapping[str, str],
    isolation: Mapping[str, str],
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The frame's environment. Precedence, lowest first:

    1. ``base`` — the worker's environment (``config.inherited_environ()`` by default) with
       every inherited ``CUE_*`` variable removed, so a worker started from inside another
       frame does not leak that frame's identity or devices, and without the worker's own
       store credentials (``PGPASSWORD``, ``PGPASSFILE``): a job must not be able to read
       the farm database's password (a layer may still set them explicitly);
    2. ``layer_env`` — the layer's ``env``;
    3. the ``CUE_*`` frame variables below;
    4. ``isolation`` — the device variables from the lease (``CUDA_VISIBLE_DEVICES``,
       ``CUE_GPUS``, …). Last, so neither the layer env nor the inherited env can un-hide a
       device.

    Frame variables (all strings):

    ========================  ===============================================================
    ``CUE_JOB`` …             job/layer names and ids, ``CUE_FRAME_ID`` the frame's id
    ``CUE_IFRAME``            frame number (first of the chunk)
    ``CUE_FRAME``             frame name ``0001-layer``
    ``CUE_RANGE``             the layer's frame range; ``CUE_CHUNK`` the chunk size
    ``CUE_ATTEMPT``           attempt number, 1-based
    ``CUE_THREADS``           reserved cores, rounded down, at least 1
    ``CUE_MEMORY``            reserved host memory in **bytes** (OpenCue gives KB; cuectl uses
                              bytes everywhere, DESIGN §6/§9)
    ``CUE_GPU_MEMORY``        per-device GPU memory granted, bytes; ``0`` when no GPU was
                              granted (or its size is unknown)
    ``CUE_LOG_PATH``          the frame's log file
    ========================  ===============================================================
    """
    inherited = config.inherited_environ() if base is None else base
    env = {k: v for k, v in inherited.items() if not k.startswith("CUE_") and k not in _WORKER_SECRETS}
    env.update(_checked_env(layer_env, "layer env"))
    env.update(_cue_vars(ctx))
    env.update(_checked_env(isolation, "isolation env"))
    return env


# The worker's credentials for the store: never handed to the frames it runs.
_WORKER_SECRETS = frozenset({"PGPASSWORD", "PGPASSFILE"})


def _cue_vars(ctx: FrameContext) -> dict[str, str]:
    return {
        "CUE_JOB": ctx.job,
        "CUE_JOB_ID": str(ctx.job_id),
        "CUE_LAYER": ctx.layer,
        "CUE_LAYER_ID": str(ctx.layer_id),
        "CUE_FRAME_ID": str(ctx.frame_id),
        "CUE_IFRAME": str(ctx.frame_number),
        "CUE_FRAME": ctx.name,
        "CUE_RANGE": ctx.layer_range,
        "CUE_CHUNK": str(ctx.chunk),
        "CUE_ATTEMPT": str(ctx.attempt),
        "CUE_THREADS": str(max(1, math.floor(ctx.cores))),
        "CUE_MEMORY": str(int(ctx.memory_bytes)),
        "CUE_GPU_MEMORY": str(int(ctx.gpu_memory_bytes or 0)),
        "CUE_LOG_PATH": str(ctx.log_path),
    }


def _checked_env(values: Mapping[str, str], what: str) -> dict[str, str]:
    """Reject what ``execve`` cannot carry, with a message instead of a ValueError later."""
    out: dict[str, str] = {}
    for key, value in values.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise InvalidInput(f"{what}: invalid variable name {key!r}")
        if not isinstance(value, str) or "\0" in value:
            raise InvalidInput(f"{what}: {key} must be a string without NUL bytes")
        out[key] = value
    return out


# --------------------------------------------------------------------------------------
# Process groups
# --------------------------------------------------------------------------------------


def _check_pgid(pgid: int) -> None:
    # killpg(0) is *our own* group and killpg(1)/negative values mean something else again:
    # a bad pgid from a corrupt store must never take the worker (or the machine) down.
    if pgid <= 1 or pgid == os.getpgrp():
        raise InvalidInput(f"refusing to signal process group {pgid}")


# pid -> (parent pid, process group, zombie), for every process we can see at one moment.
ProcessTable = Mapping[int, "tuple[int, int, bool]"]


def process_table() -> dict[int, tuple[int, int, bool]]:
    """One snapshot of the machine's processes. A frame's pids are its process group plus
    its leader's descendants; finding them costs a pass over every process on the machine,
    so the worker takes one snapshot per sampling tick and shares it between its frames
    (one pass per frame made sampling 8 frames cost ~16 ms of CPU a tick)."""
    proc = Path("/proc")
    if sys.platform.startswith("linux") and proc.is_dir():
        table: dict[int, tuple[int, int, bool]] = {}
        for entry in os.scandir(proc):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as handle:
                    stat = handle.read()
            except OSError:
                continue  # exited meanwhile, or hidden from us
            # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
            fields = stat[stat.rfind(b")") + 2:].split(b" ", 3)
            table[int(entry.name)] = (int(fields[1]), int(fields[2]), fields[0] == b"Z")
        return table
    return _process_table_psutil()


def _process_table_psutil() -> dict[int, tuple[int, int, bool]]:
    import psutil

    table: dict[int, tuple[int, int, bool]] = {}
    for p in psutil.process_iter(["ppid", "status"]):
        try:
            table[p.pid] = (p.info["ppid"] or 0, os.getpgid(p.pid), p.info["status"] == psutil.STATUS_ZOMBIE)
        except (ProcessLookupError, PermissionError):
            continue
    return table


def _group_pids(pgid: int, table: ProcessTable | None = None) -> set[int]:
    """Live (non-zombie) pids whose process group is ``pgid``."""
    table = process_table() if table is None else table
    return {pid for pid, (_, group, zombie) in table.items() if group == pgid and not zombie}


def _descendants(root: int, table: ProcessTable) -> set[int]:
    """Live descendants of ``root`` (children, grandchildren, …), not ``root`` itself."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        if pid in found:
            continue
        found.add(pid)
        stack.extend(children.get(pid, ()))
    return {pid for pid in found if not table[pid][2]}


def process_group_alive(pgid: int) -> bool:
    """Whether any process (other than a zombie) is still in group ``pgid``.

    ``killpg(pgid, 0)`` answers cheaply when the group is gone; when it says "exists" we look
    closer, because zombies waiting for a reaper (containers without an init) still count for
    the kernel but no longer run anything.
    """
    if pgid <= 0:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's processes: alive, and not ours to judge
    return bool(_group_pids(pgid))


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to the group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def kill_process_group(pgid: int, *, grace: float = DEFAULT_GRACE_S) -> None:
    """TERM group ``pgid``, wait up to ``grace`` s for it to vanish, then KILL it.

    For orphaned frames found after a worker restart (their pgid is in the store). Those
    processes are not our children, so init reaps them; we only wait until they are gone
    (bounded: a process stuck in uninterruptible sleep can outlive SIGKILL). Raises
    ``InvalidInput`` for pgids that would hit the worker itself or everything
    (``0``, ``1``, our own group) and ``PermissionError`` for another user's group.
    """
    _check_pgid(pgid)
    if not _signal_group(pgid, signal.SIGTERM):
        return
    if _wait_group_gone(pgid, grace):
        return
    if _signal_group(pgid, signal.SIGKILL):
        _wait_group_gone(pgid, 2.0)


def _wait_group_gone(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + max(0.0, timeout)
    delay = _WAIT_MIN_SLEEP_S
    while process_group_alive(pgid):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, _WAIT_MAX_SLEEP_S)
    return True


# --------------------------------------------------------------------------------------
# Logs
# --------------------------------------------------------------------------------------


def log_header(frame_id: str, attempt: int, host: str, at: float | None = None) -> str:
    """The line written to the log before each attempt starts."""
    when = iso(time.time() if at is None else at)
    return f"=== cuectl frame {frame_id} attempt {attempt} on {host} at {when} ==="


def _open_log(log_path: Path) -> int:
    """Open (append, create 0o640) the frame log and return the fd (close-on-exec)."""
    log_path = Path(log_path)
    log_path.parent.mkdir(mode=LOG_DIR_MODE, parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    return os.open(log_path, flags, LOG_FILE_MODE)


def _write_line(fd: int, line: str) -> None:
    # One line, whatever a hostile name contains: a newline must not forge a second header.
    text = line.replace("\r", " ").replace("\n", " ") + "\n"
    os.write(fd, text.encode("utf-8", "replace"))


def _append_log(log_path: Path, line: str) -> None:
    """Add a cuectl note (timeout, kill) to a log the frame may still be writing."""
    try:
        fd = _open_log(log_path)
    except OSError:
        return  # a note is not worth failing the frame over
    try:
        _write_line(fd, line)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------
# The frame process
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunAs:
    """The account a frame runs as when the worker is root (OpenCue's RQD does the same):
    the submitting user's uid, primary gid and supplementary groups."""

    user: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    @classmethod
    def lookup(cls, user: str) -> "RunAs":
        import pwd

        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise InvalidInput(f"user {user!r} does not exist on this host; the frame is not run as root instead",
                               hint="create the account, or run the worker as an unprivileged user") from None
        return cls(user, entry.pw_uid, entry.pw_gid, tuple(os.getgrouplist(user, entry.pw_gid)), entry.pw_dir)

    def popen_kwargs(self) -> dict:
        # Already that account (a root user's own jobs): switching would cost a full fork
        # instead of vfork (~3 ms a frame) for nothing.
        if self.uid == os.geteuid() and self.gid == os.getegid():
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}

    def env(self) -> dict[str, str]:
        return {"USER": self.user, "LOGNAME": self.user, "HOME": self.home}


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
        popen: subprocess.Popen[bytes] | None,
        log_path: Path,
        timeout_s: float | None,
        grace: float,
        sample_interval: float,
        started_at: float,
        spawner_maxrss: int = 0,
        immediate: ExitInfo | None = None,
    ) -> None:
        self._popen = popen
        self.pid = popen.pid if popen is not None else 0
        # start_new_session=True: the child called setsid() before exec, so pgid == pid.
        self.pgid = self.pid
        self.log_path = Path(log_path)
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
        nowhere to say why.
        """
        argv = list(argv)
        if not argv:
            raise InvalidInput("command: empty argv")
        fd = _open_log(log_path)
        try:
            if header is not None:
                _write_line(fd, header)
            started_at = time.time()
            try:
                popen = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=fd,
                    stderr=fd,
                    env=dict(env),
                    cwd=None if cwd is None else str(cwd),
                    pass_fds=tuple(pass_fds),
                    close_fds=True,
                    start_new_session=True,
                    **(run_as.popen_kwargs() if run_as else {}),
                )
                spawner_maxrss = _self_maxrss_bytes()
            except (OSError, ValueError) as exc:
                code = _exec_failure_code(exc)
                _write_line(fd, f"cuectl: cannot run {argv[0]!r}: {_describe(exc)}")
                ended = time.time()
                info = ExitInfo(code, None, False, False, started_at, ended, None, None)
                return cls(popen=None, log_path=log_path, timeout_s=None, grace=grace,
                           sample_interval=sample_interval, started_at=started_at, immediate=info)
        finally:
            os.close(fd)  # the child has its own copy; the worker must not keep one per frame
        return cls(popen=popen, log_path=log_path, timeout_s=timeout_s, grace=grace,
                   sample_interval=sample_interval, started_at=started_at,
                   spawner_maxrss=spawner_maxrss)

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
            return self._result

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
            return
        if pid == 0:
            return
        self._reaped = (status, rusage, time.time())
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
        """
        if self._reaped is not None:
            _signal_group(self.pgid, sig)
            return
        table = process_table()
        escaped = {pid for pid in self._tree_pids(table) - {self.pid} if table[pid][1] != self.pgid}
        _signal_group(self.pgid, sig)
        for pid in escaped:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                continue

    def _group_remains(self, now: float) -> bool:
        """After the leader exited: True while leftovers of its group are being put down."""
        if not process_group_alive(self.pgid):
            return False
        if self._term_sent_at is None:
            _append_log(self.log_path, "=== cuectl: frame exited, terminating processes it left running ===")
            self._terminate(self._grace)
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
