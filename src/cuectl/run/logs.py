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

import errno
import os
import re
import stat
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable, Mapping

from cuectl.errors import InvalidInput, NotFound
from cuectl.sched import model as m
from cuectl.sched.store import Store

_HINT_ELSEWHERE = "logs live on the worker host unless CUECTL_LOG_DIR is a shared directory"
_HINT_LOG_DIR = ("set CUECTL_LOG_DIR to the workers' log directory (a share mounted at the same path "
                 "everywhere, see docs/deploy.md)")
_ATTEMPT_SUFFIX = re.compile(r"^(?P<stem>.+)\.(?P<attempt>[0-9]+)\.log$")
_CHUNK = 1 << 16
# After a running log was cut back to its size limit (docs/reliability.md, "Frame logs"),
# the follower goes on this many bytes before the new end, from a line start: it sees the
# most recent output and the closing lines, at the price of a few repeated lines.
_RESYNC_BYTES = 8192


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


def job_log_dir(log_dir: str | Path, job_id: int | str) -> Path:
    """A job's directory of attempt logs, ``<log dir>/<job id>`` (as ``lifecycle.log_path_sql``
    writes the attempts' paths; a frame's ``log_path`` has it as its parent)."""
    return Path(log_dir) / str(job_id)


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


def attempt_log_path(frame: Mapping[str, Any], attempt: int | None = None) -> str:
    """The log path of ``attempt`` of ``frame`` (``store.get_frame``; None: its latest).

    The store keeps the latest attempt's path (``<log dir>/<job id>/<NNNN>-<layer>.<n>.log``,
    see ``lifecycle.log_path_sql``); the others differ only in ``<n>``."""
    latest = int(frame.get("attempts") or 0)
    path = frame.get("log_path")
    if attempt is None:
        if latest < 1:  # (not a bad --attempt: the user gave none)
            raise NotFound(f"frame {frame.get('id')} has not run yet ({frame.get('state')}): it has no log",
                           hint="`cuectl frame log -f` waits for it to start")
        attempt = latest
    if attempt < 1:
        raise InvalidInput(f"--attempt: attempts count from 1, got {attempt}")
    if not path or latest < 1:
        raise NotFound(f"frame {frame['id']} has no log yet (state {frame['state']})")
    if attempt > latest:
        raise NotFound(f"frame {frame['id']} has had {latest} attempt{'s' if latest != 1 else ''}, "
                       f"not {attempt} (state {frame['state']})")
    if attempt == latest:
        return str(path)
    parent, name = os.path.split(str(path))
    match = _ATTEMPT_SUFFIX.match(name)
    if match is None or int(match["attempt"]) != latest:
        raise NotFound(f"the log path of frame {frame['id']} does not name its attempt; "
                       f"cannot tell where attempt {attempt}'s log is")
    return os.path.join(parent, f"{match['stem']}.{attempt}.log")


