"""``cuectl run``'s quick path: an ordinary ``cuectl run [--gpus 0|1] -- COMMAND`` in ~25 ms.

A full ``cuectl run`` discovers the devices (NVML, nvidia-smi or the fake file: YAML),
matches the request and works out the isolation environment — ~150 ms of imports and work
in a process whose command may take less. What that comes to depends only on the host's
devices, so each full run (``cuectl.run.adhoc.run_command``) leaves it in a per-user cache
(``config.run_cache_file()``): for ``--gpus 1`` the grants in the matcher's order of
preference (``acquire.quick_plan``), for ``--gpus 0`` the environment that hides every
device. The next run that finds the cache valid leases straight from it: it locks the
first device of that order that it can, with the same lock files, records and
environment as the full path (``lockfile``, ``child``), and starts the command.

Anything else takes the full path, which answers it as before: other flags, a frame's
environment (nested leases), anyone in the wait queue (first come, first served), every
device held (it waits or refuses, and words why), no valid cache, not Linux.

The cache is valid while nothing it was worked out from has changed (``_fingerprint``):
the fake-GPU file; or, without one, the boot, the driver version, the GPU device nodes,
the NVIDIA GPUs and MIG instances the kernel lists, the DRM cards (AMD); the lock
directory; the PATH and library path the backends are found on; this Python and cuectl's
own sources. Only a file of this user's, writable by no one else, is read: a cache that
another user could write could send this user's command to a device someone else holds.
Imports: ``os``, ``sys``, ``fcntl``, ``marshal`` and the light modules above, nothing that
loads ``re``, ``json``, ``pathlib``, ``typing`` or ``dataclasses``.
"""

from __future__ import annotations

import marshal
import os
import stat
import sys

