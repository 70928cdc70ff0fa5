"""Writing an attempt's log: opening it without following a link planted by someone else
(:func:`open_frame_log`, the root log directory's rules, the OpenCue-named ``rqlog/`` link),
its header and footer lines and cuectl's notes, and its size cap while the frame writes it
(``_LogCap``; the 64 KiB a frame filling a full disk keeps)."""

from __future__ import annotations

import errno
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from cuectl import config
from cuectl.units import iso

if TYPE_CHECKING:
    from cuectl.run.frame.process import ExitInfo
    from cuectl.run.frame.start import RunAs

LOG_FILE_MODE = 0o640  # DESIGN §3: logs readable by owner and group, never the world
LOG_DIR_MODE = 0o750
ROOT_LOG_DIR_MODE = 0o711  # a root worker's top log directory: users pass through, never list


def log_header(frame_id: str, attempt: int, host: str, at: float | None = None) -> str:
    """The line written to the log before each attempt starts."""
    when = iso(time.time() if at is None else at)
    return f"=== cuectl frame {frame_id} attempt {attempt} on {host} at {when} ==="


def log_footer(
    frame_id: str,
    attempt: int,
    info: "ExitInfo",
    *,
    timeout_s: float | None = None,
    grace: float | None = None,
    sigkilled: bool = False,
) -> str:
    """The line appended to the log when an attempt ends (after any cut of the log, so it
    is always there): how it ended — ``exit N``, ``killed by signal N (NAME)``, ``timed out
    after T s, stopped with SIGTERM`` / ``…, SIGKILL after the G s grace period``, ``killed
    by user request (ACTION), …`` or ``stopped by cuectl (REASON), …``."""
    return (
        f"=== cuectl frame {frame_id} attempt {attempt} ended {iso(info.ended_at)}: "
        f"{describe_end(info, timeout_s=timeout_s, grace=grace, sigkilled=sigkilled)} ==="
    )


def describe_end(
    info: "ExitInfo", *, timeout_s: float | None = None, grace: float | None = None, sigkilled: bool = False
) -> str:
    """How an attempt ended, in the words of :func:`log_footer`."""
    if info.killed:
        stop = (
            f"SIGKILL after the {grace:g} s grace period"
            if sigkilled and grace is not None
            else "SIGKILL"
            if sigkilled
            else "stopped with SIGTERM"
        )
        reason = info.kill_reason or "killed"
        if info.timed_out or reason == "timeout":
            return f"timed out after {timeout_s:g} s, {stop}" if timeout_s is not None else f"timed out, {stop}"
        if reason.startswith(_USER_KILL):
            return f"killed by user request ({reason[len(_USER_KILL) :]}), {stop}"
        return f"stopped by cuectl ({reason}), {stop}"
    if info.exit_signal is not None:
        return f"killed by signal {info.exit_signal} ({signal_name(info.exit_signal)})"
    if info.exit_code is not None:
        return f"exit {info.exit_code}"
    return "exit status unknown (the process was reaped elsewhere)"


_USER_KILL = "user asked to "


def signal_name(number: int) -> str:
    import signal  # (its enums cost ~3 ms of a store's import: only once a name is wanted)

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


