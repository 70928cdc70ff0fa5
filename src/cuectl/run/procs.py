"""Process groups and escaped descendants: signalling and killing a frame's process group,
one snapshot of the machine's processes, becoming a child subreaper (Linux) and finding,
killing and reaping what a frame or a ``cuectl run`` command left behind outside its
group (by session, group, ``CUE_FRAME_ID`` or a lease file held open).

Kept to ``os``, ``sys`` and ``time`` (signals through the C ``_signal`` module, psutil and
the errors only where needed): ``cuectl run``'s quick path uses :func:`become_subreaper`
and :func:`own_children` without loading the frame launcher. The subreaper flag lives
here, so the worker and ``cuectl run`` make and read the same one."""

from __future__ import annotations

import os
import sys
import time

try:
    import _signal as signal  # type: ignore[import-not-found, unused-ignore]  # ``signal`` wraps it in enums (~3 ms)
except ImportError:  # pragma: no cover - other Pythons
    import signal  # type: ignore[no-redef, unused-ignore]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, Mapping, Sequence

__all__ = [
    "DEFAULT_GRACE_S",
    "become_subreaper",
    "file_ids",
    "hold_child",
    "holds_file",
    "kill_by_env",
    "kill_leftovers",
    "kill_process_group",
    "leftover_children",
    "own_children",
    "process_group_alive",
    "process_table",
    "processes_with_env",
    "release_child",
    "set_child_subreaper",
]

DEFAULT_GRACE_S = 5.0
# After SIGKILL, a process in uninterruptible sleep (hung NFS, a wedged driver) can linger.
# Stop waiting for such stragglers eventually so one stuck process cannot hang the worker.
_STRAGGLER_GIVE_UP_S = 10.0
_WAIT_MIN_SLEEP_S = 0.01
_WAIT_MAX_SLEEP_S = 0.1


def _check_pgid(pgid: int) -> None:
    # killpg(0) is *our own* group and killpg(1)/negative values mean something else again:
    # a bad pgid from a corrupt store must never take the worker (or the machine) down.
    if pgid <= 1 or pgid == os.getpgrp():
        from cuectl.errors import InvalidInput

        raise InvalidInput(f"refusing to signal process group {pgid}")


# pid -> (parent pid, process group, zombie), for every process we can see at one moment.
if TYPE_CHECKING:
    ProcessTable = Mapping[int, "tuple[int, int, bool]"]


def process_table() -> dict[int, tuple[int, int, bool]]:
    """One snapshot of the machine's processes. A frame's pids are its process group plus
    its leader's descendants; finding them costs a pass over every process on the machine,
    so the worker takes one snapshot per sampling tick and shares it between its frames
    (one pass per frame made sampling 8 frames cost ~16 ms of CPU a tick)."""
    if sys.platform.startswith("linux") and os.path.isdir("/proc"):
        table: dict[int, tuple[int, int, bool]] = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as handle:
                    stat = handle.read()
            except OSError:
                continue  # exited meanwhile, or hidden from us
            # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
            fields = stat[stat.rfind(b")") + 2 :].split(b" ", 3)
            table[int(entry.name)] = (int(fields[1]), int(fields[2]), fields[0] == b"Z")
        return table
    return _process_table_psutil()


def _process_table_psutil() -> dict[int, tuple[int, int, bool]]:
    import psutil

    table: dict[int, tuple[int, int, bool]] = {}
    for p in psutil.process_iter(["ppid", "status"]):
        try:
            table[p.pid] = (p.info["ppid"] or 0, os.getpgid(p.pid), p.info["status"] == psutil.STATUS_ZOMBIE)
        except (ProcessLookupError, PermissionError):
            continue
    return table


def _group_pids(pgid: int, table: ProcessTable | None = None) -> set[int]:
    """Live (non-zombie) pids whose process group is ``pgid``."""
    table = process_table() if table is None else table
    return {pid for pid, (_, group, zombie) in table.items() if group == pgid and not zombie}


