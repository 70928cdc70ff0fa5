"""One device lock file: open it safely, lock it, write the holder's record into it.

The primitives under ``cuectl.run.lease.locks`` (which adds lock directories, ``DeviceLock``
and reading records back), kept to ``os``, ``fcntl`` and ``stat`` so that ``cuectl run``'s
quick path (``cuectl.run.quick``) takes and records a lease exactly as every other holder
does, without loading ``json``, ``re`` or ``pathlib`` (each a few ms of its process).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time

from cuectl import config
from cuectl.errors import LeaseError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Mapping

# Any user must be able to open a lock file to lock the same device; the flock, not the
# mode, gives exclusivity. The record inside is not secret (pid, label, user).
LOCK_FILE_MODE = 0o666
#: Never follow a symlink planted in the shared directory; never leak an fd into a child;
#: never wait in open(2) for a FIFO planted there (its reader would block until a writer
#: came: any user could hang every lease of the machine, root's too). On a regular file
#: O_NONBLOCK changes nothing.
OPEN_FLAGS = os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK

_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def open_lock_file(path: str | os.PathLike[str]) -> tuple[int, bool]:
    """Open (creating) a lock file; returns (fd, writable).

    The file usually exists (it is never deleted): open it first and create it only when
    missing — an exception per lease costs more than the rest of the open.
    """
    for _ in range(5):
        try:
            return os.open(path, os.O_RDWR | OPEN_FLAGS), True
        except FileNotFoundError:
            pass
        except PermissionError:
            try:
                # Another user's file we may not write (made by a umask-less tool): flock
                # works on a read-only fd, only the record cannot be written.
                return os.open(path, os.O_RDONLY | OPEN_FLAGS), False
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise lock_file_error(path, exc) from None
        except OSError as exc:
            raise lock_file_error(path, exc) from None
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | OPEN_FLAGS, LOCK_FILE_MODE)
        except FileExistsError:
            continue  # created between the two opens: open it again
        except OSError as exc:
            raise lock_file_error(path, exc) from None
        os.fchmod(fd, LOCK_FILE_MODE)  # whatever the umask, other users must be able to open it
        return fd, True
    raise LeaseError(f"lock file {path} keeps disappearing; is something cleaning the lock directory?")


def lock_file_error(path: str | os.PathLike[str], exc: OSError) -> LeaseError:
    if exc.errno == errno.ELOOP:
        return LeaseError(f"lock file {path} is a symbolic link; refusing to follow it",
                          hint="remove it; lock files are plain files created by cuectl")
    return LeaseError(f"cannot open lock file {path}: {exc.strerror or exc}",
                      hint="its owner can `chmod 666` it; lock files must be openable by every user")


def file_size_if_same(fd: int, path: str | os.PathLike[str]) -> int | None:
    """``fd``'s size if it is still the file at ``path``, else None (one fstat serves both)."""
    try:
        mine = os.fstat(fd)
        there = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mine.st_mode) and (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):
        return mine.st_size
    return None