def open_log(log_dir: str | Path, path: str, frame_id: int) -> int:
    """Open a frame's log for reading (an fd; the caller closes it): only a regular file
    inside ``log_dir``, never through a link below it. The log directory itself may be a
    link made by root or by this user (an admin's: logs on a bigger disk), as for workers.
    Raises ``NotFound`` when the file is not there or cannot be read."""
    log_dir = os.path.abspath(str(log_dir))
    rel = os.path.relpath(os.path.abspath(path), log_dir)
    parts = rel.split(os.sep)
    if rel.startswith("..") or os.path.isabs(rel) or any(p in ("", ".", "..") for p in parts):
        raise NotFound(f"the log of frame {frame_id} ({path}) is not in the store's log directory {log_dir}",
                       hint=_HINT_LOG_DIR)
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    flags = os.O_RDONLY | nofollow | getattr(os, "O_CLOEXEC", 0)
    try:
        link = os.lstat(log_dir)
    except OSError:
        link = None
    follow = link is not None and stat.S_ISLNK(link.st_mode) and link.st_uid in (0, os.geteuid())
    # Directories are only passed through (O_PATH: a root worker's log directory is 0711,
    # which its users may search but not read).
    walk = flags | getattr(os, "O_PATH", 0) | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(log_dir, walk & ~nofollow if follow else walk)
    except OSError as exc:
        raise NotFound(f"the log directory {log_dir} cannot be read here: {exc.strerror}",
                       hint=_HINT_ELSEWHERE) from None
    try:
        for part in parts[:-1]:
            parent, fd = fd, os.open(part, walk, dir_fd=fd)
            os.close(parent)
        # O_NONBLOCK: a FIFO planted in place of the log cannot hang the reader.
        parent, fd = fd, os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=fd)
        os.close(parent)
    except OSError as exc:
        os.close(fd)
        if exc.errno == errno.ENOENT:
            raise NotFound(f"log {path} of frame {frame_id} does not exist on this machine",
                           hint=_HINT_ELSEWHERE) from None
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NotFound(f"log {path} of frame {frame_id} is behind a symbolic link; refusing it") from None
        raise NotFound(f"log {path} of frame {frame_id} cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotFound(f"log {path} of frame {frame_id} is not a regular file; refusing it")
    os.set_blocking(fd, True)
    return fd


def tail_bytes(fd: int, lines: int) -> bytes:
    """The last ``lines`` lines of the open file (read backwards in blocks: a log may be
    gigabytes); the fd is left at the end it read up to."""
    size = os.fstat(fd).st_size
    data, pos = b"", size
    while pos > 0 and data.count(b"\n") <= lines:
        step = min(_CHUNK, pos)
        pos -= step
        data = os.pread(fd, step, pos) + data
    os.lseek(fd, size, os.SEEK_SET)
    if lines <= 0:
        return b""
    kept = data.split(b"\n")
    last = kept.pop()  # b"" after a final newline, else a line still being written
    body = kept[-lines:] if last == b"" else kept[-(lines - 1):] if lines > 1 else []
    return b"".join(line + b"\n" for line in body) + last


def _write(out: BinaryIO, data: bytes) -> None:
    if data:
        out.write(data)
        out.flush()


class _Reader:
    """One attempt's open log, copied to ``out`` as it grows."""

    def __init__(self, fd: int, out: BinaryIO, note: Callable[[str], None]) -> None:
        self.fd = fd
        self.out = out
        self.note = note

    def copy(self) -> int:
        """Copy what was added since the last call; the number of bytes copied."""
        done = 0
        while True:
            pos = os.lseek(self.fd, 0, os.SEEK_CUR)
            size = os.fstat(self.fd).st_size
            if size < pos:
                self._resync(size)
                continue
            chunk = os.read(self.fd, _CHUNK)
            if not chunk:
                return done
            _write(self.out, chunk)
            done += len(chunk)

    def _resync(self, size: int) -> None:
        # The worker cut the log back to its limit (head, marker, most recent output): go on
        # near the new end, from a line start, so the most recent lines and the footer show.
        start = max(0, size - _RESYNC_BYTES)
        if start:
            block = os.pread(self.fd, size - start, start)
            newline = block.find(b"\n")
            start = start + newline + 1 if newline >= 0 else size
        os.lseek(self.fd, start, os.SEEK_SET)
        self.note("--- the log was cut back to its size limit; going on near its new end "
                  "(a few lines may repeat) ---")

    def close(self) -> None:
        os.close(self.fd)


def show_log(store: Store, frame_id: int, *, out: BinaryIO, attempt: int | None = None,
             tail: int | None = None) -> None:
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


def follow_log(store: Store, frame_id: int, *, out: BinaryIO, note: Callable[[str], None],
               attempt: int | None = None, tail: int | None = None, poll_s: float = 0.5,
               file_poll_s: float = 0.1, missing_s: float = 5.0,
               sleep: Callable[[float], None] = time.sleep) -> str:
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
    frame = store.get_frame(frame_id)
    latest = int(frame.get("attempts") or 0)
    if attempt is not None:
        if attempt < 1:
            raise InvalidInput(f"--attempt: attempts count from 1, got {attempt}")
        if attempt > latest + 1 or (attempt == latest + 1 and frame["state"] in m.DONE_STATES):
            raise NotFound(f"frame {frame_id} has had {latest} attempt{'s' if latest != 1 else ''}, "
                           f"not {attempt} (state {frame['state']})")
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
        reader = None
        missing_since = time.monotonic()
        while reader is None:
            try:
                path = attempt_log_path(frame, target)
                fd = open_log(store.log_dir_of(path), path, frame_id)
            except NotFound as exc:
                over = _attempt_over(frame, target)
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
            reader = _Reader(fd, out, note)
        # -- stream it until the store says it ended --------------------------------------
        try:
            if reader is not None:
                if first and tail is not None:
                    _write(out, tail_bytes(reader.fd, tail))
                reader.copy()
            first = False
            next_store = time.monotonic() + poll_s
            while not _attempt_over(frame, target):
                copied = reader.copy() if reader is not None else 0
                if copied:
                    continue
                now = time.monotonic()
                if now >= next_store:
                    frame = store.get_frame(frame_id)
                    next_store = now + poll_s
                    continue
                sleep(min(file_poll_s, max(0.0, next_store - now)))
            if reader is not None:
                reader.copy()  # the rest: the worker's footer is written before it reports
        finally:
            if reader is not None:
                reader.close()
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


def _attempt_over(frame: Mapping[str, Any], attempt: int) -> bool:
    """Whether ``attempt`` of the frame has ended: a later one was claimed, or the frame is
    no longer RUNNING."""
    return int(frame.get("attempts") or 0) > attempt or frame["state"] != m.RUNNING
