"""Exclusive device leases: kernel locks on files in a host-local lock directory (DESIGN §5).

One lock file per device UUID. Holding an exclusive ``flock`` on it *is* holding the device:
the kernel drops the lock when the last file descriptor of the holder's open file goes
away — normal exit, exception, ``kill -9`` — so there are no stale locks to clean up. The
worker (queued frames), ``cuectl run`` and ``cuectl.lease()`` all take the same locks, so
ad-hoc work and queued frames never share a device.

Low level (the worker uses it directly)::

    lock = try_lock(lock_dir, device, holder="frame 42")     # None: someone else holds it
    proc = subprocess.Popen(cmd, pass_fds=[lock.share()])    # the frame keeps the device leased
    update_holder(lock, pid=proc.pid, holder="frame 42")      # `gpu leases` shows the frame's pid
    ...
    lock.release()

High level (``cuectl.lease`` and ``cuectl run``)::

    with cuectl.lease(gpus=1, min_memory="8G", wait=True, timeout=600, label="train-a") as l:
        subprocess.run(cmd, env={**os.environ, **l.env})

What the lock file holds: after taking the lock the holder writes a small JSON record into
the file itself (uuid, index, pid, holder, kind, label, user, host, since) for ``cuectl gpu
leases``. The record is informational only; the lock is the truth, and a record is read only
for a file whose lock is held.

Waiting is FIFO among the waiters of this host, as far as it is practical: each waiter holds
a ``flock``'d ticket file in ``<lock_dir>/queue`` named by its arrival time and listing the
devices it could use; a caller (waiting or not) never takes a device that an older live
waiter would take first (``_Queue.claims``). A crashed waiter's ticket loses its lock and is
ignored. The worker takes locks directly and does not queue (see ``queued_reservations`` if
it wants to yield).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import random
import re
import stat
import sys
import threading
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Mapping, Sequence

from cuectl import config, fsutil
from cuectl.errors import (Conflict, DevicesBusy, InsufficientFreeMemory, InvalidDevice, InvalidInput, LeaseError,
                           LeaseTimeout, NoMatchingDevice)
from cuectl.gpu import Discovery, discover
from cuectl.gpu.device import VENDORS, Device, normalize_vendor
from cuectl.sched.match import GpuRequest, select_devices
from cuectl.units import iso, parse_duration, parse_size

__all__ = [
    "DeviceLock", "Lease", "LeaseInfo", "LeaseRequest", "acquire", "async_lease", "break_stale", "held_uuids",
    "isolation_env", "lease", "list_leases", "lock_path", "make_request", "prepare_lock_dir",
    "queued_reservations", "try_lock", "try_lock_all", "update_holder",
]

# The lock directory is shared by every user of the machine, because a GPU is: a worker
# running as a service account, a researcher's `cuectl run` and a training service under a
# third account must all see each other's locks. World-writable so anyone can create the
# lock file of a device nobody has used yet; sticky (like /tmp) so nobody can delete or
# rename another user's files — deleting a held lock file would let the next comer lock a
# *new* file of the same name and share the device with the holder.
SHARED_DIR_MODE = 0o1777
# Any user must be able to open a lock file to lock the same device; the flock, not the
# mode, gives exclusivity. The record inside is not secret (pid, label, user).
LOCK_FILE_MODE = 0o666
LOCK_SUFFIX = ".lock"
QUEUE_DIRNAME = "queue"
TICKET_SUFFIX = ".ticket"
#: Kinds of holders shown by `gpu leases`.
KIND_WORKER, KIND_RUN, KIND_API = "worker", "run", "api"

#: How often a waiter looks again; jittered so that waiters do not move in lock-step.
POLL_S = 0.05
MAX_POLL_S = 1.0
#: Free memory is re-read at most this often while waiting (nvidia-smi is not free).
SAMPLE_EVERY_S = 0.5
_RECORD_LIMIT = 16 * 1024
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_OPEN_FLAGS = os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)


# ============================================================================ lock dir


_prepared: set[str] = set()


def prepare_lock_dir(lock_dir: Path, *, mounts_file: Path = Path("/proc/mounts")) -> Path:
    """Create the shared lock directory (mode 01777) or check an existing one; return it.

    Refuses a directory on a network filesystem: ``flock`` there is either local to one
    client or emulated, so two hosts could both "hold" a device file (and each host's
    devices are its own anyway). Checked once per process and directory.
    """
    lock_dir = Path(lock_dir)
    key = str(lock_dir)
    if key in _prepared:
        return lock_dir
    fstype = fsutil.is_network_fs(lock_dir, mounts_file)
    if fstype:
        raise LeaseError(f"lock directory {lock_dir} is on a network filesystem ({fstype}); device locks must be "
                         f"host-local", hint="set CUECTL_LOCK_DIR or --lock-dir to a local directory, e.g. "
                                             "/dev/shm/cuectl-locks")
    _make_shared_dir(lock_dir)
    _make_shared_dir(lock_dir / QUEUE_DIRNAME)
    _prepared.add(key)
    return lock_dir


def _make_shared_dir(path: Path) -> None:
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
        raise LeaseError(f"cannot create lock directory {path}: {exc.strerror or exc}",
                         hint="set CUECTL_LOCK_DIR or --lock-dir to a writable local directory") from None
    if not stat.S_ISDIR(st.st_mode):
        raise LeaseError(f"lock directory {path} is not a directory")
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise LeaseError(f"lock directory {path} is writable by everyone but not sticky: any user could delete a "
                         f"held lock file and break exclusivity", hint=f"chmod 1777 {path}")
    if not os.access(path, os.W_OK | os.X_OK):
        raise LeaseError(f"lock directory {path} is not writable by this user",
                         hint=f"its owner can `chmod 1777 {path}`; or set CUECTL_LOCK_DIR / --lock-dir")


def lock_path(lock_dir: Path, uuid: str) -> Path:
    """The lock file of device ``uuid``: the uuid itself when it is a safe file name.

    Anything else (``MIG-GPU-…/1/0`` from old drivers, odd fake uuids) becomes a sanitised
    prefix plus a hash of the whole uuid, so two uuids never share a file.
    """
    if _SAFE_NAME.fullmatch(uuid):
        name = uuid
    else:
        import hashlib  # rare path: keep it out of every lease's import time

        digest = hashlib.sha256(uuid.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        name = (re.sub(r"[^A-Za-z0-9._-]", "_", uuid)[:64].lstrip("._-") or "device") + "-" + digest
    return Path(lock_dir) / (name + LOCK_SUFFIX)


# ============================================================================ one device lock


class DeviceLock:
    """One held device. ``release()`` is idempotent; the kernel releases it anyway at exit."""

    def __init__(self, *, uuid: str, index: int, fd: int, path: Path, since: float, record: dict[str, Any],
                 writable: bool = True) -> None:
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
        if fd < 0:
            return
        try:
            if not self.shared:
                if self.writable:
                    os.ftruncate(fd, 0)
                fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError:
            pass
        finally:
            os.close(fd)

    def __repr__(self) -> str:
        state = "held" if self.held else "released"
        return f"DeviceLock(gpu {self.index}, {self.uuid}, {state})"


def _open_lock_file(path: Path) -> tuple[int, bool]:
    """Open (creating) a lock file; returns (fd, writable)."""
    for _ in range(5):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, LOCK_FILE_MODE)
        except FileExistsError:
            pass
        except OSError as exc:
            raise _lock_file_error(path, exc) from None
        else:
            os.fchmod(fd, LOCK_FILE_MODE)  # whatever the umask, other users must be able to open it
            return fd, True
        try:
            return os.open(path, os.O_RDWR | _OPEN_FLAGS), True
        except FileNotFoundError:
            continue  # removed between the two opens: create it again
        except PermissionError:
            pass
        except OSError as exc:
            raise _lock_file_error(path, exc) from None
        try:
            # Another user's file we may not write (made by a umask-less tool): flock works
            # on a read-only fd, only the record cannot be written.
            return os.open(path, os.O_RDONLY | _OPEN_FLAGS), False
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise _lock_file_error(path, exc) from None
    raise LeaseError(f"lock file {path} keeps disappearing; is something cleaning the lock directory?")


def _lock_file_error(path: Path, exc: OSError) -> LeaseError:
    if exc.errno == errno.ELOOP:
        return LeaseError(f"lock file {path} is a symbolic link; refusing to follow it",
                          hint="remove it; lock files are plain files created by cuectl")
    return LeaseError(f"cannot open lock file {path}: {exc.strerror or exc}",
                      hint="its owner can `chmod 666` it; lock files must be openable by every user")


def _same_file(fd: int, path: Path) -> bool:
    """True if ``fd`` is still the file at ``path`` (not unlinked or replaced meanwhile)."""
    try:
        mine = os.fstat(fd)
        there = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(mine.st_mode) and (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


def _identity() -> tuple[str, str]:
    global _IDENTITY
    if _IDENTITY is None:
        _IDENTITY = (config.current_user(), config.hostname())
    return _IDENTITY


_IDENTITY: tuple[str, str] | None = None


def try_lock(lock_dir: Path, device: Device, *, holder: str, pid: int | None = None, kind: str = KIND_WORKER,
             label: str | None = None) -> DeviceLock | None:
    """Lock one device without waiting; None if someone else holds it.

    ``holder`` is what `gpu leases` shows (a frame id or a label); ``pid`` the holding
    process (default: this one). The fd is close-on-exec: pass ``lock.share()`` to the
    child that should keep the device leased.
    """
    path = lock_path(lock_dir, device.uuid)
    while True:
        fd, writable = _open_lock_file(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        if _same_file(fd, path):
            break
        # Locked a file that someone unlinked meanwhile: it guards nothing. Try again.
        os.close(fd)
    user, host = _identity()
    since = time.time()
    record = {"uuid": device.uuid, "index": device.index, "pid": os.getpid() if pid is None else pid,
              "holder": holder, "kind": kind, "label": label, "user": user, "host": host, "since": since}
    lock = DeviceLock(uuid=device.uuid, index=device.index, fd=fd, path=path, since=since, record=record,
                      writable=writable)
    _write_record(lock)
    return lock


def _lock_all(lock_dir: Path, devices: Sequence[Device], **holder: Any) -> tuple[list[DeviceLock] | None, Device | None]:
    locks: list[DeviceLock] = []
    for device in devices:
        lock = try_lock(lock_dir, device, **holder)
        if lock is None:
            for taken in locks:
                taken.release()
            return None, device
        locks.append(lock)
    return locks, None


def try_lock_all(lock_dir: Path, devices: Sequence[Device], *, holder: str, pid: int | None = None,
                 kind: str = KIND_WORKER, label: str | None = None) -> list[DeviceLock] | None:
    """Lock every device or none (all-or-nothing, without waiting)."""
    locks, _ = _lock_all(lock_dir, devices, holder=holder, pid=pid, kind=kind, label=label)
    return locks


def update_holder(lock: DeviceLock, *, pid: int, holder: str | None = None) -> None:
    """Rewrite the record, e.g. with the frame process's pid once the worker launched it."""
    lock.record["pid"] = pid
    if holder is not None:
        lock.record["holder"] = holder
    _write_record(lock)