def lock_now(path: str | os.PathLike[str]) -> tuple[int, bool, int] | None:
    """Take the exclusive lock of the file at ``path`` without waiting: (fd, writable, the
    file's size when locked), or None when someone else holds it. The fd is close-on-exec."""
    while True:
        fd, writable = open_lock_file(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        size = file_size_if_same(fd, path)
        if size is not None:
            return fd, writable, size
        # Locked a file that someone unlinked meanwhile: it guards nothing. Try again.
        os.close(fd)


def new_record(uuid: str, index: int, *, pid: int, holder: str, kind: str, label: str | None) -> dict[str, Any]:
    """The record a holder writes into a device's lock file once it holds it (shown by
    `gpu leases`; ``since`` is now)."""
    global _IDENTITY
    if _IDENTITY is None:
        _IDENTITY = (config.current_user(), config.hostname())
    user, host = _IDENTITY
    return {"uuid": uuid, "index": index, "pid": pid, "holder": holder, "kind": kind, "label": label, "user": user,
            "host": host, "since": time.time()}


_IDENTITY: tuple[str, str] | None = None


def fresh_record(uuid: str, index: int, *, pid: int, holder: str, kind: str,
                 label: str | None) -> tuple[dict[str, Any], bytes]:
    """``new_record`` and its ``encode_record`` bytes. A holder writes the same record but
    for ``since`` into every lock it takes (``cuectl.lease()`` in a loop, a worker's
    frames): the rest is encoded once per process, which halves the encoding's cost."""
    record = new_record(uuid, index, pid=pid, holder=holder, kind=kind, label=label)
    key = (uuid, index, pid, holder, kind, label)
    # Exact ints only: True == 1 would otherwise find the head written for 1.
    keyed = type(index) is int and type(pid) is int
    head = _FRESH.get(key) if keyed else None
    if head is None:
        head = encode_record({k: v for k, v in record.items() if k != "since"})[:-1] + b',"since":'
        if keyed:
            if len(_FRESH) >= 256:
                _FRESH.clear()
            _FRESH[key] = head
    return record, head + float.__repr__(record["since"]).encode() + b"}"


#: (uuid, index, pid, holder, kind, label) -> their record's encoding up to ``since``.
_FRESH: dict[tuple[Any, ...], bytes] = {}


def _quote(text: str) -> str:
    """``text`` as a JSON string, exactly as ``json.dumps`` writes it (ASCII only: other
    characters as ``\\uXXXX``, beyond the BMP as a surrogate pair)."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return '"' + text + '"'  # the usual label or uuid
    out = []
    for char in text:
        code = ord(char)
        if char in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[char])
        elif 0x20 <= code < 0x7F:
            out.append(char)
        elif code > 0xFFFF:
            code -= 0x10000
            out.append(f"\\u{0xD800 | (code >> 10):04x}\\u{0xDC00 | (code & 0x3FF):04x}")
        else:
            out.append(f"\\u{code:04x}")
    return '"' + "".join(out) + '"'


def probe_held(path: str | os.PathLike[str]) -> bool:
    """Is the lock at ``path`` held? A shared non-blocking lock attempt, released at once.

    The attempt is the only answer that is right for every holder (any user, any pid
    namespace). It holds a shared lock for a few microseconds, during which a concurrent
    non-blocking acquirer of that *free* device would see it busy; the acquisition path
    therefore never probes a device's lock, only reporting does (and the quick path of
    `cuectl run` probes wait-queue tickets, as ``WaitQueue`` does).
    """
    try:
        fd = os.open(path, os.O_RDONLY | OPEN_FLAGS)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # unreadable (another user's 0600 file): we could not lock it either
    return probe_fd(fd)


def probe_fd(fd: int) -> bool:
    """``probe_held``'s attempt on ``fd`` (opened read-only by the caller, who judges a file
    it cannot open: ``WaitQueue`` counts such a ticket as dead); closes ``fd``."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def encode_record(record: Mapping[str, Any]) -> bytes:
    """``record`` as compact JSON, the bytes ``json.dumps(record, separators=(",", ":"))``
    gives for the values a record holds (text, int, float, bool, None)."""
    parts = []
    for key, value in record.items():
        kind = type(value)
        if kind is str:
            text = _quoted(value)
        elif kind is int:
            text = int.__repr__(value)
        elif kind is float:
            text = float.__repr__(value)
        elif value is None:
            text = "null"
        elif kind is bool:
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):  # subclasses (an IntEnum): as json writes them
            text = float.__repr__(value) if isinstance(value, float) else int.__repr__(value)
        else:
            text = _quoted(str(value))
        parts.append(_quoted(key) + ":" + text)
    return ("{" + ",".join(parts) + "}").encode()


def _quoted(text: str) -> str:
    """``_quote`` remembered: a process writes the same keys, uuids, user and labels into
    every record (``cuectl.lease()`` in a loop: a third of its encoding time otherwise)."""
    found = _QUOTED.get(text)
    if found is None:
        found = _quote(text)
        if len(_QUOTED) >= 1024:
            _QUOTED.clear()
        _QUOTED[text] = found
    return found