from cuectl import config
from cuectl.run import child
from cuectl.run.lockfile import (
    elsewhere_warning,
    encode_record,
    fresh_record,
    held_elsewhere,
    lock_now,
    probe_held,
    unlock,
    write_record,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Sequence

#: Bumped whenever what the cache holds, or means, changes.
FORMAT = 1
#: ``cuectl.run.lease.locks.KIND_RUN`` (a test keeps them equal).
KIND_RUN = "run"
#: ``cuectl.run.lease.locks.QUEUE_DIRNAME``.
QUEUE_DIRNAME = "queue"
#: Sources whose change may change what the cache holds (relative to the package).
_SOURCES = (
    "run/quick.py",
    "run/child.py",
    "run/lease/acquire.py",
    "run/lease/isolation.py",
    "run/lease/request.py",
    "run/lease/locks.py",
    "sched/match.py",
    "gpu",
)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ============================================================================ the cache


def fingerprint(lock_dir: str, devices: tuple[Any, ...] | None = None) -> tuple[Any, ...]:
    """What a cached plan is worked out from (see the module docstring): ``device_key()``
    (pass the one taken before discovering: a change during discovery then invalidates the
    plan rather than hides in it) and the lock directory as it is now."""
    return (devices if devices is not None else device_key()) + (
        lock_dir,
        _stat_id(lock_dir),
        _stat_id(os.path.join(lock_dir, QUEUE_DIRNAME)),
    )


def device_key() -> tuple[Any, ...]:
    """Everything discovery and the plan depend on, cheaply: ~0.2 ms of stat calls."""
    fake = config.fake_gpus_file()
    return (
        FORMAT,
        sys.hexversion,
        sys.prefix,
        os.geteuid(),
        _sources(),
        os.environ.get("PATH"),
        os.environ.get("LD_LIBRARY_PATH"),
        fake,
        _stat_id(fake, content=True) if fake else _hardware(),
    )


def _stat_id(path: str, *, content: bool = False) -> tuple[int, ...] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    if content:  # a file whose bytes matter: any rewrite changes its size, mtime or ctime
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return (st.st_dev, st.st_ino, st.st_mode, st.st_uid)


def _sources() -> tuple[Any, ...]:
    found: list[Any] = []
    for name in _SOURCES:
        path = os.path.join(_PACKAGE, name)
        if name.endswith(".py"):
            found.append(_stat_id(path, content=True))
            continue
        try:
            with os.scandir(path) as entries:
                found.extend(
                    sorted((e.name, _stat_id(e.path, content=True)) for e in entries if e.name.endswith(".py"))
                )
        except OSError:
            found.append(None)
    return tuple(found)


def _hardware(root: str = "/") -> tuple[Any, ...]:
    """What the kernel says about the GPUs: any device added, removed or reset, a driver
    loaded or upgraded, a MIG instance made or destroyed, or a reboot changes it. (``root``:
    another tree laid out as /, for tests.)"""

    def at(path: str) -> str:
        return os.path.join(root, path)

    return (
        _read(at("proc/sys/kernel/random/boot_id")),
        _read(at("proc/driver/nvidia/version")),
        _nodes(at("dev"), ("nvidia", "kfd")),
        _nodes(at("dev/dri"), ("",)),
        _tree(at("proc/driver/nvidia/gpus"), 2),
        _tree(at("proc/driver/nvidia/capabilities"), 5),
        _tree(at("sys/class/drm"), 1),
    )


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(4096)
    except OSError:
        return None


def _nodes(directory: str, prefixes: tuple[str, ...]) -> tuple[Any, ...] | None:
    try:
        names = sorted(n for n in os.listdir(directory) if n.startswith(prefixes))
    except OSError:
        return None
    out: list[Any] = []
    for name in names:
        try:
            st = os.stat(os.path.join(directory, name))
            out.append((name, st.st_rdev, st.st_ino))
        except OSError:
            out.append((name, None, None))
    return tuple(out)


def _tree(directory: str, depth: int) -> tuple[Any, ...] | None:
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return None
    if depth <= 1:
        return tuple(names)
    return tuple((n, _tree(os.path.join(directory, n), depth - 1)) for n in names)


#: Plans kept, most recently saved first: one per configuration a user alternates between
#: (a fake-GPU file for tests, another Python, another lock directory).
KEEP = 8


def save(key: tuple[Any, ...], plan: dict[int, Any]) -> None:
    """Keep ``plan`` (``acquire.quick_plan``) for runs whose fingerprint is ``key``. Best
    effort, atomic (written aside, then renamed), mode 0600, only into a directory of ours."""
    path = config.run_cache_file()
    if not path or not sys.platform.startswith("linux"):
        return
    directory = os.path.dirname(path) or "."
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        st = os.lstat(directory)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return  # someone else's (a sudo with HOME kept): not ours to write into
        entries = [(key, plan)] + [e for e in _entries(path) if e[0] != key][: KEEP - 1]
        data = marshal.dumps(entries)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except (OSError, ValueError):
        try:
            os.unlink(tmp)
        except OSError:
            pass


def load(key: tuple[Any, ...]) -> dict[int, Any] | None:
    """The plan kept for ``key``, or None (no cache, no such key, not ours, unreadable)."""
    path = config.run_cache_file()
    if not path:
        return None
    for found, plan in _entries(path):
        if found == key:
            return plan
    return None


def _entries(path: str) -> list[tuple[tuple[Any, ...], dict[int, Any]]]:
    """The (key, plan) pairs in the cache file at ``path``; none unless it is a plain file
    of this user's that no one else can write (marshal trusts its input, and a plan names
    the devices and environment this user's commands get)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return []
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022 or st.st_size > 1 << 20:
            return []
        data = os.read(fd, st.st_size + 1)
    except OSError:
        return []
    finally:
        os.close(fd)
    try:
        found = marshal.loads(data)
    except (ValueError, EOFError, TypeError):
        return []
    if not isinstance(found, list):
        return []
    return [
        e for e in found if isinstance(e, tuple) and len(e) == 2 and isinstance(e[0], tuple) and isinstance(e[1], dict)
    ]


# ============================================================================ the run


def run(kw: dict[str, Any], say: Any) -> int | None:
    """``cuectl run`` with ``kw`` (``cuectl.cli.entry._parse_run``'s keywords) on the quick
    path: the command's exit status, or None where the full path must answer (having taken
    and started nothing). Raises what the full path raises for a command that cannot start."""
    gpus = kw.get("gpus", 1)
    if (
        not set(kw) <= {"command", "gpus", "label", "wait"}
        or gpus not in (0, 1)
        or not sys.platform.startswith("linux")
        or "CUE_FRAME_ID" in os.environ
    ):
        return None
    lock_dir = config.lock_dir_name()
    if lock_dir is None:
        return None
    plan = load(fingerprint(lock_dir))
    grants = plan.get(gpus) if plan is not None else None
    if not grants:
        return None
    argv: Sequence[str] = kw["command"]
    label = child.lease_label(kw.get("label") or child.command_label(argv))
    if gpus and _waiters(lock_dir):
        return None  # first come, first served: the full path queues behind them
    if gpus and _out_of_service(lock_dir):
        return None  # a device is drained or lost: the full path leaves it out
    held: list[tuple[int, bool, dict[str, Any]]] = []
    try:
        grant = _lock_first(grants, label, held) if gpus else grants[0]
        if grant is None:
            return None  # all held: the full path waits, or refuses naming the holders
        if gpus:  # as every lease path: a device held through another lock directory too
            for _, other, pid in held_elsewhere(lock_dir, (os.path.basename(grant[1]),)):
                say("warning: " + elsewhere_warning(grant[0], other, pid, lock_dir))
        say(child.acquired_message([(grant[2], grant[3], grant[0])] if gpus else []))
        return _run_held(argv, held, grant[4])
    finally:
        for fd, writable, _ in held:
            unlock(fd, shared=True, writable=writable)  # the command had them: close ours only


def _out_of_service(lock_dir: str) -> bool:
    """Does the lock directory say a device is out of service (lease/outofservice.py's
    directory has an entry)? Kept to ``os`` here."""
    try:
        return bool(os.listdir(os.path.join(lock_dir, "out-of-service")))
    except OSError:
        return False


def _lock_first(grants: Sequence[Any], label: str, held: list[tuple[int, bool, dict[str, Any]]]) -> Any:
    """Lock the first of ``grants`` nobody holds and record ourselves in it (appended to
    ``held`` at once, so that the caller releases it whatever happens next); that grant, or
    None when every one is held."""
    for grant in grants:
        taken = lock_now(grant[1])
        if taken is None:
            continue
        fd, writable, size = taken
        record: dict[str, Any] = {}
        held.append((fd, writable, record))
        fresh, data = fresh_record(grant[0], grant[2], pid=os.getpid(), holder=label, kind=KIND_RUN, label=label)
        record.update(fresh)
        if writable:
            write_record(fd, data, old_size=size)
        return grant
    return None


def _waiters(lock_dir: str) -> bool:
    """Is anyone queued for a device (a live ticket: its waiter holds its lock)?"""
    queue = os.path.join(lock_dir, QUEUE_DIRNAME)
    try:
        names = os.listdir(queue)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    for name in names:
        if name.startswith("."):
            continue  # a ticket being written: locked before it is renamed into view
        # Held: its waiter lives. A crashed waiter's ticket lost its lock, and is ignored
        # (as ``WaitQueue`` ignores it); one we cannot open counts as live.
        if probe_held(os.path.join(queue, name)):
            return True
    return False


def _run_held(argv: Sequence[str], held: list[tuple[int, bool, dict[str, Any]]], lease_env: dict[str, str]) -> int:
    """``adhoc.run_leased`` for locks taken here: same environment, signals, records, reaping."""
    interactive = child.is_interactive()

    def started(pid: int) -> None:
        for fd, writable, record in held:  # the command holds the device now: `gpu leases` names it
            record["pid"] = pid
            if writable:
                write_record(fd, encode_record(record))

    def leftovers(pid: int, fds: Sequence[int]) -> None:
        from cuectl.run.adhoc import reap_leftovers_of  # rare: the full path's reaper, and what it loads

        reap_leftovers_of(pid, fds, interactive=interactive)

    return child.supervise(
        argv,
        child.child_env(lease_env),
        lambda: [fd for fd, _, _ in held],
        interactive=interactive,
        on_start=started,
        leftovers=leftovers,
    )