def _write_record(lock: DeviceLock) -> None:
    fd = lock._fd
    if not lock.writable or fd < 0:
        return
    data = json.dumps(lock.record, separators=(",", ":")).encode()
    try:
        # Write then trim (not trim then write): a reader never sees an empty file for a
        # lock whose record is being replaced, at worst a torn one, which it re-reads.
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    except OSError:
        pass  # the record is informational; a full /dev/shm must not fail the lease


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
        return {"uuid": self.uuid, "index": self.index, "pid": self.pid, "holder": self.holder,
                "since": iso(self.since), "kind": self.kind, "label": self.label, "user": self.user,
                "host": self.host}

    def describe(self) -> str:
        """``gpu 0 held by pid 4242 (train-a, alice, since 2026-…Z)``."""
        who = ", ".join(str(x) for x in (self.holder, self.user) if x)
        since = f", since {iso(self.since)}" if self.since else ""
        pid = f"pid {self.pid}" if self.pid is not None else "an unknown process"
        return f"gpu {'?' if self.index is None else self.index} held by {pid}" + (f" ({who}{since})" if who else "")


def _probe_held(path: Path) -> bool:
    """Is the lock at ``path`` held? A shared non-blocking lock attempt, released at once.

    The attempt is the only answer that is right for every holder (any user, any pid
    namespace). It holds a shared lock for a few microseconds, during which a concurrent
    non-blocking acquirer of that *free* device would see it busy; the acquisition path
    therefore never probes, only this reporting path does.
    """
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # unreadable (another user's 0600 file): we could not lock it either
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
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


