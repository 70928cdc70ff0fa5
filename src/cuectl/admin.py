"""Maintenance and diagnosis: prune old jobs (and their logs), back up, doctor, clear a
stale device lease record.

Library functions return data; ``cuectl admin …`` renders it.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Sequence, runtime_checkable

from cuectl import fsutil
from cuectl.errors import CuectlError, InvalidDevice, LeaseError
from cuectl.sched.store import Store

if TYPE_CHECKING:  # the lease machinery (fcntl) is imported only by `admin lease break`
    from cuectl.gpu.device import Device
    from cuectl.run.lease import LeaseInfo

#: Findings of the store's integrity check shown one per line; the rest are counted.
_PROBLEMS_SHOWN = 10


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail}


def prune(store: Store, *, older_than_s: float, now: float) -> dict[str, Any]:
    """Delete FINISHED jobs that ended more than ``older_than_s`` ago, with their logs."""
    ids = store.prune(before=now - older_than_s)
    removed_logs = 0
    for job_id in ids:
        path = store.log_dir / str(job_id)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
            removed_logs += 1
    return {"jobs": ids, "log_dirs_removed": removed_logs}


def prune_preview(store: Store, *, older_than_s: float, now: float) -> dict[str, Any]:
    """What ``prune`` with the same arguments would delete, changing nothing: each job with
    its log directory (None when it has none)."""
    from cuectl.units import iso

    jobs = []
    for job in store.prunable_jobs(before=now - older_than_s):
        path = store.log_dir / str(job["id"])
        jobs.append(
            {
                "id": job["id"],
                "name": job["name"],
                "user": job["user"],
                "finished_at": iso(job["finished_at"]),
                "log_dir": str(path) if path.is_dir() else None,
            }
        )
    return {"dry_run": True, "jobs": jobs}


def _store_checks(store: Store) -> list[Check]:
    checks = [Check("store", "ok", f"{store.url} (schema version {store.schema_version()})")]
    path = store.local_path
    if path is not None:
        fstype = fsutil.filesystem_type(Path(path)) or "unknown"
        checks.append(Check("store filesystem", "ok", f"{fstype} (local)"))
        mode = stat.S_IMODE(os.stat(path).st_mode)
        perm_problems = fsutil.store_permission_problems(Path(path))
        shared = " (group store: setgid directory)" if fsutil.in_group_dir(Path(path)) else ""
        checks.append(
            Check(
                "store permissions",
                "warn" if perm_problems else "ok",
                "; ".join(perm_problems) if perm_problems else f"{mode:o}{shared}",
            )
        )
        checks.append(_writers_check(store))
    problems = store.integrity_problems()
    if problems is None:
        checks.append(Check("store integrity", "ok", "skipped: this store has no check a client can run"))
    elif not problems:
        checks.append(
            Check(
                "store integrity",
                "ok",
                "integrity_check ok" if path is not None else "schema and row consistency checks passed",
            )
        )
    else:
        # One line per finding: each names its own rows, and a script can count them.
        checks += [Check("store integrity", "fail", p) for p in problems[:_PROBLEMS_SHOWN]]
        if len(problems) > _PROBLEMS_SHOWN:
            checks.append(Check("store integrity", "fail", f"{len(problems) - _PROBLEMS_SHOWN} more problem(s)"))
    if isinstance(store, _ServerChecks):
        checks += [Check(name, status, detail) for name, status, detail in store.doctor_checks()]
    return checks


def _writers_check(store: Store) -> Check:
    """Whether a root worker would use this store: only its owner may write it (run/sealed.py)."""
    from cuectl.run import sealed

    found = sealed.problems(store)
    if not found:
        return Check("store writers", "ok", "only its owner can write it: a root worker may use it")
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return Check(
        "store writers",
        "warn",
        f"a root worker will refuse it: {found[0]}{more}; a store several users "
        "share goes behind `cuectl serve --socket` (docs/deploy.md)",
    )


@runtime_checkable
class _ServerChecks(Protocol):
    """A store with checks of its own for `admin doctor` (PostgreSQL: the connection budget
    and what a client cannot check)."""

    def doctor_checks(self) -> list[tuple[str, str, str]]: ...


def _lock_dir_checks(lock_dir: Path) -> list[Check]:
    try:
        return _lock_dir_checks_unguarded(lock_dir)
    except OSError as exc:  # e.g. a directory this user cannot look into: a finding, not a crash
        return [Check("lock dir", "warn", f"{lock_dir}: {exc.strerror or exc}")]


def _lock_dir_checks_unguarded(lock_dir: Path) -> list[Check]:
    from cuectl.run.lease import list_leases

    if not lock_dir.exists():
        return [Check("lock dir", "ok", f"{lock_dir} (not created yet; the first lease creates it)")]
    net = fsutil.is_network_fs(lock_dir)
    checks = [
        Check("lock dir", "fail", f"{lock_dir} is on {net}: locks there are not reliable")
        if net
        else _lock_dir_owner_check(lock_dir)
    ]
    checks.append(_lock_files_check(lock_dir))
    held = list_leases(lock_dir)
    checks.append(
        Check("device leases", "ok", f"{len(held)} held" + "".join(f"; {info.describe()}" for info in held[:4]))
    )
    return checks


def _lock_dir_owner_check(lock_dir: Path) -> Check:
    """Whose the lock directory is, and so who can lease in it (docs/leases.md, "Who makes
    the lock files"): root's or the service account's is shared, a user's is hers alone."""
    from cuectl.run import lockfile

    st = lock_dir.stat()
    mode = stat.S_IMODE(st.st_mode)
    where = f"{lock_dir} ({lockfile.user_name(st.st_uid)}, mode {mode:o})"
    if mode & 0o022 and not mode & stat.S_ISVTX:
        return Check(
            "lock dir",
            "fail",
            f"{where}: writable by others but not sticky: any user could delete "
            f"another's lock file (chmod 1777 {lock_dir})",
        )
    if lockfile.shares(st.st_uid):
        return Check("lock dir", "ok", f"{where}: shared; only its owner or root makes lock files")
    if st.st_uid == os.geteuid():
        return Check(
            "lock dir",
            "ok",
            f"{where}: yours alone; other users refuse it (a machine several people "
            f"use wants root's /run/cuectl/locks)",
        )
    return Check(
        "lock dir",
        "warn",
        f"{where}: another user's, which cuectl refuses: she could delete the lock "
        f"file of a device you hold (set CUECTL_LOCK_DIR to root's /run/cuectl/locks)",
    )


def _lock_files_check(lock_dir: Path) -> Check:
    """In a shared lock directory, the devices of this machine whose lock file root (or the
    owner) has not made yet: nobody else can lease them until it does."""
    from cuectl.gpu import discover
    from cuectl.run import lockfile
    from cuectl.run.lease import lock_path

    owner = lock_dir.stat().st_uid
    if not lockfile.shares(owner):
        return Check("lock files", "ok", "made by their leases (a user's own lock directory)")
    try:
        devices = discover().devices
    except CuectlError as exc:
        return Check("lock files", "warn", f"cannot list this machine's devices: {exc.message}")
    missing = [d for d in devices if _lock_file_problem(lock_path(lock_dir, d.uuid), owner) is not None]
    if not missing:
        return Check("lock files", "ok", f"{len(devices)} device(s), each with its lock file")
    names = ", ".join(f"gpu {d.index}" for d in missing[:8]) + (", …" if len(missing) > 8 else "")
    return Check(
        "lock files",
        "warn",
        f"{names}: no usable lock file, so only {lockfile.makers(owner)} can lease "
        f"{'it' if len(missing) == 1 else 'them'}: "
        f"`sudo cuectl admin lease setup --lock-dir {lock_dir}`",
    )


def _host_checks(store, *, now: float, down_after: float) -> list[Check]:
    checks = []
    for host in store.list_hosts(now=now, down_after=down_after):
        if host["state"] == "DOWN":
            running = store.running_on_host(host["name"])
            if running:
                checks.append(
                    Check(
                        f"host {host['name']}",
                        "warn",
                        f"DOWN since {host['last_heartbeat']} with {len(running)} frame(s) still "
                        f"claimed; they are requeued when their lease expires (`cuectl admin reap`)",
                    )
                )
    return checks


def doctor(store_opener, *, lock_dir: Path, down_after: float = 60.0) -> list[Check]:
    """Every check, never raising: a broken store is a failed check, not a crash."""
    checks: list[Check] = []
    store = None
    try:
        store = store_opener()
        checks += _store_checks(store)
    except CuectlError as exc:
        checks.append(Check("store", "fail", exc.message + (f" (hint: {exc.hint})" if exc.hint else "")))
    from cuectl.gpu.doctor import check_backends

    for c in check_backends():
        checks.append(Check(f"gpu backend {c.name}", "ok" if c.ok else "warn", c.line()))
    checks += _lock_dir_checks(lock_dir)
    if store is not None:
        checks += _host_checks(store, now=time.time(), down_after=down_after)
    return checks


# ============================================================================ admin lease break


@dataclass(frozen=True)
class StaleLease:
    """What ``break_lease`` found: the device, its lock file, and the record it cleared."""

    index: int | None
    uuid: str
    lock_file: Path
    cleared: bool
    record: LeaseInfo | None  # the leftover record as it was; None if there was none (or unreadable)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "lock_file": str(self.lock_file),
            "cleared": self.cleared,
            "record": self.record.to_json() if self.record is not None else None,
        }


