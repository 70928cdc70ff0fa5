"""Reading frame logs (``cuectl frame log [--follow] [--attempt N] [--tail N]``).

Only store calls and file reads: the same for SQLite and PostgreSQL stores. A log is
opened only inside the store's log directory, each component relative to its parent with
``O_NOFOLLOW`` (a log directory is written by workers, possibly as other users: a link
planted there is never followed), and only a regular file is read.

Following (:func:`follow_log`) polls the store about every ``poll_s`` seconds and the open
file with short sleeps; it waits for a WAITING/DEPEND frame to start, moves on to the next
attempt when one ends and the frame is retried, and returns when the frame is SUCCEEDED,
DEAD or EATEN, after printing the rest of the log. What it says about attempts and states
goes to ``note`` (the CLI prints it on stderr), never into the copied log.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable, Mapping

from cuectl.errors import InvalidInput, NotFound
from cuectl.run import framelog

# One attempt's log file (its name, safe open, tail, the follower) is run/framelog/'s;
# these names stay importable from here.
from cuectl.run.framelog import attempt_log_path, job_log_dir, open_log, tail_bytes
from cuectl.sched import model as m
from cuectl.sched.store import Store

__all__ = [
    "RQLOG_DIR",
    "RQLOG_SUFFIX",
    "attempt_log_path",
    "describe_attempt",
    "follow_log",
    "job_log_dir",
    "open_log",
    "rqlog_dir",
    "rqlog_name",
    "rqlog_path",
    "show_log",
    "tail_bytes",
]


# OpenCue's log names (CueGUI). CueGUI opens a frame's log by a path it builds itself,
# ``<Job.log_dir>/<job name>.<frame name>.rqlog`` (RQD's naming), and reads whatever file is
# there. cuectl keeps one file per attempt instead, so each job directory gets an ``rqlog/``
# subdirectory of links by RQD's names, each pointing at the frame's latest attempt's log;
# the worker replaces a link when it opens an attempt's log (run/framelog.py, ``_link_rqlog``).
# The gRPC server fills ``Job.log_dir`` with :func:`rqlog_dir` and ``Proc.log_path`` with
# :func:`rqlog_path`: these functions are the one definition of that layout.
RQLOG_DIR = "rqlog"
RQLOG_SUFFIX = ".rqlog"
_NAME_MAX = 255  # bytes in one file name on Linux filesystems (NAME_MAX)


def rqlog_dir(job_log_dir: str | Path) -> Path:
    """The directory of a job's OpenCue-named log links (OpenCue's ``Job.log_dir``)."""
    return Path(job_log_dir) / RQLOG_DIR


def rqlog_name(job_name: str, frame_name: str) -> str | None:
    """``<job name>.<frame name>.rqlog`` (``frame_name``: ``views.frame_name``, ``0001-render``),
    or None when that cannot be one file name, so no link is made for it.

    Job names are free text (sched/spec.py ``_job_name``: no control characters, at most 200
    characters): one may hold ``/`` or be ``.``/``..``, and CueGUI would then build a path
    with more components than ours. A name with ``/`` (or NUL) or longer than NAME_MAX gets
    no link; ``.`` and ``..`` need no rule of their own, since the whole name ends in
    ``.rqlog`` and is therefore never ``.`` or ``..`` itself."""
    name = f"{job_name}.{frame_name}{RQLOG_SUFFIX}"
    if "/" in name or "\0" in name:
        return None
    try:
        size = len(os.fsencode(name))
    except UnicodeError:  # a lone surrogate: no file name the GUI could build either
        return None
    return name if size <= _NAME_MAX else None


def rqlog_path(job_log_dir: str | Path, job_name: str, frame_name: str) -> Path | None:
    """Where CueGUI looks for a frame's log (OpenCue's ``Proc.log_path``); None when the job's
    name cannot be a file name (:func:`rqlog_name`)."""
    name = rqlog_name(job_name, frame_name)
    return None if name is None else rqlog_dir(job_log_dir) / name


def _write(out: BinaryIO, data: bytes) -> None:
    if data:
        out.write(data)
        out.flush()


def show_log(
    store: Store, frame_id: int, *, out: BinaryIO, attempt: int | None = None, tail: int | None = None
) -> None:
    """Copy one attempt's log (default: the latest) to ``out``; with ``tail``, its last lines."""
    frame = store.get_frame(frame_id)
    path = attempt_log_path(frame, attempt)
    fd = open_log(store.log_dir_of(path), path, frame_id)
    try:
        if tail is not None:
            _write(out, tail_bytes(fd, tail))
            return
        while chunk := os.read(fd, 1 << 20):
            _write(out, chunk)
    finally:
        os.close(fd)


def describe_attempt(frame: Mapping[str, Any], attempt: int) -> str:
    """How ``attempt`` ended, from the store's record (``frame show``'s attempt history)."""
    record = next((a for a in frame.get("attempt_history") or [] if a.get("attempt") == attempt), None)
    if record is None:
        return "ended"
    outcome = record.get("outcome")
    if outcome == "lost":
        return "worker lost (no heartbeat)"
    if outcome in ("killed", "retried", "eaten"):
        action = {"killed": "kill", "retried": "retry", "eaten": "eat"}[outcome]
        return f"stopped by user request ({action})"
    if record.get("timed_out") or outcome == "timeout":
        return "timed out"
    if record.get("exit_signal"):
        from cuectl.run.framelog import signal_name

        return f"killed by signal {record['exit_signal']} ({signal_name(int(record['exit_signal']))})"
    if record.get("exit_code") is not None:
        return f"exit {record['exit_code']}"
    return str(outcome or "ended")