def _pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def _read_live_record(path: Path, *, within: float = 0.01) -> dict[str, Any]:
    """The record of a held lock. Re-read for up to ``within`` seconds while it is missing,
    torn or names a dead pid: a new holder may be between taking the lock and writing its
    record (which takes longer than one would think on a loaded machine)."""
    deadline = time.monotonic() + within
    while True:
        record = _read_record(path)
        if record is not None and _pid_alive(record.get("pid")):
            return record
        if time.monotonic() >= deadline:
            return record or {}
        time.sleep(0.002)


def _info(path: Path, record: Mapping[str, Any], device: Device | None) -> LeaseInfo:
    def text(key: str) -> str | None:
        value = record.get(key)
        return str(value) if value is not None else None

    pid = record.get("pid")
    since = record.get("since")
    index = device.index if device is not None else record.get("index")
    uuid = device.uuid if device is not None else (text("uuid") or path.name[: -len(LOCK_SUFFIX)])
    return LeaseInfo(uuid=uuid, index=index if isinstance(index, int) else None,
                     pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
                     holder=text("holder"), since=float(since) if isinstance(since, (int, float)) else None,
                     kind=text("kind"), label=text("label"), user=text("user"), host=text("host"))


def list_leases(lock_dir: Path, devices: Sequence[Device] | None = None) -> list[LeaseInfo]:
    """Held locks only, with their holders; of ``devices``, or of every lock file in the dir."""
    lock_dir = Path(lock_dir)
    if devices is not None:
        targets: list[tuple[Path, Device | None]] = [(lock_path(lock_dir, d.uuid), d) for d in devices]
    elif lock_dir.is_dir():
        targets = [(p, None) for p in sorted(lock_dir.glob("*" + LOCK_SUFFIX))]
    else:
        targets = []
    out = [_info(path, _read_live_record(path), device) for path, device in targets if _probe_held(path)]
    return sorted(out, key=lambda i: (i.index is None, i.index if i.index is not None else 0, i.uuid))


def held_uuids(lock_dir: Path, devices: Sequence[Device]) -> set[str]:
    """UUIDs of ``devices`` whose lock someone holds right now (a hint: it may change at once)."""
    return {d.uuid for d in devices if _probe_held(lock_path(Path(lock_dir), d.uuid))}


def break_stale(lock_dir: Path, uuid: str) -> bool:
    """Clear the leftover record of a device whose holder is gone; True if there was one.

    The lock file itself is never deleted: a process that has opened it but not yet locked
    it would lock the orphan while the next comer locks a new file — two holders. Raises
    ``Conflict`` if the lock is held: a held lock is never broken (its holder, or a child
    that inherited it, is alive; the kernel frees it when they exit).
    """
    path = lock_path(Path(lock_dir), uuid)
    try:
        fd, writable = _open_lock_file(path) if path.exists() else (-1, False)
    except LeaseError:
        raise
    if fd < 0:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            info = _info(path, _read_live_record(path), None)
            raise Conflict(f"device {uuid} is not stale: {info.describe()}",
                           hint=f"stop that process; `fuser -v {path}` lists every process holding it") from None
        had_record = os.fstat(fd).st_size > 0
        if writable:
            os.ftruncate(fd, 0)
        return had_record
    finally:
        os.close(fd)


# ============================================================================ isolation env

#: Value that hides every device for CUDA, HIP and ROCr. An invalid index ends each
#: runtime's device list there (CUDA: documented in the programming guide's environment
#: variables; ROCr: ``RvdFilter`` stops at a negative index and surfaces zero devices; HIP
#: mirrors CUDA). Chosen over the empty string, which the runtimes also read as "none",
#: because tools and shell snippets often treat an empty variable as unset
#: (``${CUDA_VISIBLE_DEVICES:-0}``) and would un-hide the GPUs.
HIDE_ALL = "-1"
#: nvidia-container-runtime: ``void`` = inject no GPU into a container started from here.
NVIDIA_HIDE_ALL = "void"
_ROCR_UUID = re.compile(r"GPU-[0-9A-Fa-f]{1,16}")