def _descendants(root: int, table: ProcessTable) -> set[int]:
    """Live descendants of ``root`` (children, grandchildren, …), not ``root`` itself."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        if pid in found:
            continue
        found.add(pid)
        stack.extend(children.get(pid, ()))
    return {pid for pid in found if not table[pid][2]}


def process_group_alive(pgid: int) -> bool:
    """Whether any process (other than a zombie) is still in group ``pgid``.

    ``killpg(pgid, 0)`` answers cheaply when the group is gone; when it says "exists" we look
    closer, because zombies waiting for a reaper (containers without an init) still count for
    the kernel but no longer run anything.
    """
    if pgid <= 0:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's processes: alive, and not ours to judge
    return bool(_group_pids(pgid))


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to the group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def kill_process_group(pgid: int, *, grace: float = DEFAULT_GRACE_S) -> None:
    """TERM group ``pgid``, wait up to ``grace`` s for it to vanish, then KILL it.

    For orphaned frames found after a worker restart (their pgid is in the store). Those
    processes are not our children, so init reaps them; we only wait until they are gone
    (bounded: a process stuck in uninterruptible sleep can outlive SIGKILL). Raises
    ``InvalidInput`` for pgids that would hit the worker itself or everything
    (``0``, ``1``, our own group) and ``PermissionError`` for another user's group.
    """
    _check_pgid(pgid)
    if not _signal_group(pgid, signal.SIGTERM):
        return
    if _wait_group_gone(pgid, grace):
        return
    if _signal_group(pgid, signal.SIGKILL):
        _wait_group_gone(pgid, 2.0)


def _wait_group_gone(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + max(0.0, timeout)
    delay = _WAIT_MIN_SLEEP_S
    while process_group_alive(pgid):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, _WAIT_MAX_SLEEP_S)
    return True


# Escaped descendants (Linux: this process as a child subreaper) ------------------------

_PR_SET_CHILD_SUBREAPER = 36


def set_child_subreaper() -> bool:
    """``prctl(PR_SET_CHILD_SUBREAPER, 1)``: orphaned descendants are re-parented to this
    process instead of init. False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        prctl = _prctl()
        return bool(prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError, TypeError):
        return False


def _prctl() -> Any:
    """libc's ``prctl``, taking five unsigned longs and returning an int (cuectl.run.libc:
    ``import ctypes`` would cost ~3 ms of a ~25 ms ``cuectl run -- true``)."""
    from cuectl.run import libc

    return libc.function("prctl", "LLLLL", "i")