def break_lease(ident: str, *, lock_dir: Path, devices: Sequence[Device]) -> StaleLease:
    """Clear the leftover lease record of device ``ident`` (an index or UUID of ``devices``,
    as `gpu list` shows them; or the UUID of a lock file in ``lock_dir`` that discovery no
    longer lists, e.g. after a MIG change).

    Raises ``Conflict`` while the device is leased — a live holder is never broken — and
    ``InvalidDevice`` for an unknown device. The record is read just before it is cleared
    (``break_stale`` clears it under the lock), to say whose it was.
    """
    from cuectl.run.lease import break_stale, lock_path
    from cuectl.run.lease.locks import lease_info, read_record
    from cuectl.run.lease.request import resolve_devices

    ident = ident.strip()
    device: Device | None
    try:
        device = resolve_devices([ident], devices)[0]
        uuid = device.uuid
    except InvalidDevice:
        # A lock file named by a UUID discovery does not list: `gpu leases` shows such locks too.
        if ident.isdigit() or not lock_path(lock_dir, ident).is_file():
            raise
        device, uuid = None, ident
    path = lock_path(lock_dir, uuid)
    before = read_record(path) if path.is_file() else None
    cleared = break_stale(lock_dir, uuid)
    record = lease_info(path, before, device) if cleared and before else None
    index = device.index if device is not None else (record.index if record is not None else None)
    return StaleLease(index=index, uuid=uuid, lock_file=path, cleared=cleared, record=record)


