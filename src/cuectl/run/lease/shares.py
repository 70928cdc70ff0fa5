"""Shares of one GPU by memory budget (docs/gpu-health.md, "Sharing a GPU by memory budget").

A share holds the device's lock file with a *shared* ``flock`` (an exclusive lease holds
it exclusively: the kernel keeps the two apart, in both directions) and an entry in the
device's **budget ledger**, the directory ``<lock file without .lock>.shares`` beside the
lock file:

- one file per holder, ``<arrival ns>-<pid>-<random>.share``, ``flock``'d exclusively by
  its holder for as long as the share lives and holding its record (the lease record of
  ``locks`` plus ``budget_bytes``). The holder passes both descriptors to the program it
  runs, so the share lives as long as that program; a killed holder's entry loses its lock
  at once and counts for nothing from then on (it is deleted by the next taker that may);
- taking a share is one critical section under an exclusive ``flock`` of the ledger
  directory itself: read the live entries, check that their budgets plus the new one fit
  the device's memory less what other programs use, and make the new entry — so any
  number of racing takers never oversubscribe it.

Against other users of a shared lock directory: the ledger belongs to the lock
directory's owner (or root), is sticky, and only they make it (as lock files); nobody can
delete or unlock another's entry; every open refuses links and FIFOs; an entry counts for
at most the device's memory, so a forged entry denies no more than one real share of the
whole device could; and the ledger's lock is waited for only a bounded time, so a user
holding it stalls nobody (the share is refused as busy).
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from cuectl.errors import LeaseError
from cuectl.gpu.device import Device
from cuectl.run import lockfile
from cuectl.run.lease.locks import (
    KIND_WORKER,
    LOCK_SUFFIX,
    SHARED_DIR_MODE,
    DeviceLock,
    LeaseInfo,
    lease_info,
    lock_path,
)
from cuectl.units import format_bytes

SHARES_SUFFIX = ".shares"
ENTRY_SUFFIX = ".share"
_ENTRY_LIMIT = 16 * 1024
#: How long a taker waits for the ledger's lock (held for microseconds by each taker, but
#: any user who can read the directory can hold it): then the share is refused as busy.
LEDGER_PATIENCE_S = 2.0
#: The environment variable that tells a share's program its budget, in bytes.
SHARE_VAR = "CUE_GPU_SHARE_BYTES"
#: What an MPS server enforces for its clients: ``<device ordinal>=<limit>`` pairs.
MPS_LIMIT_VAR = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"


def ledger_path(lock_dir: Path, uuid: str) -> Path:
    """The budget ledger of device ``uuid``: its lock file's name with ``.shares``."""
    lock = lock_path(lock_dir, uuid)
    return lock.with_name(lock.name[: -len(LOCK_SUFFIX)] + SHARES_SUFFIX)


# ============================================================================ the ledger directory