class UnsafeLogPath(OSError):
    """The frame log cannot be opened without following a link or touching someone else's
    file (docs/security.md, "Frame logs"). Nothing was created or written."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EPERM, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC


def open_frame_log(
    log_path: Path,
    *,
    log_root: str | Path | None = None,
    owner: "RunAs | None" = None,
    rqlog: "RqlogLink | None" = None,
) -> int:
    """Open (append; create ``0640``) an attempt's log ``<log root>/<job id>/<file>`` and
    return the fd (close-on-exec), without ever following a link planted by someone else.

    A root worker opens logs in directories other users can write to (the job directory
    belongs to the job's user), so every step is relative to a directory handle:

    * the log root (``log_root``; default ``log_path.parent.parent``) is the worker's own
      configuration and is opened normally — unless it is a symbolic link owned by
      somebody other than root or the worker's user, which is refused;
    * the job directory is created (``0750``) and opened with ``O_NOFOLLOW`` from the
      root's handle, and must be owned by the worker's user or the frame's user;
    * the file is created or opened with ``O_NOFOLLOW`` from the job directory's handle
      (``O_NONBLOCK``, so a planted FIFO cannot hang the worker) and must be a regular
      file with one link, owned by the worker's user or the frame's user.

    When ``owner`` (the account the frame runs as) differs from the worker's user and the
    worker is root, what is created here is handed to that user (``fchown`` on the handle),
    so a frame never writes into a root-owned file. Raises :class:`UnsafeLogPath` for
    anything refused and ``OSError`` for other failures (disk full, permissions).

    ``rqlog``: once the file is open, the job's OpenCue-named link is pointed at it
    (:func:`_link_rqlog`); that never raises.
    """
    log_path = Path(log_path)
    root = Path(log_root) if log_root is not None else log_path.parent.parent
    job_dir, name = log_path.parent.name, log_path.name
    if log_path.parent.parent != root or job_dir in ("", ".", "..") or name in ("", ".", ".."):
        raise UnsafeLogPath(f"log path {log_path} is not a file of a job directory under {root}")
    return _open_log_fds(log_path, root, owner, rw=False, rqlog=rqlog)[0]


@dataclass(frozen=True)
class RqlogLink:
    """The OpenCue-named link to make for an attempt's log (``logs.rqlog_name``), and whom to
    tell when it cannot be made (the worker says so once per job): a missing link costs
    CueGUI its view of the log, never the frame its run."""

    name: str
    on_error: Callable[[str], None] | None = None


def _open_log_fds(
    log_path: Path, root: Path, owner: "RunAs | None", *, rw: bool, create: bool = True, rqlog: RqlogLink | None = None
) -> tuple[int, int | None]:
    """(append fd, and with ``rw`` a second, non-append read-write fd of the same file).

    The second descriptor is what the worker keeps to cap the log: ``pwrite`` on an
    ``O_APPEND`` descriptor appends on Linux whatever the offset, and the append one's file
    description is shared with the frame, so its flags must not change.

    ``create=False`` (notes on a running frame): nothing is created, and the file is
    accepted when it belongs to the worker's user or to the owner of its job directory —
    a note then lands only in a file that user could write anyway.

    ``rqlog`` (with ``create``): the link is made from the job directory's handle once the
    file is open, with the job directory's rules (:func:`_link_rqlog`)."""
    euid = os.geteuid()
    chown_to = None
    root_fd = _open_log_root(root, euid)
    try:
        if create and owner is not None and euid == 0 and owner.uid != euid:
            setgid = bool(os.fstat(root_fd).st_mode & stat.S_ISGID)
            chown_to = (owner.uid, -1 if setgid else owner.gid)  # a setgid root's group is inherited
        dir_owners = ({euid} | ({owner.uid} if owner is not None else set())) if create else None
        dir_fd = _open_job_dir(root_fd, log_path.parent.name, log_path.parent, dir_owners, chown_to)
    finally:
        os.close(root_fd)
    try:
        file_owners = {euid, os.fstat(dir_fd).st_uid}
        fd = _open_log_file(dir_fd, log_path.name, log_path, file_owners, chown_to, create=create)
        if rqlog is not None and create and dir_owners is not None:
            _link_rqlog(dir_fd, log_path, rqlog, dir_owners, chown_to)
        if not rw:
            return fd, None
        try:
            rw_fd = os.open(log_path.name, os.O_RDWR | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
            a, b = os.fstat(fd), os.fstat(rw_fd)
            if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
                os.close(rw_fd)
                raise UnsafeLogPath(f"log file {log_path} was replaced while it was opened; refusing it")
        except BaseException:
            os.close(fd)
            raise
        return fd, rw_fd
    finally:
        os.close(dir_fd)


def _open_log_root(root: Path, euid: int) -> int:
    try:
        return os.open(root, _DIR_FLAGS | _NOFOLLOW)
    except FileNotFoundError:
        # Root's log directory serves every user of a shared store (docs/deploy.md): each
        # may pass through to her own job's directory (0750, hers), none may list the others.
        root.mkdir(mode=ROOT_LOG_DIR_MODE if euid == 0 else LOG_DIR_MODE, parents=True, exist_ok=True)
        return os.open(root, _DIR_FLAGS | _NOFOLLOW)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
    # A symbolic link: an admin's (logs on a bigger disk) is followed, anyone else's is not.
    try:
        link_owner = os.lstat(root).st_uid
    except OSError:
        link_owner = -1
    if link_owner not in (0, euid):
        raise UnsafeLogPath(f"log directory {root} is a symbolic link owned by uid {link_owner}; refusing to follow it")
    return os.open(root, _DIR_FLAGS)


def _open_job_dir(
    root_fd: int, name: str, shown: Path, allowed: set[int] | None, chown_to: tuple[int, int] | None
) -> int:
    created = False
    try:
        try:  # opened first: a job's directory exists for all but its first frame here
            fd = os.open(name, _DIR_FLAGS | _NOFOLLOW, dir_fd=root_fd)
        except FileNotFoundError:
            if allowed is None:  # a note never creates the directory
                raise
            try:
                os.mkdir(name, LOG_DIR_MODE, dir_fd=root_fd)
                created = True
            except FileExistsError:
                pass  # made meanwhile by another worker: judged like any other below
            fd = os.open(name, _DIR_FLAGS | _NOFOLLOW, dir_fd=root_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeLogPath(f"log directory {shown} is a symbolic link or not a directory; refusing it") from None
        raise
    try:
        st = os.fstat(fd)
        if allowed is not None and st.st_uid not in allowed:
            raise UnsafeLogPath(
                f"log directory {shown} belongs to uid {st.st_uid}, not to the frame's user; refusing it"
            )
        if created and chown_to is not None:
            os.fchown(fd, *chown_to)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _link_rqlog(
    job_fd: int, log_path: Path, link: RqlogLink, allowed: set[int], chown_to: tuple[int, int] | None
) -> None:
    """Point ``<job dir>/rqlog/<link.name>`` at ``../<attempt log>`` (relative, so it resolves
    wherever the log share is mounted); never raises: problems go to ``link.on_error``.

    The job directory may belong to the frame's user, so ``rqlog/`` is judged exactly like
    the job directory itself (:func:`_open_job_dir`: opened with ``O_NOFOLLOW`` from the
    job directory's handle, created ``0750`` and handed to the frame's user, refused unless
    a real directory of the worker's or the frame's user): a link planted in its place is
    never followed. The link is made under a temporary name in that directory and renamed
    over the old one (``rename`` replaces a link, it never follows it), so a reader sees the
    previous attempt's log or this one's, never nothing."""
    shown = log_path.parent / "rqlog"
    tmp = f".tmp.{os.getpid()}.{os.urandom(4).hex()}"  # short: link.name may be near NAME_MAX
    try:
        rq_fd = _open_job_dir(job_fd, "rqlog", shown, allowed, chown_to)
        try:
            os.symlink(f"../{log_path.name}", tmp, dir_fd=rq_fd)
            try:
                if chown_to is not None:  # like the log itself: what a root worker makes is the user's
                    os.chown(tmp, *chown_to, dir_fd=rq_fd, follow_symlinks=False)
                os.replace(tmp, link.name, src_dir_fd=rq_fd, dst_dir_fd=rq_fd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=rq_fd)
                except OSError:
                    pass  # what the rename refused is reported; a stray temp link harms nobody
                raise
        finally:
            os.close(rq_fd)
    except (OSError, ValueError) as exc:
        if link.on_error is not None:
            why = exc.message if isinstance(exc, UnsafeLogPath) else str(getattr(exc, "strerror", None) or exc)
            link.on_error(f"no OpenCue log link {shown / link.name} for {log_path.name}: {why}")


def _open_log_file(
    dir_fd: int, name: str, shown: Path, allowed: set[int], chown_to: tuple[int, int] | None, *, create: bool = True
) -> int:
    flags = os.O_WRONLY | os.O_APPEND | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
    created = create
    try:
        if not create:
            fd = os.open(name, flags, dir_fd=dir_fd)
        else:
            try:
                fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, LOG_FILE_MODE, dir_fd=dir_fd)
            except FileExistsError:
                created = False
                fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise UnsafeLogPath(f"log file {shown} is a symbolic link, a FIFO or a directory; refusing it") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid not in allowed:
            raise UnsafeLogPath(
                f"log file {shown} is not a regular file of the frame's user with one link; refusing it"
            )
        if created and chown_to is not None:
            os.fchown(fd, *chown_to)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_log(log_path: Path) -> int:
    """An existing frame log, for a note on a running frame (never creates, never follows links)."""
    log_path = Path(log_path)
    return _open_log_fds(log_path, log_path.parent.parent, None, rw=False, create=False)[0]


def _line_bytes(line: str) -> bytes:
    # One line, whatever a hostile name contains: a newline must not forge a second header.
    text = line.replace("\r", " ").replace("\n", " ") + "\n"
    return text.encode("utf-8", "replace")


def _write_line(fd: int, line: str) -> None:
    os.write(fd, _line_bytes(line))


def _append_log(log_path: Path, line: str) -> None:
    """Add a cuectl note (timeout, kill) to a log the frame may still be writing."""
    try:
        fd = _open_log(log_path)
    except OSError:
        return  # a note is not worth failing the frame over
    try:
        _write_line(fd, line)
    except OSError:
        pass  # disk full: the note is lost, the frame's fate is decided elsewhere
    finally:
        os.close(fd)


def append_log_note(
    log_path: Path,
    line: str,
    *,
    log_root: str | Path | None = None,
    owner: "RunAs | None" = None,
    rqlog: RqlogLink | None = None,
) -> None:
    """Best effort, never raises: say in a frame's log why it never started (the worker's
    ``_log_failure``). Opened exactly like the frame's own log, so a planted link is not
    followed here either."""
    try:
        fd = open_frame_log(log_path, log_root=log_root, owner=owner, rqlog=rqlog)
    except OSError:
        return
    try:
        _write_line(fd, line)
    except OSError:
        pass
    finally:
        os.close(fd)


DEFAULT_LOG_LIMIT = config.DEFAULT_LOG_LIMIT  # 1 GiB per attempt (docs/reliability.md, "Frame logs")
MIN_LOG_LIMIT = config.MIN_LOG_LIMIT
# A running frame's log is cut back to the limit only once it is this share of the limit
# over it, so the next cut is due only after the frame wrote another quarter of the limit:
# each byte written past the limit is copied about twice, not once per poll.
_RUNNING_SLACK_SHARE = 4
_COPY_CHUNK = 1 << 20
_SPACE_CHECK_S = 1.0
# On a full filesystem, the log of a frame that keeps writing is cut to this before cuectl
# notes why the frame is stopped: room for the note, and for the store beside it.
_FULL_DISK_LOG = 64 * 1024


def _free_space_floor(st: os.statvfs_result) -> int:
    """Bytes below which the log's filesystem counts as full: 1% of it, at most 64 MiB."""
    return min(64 << 20, st.f_blocks * st.f_frsize // 100)


class _LogCap:
    """Keeps one attempt's log within ``limit`` bytes: the first half, a marker line, and
    the most recent output (docs/reliability.md, "Frame logs").

    Checked by :meth:`FrameProcess.poll` with one ``fstat`` per poll (no pipe: the frame
    writes straight into the file). While the frame runs the file is cut back to the limit
    once it is a quarter over it; when the attempt ends, to the limit. The frame's
    descriptor is ``O_APPEND``, so after a cut its next write lands at the new end. Output
    written in the instant between the last size check and the ``ftruncate`` of a cut is
    lost; nothing else is.
    """

    def __init__(self, fd: int, limit: int) -> None:
        self.fd = fd
        self.limit = max(MIN_LOG_LIMIT, int(limit))
        self.head = self.limit // 2
        self.marker = (
            f"\n=== cuectl: this attempt's log reached its limit of {self.limit} bytes: "
            "output was cut here; the most recent output follows ===\n"
        ).encode()
        self.cut = False
        self.dropped = 0
        self.last_size = 0
        self.next_space_check = time.monotonic() + _SPACE_CHECK_S
        # The frame was found filling a full disk: from then on (while it is being stopped,
        # and when it is gone) its log is kept at _FULL_DISK_LOG, not at its limit.
        self.full = False

    def started(self) -> None:
        """The header is written: only what the frame writes after it counts as growth (a
        frame that writes nothing is neither stopped nor its log called lost for a disk
        that something else filled)."""
        self.last_size = os.fstat(self.fd).st_size

    def check(self, now: float) -> str | None:
        """Cut the log back if it is over the limit; a reason to stop the frame when the
        filesystem is full and this log is still growing, else None."""
        size = os.fstat(self.fd).st_size
        if self.full:
            # Being stopped for a full disk: it refills what a cut frees in an instant, so
            # every poll until it is gone cuts it back again.
            if size > min(self.limit, _FULL_DISK_LOG):
                self.shrink(min(self.limit, _FULL_DISK_LOG))
            return None
        if size > self.limit + self.limit // _RUNNING_SLACK_SHARE:
            size = self.shrink(self.limit)
        if now < self.next_space_check:
            return None
        self.next_space_check = now + _SPACE_CHECK_S
        grew, self.last_size = size > self.last_size, size
        if not grew:
            return None
        st = os.fstatvfs(self.fd)
        if st.f_bavail * st.f_frsize >= _free_space_floor(st):
            return None
        self.full = True
        keep = min(self.limit, _FULL_DISK_LOG)
        # The kill's note is appended at the end, where the next cut may drop it: the marker
        # after the head, which every cut keeps, says it too.
        self.marker = (
            f"\n=== cuectl: the log's filesystem is full: the frame is being stopped and its log "
            f"kept to {keep} bytes: output was cut here; the most recent output follows ===\n"
        ).encode()
        self.cut = False
        self.last_size = self.shrink(keep)
        return "the log's filesystem is full"

    def shrink(self, limit: int) -> int:
        """Cut the file to at most ``limit`` bytes (head, marker, the most recent output); the size."""
        size = os.fstat(self.fd).st_size
        if size <= limit:
            return size
        head = min(self.head, limit // 2)
        if self.cut and head < self.head:  # a smaller limit than before (disk full): new marker
            self.cut = False
        keep_from = head + len(self.marker)
        tail = max(0, limit - keep_from)
        if not self.cut:
            os.pwrite(self.fd, self.marker, head)
            self.cut = True
        self.head = head
        read = size
        self._move(size - tail, keep_from, tail)
        write = keep_from + tail
        for _ in range(4):  # the frame may have written more meanwhile: keep that too
            now_size = os.fstat(self.fd).st_size
            if now_size <= read:
                break
            self._move(read, write, now_size - read)
            write += now_size - read
            read = now_size
        os.ftruncate(self.fd, write)
        self.dropped += read - write
        return write

    def _move(self, src: int, dst: int, length: int) -> None:
        # Forward copy to a lower offset: safe even where the two ranges overlap.
        done = 0
        while done < length:
            chunk = os.pread(self.fd, min(_COPY_CHUNK, length - done), src + done)
            if not chunk:
                break
            os.pwrite(self.fd, chunk, dst + done)
            done += len(chunk)

    def space_lost(self) -> bool:
        """Did output of this attempt probably never reach the log? Its filesystem is full
        (under the floor that stops a running frame) and the log grew since the last check:
        a frame can flood a small disk between two once-a-second checks, its writes then
        failing (ENOSPC) while it exits 0."""
        try:
            size = os.fstat(self.fd).st_size
            st = os.fstatvfs(self.fd)
        except OSError:
            return False
        return size > self.last_size and st.f_bavail * st.f_frsize < _free_space_floor(st)

    def finish(self, footer: str | Sequence[str] | None = None, *, lost: bool = False) -> None:
        """The frame is gone: cut to the limit with as much tail as fits, note what was cut,
        then add ``footer`` (one line, see :func:`log_footer`): the limit counts the frame's
        output, so the notes after the cut are always there. ``lost`` (``space_lost``): cut
        to what a full disk gets, freeing the rest, and say that output was lost; so is the
        log of a frame stopped for filling the disk (``full``): what it wrote in its last
        instants must not keep the disk full once it is gone."""
        try:
            try:
                self.shrink(min(self.limit, _FULL_DISK_LOG) if lost or self.full else self.limit)
            except OSError:
                pass  # disk full: the footer may still fit
            if lost:
                note = (
                    "\n=== cuectl: the log's filesystem was full when this attempt ended: some of its "
                    f"output never reached this log, and the log was cut to {os.fstat(self.fd).st_size} "
                    "bytes to free the disk; the attempt is not counted a success (log-lost) ===\n"
                ).encode()
                os.pwrite(self.fd, note, os.fstat(self.fd).st_size)
            if self.dropped:
                note = (
                    f"=== cuectl: {self.dropped} bytes of output were cut from the middle of this log "
                    f"(limit {self.limit} bytes) ===\n"
                ).encode()
                os.pwrite(self.fd, note, os.fstat(self.fd).st_size)
            if footer is not None:
                # (one line, or the worker's warnings and then that line: each kept one line)
                lines = [footer] if isinstance(footer, str) else list(footer)
                os.pwrite(self.fd, b"".join(_line_bytes(line) for line in lines), os.fstat(self.fd).st_size)
        except OSError:
            pass  # disk full or gone: the log is what it is
        finally:
            os.close(self.fd)