def _waiting_reason(store: Store, frame: Mapping[str, Any]) -> str:
    """``WAITING: <why>`` for the waiting line; the reason only when it is cheap to get."""
    text = str(frame["state"])
    reason = None
    if frame.get("retry_at"):
        reason = f"next attempt not before {frame['retry_at']}"
    else:
        try:
            from cuectl.sched.pending import pending_reason

            job = store.get_job(frame["job_id"])
            reason = pending_reason(store, job)
            if reason and "; " in reason:  # one clause per layer: keep this frame's layer's
                mine = [r for r in reason.split("; ") if r.startswith(f"layer {frame['layer']}:")]
                reason = mine[0] if mine else reason
        except Exception:  # a reason is a courtesy: never fail the follow over it
            reason = None
    return f"{text}: {reason}" if reason else text


def follow_log(
    store: Store,
    frame_id: int,
    *,
    out: BinaryIO,
    note: Callable[[str], None],
    attempt: int | None = None,
    tail: int | None = None,
    poll_s: float = 0.5,
    file_poll_s: float = 0.1,
    missing_s: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Stream a frame's log until the frame is done; the frame's final state.

    Without ``attempt``: the latest attempt's log, then each following attempt's as the
    frame is retried (``note``: ``--- attempt 1 ended: exit 1; following attempt 2 ---``),
    until the frame is SUCCEEDED, DEAD or EATEN. A WAITING or DEPEND frame that never ran
    is waited for (``note``: ``waiting for frame F to start (WAITING: reason)...``).
    With ``attempt``: that attempt only, until it ends (waiting for it if it is the next
    one). ``tail``: the first log printed starts with its last ``tail`` lines. The log of a
    running attempt that is not there after ``missing_s`` seconds (the worker opens it as
    it launches the frame) is reported missing: ``NotFound`` for the first one, a note for
    later ones."""
    frame: Mapping[str, Any] = store.get_frame(frame_id)
    latest = int(frame.get("attempts") or 0)
    if attempt is not None:
        if attempt < 1:
            raise InvalidInput(f"--attempt: attempts count from 1, got {attempt}")
        if attempt > latest + 1 or (attempt == latest + 1 and frame["state"] in m.DONE_STATES):
            raise NotFound(
                f"frame {frame_id} has had {latest} attempt{'s' if latest != 1 else ''}, "
                f"not {attempt} (state {frame['state']})"
            )
    elif latest < 1 and frame["state"] in m.DONE_STATES:
        raise NotFound(f"frame {frame_id} has no log yet (state {frame['state']})")
    target = attempt if attempt is not None else max(1, latest)
    first = True
    said_waiting = False
    while True:
        # -- wait for the target attempt to start ----------------------------------------
        while int(frame.get("attempts") or 0) < target:
            if frame["state"] in m.DONE_STATES:
                note(f"--- frame {frame_id} is {frame['state']} ---")
                return str(frame["state"])
            if first and not said_waiting:
                note(f"waiting for frame {frame_id} to start ({_waiting_reason(store, frame)})...")
                said_waiting = True
            sleep(poll_s)
            frame = store.get_frame(frame_id)
        # -- open its log: a claimed attempt's file appears when the worker launches it ---
        fd = None
        missing_since = time.monotonic()
        while fd is None:
            try:
                path = attempt_log_path(frame, target)
                fd = open_log(store.log_dir_of(path), path, frame_id)
            except NotFound as exc:
                over = framelog.attempt_over(frame, target)
                if first and ((over and not said_waiting) or time.monotonic() - missing_since > missing_s):
                    raise  # not here (another host's log, outside the log dir): as `frame log` says
                if over:
                    break  # ended before its log showed up (never started, worker lost)
                if time.monotonic() - missing_since > missing_s:
                    note(f"--- attempt {target}: {exc.message}; waiting for it to end ---")
                    missing_since = float("inf")
                sleep(poll_s)
                frame = store.get_frame(frame_id)
                continue
        # -- stream it until the store says it ended (the one follower, as the API's) ----
        if fd is not None:
            try:
                steps = framelog.follow(
                    fd, frame, target, tail=tail if first else None, poll_s=poll_s, file_poll_s=file_poll_s
                )
                frame = framelog.drive(
                    steps,
                    write=lambda data: _write(out, data),
                    note=note,
                    refresh=lambda: store.get_frame(frame_id),
                    sleep=sleep,
                )
            finally:
                os.close(fd)
        first = False
        how = describe_attempt(frame, target)
        state = str(frame["state"])
        if attempt is not None:
            note(f"--- attempt {target} ended: {how}; frame {frame_id} is {state} ---")
            return state
        if state in m.DONE_STATES and int(frame.get("attempts") or 0) == target:
            note(f"--- attempt {target} ended: {how}; frame {frame_id} is {state} ---")
            return state
        note(f"--- attempt {target} ended: {how}; following attempt {target + 1} ---")
        target += 1