def _vendor_index(device: Device) -> int:
    """The device's index within its vendor's runtime (``Device.index`` is host-wide)."""
    value = device.attributes.get("vendor_index") if device.attributes else None
    return value if isinstance(value, int) and not isinstance(value, bool) else device.index


def _cuda_id(device: Device) -> str:
    # MIG instances have no index of their own in CUDA: only their UUID selects them.
    # Whole cards: the index, which with CUDA_DEVICE_ORDER=PCI_BUS_ID is NVML's index.
    return device.uuid if device.mig_parent_uuid else str(_vendor_index(device))


def _rocr_id(device: Device) -> str:
    # ROCr takes "GPU-<unique id>" tokens (robust against enumeration order); else the index.
    return device.uuid if _ROCR_UUID.fullmatch(device.uuid) else str(_vendor_index(device))


def isolation_env(devices: Sequence[Device], *, all_vendors_present: Collection[str]) -> dict[str, str]:
    """The variables that confine a child process to ``devices`` (DESIGN §4).

    ``all_vendors_present`` are the vendors of every GPU on the host: a vendor's variables
    are set whenever the host has such GPUs, so a process leased none of them (or none at
    all: ``devices`` empty) sees them hidden. Per vendor:

    - NVIDIA: ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; ``CUDA_VISIBLE_DEVICES`` = indices (MIG
      instances by UUID) or ``-1``; ``NVIDIA_VISIBLE_DEVICES`` = UUIDs or ``void``.
    - AMD: ``ROCR_VISIBLE_DEVICES`` = UUIDs (indices where the backend has none) or ``-1``;
      ``HIP_VISIBLE_DEVICES`` = ``0..n-1`` — HIP numbers the devices ROCr left visible, so
      repeating ROCr's indices there would hide them — or ``-1``. Setting it also keeps HIP
      from reading ``CUDA_VISIBLE_DEVICES`` (meant for NVIDIA) on a mixed host.
    - Apple, Intel: nothing — they cannot be isolated by environment; usage is reported only.

    Always: ``CUE_GPUS`` (count), ``CUE_GPU_CORES`` (host-wide indices as in `gpu list`),
    ``CUE_GPU_UUIDS``.
    """
    vendors = {normalize_vendor(v) or v for v in all_vendors_present} | {d.vendor for d in devices}
    env = {
        "CUE_GPUS": str(len(devices)),
        "CUE_GPU_CORES": ",".join(str(d.index) for d in devices),
        "CUE_GPU_UUIDS": ",".join(d.uuid for d in devices),
    }
    nvidia = [d for d in devices if d.vendor == "NVIDIA"]
    if "NVIDIA" in vendors:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(_cuda_id(d) for d in nvidia) or HIDE_ALL
        env["NVIDIA_VISIBLE_DEVICES"] = ",".join(d.uuid for d in nvidia) or NVIDIA_HIDE_ALL
    amd = [d for d in devices if d.vendor == "AMD"]
    if "AMD" in vendors:
        env["ROCR_VISIBLE_DEVICES"] = ",".join(_rocr_id(d) for d in amd) or HIDE_ALL
        env["HIP_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(amd))) or HIDE_ALL
    return env


# ============================================================================ the request


@dataclass(frozen=True)
class LeaseRequest:
    """A validated lease request (see ``make_request``)."""

    gpus: int
    vendor: str | None = None
    models: tuple[str, ...] = ()
    memory_min_bytes: int = 0
    min_free_bytes: int = 0
    devices: tuple[str, ...] | None = None  # explicit ids (index or uuid) to choose from

    def gpu_request(self) -> GpuRequest:
        return GpuRequest(gpus=self.gpus, vendor=self.vendor, models=self.models,
                          memory_min_bytes=self.memory_min_bytes, min_free_bytes=self.min_free_bytes)


def make_request(gpus: int | None = None, *, vendor: str | None = None, models: str | Iterable[str] = (),
                 min_memory: str | int | None = None, min_free_memory: str | int | None = None,
                 devices: Iterable[str | int] | None = None) -> LeaseRequest:
    """Validate user input into a ``LeaseRequest``; ``InvalidInput`` (exit 2) otherwise.

    ``gpus`` defaults to the number of explicit ``devices``, else 1. Sizes are bytes (int)
    or strings as in DESIGN §5 (``8G``; a bare number is MiB).
    """
    ids = None
    if devices is not None:
        if isinstance(devices, (str, int)):
            devices = [devices]
        ids = tuple(dict.fromkeys(_device_id(d) for d in devices))
        if not ids:
            raise InvalidInput("devices: empty list (leave it out to choose from every device)")
    if gpus is None:
        gpus = len(ids) if ids else 1
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise InvalidInput(f"gpus: expected a count of 0 or more, got {gpus!r}")
    norm_vendor = None
    if vendor is not None:
        norm_vendor = normalize_vendor(vendor)
        if norm_vendor is None:
            raise InvalidInput(f"vendor: unknown vendor {vendor!r} (use one of {', '.join(VENDORS)})")
    model_list = (models,) if isinstance(models, str) else tuple(models)
    for m in model_list:
        if not isinstance(m, str) or not m.strip():
            raise InvalidInput(f"models: expected non-empty model names, got {m!r}")
    return LeaseRequest(
        gpus=gpus, vendor=norm_vendor, models=tuple(m.strip() for m in model_list),
        memory_min_bytes=0 if min_memory is None else parse_size(min_memory, field="min_memory"),
        min_free_bytes=0 if min_free_memory is None else parse_size(min_free_memory, field="min_free_memory"),
        devices=ids)


def _device_id(value: str | int) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise InvalidDevice(f"invalid device id {value!r} (use an index from `cuectl gpu list` or a UUID)")
    return str(value).strip()


def _resolve_devices(ids: Sequence[str], inventory: Sequence[Device]) -> tuple[Device, ...]:
    """Explicit ids -> devices of this host. Indices are host-wide (as `gpu list` shows)."""
    parents = {d.mig_parent_uuid for d in inventory if d.mig_parent_uuid}
    chosen: dict[str, Device] = {}
    for ident in ids:
        if re.fullmatch(r"\d+", ident):
            matches = [d for d in inventory if d.index == int(ident)]
        else:
            matches = [d for d in inventory if d.uuid.casefold() == ident.casefold()]
        if not matches:
            have = ", ".join(f"{d.index} ({d.uuid})" for d in inventory[:8]) or "no GPU"
            raise InvalidDevice(f"no device {ident!r} on this host (it has: {have})",
                                hint="use an index or UUID from `cuectl gpu list`")
        if len(matches) > 1:
            raise InvalidDevice(f"device {ident!r} is ambiguous: {', '.join(d.uuid for d in matches)}",
                                hint="name it by UUID")
        device = matches[0]
        if device.uuid in parents:
            raise InvalidDevice(f"device {ident!r} is split into MIG instances; lease one of them",
                                hint="their UUIDs are listed by `cuectl gpu list`")
        chosen[device.uuid] = device
    return tuple(chosen.values())


# ============================================================================ discovery cache


_discoveries: dict[tuple[str, str | None, int], Discovery] = {}
_discovery_lock = threading.Lock()


def _discovery(backend: str, fake_file: str | None) -> Discovery:
    """Discover once per process (NVML init, nvidia-smi: tens to hundreds of ms), then reuse.

    A fake file is keyed by its mtime so that a test rewriting it sees the new devices.
    """
    try:
        mtime = os.stat(fake_file).st_mtime_ns if fake_file else 0
    except OSError:
        mtime = -1
    key = (backend, fake_file, mtime)
    with _discovery_lock:
        found = _discoveries.get(key)
        if found is None:
            found = discover(backend, fake_file=fake_file)
            _discoveries[key] = found
        return found


def forget_discovery() -> None:
    """Drop the cached discovery (after hot-plugging, or a MIG reconfiguration)."""
    with _discovery_lock:
        _discoveries.clear()


# ============================================================================ FIFO queue


@dataclass(frozen=True)
class _Ticket:
    candidates: frozenset[str]
    gpus: int


class _Queue:
    """This host's waiters: ``<lock_dir>/queue/<arrival ns>-<pid>-<rand>.ticket``.

    A ticket lists the devices its waiter could use and is ``flock``'d by its waiter for as
    long as it waits, so a crashed waiter's ticket is recognisably dead. Names sort by
    arrival, which is the queue order.
    """

    def __init__(self, lock_dir: Path) -> None:
        self.dir = lock_dir / QUEUE_DIRNAME
        self.own: str | None = None
        self._fd = -1
        self._tickets: dict[str, _Ticket | None] = {}
        self._dead: set[str] = set()

    def join(self, candidates: Iterable[str], gpus: int, label: str) -> None:
        if self.own is not None:
            return
        name = f"{time.time_ns():020d}-{os.getpid()}-{os.urandom(3).hex()}{TICKET_SUFFIX}"
        # Locked and written under a hidden name, then renamed: no one ever sees an
        # unlocked (seemingly dead) or empty ticket.
        tmp = self.dir / f".{name}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, 0o644)
        try:
            os.fchmod(fd, 0o644)  # whatever the umask: other users' waiters must read and probe it
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, json.dumps({"candidates": sorted(candidates), "gpus": gpus, "pid": os.getpid(),
                                     "label": label, "since": time.time()}).encode())
            os.rename(tmp, self.dir / name)
        except BaseException:
            os.close(fd)
            _unlink(tmp)
            raise
        self.own, self._fd = name, fd

    def leave(self) -> None:
        if self.own is None:
            return
        _unlink(self.dir / self.own)
        os.close(self._fd)
        self.own, self._fd = None, -1

    def claims(self, free: Callable[[], Sequence[str]]) -> tuple[set[str], list[str], int]:
        """What the live waiters older than us would take of the devices that look free
        (``free()``: uuids in preference order, read only if there are older waiters), what
        is left for us, and how many such waiters there are (0: we head the queue).

        Oldest first, each waiter takes its ``gpus`` devices from what is left; one that
        cannot be satisfied yet takes everything it could use, so that younger waiters do
        not keep nibbling at a big request's devices (no starvation). Stops once nothing
        is left: with 100 waiters for 4 devices each waiter looks at about 4 tickets.
        """
        try:
            names = sorted(n for n in os.listdir(self.dir) if n.endswith(TICKET_SUFFIX) and not n.startswith("."))
        except FileNotFoundError:
            names = []
        pool: list[str] | None = None
        taken: set[str] = set()
        waiters = 0
        for name in names:
            if self.own is not None and name >= self.own:
                break
            ticket = self._ticket(name)
            if ticket is None or not self._alive(name):
                continue
            waiters += 1
            if pool is None:
                pool = list(free())
            usable = [u for u in pool if u in ticket.candidates]
            grab = usable[: ticket.gpus] if len(usable) >= ticket.gpus else usable
            taken.update(grab)
            pool = [u for u in pool if u not in grab]
            if not pool:
                break
        return taken, pool or [], waiters

    def _ticket(self, name: str) -> _Ticket | None:
        if name in self._dead:
            return None
        if name not in self._tickets:
            try:
                data = json.loads((self.dir / name).read_bytes())
                self._tickets[name] = _Ticket(frozenset(map(str, data["candidates"])), int(data["gpus"]))
            except (OSError, ValueError, KeyError, TypeError):
                self._tickets[name] = None
        return self._tickets[name]

    def _alive(self, name: str) -> bool:
        path = self.dir / name
        try:
            fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
        except OSError:
            self._dead.add(name)
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        # Its waiter died without cleaning up. Remove it if we may (same user; the sticky
        # bit stops us otherwise) — ignored from now on either way.
        self._dead.add(name)
        _unlink(path)
        return False


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _preference(device: Device) -> tuple[bool, int, int, str]:
    # The order select_devices prefers (smallest card first), so that predictions of what
    # an older waiter takes match what it will take.
    total = device.memory_total_bytes
    return (total is None, total or 0, device.index, device.uuid)