# ============================================================================ admin lease setup


@dataclass(frozen=True)
class LockFileState:
    """One device's lock file after ``setup_lock_files``: ``problem`` is None when it is
    ready (a regular file of the lock directory's owner or root, which no user can delete)."""

    index: int
    uuid: str
    lock_file: Path
    problem: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "lock_file": str(self.lock_file),
            "ready": self.problem is None,
            "problem": self.problem,
        }


@dataclass(frozen=True)
class LockSetup:
    """What ``setup_lock_files`` did to a lock directory."""

    lock_dir: Path
    owner_uid: int
    mode: int
    files: list[LockFileState]

    @property
    def ready(self) -> bool:
        return all(f.problem is None for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "lock_dir": str(self.lock_dir),
            "owner_uid": self.owner_uid,
            "mode": f"{self.mode:o}",
            "ready": self.ready,
            "devices": [f.to_json() for f in self.files],
        }


def setup_lock_files(lock_dir: Path, devices: Sequence[Device]) -> LockSetup:
    """Set a lock directory up for every user of this machine: check it (root refuses one
    another user could change), make its ``queue/`` and ``nested/``, and make the lock file
    of each of ``devices`` that lacks one, taking over one another user made.

    In a shared lock directory (root's or ``CUECTL_SERVICE_USER``'s) only root or its owner
    makes lock files, so that no user can delete one a lease holds (docs/leases.md); a
    service that runs its worker as another account runs this as root before it starts
    (deploy/systemd/cuectl-worker.service). Unlike a lease it waits for nobody: a device
    in use keeps its lock. Raises ``LeaseError`` for a user who may not make them."""
    from cuectl.run import lockfile
    from cuectl.run.lease import lock_path, prepare_lock_dir

    directory = prepare_lock_dir(lock_dir)
    owner = lockfile.lock_dir_owner(str(directory))
    if not lockfile.makes_lock_files(owner):
        raise LeaseError(
            f"only {lockfile.makers(owner)} makes the lock files of {directory} (so that no user "
            f"can delete one a lease holds)",
            hint=f"sudo cuectl admin lease setup --lock-dir {directory}",
        )
    files = []
    for device in devices:
        path = lock_path(directory, device.uuid)
        lockfile.ensure_lock_file(str(path), owner)
        files.append(LockFileState(device.index, device.uuid, path, _lock_file_problem(path, owner)))
    mode = stat.S_IMODE(os.stat(directory).st_mode)
    return LockSetup(directory, owner, mode, files)


def _lock_file_problem(path: Path, owner: int) -> str | None:
    """Why the lock file at ``path`` would not do for other users' leases; None if it does."""
    from cuectl.run import lockfile

    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot make it: {exc.strerror or exc}"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file: remove it, then run this again"
    if st.st_uid not in (owner, 0):
        return f"belongs to {lockfile.user_name(st.st_uid)}, who could delete it while a lease holds it"
    return None
