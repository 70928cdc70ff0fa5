"""Reading an attempt's log: opening it only inside the log directory and never through
a link below it (:func:`open_log`), its tail (:func:`tail_bytes`, byte for byte; the
failure evidence :func:`read_log_tail`), and the one follower (:func:`follow`) that both
``cuectl frame log -f`` (:func:`drive`, ``time.sleep``) and the API's ``follow=true``
(:func:`drive_async`, ``asyncio.sleep``) run, so both give the same bytes."""

from __future__ import annotations

import errno
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Generator, Iterator, Mapping, Union

from cuectl.errors import NotFound

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

_HINT_ELSEWHERE = "logs live on the worker host unless CUECTL_LOG_DIR is a shared directory"
_HINT_LOG_DIR = (
    "set CUECTL_LOG_DIR to the workers' log directory (a share mounted at the same path everywhere, see docs/deploy.md)"
)
_CHUNK = 1 << 16
#: How much of the end of a frame's log is searched for a GPU out-of-memory message (run/failure.py):
#: the error that ended a process is printed last, and scanning a multi-GB log would stall the worker loop.
DEFAULT_TAIL_BYTES = 65536


def open_log(log_dir: str | Path, path: str, frame_id: int | str) -> int:
    """Open a frame's log for reading (an fd; the caller closes it): only a regular file
    inside ``log_dir``, never through a link below it. The log directory itself may be a
    link made by root or by this user (an admin's: logs on a bigger disk), as for workers.
    Raises ``NotFound`` when the file is not there or cannot be read."""
    log_dir = os.path.abspath(str(log_dir))
    rel = os.path.relpath(os.path.abspath(path), log_dir)
    parts = rel.split(os.sep)
    if rel.startswith("..") or os.path.isabs(rel) or any(p in ("", ".", "..") for p in parts):
        raise NotFound(
            f"the log of frame {frame_id} ({path}) is not in the store's log directory {log_dir}", hint=_HINT_LOG_DIR
        )
    flags = os.O_RDONLY | _NOFOLLOW | _CLOEXEC
    try:
        link = os.lstat(log_dir)
    except OSError:
        link = None
    follow = link is not None and stat.S_ISLNK(link.st_mode) and link.st_uid in (0, os.geteuid())
    # Directories are only passed through (O_PATH: a root worker's log directory is 0711,
    # which its users may search but not read).
    walk = flags | getattr(os, "O_PATH", 0) | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(log_dir, walk & ~_NOFOLLOW if follow else walk)
    except OSError as exc:
        raise NotFound(
            f"the log directory {log_dir} cannot be read here: {exc.strerror}", hint=_HINT_ELSEWHERE
        ) from None
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
            raise NotFound(
                f"log {path} of frame {frame_id} does not exist on this machine", hint=_HINT_ELSEWHERE
            ) from None
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
    gigabytes), byte for byte: a last line still being written counts as a line and gets
    no newline it does not have. The fd is left at the end it read up to, where a follower
    goes on."""
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
    body = kept[-lines:] if last == b"" else kept[-(lines - 1) :] if lines > 1 else []
    return b"".join(line + b"\n" for line in body) + last


def read_log(fd: int, tail: int | None = None) -> bytes:
    """The whole open log from where ``fd`` is, or with ``tail`` its last lines
    (:func:`tail_bytes`); the fd is left at the end it read up to."""
    if tail is not None:
        return tail_bytes(fd, tail)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def read_log_tail(path: Path, limit: int = DEFAULT_TAIL_BYTES, *, log_root: str | Path | None = None) -> bytes:
    """The last ``limit`` bytes of the attempt log at ``path`` (a failure's evidence); ``b""``
    when there is nothing safe to read.

    Opened as every reader opens a log (:func:`open_log`, in ``log_root``, default the
    path's grandparent, the log directory): no link below the log directory is followed (a
    frame that replaced its log, or its job directory, with a link to another file must not
    make the worker read that file into a failure reason). A missing or unreadable file, and
    anything that is not a regular file (a FIFO would block, a device never ends), also give
    ``b""`` — the reason then just lacks the log's evidence. Only the tail is read, however
    large the file."""
    if limit <= 0:
        return b""
    path = Path(path)
    try:
        fd = open_log(path.parent.parent if log_root is None else log_root, str(path), path.name)
    except NotFound:
        return b""
    try:
        data = b""
        offset = max(0, os.fstat(fd).st_size - limit)
        while len(data) < limit and (chunk := os.pread(fd, limit - len(data), offset + len(data))):
            data += chunk
        # The file may have grown between fstat and the reads: keep the newest ``limit`` bytes.
        return data[-limit:]
    except OSError:
        return b""
    finally:
        os.close(fd)


# -- following: one follower, for the CLI and the API -------------------------------------------
# After a running log was cut back to its size limit (docs/reliability.md, "Frame logs"),
# the follower goes on this many bytes before the new end, from a line start: it sees the
# most recent output and the closing lines, at the price of a few repeated lines.
_RESYNC_BYTES = 8192


@dataclass(frozen=True)
class Wait:
    """A follower's step: nothing new; sleep this long, then go on."""

    seconds: float


@dataclass(frozen=True)
class Note:
    """A follower's step: something to tell the reader that is not in the log (the CLI
    prints it on stderr; the API leaves it out of the log's bytes)."""

    text: str


class Refresh:
    """A follower's step: send back the frame's current record (``store.get_frame``)."""


REFRESH = Refresh()
Step = Union[bytes, Wait, Note, Refresh]


def attempt_over(frame: Mapping[str, Any], attempt: int) -> bool:
    """Whether ``attempt`` of the frame has ended: a later one was claimed, or the frame is
    no longer RUNNING."""
    return int(frame.get("attempts") or 0) > attempt or frame["state"] != "RUNNING"


def follow(
    fd: int,
    frame: Mapping[str, Any],
    attempt: int,
    *,
    tail: int | None = None,
    poll_s: float = 0.5,
    file_poll_s: float = 0.1,
) -> Generator[Step, Any, Mapping[str, Any]]:
    """Follow attempt ``attempt``'s open log ``fd`` until the frame's record says it ended,
    then copy the rest (the worker writes its footer before it reports); returns the last
    record. The steps: ``bytes`` of the log, exactly as they are in the file (``tail``: the
    first are its last lines, :func:`tail_bytes`; a running line goes on where it stopped),
    :class:`Wait`, :class:`Note` and :data:`REFRESH`, answered by sending the frame's record
    (at most every ``poll_s`` seconds; the file is looked at every ``file_poll_s``). A log
    cut back to its size limit meanwhile is taken up again near its new end.

    Driven by :func:`drive` (``time.sleep``: ``cuectl frame log -f``) or :func:`drive_async`
    (``asyncio.sleep``: the API's ``follow=true``), so both give the same bytes."""
    if tail is not None:
        data = tail_bytes(fd, tail)
        if data:
            yield data
    yield from _copy(fd)
    next_store = time.monotonic() + poll_s
    while not attempt_over(frame, attempt):
        copied = False
        for step in _copy(fd):
            copied = True
            yield step
        if copied:
            continue
        now = time.monotonic()
        if now >= next_store:
            frame = yield REFRESH
            next_store = now + poll_s
            continue
        yield Wait(min(file_poll_s, max(0.0, next_store - now)))
    yield from _copy(fd)
    return frame


def _copy(fd: int) -> Iterator[bytes | Note]:
    """What was added to the log since the last call."""
    while True:
        pos = os.lseek(fd, 0, os.SEEK_CUR)
        size = os.fstat(fd).st_size
        if size < pos:
            # The worker cut the log back to its limit (head, marker, most recent output): go
            # on near the new end, from a line start, so the most recent lines and the footer show.
            start = max(0, size - _RESYNC_BYTES)
            if start:
                block = os.pread(fd, size - start, start)
                newline = block.find(b"\n")
                start = start + newline + 1 if newline >= 0 else size
            os.lseek(fd, start, os.SEEK_SET)
            yield Note(
                "--- the log was cut back to its size limit; going on near its new end (a few lines may repeat) ---"
            )
            continue
        chunk = os.read(fd, _CHUNK)
        if not chunk:
            return
        yield chunk


def drive(
    steps: Generator[Step, Any, Mapping[str, Any]],
    *,
    write: Callable[[bytes], None],
    note: Callable[[str], None],
    refresh: Callable[[], Mapping[str, Any]],
    sleep: Callable[[float], None] = time.sleep,
) -> Mapping[str, Any]:
    """Run a follower with blocking calls (the CLI); what it returns."""
    reply: Any = None
    while True:
        try:
            step = steps.send(reply)
        except StopIteration as stop:
            return stop.value
        reply = None
        if isinstance(step, bytes):
            write(step)
        elif isinstance(step, Wait):
            sleep(step.seconds)
        elif isinstance(step, Note):
            note(step.text)
        else:
            reply = refresh()


async def drive_async(
    steps: Generator[Step, Any, Mapping[str, Any]], refresh: Callable[[], Awaitable[Mapping[str, Any]]]
) -> AsyncIterator[bytes]:
    """Run a follower in an event loop (the API's stream): the log's bytes, with
    ``asyncio.sleep`` between them; notes are not part of the log and are left out."""
    import asyncio

    reply: Any = None
    while True:
        try:
            step = steps.send(reply)
        except StopIteration:
            return
        reply = None
        if isinstance(step, bytes):
            yield step
        elif isinstance(step, Wait):
            await asyncio.sleep(step.seconds)
        elif isinstance(step, Refresh):
            reply = await refresh()
