"""The fair wait queue: first come, first served among the waiters of this host.

Each waiter holds a ``flock``'d ticket file in ``<lock_dir>/queue`` named by its arrival
time and listing the devices it could use — only those that statically fit its request
(vendor, model, memory), so that it never holds back a device it cannot use; a caller (waiting or not) never takes a device
that an older live waiter would take first (``WaitQueue.claims``). A crashed waiter's
ticket loses its lock and is ignored. The worker takes locks directly and does not queue
(``queued_reservations`` tells it what waiters are about to take, to let them go first).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Collection, Iterable, Sequence

from cuectl.gpu.device import Device
from cuectl.run.lease.locks import OPEN_FLAGS, QUEUE_DIRNAME, lock_path, pid_alive, read_record
from cuectl.run.lockfile import probe_fd

TICKET_SUFFIX = ".ticket"


@dataclass(frozen=True)
class _Ticket:
    candidates: frozenset[str]
    gpus: int


class WaitQueue:
    """This host's waiters: ``<lock_dir>/queue/<arrival ns>-<pid>-<rand>.ticket``.

    A ticket lists the devices its waiter could use (that fit its request) and is ``flock``'d by its waiter for as
    long as it waits, so a crashed waiter's ticket is recognisably dead. Names sort by
    arrival, which is the queue order.
    """

    def __init__(self, lock_dir: Path) -> None:
        self.dir = _queue_dir(lock_dir)
        self.own: str | None = None
        self._fd = -1
        self._tickets: dict[str, _Ticket | None] = {}
        self._dead: set[str] = set()

    def join(self, candidates: Iterable[str], gpus: int, label: str) -> None:
        """Queue up for ``gpus`` of ``candidates``: the devices that fit the request, never
        the whole inventory (an A100 waiter must not hold back an idle RTX 4090)."""
        if self.own is not None:
            return
        name = f"{time.time_ns():020d}-{os.getpid()}-{os.urandom(3).hex()}{TICKET_SUFFIX}"
        # Locked and written under a hidden name, then renamed: no one ever sees an
        # unlocked (seemingly dead) or empty ticket.
        tmp = self.dir / f".{name}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | OPEN_FLAGS, 0o644)
        try:
            os.fchmod(fd, 0o644)  # whatever the umask: other users' waiters must read and probe it
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(
                fd,
                json.dumps(
                    {
                        "candidates": sorted(candidates),
                        "gpus": gpus,
                        "pid": os.getpid(),
                        "label": label,
                        "since": time.time(),
                    }
                ).encode(),
            )
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

    def claims(
        self, free: Callable[[], Sequence[str]], mine: Collection[str] | None = None
    ) -> tuple[set[str], list[str], int]:
        """What the live waiters older than us would take of the devices that look free
        (``free()``: uuids in preference order, read only if there are older waiters), what
        is left for us, and how many of those waiters compete with us (0: nobody older
        wants any of our devices, so we may try them all).

        Oldest first, each waiter takes its ``gpus`` devices from what is left — only
        devices its ticket lists, which are those that fit its request; one that cannot
        be satisfied yet takes everything left that it could use, so that younger waiters
        do not keep nibbling at a big request's devices (no starvation). A waiter never
        takes a device it cannot use. ``mine`` (the devices that fit our request) limits
        the count to waiters that want one of them; without it every older waiter counts.
        Stops once nothing is left: with 100 waiters for 4 devices each waiter looks at
        about 4 tickets.
        """
        names = ticket_names(self.dir)
        pool: list[str] | None = None
        taken: set[str] = set()
        waiters = 0
        for name in names:
            if self.own is not None and name >= self.own:
                break
            ticket = self._ticket(name)
            if pool is not None and not pool:
                # Everything that looks free is taken. Only whether someone older wants
                # one of our devices is still open (they all look busy, but one may come
                # free before our attempt: it is that waiter's, not ours).
                if ticket is not None and not ticket.candidates.isdisjoint(mine or ()) and self._alive(name):
                    waiters += 1
                    break
                continue
            if ticket is None or not self._alive(name):
                continue
            if mine is None or not ticket.candidates.isdisjoint(mine):
                waiters += 1
            if pool is None:
                pool = list(free())
            usable = [u for u in pool if u in ticket.candidates]
            grab = usable[: ticket.gpus] if len(usable) >= ticket.gpus else usable
            taken.update(grab)
            pool = [u for u in pool if u not in grab]
            if not pool and (waiters or mine is None):
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
            fd = os.open(path, os.O_RDONLY | OPEN_FLAGS)
        except OSError:
            self._dead.add(name)
            return False
        if probe_fd(fd):
            return True
        # Its waiter died without cleaning up. Remove it if we may (same user; the sticky
        # bit stops us otherwise) — ignored from now on either way.
        self._dead.add(name)
        _unlink(path)
        return False


_queue_dirs: dict[str, Path] = {}


def _queue_dir(lock_dir: Path) -> Path:
    key = str(lock_dir)
    found = _queue_dirs.get(key)
    if found is None:
        found = _queue_dirs[key] = Path(lock_dir) / QUEUE_DIRNAME
    return found


#: Queue directories this process listed and found without tickets, with the directory's
#: identity and timestamps then; see ``ticket_names``.
_quiet: dict[str, tuple[int, int, int, int, int]] = {}
#: A directory counts as quiet only if its mtime was this much older than our look at it.
QUIET_NS = 1_000_000_000


def ticket_names(directory: Path) -> list[str]:
    """The tickets in ``directory``, oldest first — usually none, found by one ``stat``.

    Adding or removing a ticket (a create, rename or unlink in the directory) sets the
    directory's mtime to the current time. So once a listing found no ticket in a
    directory whose mtime was already a second old when we stat'ed it, the same mtime
    (with the same inode, ctime and size) later means no entry came or went since: no
    ticket. The margin covers the coarse clock file times are taken from (a jiffy), so a
    ticket added right after our look can never leave the mtime as it was.
    """
    key = str(directory)
    before = time.time_ns()
    try:
        st = os.stat(key)
    except FileNotFoundError:
        return []
    signature = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
    if _quiet.get(key) == signature:
        return []
    try:
        names = sorted(n for n in os.listdir(key) if n.endswith(TICKET_SUFFIX) and not n.startswith("."))
    except FileNotFoundError:
        names = []
    if not names and st.st_mtime_ns < before - QUIET_NS:
        if len(_quiet) >= 256:
            _quiet.clear()
        _quiet[key] = signature
    else:
        _quiet.pop(key, None)
    return names


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


def predicted_free(lock_dir: Path, devices: Sequence[Device]) -> list[str]:
    """UUIDs of ``devices`` that look free, in preference order — from the records, never
    by probing the locks (a probe would make a concurrent acquirer fail). A record is
    cleared on release, and one naming a dead pid is a crashed holder's. Only a guess for
    queue order; the lock attempt decides."""
    out = []
    for d in sorted(devices, key=_preference):
        record = read_record(lock_path(lock_dir, d.uuid))
        if not record or not pid_alive(record.get("pid")):
            out.append(d.uuid)
    return out


def queued_reservations(lock_dir: Path, devices: Sequence[Device]) -> set[str]:
    """UUIDs of ``devices`` that queued `cuectl run --wait` / ``lease(wait=True)`` callers
    are about to take — for a worker that wants to let waiting ad-hoc work go first."""
    lock_dir = Path(lock_dir)
    taken, _, _ = WaitQueue(lock_dir).claims(lambda: predicted_free(lock_dir, devices))
    return taken