def _predicted_free(lock_dir: Path, devices: Sequence[Device]) -> list[str]:
    """UUIDs of ``devices`` that look free, in preference order — from the records, never
    by probing the locks (a probe would make a concurrent acquirer fail). A record is
    cleared on release, and one naming a dead pid is a crashed holder's. Only a guess for
    queue order; the lock attempt decides."""
    out = []
    for d in sorted(devices, key=_preference):
        record = _read_record(lock_path(lock_dir, d.uuid))
        if not record or not _pid_alive(record.get("pid")):
            out.append(d.uuid)
    return out


def queued_reservations(lock_dir: Path, devices: Sequence[Device]) -> set[str]:
    """UUIDs of ``devices`` that queued `cuectl run --wait` / ``lease(wait=True)`` callers
    are about to take — for a worker that wants to let waiting ad-hoc work go first."""
    lock_dir = Path(lock_dir)
    taken, _, _ = _Queue(lock_dir).claims(lambda: _predicted_free(lock_dir, devices))
    return taken


# ============================================================================ the lease


class Lease:
    """An exclusive lease on ``devices``; a context manager (sync and async).

    ``env`` holds the isolation variables for a child process (``{**os.environ,
    **lease.env}``), or to apply with ``os.environ.update`` before CUDA is initialised.
    ``release()`` is idempotent; the kernel releases everything if the process dies.
    """

    def __init__(self, locks: Sequence[DeviceLock], devices: Sequence[Device], env: Mapping[str, str],
                 lock_dir: Path, label: str) -> None:
        self._locks = list(locks)
        self.devices: tuple[Device, ...] = tuple(devices)
        self._env = dict(env)
        self.lock_dir = lock_dir
        self.label = label

    @property
    def env(self) -> dict[str, str]:
        return dict(self._env)

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(d.uuid for d in self.devices)

    @property
    def released(self) -> bool:
        return not any(lock.held for lock in self._locks)

    @property
    def fds(self) -> tuple[int, ...]:
        """The lock fds, for ``Popen(pass_fds=lease.fds)``: the child then keeps the devices
        leased for as long as it runs, even if this process dies."""
        return tuple(lock.share() for lock in self._locks)

    def set_holder_pid(self, pid: int) -> None:
        """Name ``pid`` (a child given ``fds``) as the holder in `gpu leases`: it is the
        process using the devices, and the one that keeps them leased if we die."""
        for lock in self._locks:
            if lock.held:
                update_holder(lock, pid=pid)

    def release(self) -> None:
        for lock in self._locks:
            lock.release()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        if getattr(self, "_locks", None) and not self.released:
            warnings.warn(f"unreleased {self!r}: release it or use `with`", ResourceWarning, stacklevel=2)
            self.release()

    def __repr__(self) -> str:
        gpus = ",".join(str(d.index) for d in self.devices) or "none"
        return f"<Lease gpus={gpus} label={self.label!r}{' released' if self.released else ''}>"