def own_children(*, all_threads: bool = False) -> set[int]:
    """Direct children of this process (``/proc/PID/task/TID/children``; empty where that
    cannot be read).

    By default only the main thread's: the kernel re-parents orphans to a subreaper's
    main thread while it lives, and the worker starts its frames from it — one small read
    per frame end instead of a directory scan (this runs on the per-frame path)."""
    pid = os.getpid()
    tids = [str(pid)]
    if all_threads:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return set()
    kids: set[int] = set()
    for tid in tids:
        try:  # os.open/os.read: a third of what the io layers of open() cost (~20 µs a frame)
            fd = os.open(f"/proc/{pid}/task/{tid}/children", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            data = b""
            while chunk := os.read(fd, 65536):
                data += chunk
            kids.update(int(x) for x in data.split())
        except (OSError, ValueError):
            continue
        finally:
            os.close(fd)
    return kids


_subreaper = False
_reap_zombies = False
#: Leaders of this process's unfinished frames, by pid: never taken for strays.
_LEADERS: dict[int, object] = {}


def hold_child(pid: int, owner: object) -> None:
    """Keep a child that is not a frame (a notification hook) out of the worker's zombie
    reaping: its owner waits for it and needs its exit status."""
    _LEADERS[pid] = owner


def release_child(pid: int, owner: object) -> None:
    if _LEADERS.get(pid) is owner:
        del _LEADERS[pid]


def become_subreaper(*, reap_zombies: bool = False) -> bool:
    """Make this process a child subreaper (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``).

    A descendant that leaves a frame's process group and tree (``setsid cmd &``, a double
    fork) is then re-parented to us instead of to init, so :class:`FrameProcess` finds it
    when the frame ends, kills it and reaps it. ``reap_zombies``: also reap any zombie
    child that is not a frame leader — only for a process whose children outside its own
    session are frames or what they left behind (the worker; never a test runner or an
    application that has children of its own). False where unsupported (then such
    escapees are not found)."""
    global _subreaper, _reap_zombies
    if reap_zombies:
        _reap_zombies = True
    if not _subreaper:
        _subreaper = set_child_subreaper()
    return _subreaper


def _stat_fields(pid: int) -> tuple[bool, int, int] | None:
    """(zombie, pgid, session id) of ``pid``; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split(b" ", 5)
    try:
        return fields[0] == b"Z", int(fields[2]), int(fields[3])
    except (IndexError, ValueError):
        return None


def _env_value(pid: int, name: str) -> str | None:
    """``name`` from ``pid``'s initial environment (None: unset or unreadable)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    prefix = name.encode() + b"="
    for item in data.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode("utf-8", "replace")
    return None


def file_ids(fds: Sequence[int]) -> frozenset[tuple[int, int]]:
    """(device, inode) of the files behind ``fds`` — to recognise their holders later."""
    ids = set()
    for fd in fds:
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        ids.add((st.st_dev, st.st_ino))
    return frozenset(ids)


def holds_file(pid: int, ids: frozenset[tuple[int, int]]) -> bool:
    """Whether ``pid`` has one of the files ``ids`` open (``/proc/PID/fd``)."""
    if not ids:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in ids:
            return True
    return False


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _signal_pids(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            continue


def leftover_children(owns: Callable[[int, int, int], bool]) -> set[int]:
    """Live processes re-parented to us (a subreaper) that ``owns(pid, pgid, sid)`` claims,
    with all their live descendants. Zombie children that ``owns`` claims (or any that is
    not a frame leader, after ``become_subreaper(reap_zombies=True)``) are reaped on the
    way: something a frame left behind that died by itself."""
    kids = own_children() - set(_LEADERS)
    if not kids:
        return set()
    roots = []
    for pid in kids:
        fields = _stat_fields(pid)
        if fields is None:
            continue
        zombie, pgid, sid = fields
        if zombie:
            # Something left behind that died by itself: ours to reap if it is recognisably
            # this caller's (group, session) or, in the worker, whatever it is.
            if _reap_zombies or owns(pid, pgid, sid):
                _reap(pid)
        elif owns(pid, pgid, sid):
            roots.append(pid)
    if not roots:
        return set()
    table = process_table()
    found = set(roots)
    for pid in roots:
        found |= _descendants(pid, table)
    return found


def processes_with_env(match: Mapping[str, str]) -> set[int]:
    """Live pids (not ours) whose initial environment has every ``name=value`` of ``match``
    — a full scan of ``/proc``: for a restarted worker looking for what an orphaned frame
    left behind outside its process group (start-up only, tens of ms)."""
    if not match or not os.path.isdir("/proc"):
        return set()
    needles = [f"{k}={v}".encode() for k, v in match.items()]
    found = set()
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                items = set(fh.read().split(b"\0"))
        except OSError:
            continue
        if all(n in items for n in needles):
            found.add(int(entry.name))
    return found


def kill_by_env(match: Mapping[str, str], *, grace: float = DEFAULT_GRACE_S) -> int:
    """Put down an orphaned frame: TERM the processes :func:`processes_with_env` finds and
    the process groups of those among them that lead a session (the frame's leader started
    one: its group also holds members that replaced their environment), KILL what is left
    after ``grace`` s (looked up again, so a recycled pid is never hit), wait up to 2 s
    more for it to go; returns how many processes were found."""
    found = processes_with_env(match)
    if not found:
        return 0
    groups = set()
    for pid in found:
        fields = _stat_fields(pid)
        if fields is not None and fields[2] == pid and pid > 1 and pid != os.getpgrp():
            groups.add(pid)

    def signal_all(pids: set[int], sig: int) -> None:
        for group in groups:
            _signal_group(group, sig)
        _signal_pids(pids, sig)

    signal_all(found, signal.SIGTERM)
    deadline = time.monotonic() + max(0.0, grace)
    killed = False
    delay = _WAIT_MIN_SLEEP_S
    while True:
        groups = {g for g in groups if process_group_alive(g)}
        left = processes_with_env(match)
        if not left and not groups:
            return len(found)
        now = time.monotonic()
        if now >= deadline:
            if killed:
                if now - deadline > 2.0:
                    return len(found)  # stuck in the kernel: give up, as kill_process_group
            else:
                signal_all(left, signal.SIGKILL)
                killed = True
        time.sleep(delay)
        delay = min(delay * 2, _WAIT_MAX_SLEEP_S)


def kill_leftovers(owns: Callable[[int, int, int], bool], *, grace: float) -> int:
    """TERM what :func:`leftover_children` finds, KILL what is left after ``grace`` s, reap
    them; returns how many there were. For ``cuectl run`` once its command exited."""
    found = leftover_children(owns)
    if not found:
        return 0
    _signal_pids(found, signal.SIGTERM)
    deadline = time.monotonic() + max(0.0, grace)
    delay = _WAIT_MIN_SLEEP_S
    killed = False
    while True:
        left = leftover_children(owns)
        if not left:
            break
        now = time.monotonic()
        if now >= deadline:
            if killed and now - deadline > _STRAGGLER_GIVE_UP_S:
                break
            if not killed:
                _signal_pids(left, signal.SIGKILL)
                killed = True
        else:
            _signal_pids(left - found, signal.SIGTERM)  # newly re-parented ones
            found |= left
        time.sleep(delay)
        delay = min(delay * 2, _WAIT_MAX_SLEEP_S)
    for pid in found & own_children():
        _reap(pid)  # they are dead (or given up on): no zombie of theirs stays behind
    return len(found)