def _open_ledger(path: Path, owner: int, *, create: bool) -> int:
    """The ledger directory's fd (a real directory of ``owner``'s or root's; sticky where
    others may write it), made first where this process makes lock files (``create``)."""
    text = str(path)
    if create:
        try:
            os.mkdir(text, SHARED_DIR_MODE)
        except FileExistsError:
            pass
        except OSError as exc:
            raise LeaseError(f"cannot create the share ledger {text}: {exc.strerror or exc}") from None
    try:
        fd = os.open(text, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise LeaseError(
            f"share ledger {text} does not exist yet, and in this shared lock directory only "
            f"{lockfile.makers(owner)} makes it (so that no user can delete another's share): "
            f"{lockfile.setup_command(os.path.dirname(text))}",
            hint="root makes the lock file and share ledger of every device it sees (docs/leases.md)",
        ) from None
    except OSError as exc:
        raise LeaseError(
            f"share ledger {text} is not a directory ({exc.strerror or exc})", hint="remove it; cuectl makes it"
        ) from None
    try:
        st = os.fstat(fd)
        if st.st_uid not in (owner, 0):
            if os.geteuid() != 0:
                raise LeaseError(
                    f"share ledger {text} belongs to {lockfile.user_name(st.st_uid)}, not to the lock "
                    f"directory's owner ({lockfile.user_name(owner)}) or root: its owner could delete "
                    "the shares of others",
                    hint=f"a root cuectl takes it over: {lockfile.setup_command(os.path.dirname(text))}",
                )
            os.fchown(fd, owner, -1)
            st = os.fstat(fd)
        if create and stat.S_IMODE(st.st_mode) != SHARED_DIR_MODE and st.st_uid == os.geteuid():
            os.fchmod(fd, SHARED_DIR_MODE)  # mkdir's mode went through the umask
            st = os.fstat(fd)
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise LeaseError(
                f"share ledger {text} is writable by others but not sticky: anyone could delete a share",
                hint=f"chmod 1777 {text}",
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def provision_ledger(lock_dir: Path, uuid: str, owner: int) -> None:
    """Make the ledger of ``uuid`` (best effort), as root or a shared lock directory's owner
    makes its lock files (``locks.provision_lock_files`` calls this)."""
    try:
        os.close(_open_ledger(ledger_path(lock_dir, uuid), owner, create=True))
    except (LeaseError, OSError):
        pass  # the share that needs it words the problem


def _lock_ledger(fd: int, patience: float) -> bool:
    """The ledger's exclusive lock, waited for at most ``patience`` seconds."""
    deadline = time.monotonic() + patience
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.0005)


# ============================================================================ entries


@dataclass(frozen=True)
class ShareEntry:
    """A live share as its entry says: its record and its budget (at most the device's memory)."""

    name: str
    budget_bytes: int
    record: dict[str, Any]


def _read_entries(dir_fd: int, total: int | None, *, prune: bool) -> list[ShareEntry]:
    """The live entries of the ledger ``dir_fd``; with ``prune`` (under the ledger's lock),
    dead ones this process may delete are deleted."""
    try:
        names = os.listdir(dir_fd)
    except OSError:
        return []
    live = []
    euid = os.geteuid()
    for name in sorted(names):
        if not name.endswith(ENTRY_SUFFIX) or name.startswith("."):
            continue
        try:
            fd = os.open(name, os.O_RDONLY | lockfile.OPEN_FLAGS, dir_fd=dir_fd)
        except OSError:
            continue  # gone, a link, unreadable: no share of ours makes such an entry
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                pass  # held: a live share
            else:
                if prune and (st.st_uid == euid or euid == 0):
                    try:
                        os.unlink(name, dir_fd=dir_fd)
                    except OSError:
                        pass
                continue
            data = os.pread(fd, _ENTRY_LIMIT, 0)
        except OSError:
            continue
        finally:
            os.close(fd)
        try:
            record = json.loads(data)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            record = {}
        budget = record.get("budget_bytes")
        if not isinstance(budget, int) or isinstance(budget, bool) or budget <= 0:
            budget = total or 0  # a live entry that says nothing sensible counts as the whole device
        if total is not None:
            budget = min(budget, total)  # never more than one real share could hold
        live.append(ShareEntry(name, budget, record))
    return live


def live_shares(lock_dir: Path, uuid: str, total: int | None = None) -> list[ShareEntry]:
    """The live shares of device ``uuid`` (a hint: it may change at once); none without a ledger."""
    try:
        fd = os.open(str(ledger_path(lock_dir, uuid)), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        return _read_entries(fd, total, prune=False)
    finally:
        os.close(fd)


def shared_uuids(lock_dir: Path, devices: Sequence[Device]) -> set[str]:
    """UUIDs of ``devices`` with a live share now (a hint). One ``listdir`` per device: an
    empty or missing ledger costs a few microseconds."""
    found = set()
    for device in devices:
        path = str(ledger_path(lock_dir, device.uuid))
        try:
            names = os.listdir(path)
        except OSError:
            continue
        if any(n.endswith(ENTRY_SUFFIX) and not n.startswith(".") for n in names) and live_shares(
            lock_dir, device.uuid
        ):
            found.add(device.uuid)
    return found


def used_shares_bytes(lock_dir: Path, device: Device) -> int:
    """The sum of the live budgets on ``device``."""
    return sum(e.budget_bytes for e in live_shares(lock_dir, device.uuid, device.memory_total_bytes))


def share_infos(lock_dir: Path, devices: Sequence[Device] | None = None) -> list[tuple[LeaseInfo, int]]:
    """Every live share (of ``devices``, or of every ledger in the directory), as a lease
    object and its budget: what `cuectl gpu leases` lists."""
    lock_dir = Path(lock_dir)
    targets: list[tuple[str, Device | None]]
    if devices is not None:
        targets = [(d.uuid, d) for d in devices]
    else:
        try:
            names = sorted(os.listdir(lock_dir))
        except OSError:
            names = []
        targets = [(n[: -len(SHARES_SUFFIX)], None) for n in names if n.endswith(SHARES_SUFFIX)]
    out = []
    for uuid, device in targets:
        total = device.memory_total_bytes if device is not None else None
        for entry in live_shares(lock_dir, uuid, total):
            record = dict(entry.record)
            record.setdefault("uuid", uuid)
            out.append((lease_info(lock_path(lock_dir, uuid), record, device), entry.budget_bytes))
    return out


# ============================================================================ one share


class ShareLock(DeviceLock):
    """A held share of one device: the shared lock on its lock file and the holder's ledger
    entry. ``share_fds()`` are both: a child given them keeps the share alive."""

    def __init__(
        self,
        *,
        uuid: str,
        index: int,
        fd: int,
        path: Path,
        since: float,
        record: dict[str, Any],
        budget_bytes: int,
        entry_fd: int,
        entry_path: Path,
    ) -> None:
        # ``writable=False``: the lock file's record is an exclusive holder's; a share never
        # writes or clears it.
        super().__init__(uuid=uuid, index=index, fd=fd, path=path, since=since, record=record, writable=False)
        self.budget_bytes = budget_bytes
        self.entry_path = entry_path
        self._entry_fd = entry_fd

    def share_fds(self) -> tuple[int, ...]:
        return (self.share(), self._entry_fd)

    def write_record(self) -> None:
        if self._entry_fd >= 0:
            lockfile.write_record(self._entry_fd, lockfile.encode_record(self.record))

    def release(self) -> None:
        entry, self._entry_fd = self._entry_fd, -1
        if entry >= 0:
            os.close(entry)  # a child given it keeps the entry locked: the share lives on
            _drop_if_free(str(self.entry_path))
        super().release()

    def __repr__(self) -> str:
        state = "held" if self.held else "released"
        return f"ShareLock(gpu {self.index}, {self.uuid}, {format_bytes(self.budget_bytes)}, {state})"


def _drop_if_free(path: str) -> None:
    """Delete our entry at ``path`` once nobody holds it (a child we gave it to may still
    run: then its lock stays, and so does the entry, until a later taker prunes it)."""
    try:
        fd = os.open(path, os.O_RDONLY | lockfile.OPEN_FLAGS)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.unlink(path)
    except OSError:
        pass  # held (BlockingIOError), or gone
    finally:
        os.close(fd)


@dataclass(frozen=True)
class NoRoom:
    """Why a share was not taken now: an exclusive holder, or too little room in the budget."""

    reason: str
    exclusive: bool = False


def room_left(total: int, shares: Sequence[ShareEntry], used_bytes: int | None) -> int:
    """What a new share may still have of a device of ``total`` bytes: its memory less the
    live budgets and less what other programs use. Memory in use beyond the live budgets
    (``used_bytes``: the device's used memory now, None when unknown) is counted as
    foreign: shares within their budgets are inside it already."""
    booked = sum(e.budget_bytes for e in shares)
    foreign = max(0, used_bytes - booked) if used_bytes is not None else 0
    return total - booked - foreign


def take_share(
    lock_dir: Path,
    device: Device,
    budget_bytes: int,
    *,
    holder: str,
    pid: int | None = None,
    kind: str = KIND_WORKER,
    label: str | None = None,
    used_bytes: int | None = None,
    patience: float = LEDGER_PATIENCE_S,
) -> ShareLock | NoRoom:
    """Take a share of ``budget_bytes`` of ``device`` without waiting for other holders:
    a ``ShareLock``, or ``NoRoom`` saying why not. ``used_bytes``: the device's memory in
    use now, if known (see ``room_left``)."""
    total = device.memory_total_bytes
    if total is None:
        return NoRoom(f"gpu {device.index} reports no memory size: a share needs one")
    path = lock_path(lock_dir, device.uuid)
    text = str(path)
    owner = lockfile.lock_dir_owner(os.path.dirname(text))
    while True:
        fd, _ = lockfile.open_lock_file(text, owner)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            size = lockfile.held_file_size(fd, text, owner)
        except BlockingIOError:
            os.close(fd)
            return NoRoom(f"gpu {device.index} is leased whole", exclusive=True)
        except BaseException:
            os.close(fd)
            raise
        if size is not None:
            break
        os.close(fd)  # locked a file unlinked meanwhile: it guards nothing
    try:
        ledger = ledger_path(lock_dir, device.uuid)
        dir_fd = _open_ledger(ledger, owner, create=lockfile.makes_lock_files(owner))
        try:
            if not _lock_ledger(dir_fd, patience):
                os.close(fd)
                return NoRoom(f"the share ledger of gpu {device.index} stayed locked for {patience:g} s")
            shares = _read_entries(dir_fd, total, prune=True)
            room = room_left(total, shares, used_bytes)
            if budget_bytes > room:
                os.close(fd)
                return NoRoom(
                    f"gpu {device.index} has {format_bytes(max(0, room))} of {format_bytes(total)} left for "
                    f"shares ({len(shares)} share{'s' if len(shares) != 1 else ''} of "
                    f"{format_bytes(sum(e.budget_bytes for e in shares))} hold it)"
                )
            record = lockfile.new_record(
                device.uuid,
                device.index,
                pid=os.getpid() if pid is None else pid,
                holder=holder,
                kind=kind,
                label=label,
            )
            record["budget_bytes"] = budget_bytes
            name = f"{time.time_ns():020d}-{os.getpid()}-{os.urandom(4).hex()}{ENTRY_SUFFIX}"
            entry = _make_entry(dir_fd, name, lockfile.encode_record(record))
            if entry is None:
                os.close(fd)
                return NoRoom(f"the share ledger of gpu {device.index}: a new entry could not be locked")
        finally:
            os.close(dir_fd)  # and with it the ledger's lock
    except BaseException:
        try:
            os.close(fd)
        except OSError:
            pass
        raise
    return ShareLock(
        uuid=device.uuid,
        index=device.index,
        fd=fd,
        path=path,
        since=record["since"],
        record=record,
        budget_bytes=budget_bytes,
        entry_fd=entry,
        entry_path=ledger / name,
    )


def _make_entry(dir_fd: int, name: str, data: bytes) -> int | None:
    """Make the entry ``name``, locked and written, in the ledger ``dir_fd`` (whose lock we
    hold): made under a hidden name, which readers skip, and renamed once locked, so that
    nobody sees it unlocked (dead) or empty. None if its lock could not be taken (someone
    opened the brand-new hidden file and holds a lock on it)."""
    hidden = f".{name}.tmp"
    entry = os.open(hidden, os.O_RDWR | os.O_CREAT | os.O_EXCL | lockfile.OPEN_FLAGS, 0o644, dir_fd=dir_fd)
    try:
        os.fchmod(entry, 0o644)  # whatever the umask: every taker reads it
        deadline = time.monotonic() + 0.1
        while True:
            try:
                fcntl.flock(entry, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.unlink(hidden, dir_fd=dir_fd)
                    os.close(entry)
                    return None
                time.sleep(0.0005)
        lockfile.write_record(entry, data)
        os.rename(hidden, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(hidden, dir_fd=dir_fd)
        except OSError:
            pass
        os.close(entry)
        raise
    return entry


# ============================================================================ the program's environment


def mps_running(environ: dict[str, str] | None = None) -> bool:
    """Is an MPS control daemon running for programs started with ``environ``? Its pipe
    directory (``CUDA_MPS_PIPE_DIRECTORY``, else ``/tmp/nvidia-mps``) holds its ``control``
    socket while it runs."""
    env = os.environ if environ is None else environ
    directory = env.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
    try:
        return stat.S_ISSOCK(os.stat(os.path.join(directory, "control")).st_mode)
    except OSError:
        return False


def share_env(budget_bytes: int, *, mps: bool) -> dict[str, str]:
    """What a share's program sees: its budget, and where an MPS server runs, the same
    budget as MPS's pinned device memory limit of its one visible device (ordinal 0, in
    MiB, rounded down)."""
    env = {SHARE_VAR: str(budget_bytes)}
    if mps:
        env[MPS_LIMIT_VAR] = f"0={max(1, budget_bytes // (1024 * 1024))}M"
    return env