def _default_label() -> str:
    argv0 = sys.argv[0] if sys.argv else ""
    return "python" if argv0 in ("", "-c", "-m") else os.path.basename(argv0)


class _Acquirer:
    """One acquisition: a static check up front, then attempts until success or give-up."""

    def __init__(self, request: LeaseRequest, *, lock_dir: Path, backend: str, fake_file: str | None,
                 label: str, kind: str) -> None:
        self.request = request
        self.gpu_request = request.gpu_request()
        self.lock_dir = lock_dir
        self.label = label
        self.kind = kind
        self.discovery = _discovery(backend, fake_file)
        inventory = [replace(d, memory_free_bytes=None) for d in self.discovery.devices]
        self.vendors = {d.vendor for d in inventory}
        self.candidates: tuple[Device, ...] = (_resolve_devices(request.devices, inventory)
                                               if request.devices is not None else tuple(inventory))
        self.candidate_uuids = {d.uuid for d in self.candidates}
        self.needs_sample = request.gpus > 0 and (request.memory_min_bytes > 0 or request.min_free_bytes > 0)
        self.queue = _Queue(lock_dir)
        self._free: dict[str, int | None] | None = None
        self._sampled_at = -1e9
        self.waiters_ahead = 0
        self._check_static()

    def _check_static(self) -> None:
        if self.request.gpus == 0:
            return
        result = select_devices(self.gpu_request, self.candidates)
        if not result.could_ever_fit:
            where = "the devices named" if self.request.devices is not None else "this host"
            hint = None
            if not self.discovery.devices:
                tried = "; ".join(f"{b.name}: {b.error}" for b in self.discovery.backends if not b.ok)
                hint = f"no GPU found ({tried})" if tried else "no GPU found"
            raise NoMatchingDevice(f"no device on {where} can ever satisfy the request: {result.reason}", hint=hint)

    # -- free memory -----------------------------------------------------------------

    def sample_due(self) -> bool:
        return self.needs_sample and time.monotonic() - self._sampled_at >= SAMPLE_EVERY_S

    def read_free(self) -> dict[str, int | None]:
        """Live free memory of the candidates (may be slow: run it off the event loop)."""
        samples = self.discovery.sample([d.uuid for d in self.candidates])
        return {u: s.memory_free_bytes for u, s in samples.items()}

    def set_free(self, free: dict[str, int | None]) -> None:
        self._free, self._sampled_at = free, time.monotonic()

    def _devices_now(self) -> list[Device]:
        if self._free is None:
            return list(self.candidates)
        return [replace(d, memory_free_bytes=self._free.get(d.uuid)) for d in self.candidates]

    # -- one attempt -----------------------------------------------------------------

    def attempt(self) -> Lease:
        """Take the devices now or raise ``DevicesBusy`` / ``InsufficientFreeMemory``."""
        if self.request.gpus == 0:
            return self._lease([])
        devices = self._devices_now()
        busy, waiters = self._queued_before_us()
        failed: list[Device] = []
        result = None
        # Choose among the devices not known busy, lock them, and on a lost race mark the
        # loser busy and choose again: the lock attempt is the only authority. Never
        # probe first — a probe's brief lock would make a concurrent acquirer fail.
        for _ in range(len(devices) + 1):
            result = select_devices(self.gpu_request, devices, busy=busy)
            if result.devices is None:
                break
            locks, lost = _lock_all(self.lock_dir, result.devices, holder=self.label, kind=self.kind,
                                    label=self.label)
            if locks is not None:
                return self._lease(locks)
            assert lost is not None
            busy.add(lost.uuid)
            failed.append(lost)
        raise self._refusal(devices, busy, failed, waiters, result.reason if result else None)

    def _queued_before_us(self) -> tuple[set[str], int]:
        """Devices we must leave alone for older waiters, and how many of them there are.

        At the head of the queue (the usual case: nobody waits) that is nothing — we try
        every candidate, whatever the records say. Behind others, we may try only the
        devices that look free and that the older waiters would not take first.
        """
        inventory = self.discovery.devices
        _, left, waiters = self.queue.claims(lambda: _predicted_free(self.lock_dir, inventory))
        self.waiters_ahead = waiters
        if waiters == 0:
            return set(), 0
        return {d.uuid for d in inventory} - set(left), waiters

    def _lease(self, locks: list[DeviceLock]) -> Lease:
        by_uuid = {d.uuid: d for d in self.candidates}
        devices = [by_uuid[lock.uuid] for lock in locks]
        env = isolation_env(devices, all_vendors_present=self.vendors)
        totals = [d.memory_total_bytes for d in devices if d.memory_total_bytes]
        # Same meaning as for frames: per-device memory granted, bytes (the smallest card's).
        env["CUE_GPU_MEMORY"] = str(min(totals) if totals and len(totals) == len(devices) else 0)
        return Lease(locks, devices, env, self.lock_dir, self.label)

    def _refusal(self, devices: list[Device], busy: set[str], failed: list[Device], waiters: int,
                 reason: str | None) -> LeaseError:
        if self._free is not None:
            unknown_free = [replace(d, memory_free_bytes=None) for d in devices]
            if select_devices(self.gpu_request, unknown_free, busy=busy).devices is not None:
                return InsufficientFreeMemory(f"not enough free memory on the matching devices now: {reason}",
                                              hint="wait for it (--wait / wait=True), or lower the request")
        # An error path: waiting a little for a brand-new holder's record costs nothing and
        # names the holder (a loaded CI machine needed more than the 2 ms this once allowed).
        holders = [_info(lock_path(self.lock_dir, d.uuid), _read_live_record(lock_path(self.lock_dir, d.uuid),
                                                                             within=0.25), d)
                   for d in failed]
        parts = [h.describe() for h in holders]
        if waiters:
            parts.append(f"{waiters} earlier waiter{'s' if waiters != 1 else ''} queued for "
                         f"{'them' if len(busy) > 1 else 'it'}")
        need = f"{self.request.gpus} device{'s' if self.request.gpus != 1 else ''}"
        message = f"cannot lease {need} now: " + ("; ".join(parts) if parts else (reason or "all busy"))
        return DevicesBusy(message, holders=[h.to_json() for h in holders],
                           hint="to queue for it instead, use --wait (Python: wait=True)")

    # -- waiting ---------------------------------------------------------------------

    def queue_up(self) -> None:
        self.queue.join(self.candidate_uuids, self.request.gpus, self.label)

    def close(self) -> None:
        self.queue.leave()


