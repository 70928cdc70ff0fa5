"""Kernel locks on device lock files, and the records in them (who holds what).

One lock file per device UUID in a host-local lock directory. Holding an exclusive
``flock`` on it *is* holding the device: the kernel drops the lock when the last file
descriptor of the holder's open file goes away — normal exit, exception, ``kill -9`` — so
there are no stale locks to clean up.

After taking the lock the holder writes a small JSON record into the file itself (uuid,
index, pid, holder, kind, label, user, host, since) for ``cuectl gpu leases``. The record is
informational only; the lock is the truth, and a record is read only for a file whose lock
is held.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from cuectl import config, fsutil
from cuectl.errors import Conflict, LeaseError
from cuectl.gpu.device import Device
from cuectl.run import lockfile
from cuectl.run.lockfile import (
    OPEN_FLAGS,
    encode_record,
    fresh_record,
    lock_now,
    open_lock_file,
    probe_held,
    read_registry_entry,
    unlock,
    write_record,
)
from cuectl.units import iso

# The lock directory is shared by every user of the machine, because a GPU is: a worker
# running as root or a service account, a researcher's `cuectl run` and a training service
# under a third account must all see each other's locks. Nobody but its owner (root, the
# service account, or the one user of a user's own directory) may delete a lock file
# there: deleting a held lock file would let the next comer lock a *new* file of the same
# name and share the device with the holder. So the owner makes the lock files
# (``cuectl.run.lockfile``: "who may make lock files"), and the directory is sticky (like
# /tmp: nobody deletes or renames another's files) where others may write it at all. Its
# ``queue`` and ``nested`` subdirectories are world-writable and sticky: every user makes
# their wait-queue tickets and nested-lease directories there.
SHARED_DIR_MODE = 0o1777
LOCK_SUFFIX = ".lock"
#: The waiters' tickets (see ``queue``) live in this subdirectory of the lock directory.
QUEUE_DIRNAME = "queue"
#: Sub-locks of frames' devices (``nested``) live below this subdirectory.
NESTED_DIRNAME = "nested"
#: Kinds of holders shown by `gpu leases`.
KIND_WORKER, KIND_RUN, KIND_API = "worker", "run", "api"
_RECORD_LIMIT = 16 * 1024
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

# ============================================================================ lock dir

#: Lock directories checked in this process: given text -> the checked Path.
_prepared: dict[str, Path] = {}


def prepare_lock_dir(
    lock_dir: str | Path, *, create: bool | None = None, mounts_file: Path = Path("/proc/mounts")
) -> Path:
    """Create the lock directory (mode 01777) or check an existing one; return it.

    Refuses a directory on a network filesystem: ``flock`` there is either local to one
    client or emulated, so two hosts could both "hold" a device file (and each host's
    devices are its own anyway). A missing directory is created only where the docs say
    lock directories live (``config.default_lock_dirs``), or when ``create`` (None:
    ``CUECTL_CREATE_LOCK_DIR``): a root worker must not make a mistyped path anywhere, and
    a second lock directory means separate locks. Refuses a directory another user could
    swap or empty (``lockfile.check_lock_dir``: for root, anything but root's or the service
    account's, on a path only they can change), before making anything. Whoever may make
    lock files there (its owner, root) makes its ``queue`` and ``nested`` subdirectories;
    anyone else needs them made. Checked once per process and directory.
    """
    key = str(lock_dir)
    done = _prepared.get(key)
    if done is not None:
        return done
    lock_dir = Path(lock_dir)
    if (
        not lock_dir.exists()
        and not (config.create_lock_dir() if create is None else create)
        and lock_dir not in config.default_lock_dirs()
    ):
        raise LeaseError(
            f"lock directory {lock_dir} does not exist, and cuectl creates only its default ones "
            f"({', '.join(str(d) for d in config.default_lock_dirs())})",
            hint=f"check CUECTL_LOCK_DIR / --lock-dir for a typo; to use it, create it first "
            f"(install -d -m 1777 {lock_dir}) or set CUECTL_CREATE_LOCK_DIR=1",
        )
    fstype = fsutil.is_network_fs(lock_dir, mounts_file)
    if fstype:
        raise LeaseError(
            f"lock directory {lock_dir} is on a network filesystem ({fstype}); device locks must be host-local",
            hint="set CUECTL_LOCK_DIR or --lock-dir to a local directory, e.g. /dev/shm/cuectl-locks",
        )
    if os.geteuid() == 0:
        # Before anything is made: root makes no directory where another user could swap it.
        problem = lockfile.unsafe_path(key, lockfile.trusted_owners())
        if problem is not None:
            raise LeaseError(
                f"lock directory {lock_dir} is not safe for a root cuectl: {problem}", hint=lockfile.ROOT_SETUP_HINT
            )
    _make_lock_dir(lock_dir)
    owner = lockfile.lock_dir_owner(key, recheck=True)
    if lockfile.makes_lock_files(owner):
        for name in (QUEUE_DIRNAME, NESTED_DIRNAME):
            _make_subdir(lock_dir / name, owner)
    else:
        _check_subdir(lock_dir / QUEUE_DIRNAME, owner)
    _note_in_registry(lock_dir)
    _prepared[key] = lock_dir
    return lock_dir


def _make_lock_dir(path: Path) -> None:
    """Create the lock directory ``path`` (mode 1777) when it is missing."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, SHARED_DIR_MODE)
    except FileExistsError:
        return
    except OSError as exc:
        raise LeaseError(
            f"cannot create lock directory {path}: {exc.strerror or exc}",
            hint="set CUECTL_LOCK_DIR or --lock-dir to a writable local directory",
        ) from None
    os.chmod(path, SHARED_DIR_MODE)  # mkdir's mode went through the umask


def _make_subdir(path: Path, owner: int) -> None:
    """The ``queue`` or ``nested`` subdirectory of a lock directory of ``owner`` that this
    process makes lock files in: a real directory, 1777, ``owner``'s. Root takes over one
    that another user made (before its owner could, in a world-writable lock directory),
    so that she cannot remove what others make in it."""
    try:
        os.mkdir(path, SHARED_DIR_MODE)
        made = True
    except FileExistsError:
        made = False
    except OSError as exc:
        raise LeaseError(
            f"cannot create lock directory {path}: {exc.strerror or exc}",
            hint="set CUECTL_LOCK_DIR or --lock-dir to a writable local directory",
        ) from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise LeaseError(
            f"lock directory {path} is not a directory ({exc.strerror or exc})", hint="remove it; cuectl makes it"
        ) from None
    try:
        st = os.fstat(fd)
        if os.geteuid() == 0 and (st.st_uid != owner or stat.S_IMODE(st.st_mode) != SHARED_DIR_MODE):
            os.fchown(fd, owner, -1)
            made = True
        if made:
            os.fchmod(fd, SHARED_DIR_MODE)  # mkdir's mode went through the umask
            st = os.fstat(fd)
    finally:
        os.close(fd)
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise LeaseError(
            f"lock directory {path} is writable by everyone but not sticky: any user could delete a "
            f"ticket or a nested lock directory of another",
            hint=f"chmod 1777 {path}",
        )
    if not os.access(path, os.W_OK | os.X_OK):
        raise LeaseError(
            f"lock directory {path} is not writable by this user",
            hint=f"its owner can `chmod 1777 {path}`; or set CUECTL_LOCK_DIR / --lock-dir",
        )


def _check_subdir(path: Path, owner: int) -> None:
    """The ``queue`` subdirectory of a shared lock directory (``owner``'s) that another
    user made: it must be there, and writable (every waiter puts its ticket there)."""
    if not path.is_dir():
        directory = path.parent
        raise LeaseError(
            f"lock directory {directory} is not set up: {path} is missing, and in this shared lock "
            f"directory only {lockfile.makers(owner)} makes it: {lockfile.setup_command(str(directory))}",
            hint="root makes a shared lock directory's parts and lock files (docs/leases.md)",
        )
    if not os.access(path, os.W_OK | os.X_OK):
        raise LeaseError(
            f"lock directory {path} is not writable by this user", hint=f"its owner can `chmod 1777 {path}`"
        )


def provision_lock_files(lock_dir: str | Path, devices: Sequence[Device]) -> None:
    """Make the lock file of each of ``devices`` that lacks one, as root or the owner of a
    shared lock directory (root's or the service account's), where other users only open
    lock files (``lockfile``: "who may make lock files"); root takes over one another user
    made. `cuectl run` and ``cuectl.lease()`` call this at their start, the worker at each
    look at its devices (``held_uuids``): each device once per process. Nothing to do in a
    user's own lock directory, where she makes them as she leases."""
    key = str(lock_dir)
    todo = [d for d in devices if (key, d.uuid) not in _provisioned]
    if not todo:
        return
    owner = lockfile.lock_dir_owner(key)
    if lockfile.shares(owner) and lockfile.makes_lock_files(owner):
        from cuectl.run.lease.shares import provision_ledger  # (it imports this module)

        for device in todo:
            lockfile.ensure_lock_file(str(lock_path(Path(lock_dir), device.uuid)), owner)
            provision_ledger(Path(lock_dir), device.uuid, owner)
    if len(_provisioned) >= 4096:
        _provisioned.clear()
    _provisioned.update((key, d.uuid) for d in todo)


#: (lock dir, device uuid) that ``provision_lock_files`` has seen to in this process.
_provisioned: set[tuple[str, str]] = set()


def _registry_entry(lock_dir: Path) -> str:
    return _sha256_hex(str(lock_dir.resolve()).encode())[:20]


def _sha256_hex(data: bytes) -> str:
    """``hashlib.sha256(data).hexdigest()``. Every process that leases computes one (the
    registry entry); CPython's built-in sha256 gives the same digest without loading
    OpenSSL, which ``import hashlib`` does (a few ms of `cuectl run`)."""
    try:
        from _sha256 import sha256  # type: ignore[import-not-found, unused-ignore]  # CPython <= 3.11
    except ImportError:
        try:
            from _sha2 import sha256  # type: ignore[import-not-found, unused-ignore]  # CPython >= 3.12
        except ImportError:
            from hashlib import sha256
    return sha256(data).hexdigest()


def _note_in_registry(lock_dir: Path) -> None:
    """Best effort: note this lock directory in the host's registry (a sticky directory)."""
    registry = config.lock_dir_registry()
    try:
        _make_shared_dir(registry)
        entry = registry / _registry_entry(lock_dir)
        if not entry.exists():
            fd = os.open(entry, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            try:
                os.write(fd, str(lock_dir.resolve()).encode())
            finally:
                os.close(fd)
    except (OSError, LeaseError):
        pass  # the warning below is a courtesy; locking works without it


def other_lock_dirs_in_use(lock_dir: Path, warn: Callable[[str], None] | None = None) -> list[Path]:
    """Other lock directories of this machine that hold a lease right now: processes using
    them do not see this directory's leases, so two of them can use one GPU at once.

    An entry of this user's whose directory no longer exists is removed on the way, so the
    registry does not grow with every temporary lock directory ever used: a development
    machine's had 491 entries, 413 of them for directories long gone, and each worker's
    start read them all.

    The registry is writable by every user: an entry that is not a regular file, cannot be
    read, or names a directory this user cannot look at (another user's, under a 0700
    directory) is skipped, with one line to ``warn`` naming it; nothing found there is an
    error (a ``PermissionError`` stopped every non-root worker's start, issue 35) or makes
    this wait (a FIFO entry hung it)."""
    registry = config.lock_dir_registry()
    mine = _registry_entry(Path(lock_dir))
    found = []
    try:
        entries = sorted(os.listdir(registry))
    except OSError:
        return []
    prune = _prunable_registry(registry)

    def skip(entry: Path, why: str) -> None:
        if warn is not None:
            warn(f"lock-directory registry entry {entry} {why}: skipped")

    for name in entries:
        if name == mine:
            continue
        entry = registry / name
        try:
            text = read_registry_entry(str(entry))
        except FileNotFoundError:
            continue  # dropped meanwhile
        except OSError as exc:
            skip(entry, f"cannot be read ({exc.strerror or exc})")
            continue
        if text is None:
            skip(entry, "is not a regular file")
            continue
        if not text:
            continue  # being written (_note_in_registry creates it, then writes)
        if not text.startswith("/"):
            skip(entry, f"does not name an absolute path ({text[:80]!r})")
            continue
        other = Path(text)
        try:
            st = os.stat(other)
        except (FileNotFoundError, NotADirectoryError):
            st = None
        except OSError as exc:
            skip(entry, f"names {other}, which this user cannot look at ({exc.strerror or exc})")
            continue
        if st is None or not stat.S_ISDIR(st.st_mode):
            if prune:
                _drop_own_entry(entry)
            continue
        try:
            names = os.listdir(other)
        except OSError as exc:
            skip(entry, f"names {other}, which this user cannot list ({exc.strerror or exc})")
            continue
        if any(probe_held(other / n) for n in names if n.endswith(LOCK_SUFFIX) and not n.startswith(".")):
            found.append(other)
    return found


def _prunable_registry(registry: Path) -> bool:
    """May stale entries be deleted here? Only in a real directory (not a symbolic link,
    which anyone could have planted at the shared path to aim a root worker's deletions at
    files elsewhere) that belongs to root or to this user."""
    try:
        st = os.lstat(registry)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid in (0, os.geteuid())


def _drop_own_entry(entry: Path) -> None:
    """Delete ``entry`` if it is a plain file of this user's (as _note_in_registry makes
    them): another user's entry is theirs to drop, even for root."""
    try:
        st = os.lstat(entry)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
            entry.unlink()
    except OSError:
        pass  # gone meanwhile


def _make_shared_dir(path: Path) -> None:
    """The registry (a world-writable sticky directory, as /tmp): create or check it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path, SHARED_DIR_MODE)
        except FileExistsError:
            pass
        else:
            os.chmod(path, SHARED_DIR_MODE)  # mkdir's mode went through the umask
        st = os.stat(path)
    except OSError as exc:
        raise LeaseError(f"cannot create {path}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise LeaseError(f"{path} is not a directory")
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise LeaseError(f"{path} is writable by everyone but not sticky")


def lock_path(lock_dir: Path, uuid: str) -> Path:
    """The lock file of device ``uuid``: the uuid itself when it is a safe file name.

    Anything else (``MIG-GPU-…/1/0`` from old drivers, odd fake uuids) becomes a sanitised
    prefix plus a hash of the whole uuid, so two uuids never share a file.
    """
    key = (str(lock_dir), uuid)
    known = _lock_paths.get(key)
    if known is not None:
        return known
    if _SAFE_NAME.fullmatch(uuid):
        name = uuid
    else:
        digest = _sha256_hex(uuid.encode("utf-8", "surrogatepass"))[:16]
        name = (re.sub(r"[^A-Za-z0-9._-]", "_", uuid)[:64].lstrip("._-") or "device") + "-" + digest
    path = Path(lock_dir) / (name + LOCK_SUFFIX)
    if len(_lock_paths) >= 4096:
        _lock_paths.clear()
    _lock_paths[key] = path
    return path


#: (lock dir, uuid) -> lock file: a pure function of its arguments, built once per process
#: (``Path`` arithmetic costs microseconds on every lease otherwise).
_lock_paths: dict[tuple[str, str], Path] = {}


# ============================================================================ one device lock


class DeviceLock:
    """One held device. ``release()`` is idempotent; the kernel releases it anyway at exit."""

    def __init__(
        self, *, uuid: str, index: int, fd: int, path: Path, since: float, record: dict[str, Any], writable: bool = True
    ) -> None:
        self.uuid = uuid
        self.index = index
        self.path = path
        self.since = since
        self.record = record
        self.writable = writable
        #: The fd went (or may have gone) to a child: the child holds the device too.
        self.shared = False
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd >= 0

    @property
    def fd(self) -> int:
        """The lock's fd, e.g. for ``Popen(pass_fds=[lock.fd])``; the same as ``share()``.

        Handing out the raw fd counts as sharing it: from then on ``release()`` only closes
        our copy and never unlocks a child that may hold it.
        """
        return self.share()

    def share(self) -> int:
        """The fd to pass to a child process (``Popen(pass_fds=...)``).

        The child then holds the same lock: the device stays leased until the child *and*
        this process have closed it — so a frame keeps its device when the worker dies.
        """
        if self._fd < 0:
            raise LeaseError(f"lease of {self.uuid} was already released")
        self.shared = True
        return self._fd

    def share_fds(self) -> tuple[int, ...]:
        """Every fd a child must be given to hold this lease (``Popen(pass_fds=...)``): the
        lock's, and for a share (``shares.ShareLock``) its ledger entry's too."""
        return (self.share(),)

    def write_record(self) -> None:
        """Write ``record`` where `gpu leases` reads it: into the lock file."""
        fd = self._fd
        if self.writable and fd >= 0:
            write_record(fd, encode_record(self.record))

    def release(self) -> None:
        """Give up the device (idempotent).

        Not shared: clear the record and unlock at once — also for copies of the fd that
        plain ``fork()`` children (multiprocessing workers) inherited without being meant to.
        Shared with a child: only close our fd; ``LOCK_UN`` would unlock the child too, and
        the kernel frees the device when the child's copy closes. The record then stays,
        naming the child; a stale record in a free lock file is harmless because records are
        read only for held locks.
        """
        fd, self._fd = self._fd, -1
        if fd >= 0:
            unlock(fd, shared=self.shared, writable=self.writable)

    def __repr__(self) -> str:
        state = "held" if self.held else "released"
        return f"DeviceLock(gpu {self.index}, {self.uuid}, {state})"


def try_lock(
    lock_dir: Path,
    device: Device,
    *,
    holder: str,
    pid: int | None = None,
    kind: str = KIND_WORKER,
    label: str | None = None,
) -> DeviceLock | None:
    """Lock one device without waiting; None if someone else holds it.

    ``holder`` is what `gpu leases` shows (a frame id or a label); ``pid`` the holding
    process (default: this one). The fd is close-on-exec: pass ``lock.share()`` to the
    child that should keep the device leased.
    """
    path = lock_path(lock_dir, device.uuid)
    taken = lock_now(str(path))  # os calls take a str without two __fspath__ calls
    if taken is None:
        return None
    fd, writable, size = taken
    record, data = fresh_record(
        device.uuid, device.index, pid=os.getpid() if pid is None else pid, holder=holder, kind=kind, label=label
    )
    if writable:
        write_record(fd, data, old_size=size)
    return DeviceLock(
        uuid=device.uuid, index=device.index, fd=fd, path=path, since=record["since"], record=record, writable=writable
    )


def lock_all(
    lock_dir: Path,
    devices: Sequence[Device],
    *,
    holder: str,
    pid: int | None = None,
    kind: str = KIND_WORKER,
    label: str | None = None,
) -> tuple[list[DeviceLock] | None, Device | None]:
    """``try_lock_all``, also naming the device that was busy (for the caller's message)."""
    locks: list[DeviceLock] = []
    try:
        for device in devices:
            lock = try_lock(lock_dir, device, holder=holder, pid=pid, kind=kind, label=label)
            if lock is None:
                break
            locks.append(lock)
        else:
            return locks, None
    except BaseException:
        # A lock file refused (a missing one in a shared directory, another user's): the
        # devices locked before it must not stay held by a process that goes on (a worker).
        for taken in locks:
            taken.release()
        raise
    for taken in locks:
        taken.release()
    return None, device


def try_lock_all(
    lock_dir: Path,
    devices: Sequence[Device],
    *,
    holder: str,
    pid: int | None = None,
    kind: str = KIND_WORKER,
    label: str | None = None,
) -> list[DeviceLock] | None:
    """Lock every device or none (all-or-nothing, without waiting)."""
    locks, _ = lock_all(lock_dir, devices, holder=holder, pid=pid, kind=kind, label=label)
    return locks


def update_holder(lock: DeviceLock, *, pid: int, holder: str | None = None) -> None:
    """Rewrite the record, e.g. with the frame process's pid once the worker launched it."""
    lock.record["pid"] = pid
    if holder is not None:
        lock.record["holder"] = holder
    lock.write_record()


# ============================================================================ who holds what


@dataclass(frozen=True)
class LeaseInfo:
    """One held device as `gpu leases` shows it (DESIGN §9 lease shape, plus extras)."""

    uuid: str
    index: int | None
    pid: int | None
    holder: str | None
    since: float | None
    kind: str | None = None
    label: str | None = None
    user: str | None = None
    host: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "index": self.index,
            "pid": self.pid,
            "holder": self.holder,
            "since": iso(self.since),
            "kind": self.kind,
            "label": self.label,
            "user": self.user,
            "host": self.host,
        }

    def describe(self) -> str:
        """``gpu 0 held by pid 4242 (train-a, alice, since 2026-…Z)``."""
        who = ", ".join(str(x) for x in (self.holder, self.user) if x)
        since = f", since {iso(self.since)}" if self.since else ""
        pid = f"pid {self.pid}" if self.pid is not None else "an unknown process"
        return f"gpu {'?' if self.index is None else self.index} held by {pid}" + (f" ({who}{since})" if who else "")


def read_record(path: Path) -> dict[str, Any] | None:
    try:
        fd = os.open(path, os.O_RDONLY | OPEN_FLAGS)
    except OSError:
        return None
    try:
        data = os.pread(fd, _RECORD_LIMIT, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        record = json.loads(data)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def read_live_record(path: Path, *, within: float = 0.01) -> dict[str, Any]:
    """The record of a held lock. Re-read for up to ``within`` seconds while it is missing,
    torn or names a dead pid: a new holder may be between taking the lock and writing its
    record (which takes longer than one would think on a loaded machine)."""
    deadline = time.monotonic() + within
    while True:
        record = read_record(path)
        if record is not None and pid_alive(record.get("pid")):
            return record
        if time.monotonic() >= deadline:
            return record or {}
        time.sleep(0.002)


def lease_info(path: Path, record: Mapping[str, Any], device: Device | None) -> LeaseInfo:
    def text(key: str) -> str | None:
        value = record.get(key)
        return str(value) if value is not None else None

    pid = record.get("pid")
    since = record.get("since")
    index = device.index if device is not None else record.get("index")
    uuid = device.uuid if device is not None else (text("uuid") or path.name[: -len(LOCK_SUFFIX)])
    return LeaseInfo(
        uuid=uuid,
        index=index if isinstance(index, int) else None,
        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        holder=text("holder"),
        since=float(since) if isinstance(since, (int, float)) else None,
        kind=text("kind"),
        label=text("label"),
        user=text("user"),
        host=text("host"),
    )


def open_by(path: Path) -> list[int]:
    """Live pids that have the file at ``path`` open (Linux ``/proc/*/fd``; others' processes
    only as root). Slow on a busy machine (every fd of every process): an error path only."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return []
    target = (st.st_dev, st.st_ino)
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                fst = os.stat(f"/proc/{entry}/fd/{fd}")
            except OSError:
                continue
            if (fst.st_dev, fst.st_ino) == target:
                found.append(int(entry))
                break
    return sorted(found)


def holder_info(path: Path, device: Device | None, *, within: float = 0.01) -> LeaseInfo:
    """Who holds the (held) lock at ``path``: its record — and, when the pid recorded there
    is gone while the lock is still held (a child inherited the fd and outlived the holder
    that wrote the record), the live process that has the file open instead, or no pid at
    all ("unknown") when none can be seen. Never a dead pid."""
    record = dict(read_live_record(path, within=within))
    recorded = record.get("pid")
    if not pid_alive(recorded):
        live = [pid for pid in open_by(path) if pid != os.getpid()]
        record["pid"] = live[0] if live else None
        note = (
            f"inherited from pid {recorded}, which exited"
            if isinstance(recorded, int) and live
            else "holder unknown, alive"
        )
        record["holder"] = f"{record['holder']} ({note})" if record.get("holder") else note
    return lease_info(path, record, device)


def list_leases(lock_dir: Path, devices: Sequence[Device] | None = None) -> list[LeaseInfo]:
    """Held locks only, with their holders; of ``devices``, or of every lock file in the dir."""
    lock_dir = Path(lock_dir)
    if devices is not None:
        targets: list[tuple[Path, Device | None]] = [(lock_path(lock_dir, d.uuid), d) for d in devices]
    elif lock_dir.is_dir():
        targets = [(p, None) for p in sorted(lock_dir.glob("*" + LOCK_SUFFIX))]
    else:
        targets = []
    out = [holder_info(path, device) for path, device in targets if probe_held(path)]
    return sorted(out, key=lambda i: (i.index is None, i.index if i.index is not None else 0, i.uuid))


def held_uuids(lock_dir: Path, devices: Sequence[Device], *, shares: bool = True) -> set[str]:
    """UUIDs of ``devices`` whose lock someone holds right now (a hint: it may change at once);
    with ``shares`` (the default) those with a live share too, else only those held whole.

    The worker asks this at every look at its devices, from its first pass on and after
    every re-discovery: so a root worker (or the service account's, in its lock
    directory) also makes the lock file of each device it has (``provision_lock_files``),
    which users of a shared lock directory cannot make themselves."""
    provision_lock_files(lock_dir, devices)
    from cuectl.run.lease.shares import shared_uuids  # (it imports this module)

    held = {d.uuid for d in devices if probe_held(lock_path(Path(lock_dir), d.uuid))}
    # A shared lock is no holder to the probe above (shared locks coexist): shares are
    # found in the devices' budget ledgers. Either way nothing exclusive may start there.
    return held | shared_uuids(lock_dir, devices) if shares else held


def break_stale(lock_dir: Path, uuid: str) -> bool:
    """Clear the leftover record of a device whose holder is gone; True if there was one.

    The lock file itself is never deleted: a process that has opened it but not yet locked
    it would lock the orphan while the next comer locks a new file — two holders. Raises
    ``Conflict`` if the lock is held: a held lock is never broken (its holder, or a child
    that inherited it, is alive; the kernel frees it when they exit).
    """
    path = lock_path(Path(lock_dir), uuid)
    try:
        fd, writable = open_lock_file(path) if path.exists() else (-1, False)
    except LeaseError:
        raise
    if fd < 0:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            info = holder_info(path, None)
            raise Conflict(
                f"device {uuid} is not stale: {info.describe()}",
                hint=f"stop that process; `fuser -v {path}` lists every process holding it",
            ) from None
        had_record = os.fstat(fd).st_size > 0
        if writable:
            os.ftruncate(fd, 0)
        return had_record
    finally:
        os.close(fd)