_QUOTED: dict[str, str] = {}


def write_record(fd: int, data: bytes, *, old_size: int | None = None) -> None:
    """Put ``data`` in the locked file ``fd``. Best effort: the record is informational, and
    a full /dev/shm must not fail the lease."""
    try:
        # Write then trim (not trim then write): a reader never sees an empty file for a
        # lock whose record is being replaced, at worst a torn one, which it re-reads.
        # ``old_size``: what the file held when we locked it (usually 0: release clears
        # it); nothing longer to trim then.
        os.pwrite(fd, data, 0)
        if old_size is None or old_size > len(data):
            os.ftruncate(fd, len(data))
    except OSError:
        pass


def unlock(fd: int, *, shared: bool, writable: bool) -> None:
    """Close a lock's fd. Not ``shared`` with a child: clear the record and unlock first
    (also for copies a plain ``fork()`` child inherited unasked). Shared: only close ours;
    ``LOCK_UN`` would unlock the child too."""
    try:
        if not shared:
            if writable:
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError:
        pass
    finally:
        os.close(fd)


# ============================================================================ other lock directories


def held_elsewhere(lock_dir: str, names: "list[str] | tuple[str, ...]") -> list[tuple[str, str, int]]:
    """The lock files of ``names`` (base names, ``GPU-….lock``) held right now through another
    lock directory of this machine (one the registry of ``config.lock_dir_registry`` notes):
    ``(name, that directory, holder pid)`` for each. Leases there and here do not see each
    other, so each such device is now used twice. Judged by the holder's record (a live
    pid), never by a probe, which would make a concurrent acquirer there see it busy; a
    directory inside this one or holding it (nested leases of a frame) is not another."""
    registry = config.lock_dir_registry_name()
    try:
        entries = os.listdir(registry)
    except OSError:
        return []
    mine = os.path.realpath(lock_dir)
    found = []
    for entry in entries:
        try:
            other = read_registry_entry(os.path.join(registry, entry)) or ""
        except OSError:
            continue
        if not other.startswith("/") or _related(os.path.realpath(other), mine):
            continue
        for name in names:
            pid = _live_holder(os.path.join(other, name))
            if pid:
                found.append((name, other, pid))
    return found


def read_registry_entry(path: str) -> str | None:
    """The lock directory a registry entry names, as written (stripped); None when the entry
    is not a regular file. The registry is writable by every user: a link there is not
    followed and a FIFO does not block the open (``OPEN_FLAGS``), so nothing planted there
    can hang the reader. Raises ``OSError``."""
    fd = os.open(path, os.O_RDONLY | OPEN_FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.fsdecode(os.pread(fd, 4096, 0)).strip()
    finally:
        os.close(fd)


def _related(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def _live_holder(path: str) -> int:
    """The pid a lock file's record names when that process lives, else 0."""
    try:
        fd = os.open(path, os.O_RDONLY | OPEN_FLAGS)
    except OSError:
        return 0
    try:
        data = os.pread(fd, 4096, 0)
    except OSError:
        return 0
    finally:
        os.close(fd)
    if not data:
        return 0  # released cleanly: the record is cleared
    import json  # only here: a record of another directory's lease is rare

    try:
        pid = json.loads(data).get("pid")
    except (ValueError, AttributeError):
        return 0
    if not isinstance(pid, int) or pid <= 0:
        return 0
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return 0
    except OSError:
        pass  # another user's live process
    return pid


def elsewhere_warning(uuid: str, other: str, pid: int, lock_dir: str) -> str:
    """What every lease path says of a device it leased that another lock directory holds."""
    return (f"GPU {uuid} is also leased through another lock directory, {other} (pid {pid}): its leases "
            f"and this one's ({lock_dir}) do not see each other, so the GPU is now used twice; use one "
            "lock directory on a machine (CUECTL_LOCK_DIR)")
