"""Crash recovery: the run files of this worker's frames (``RunFiles``), the state
directory's worker lock (``hold_state_dir``: one worker per host name and machine) and what
a worker that holds it does with what a dead predecessor left (``Recovery``).

A device is leased (a kernel lock, inherited by the frame process) before its frame is
claimed, so if the worker dies anywhere the device stays leased until the frame's processes
are gone. A restarted worker reads the run files it left in its state directory, kills
still-running orphans, and only then requeues their frames: a frame never runs twice at
once on its host.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import heapq
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cuectl.errors import Conflict
from cuectl.run import launch
from cuectl.run.lease.locks import pid_alive
from cuectl.sched.store import ClaimedFrame
from cuectl.units import iso

if TYPE_CHECKING:
    from cuectl.run.worker.core import Worker


@dataclass
class Recovery:
    worker: "Worker"
    # The state directory's worker lock (see ``prepare``): held for the worker's life.
    state_lock_fd: int = -1

    def prepare(self) -> None:
        """Become this host name's one worker: take the state directory's worker lock (or
        raise ``WorkerAlreadyRunning``) and, on Linux, become a child subreaper so that
        processes a frame leaves behind are re-parented to us and can be put down.
        Idempotent; ``recover`` calls it, the CLI calls it before registering the host."""
        if self.state_lock_fd < 0:
            opts = self.worker.opts
            self.state_lock_fd = hold_state_dir(opts.state_dir, opts.name)
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
        w = self.worker
        opts, store = w.opts, w.store
        runfiles = {}
        for path in opts.state_dir.glob("*.json"):
            try:
                info = json.loads(path.read_text())
                runfiles[int(info["frame_id"])] = (path, info)
            except (OSError, ValueError, KeyError):
                path.unlink(missing_ok=True)
        requeued = []
        for _path, info in runfiles.values():
            if info.get("pgid") and _same_process(info):  # a run file of an older cuectl
                launch.kill_process_group(int(info["pgid"]), grace=opts.kill_grace_s)
            # The orphan's processes — its group and whatever left it (setsid, double
            # forks: re-parented to init when we died) — by the frame environment.
            if info.get("log_path"):
                launch.kill_by_env(
                    {
                        "CUE_FRAME_ID": str(info["frame_id"]),
                        "CUE_ATTEMPT": str(info["attempt"]),
                        "CUE_LOG_PATH": str(info["log_path"]),
                    },
                    grace=opts.kill_grace_s,
                )
        for frame in store.running_on_host(opts.name):
            if frame["id"] not in runfiles and _claimer_may_live(frame.get("worker")):
                continue
            if store.requeue_frame(frame["id"], frame["attempts"], now=now, reason="orphaned"):
                requeued.append(frame["id"])
        for path, _ in runfiles.values():
            path.unlink(missing_ok=True)
        w.frames.release_runfiles(delete_blank=False)  # (slots this process opened before recovering: made afresh)
        # Notifications a previous worker of this host claimed and may not have delivered:
        # it is dead (we hold the lock), so they are due again now rather than at claim expiry.
        store.release_notifications(f"{opts.name}:", keep=w.worker_id)
        if runfiles or requeued:
            ids = ", ".join(str(i) for i in sorted(requeued)) or "none"
            w.tell_say(
                f"recovered after a restart: {len(runfiles)} run file(s) of a previous worker of "
                f"{opts.name} cleaned up (orphaned processes killed); requeued frame(s) {ids}"
            )
        return requeued


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
        data = json.dumps(
            {
                "frame_id": claim.frame_id,
                "attempt": claim.attempt,
                "log_path": log_path if log_path is not None else str(Path(claim.log_path)),
                "worker_pid": os.getpid(),
            }
        ).encode()
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
            "this host's GPUs through device leases",
        ) from None
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