def _poll_delay(acq: _Acquirer, deadline: float | None) -> float:
    # Far back in the queue nothing can change for us soon: look less often (up to 1 s),
    # which keeps 100 waiters from eating the CPU the holders need. Jitter avoids lock-step.
    rounds_behind = acq.waiters_ahead / max(1, len(acq.candidates))
    delay = min(MAX_POLL_S, POLL_S * max(1.0, rounds_behind)) * random.uniform(0.6, 1.4)
    if deadline is not None:
        delay = max(0.0, min(delay, deadline - time.monotonic()))
    return delay


def _timeout_error(last: LeaseError, timeout: float) -> LeaseTimeout:
    return LeaseTimeout(f"no lease after waiting {timeout:g} s; last: {last.message}",
                        holders=list(getattr(last, "holders", [])))


def _setup(request: LeaseRequest, *, wait: bool, timeout: float | str | None, label: str | None,
           lock_dir: str | Path | None, backend: str, fake_file: str | Path | None,
           kind: str) -> tuple[_Acquirer, float | None]:
    timeout_s = None if timeout is None else parse_duration(timeout, field="timeout")
    if timeout_s is not None and not wait:
        raise InvalidInput("timeout: only meaningful when waiting (wait=True / --wait)")
    directory = prepare_lock_dir(Path(lock_dir) if lock_dir is not None else config.lock_dir())
    fake = str(fake_file) if fake_file is not None else config.fake_gpus_file()
    text = (label or "").strip()[:200] or _default_label()
    acquirer = _Acquirer(request, lock_dir=directory, backend=backend, fake_file=fake, label=text, kind=kind)
    return acquirer, timeout_s


def acquire(request: LeaseRequest, *, wait: bool = False, timeout: float | str | None = None,
            label: str | None = None, lock_dir: str | Path | None = None, backend: str = "auto",
            fake_file: str | Path | None = None, kind: str = KIND_API,
            on_wait: Callable[[LeaseError], None] | None = None) -> Lease:
    """Acquire ``request`` (blocking while ``wait``); see ``lease`` for the arguments."""
    acq, timeout_s = _setup(request, wait=wait, timeout=timeout, label=label, lock_dir=lock_dir, backend=backend,
                            fake_file=fake_file, kind=kind)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        retried = False
        while True:
            if acq.sample_due():
                acq.set_free(acq.read_free())
            try:
                return acq.attempt()
            except (DevicesBusy, InsufficientFreeMemory) as exc:
                if not wait:
                    # A holder without a record may be a `gpu leases` probe or a racer that
                    # is about to let go: look once more before saying busy.
                    if not retried and isinstance(exc, DevicesBusy) and any(h["pid"] is None for h in exc.holders):
                        retried = True
                        time.sleep(0.002)
                        continue
                    raise
                if deadline is not None and time.monotonic() >= deadline:
                    raise _timeout_error(exc, timeout_s or 0.0) from None
                if acq.queue.own is None:
                    acq.queue_up()
                    if on_wait is not None:
                        on_wait(exc)
            time.sleep(_poll_delay(acq, deadline))
    finally:
        acq.close()


def lease(gpus: int | None = None, *, vendor: str | None = None, models: str | Iterable[str] = (),
          min_memory: str | int | None = None, min_free_memory: str | int | None = None,
          devices: Iterable[str | int] | None = None, wait: bool = False, timeout: float | str | None = None,
          label: str | None = None, lock_dir: str | Path | None = None, backend: str = "auto",
          fake_file: str | Path | None = None, on_wait: Callable[[LeaseError], None] | None = None) -> Lease:
    """Lease ``gpus`` matching local devices exclusively; use as a context manager.

    ``vendor`` (NVIDIA, AMD, Apple, Intel), ``models`` (any of; DESIGN §5 matching),
    ``min_memory`` (per device, total), ``min_free_memory`` (per device, free now),
    ``devices`` (explicit indices/UUIDs to choose from). ``wait``: block until free, FIFO
    among this host's waiters; ``timeout`` (seconds or ``"10m"``) bounds the wait.
    ``label`` is what `cuectl gpu leases` shows. ``on_wait`` is called once, with the
    reason, when the call starts waiting.

    Raises ``NoMatchingDevice`` (no device here could ever match), ``DevicesBusy`` (with
    ``.holders``), ``InsufficientFreeMemory``, ``InvalidDevice``, ``LeaseTimeout`` — all
    ``LeaseError``.
    """
    request = make_request(gpus, vendor=vendor, models=models, min_memory=min_memory,
                           min_free_memory=min_free_memory, devices=devices)
    return acquire(request, wait=wait, timeout=timeout, label=label, lock_dir=lock_dir, backend=backend,
                   fake_file=fake_file, on_wait=on_wait)


class async_lease:
    """``lease`` for asyncio: ``async with async_lease(gpus=1, wait=True) as l:`` or
    ``l = await async_lease(...)``. Waiting sleeps on the event loop; discovery and
    free-memory sampling (which may run nvidia-smi) run in a worker thread. Cancelling
    the waiting task leaves the queue and takes nothing."""

    def __init__(self, gpus: int | None = None, **kwargs: Any) -> None:
        self._on_wait = kwargs.pop("on_wait", None)
        self._opts = {k: kwargs.pop(k) for k in ("wait", "timeout", "label", "lock_dir", "backend", "fake_file")
                      if k in kwargs}
        self._request = make_request(gpus, **kwargs)
        self._lease: Lease | None = None

    async def _acquire(self) -> Lease:
        opts = {"wait": False, "timeout": None, "label": None, "lock_dir": None, "backend": "auto",
                "fake_file": None, **self._opts}
        wait = bool(opts.pop("wait"))
        import asyncio  # here, not at the top: asyncio costs ~40 ms to import

        acq, timeout_s = await asyncio.to_thread(_setup, self._request, wait=wait, kind=KIND_API, **opts)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while True:
                if acq.sample_due():
                    acq.set_free(await asyncio.to_thread(acq.read_free))
                try:
                    return acq.attempt()  # file operations only: microseconds
                except (DevicesBusy, InsufficientFreeMemory) as exc:
                    if not wait:
                        raise
                    if deadline is not None and time.monotonic() >= deadline:
                        raise _timeout_error(exc, timeout_s or 0.0) from None
                    if acq.queue.own is None:
                        acq.queue_up()
                        if self._on_wait is not None:
                            self._on_wait(exc)
                await asyncio.sleep(_poll_delay(acq, deadline))
        finally:
            acq.close()

    def __await__(self):
        return self._acquire().__await__()

    async def __aenter__(self) -> Lease:
        self._lease = await self._acquire()
        return self._lease

    async def __aexit__(self, *exc: object) -> None:
        if self._lease is not None:
            self._lease.release()
