"""Assemble a worker from the machine (discovery, cores, memory) and run it.

Separate from the ``worker`` package so the loop stays free of environment lookups: everything
host-specific is decided here, once, and passed in as ``WorkerOptions``. ``probe`` (for
``cuectl worker --probe``) lives here too and imports nothing of the worker: a liveness
probe runs every few seconds and must stay cheap.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping, Sequence, TypeVar

from cuectl import config
from cuectl.errors import BackendUnavailable, CuectlError, InvalidInput, StoreUnreachable

if TYPE_CHECKING:
    from cuectl.gpu import Discovery
    from cuectl.run.hostschedule import Schedule
    from cuectl.run.worker import Inventory, Worker
    from cuectl.sched.store import Store

_HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,252}$")


T = TypeVar("T")


WORKER_RECONNECT_S = 1.0
#: In the worker's state directory: what ``cuectl worker --probe`` reads.
HEARTBEAT_FILE = "heartbeat"


def worker_host(name: str | None) -> str:
    """The host name a worker registers as: ``--name``, else the fake GPU file's host, else
    this machine's name."""
    from cuectl.gpu import fake_host_name

    host = name or fake_host_name(None) or config.hostname()
    if not _HOST_RE.match(host):
        raise InvalidInput(f"invalid host name {host!r} (letters, digits, '.', '_' and '-')")
    return host


def worker_state_dir(host: str) -> Path:
    """Host-local: the worker lock, run files of its frames, its heartbeat file."""
    return config.state_home() / "cuectl" / "worker" / host


def heartbeat_path(name: str | None) -> Path:
    return worker_state_dir(worker_host(name)) / HEARTBEAT_FILE


def wait_for_store(
    open_store: Callable[[], T],
    *,
    warn: Callable[[str], None],
    first_delay: float = 1.0,
    max_delay: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
    heartbeat: Path | None = None,
    reached: Callable[[str], None] | None = None,
) -> T:
    """Open the store, waiting for as long as its server is unreachable (backing off from
    ``first_delay`` to ``max_delay`` seconds, one warning per try): a worker host that
    boots before the database server — a power cut, a cluster where both start together
    — should start working when the server does, not depend on its service manager's
    restart policy. Every other error (bad credentials, no such database, a schema too
    new) is raised at once: waiting would not fix it. Each try refreshes ``heartbeat``
    (the worker's heartbeat file), so a liveness probe does not kill a worker that waits.
    ``reached`` is told once the store opens after one or more failed tries."""
    delay = first_delay
    failed, started = 0, time.monotonic()
    while True:
        try:
            store = open_store()
            if failed and reached is not None:
                reached(
                    f"store reachable after {failed} failed tr{'y' if failed == 1 else 'ies'} "
                    f"({time.monotonic() - started:.0f} s)"
                )
            return store
        except StoreUnreachable as exc:
            failed += 1
            warn(f"{exc}; trying again in {delay:g} s")
            if heartbeat is not None:
                from cuectl.run.worker import write_heartbeat

                write_heartbeat(heartbeat, name=heartbeat.parent.name, store_ok_at=None)
            sleep(delay)
            delay = min(delay * 2, max_delay)


def discover_gpus(backend: str = "auto") -> Discovery:
    """This host's GPUs for a worker. ``auto`` may find none (a CPU-only worker); a backend
    named explicitly must find some, or the worker would silently run without the GPUs it
    was started for: ``BackendUnavailable`` names the backend and why."""
    from cuectl.gpu import discover

    discovery = discover(backend)
    key = backend.strip().lower()
    if key != "auto" and not discovery.devices:
        status = next((b for b in discovery.backends if b.name == key), None)
        why = status.error if status is not None and status.error else "it found no GPU"
        hint = f"{status.hint}; " if status is not None and status.hint else ""
        raise BackendUnavailable(
            f"--backend {key}: no GPU found: {why}",
            hint=f"{hint}--backend auto starts a CPU-only worker where no GPU is found",
        )
    return discovery


def inventory_of(discovery: Discovery, devices: Sequence[str] | None = None, exclude: Sequence[str] = ()) -> Inventory:
    """The worker's view of one discovery: devices (only those ``--devices`` names and
    ``--exclude-devices`` does not), their sampler, what the backends said."""
    from cuectl.run.devicefilter import select_inventory
    from cuectl.run.worker import Inventory

    found = discovery.devices
    if devices is not None or exclude:
        found = select_inventory(found, devices, exclude)
    return Inventory(
        devices=tuple(found),
        sampler=lambda uuids, pids, every_process=False: discovery.sample(uuids, pids, every_process=every_process),
        problems=discovery.problems(),
        health=discovery.health,
    )


def build_worker(
    store: Store,
    *,
    name: str | None,
    until_idle: bool,
    max_frames: int | None,
    poll: float,
    sample_interval: float,
    lease_timeout: float,
    gpu_only: bool,
    lock_dir: Path | None,
    tags: Sequence[str],
    cores: float | None,
    backend: str = "auto",
    allowed_users: Sequence[str] = (),
    run_as_submitter: bool | None = None,
    log_limit: int | None = None,
    discovery: Discovery | None = None,
    rediscover_interval: float = 300.0,
    devices: Sequence[str] | None = None,
    exclude_devices: Sequence[str] = (),
    nimby_memory: int | None = None,
    nimby_util: float | None = None,
    available: Schedule | None = None,
    reservation_timeout: float = 1800.0,
    gpu_xid_drain: Collection[int] = (),
    gpu_suspect_jobs: int = 3,
    gpu_policy: Mapping[str, Any] | None = None,
) -> tuple[Worker, Discovery]:
    """The worker for this host. ``discovery``: the GPUs found already (``discover_gpus``),
    else found here with ``backend``; the worker finds them again with the same backend
    every ``rediscover_interval`` seconds (0: only on SIGHUP)."""
    from cuectl.gpu import discover
    from cuectl.gpu.device import CRITICAL_XIDS
    from cuectl.run.lease import prepare_lock_dir
    from cuectl.run.worker import Worker, WorkerOptions

    if discovery is None:
        discovery = discover_gpus(backend)
    host = worker_host(name)
    if os.geteuid() == 0:
        # It runs what the store says, as whom the store says or as root: only one account
        # may write that store (run/sealed.py). Checked before anything is made or changed.
        from cuectl.run import sealed

        sealed.check(store)
    locks = Path(lock_dir) if lock_dir else config.lock_dir()
    prepare_lock_dir(locks)
    state_dir = worker_state_dir(host)
    opts = WorkerOptions(
        name=host,
        lock_dir=locks,
        state_dir=state_dir,
        log_dir=str(store.log_dir),
        cores=float(cores or os.cpu_count() or 1),
        memory_bytes=host_memory_bytes(),
        poll_s=poll,
        sample_interval_s=sample_interval,
        lease_timeout_s=lease_timeout,
        gpu_only=gpu_only,
        tags=tuple(tags),
        max_frames=max_frames,
        until_idle=until_idle,
        kill_grace_s=config.kill_grace(),
        log_limit_bytes=config.log_limit() if log_limit is None else log_limit,
        crash_at=config.test_hook(),
        allowed_users=tuple(allowed_users),
        # A root worker runs frames as their submitters unless told otherwise: anyone who
        # can write the store could otherwise run commands as root on every host.
        run_as_submitter=(os.geteuid() == 0) if run_as_submitter is None else run_as_submitter,
        rediscover_interval_s=rediscover_interval,
        heartbeat_file=state_dir / HEARTBEAT_FILE,
        nimby_memory_bytes=nimby_memory,
        nimby_util_pct=nimby_util,
        schedule=available,
        reservation_timeout_s=reservation_timeout,
        **dict(gpu_policy or {}),
        gpu_xid_drain=CRITICAL_XIDS | frozenset(gpu_xid_drain),
        gpu_suspect_jobs=gpu_suspect_jobs,
    )
    first = inventory_of(discovery, devices, exclude_devices)
    # Re-discovery uses the backend the worker was started with, but never fails for want
    # of GPUs: devices that vanish are reported unavailable, not a reason to stop.
    worker = Worker(
        store=store,
        opts=opts,
        devices=list(first.devices),
        sampler=first.sampler,
        health_reader=first.health,
        rediscover=lambda: inventory_of(discover(backend), devices, exclude_devices),
    )
    # A call that waits long for a lost server stalls the whole loop: frames that end meanwhile
    # are reaped (and timed) late, and signals wait. The loop retries every iteration anyway.
    store.reconnect_s = min(store.reconnect_s, WORKER_RECONNECT_S)
    # One worker per host name on this machine: a second one is refused here, before it
    # registers the host or touches the first one's run files (WorkerAlreadyRunning).
    worker.prepare()
    return worker, discovery


def run_worker(
    worker: Worker, *, on_iteration: Callable[[Worker], None] | None = None, hangup_stops: bool = False
) -> int:
    """Run the worker under its supervisor until it is done (or stopped by signals).
    ``hangup_stops``: SIGHUP drains (a worker in a terminal) instead of re-discovering."""
    from cuectl.run.worker import Supervisor

    sup = Supervisor(worker, on_iteration=on_iteration)
    sup.install_signals(hangup_stops=hangup_stops)
    return sup.run()


# -- `cuectl worker --probe` ------------------------------------------------------------------


class ProbeFailed(CuectlError):
    """The worker's heartbeat file says it is not alive (or, for readiness, not connected)."""


def probe(name: str | None, *, max_age: float, ready: bool = False, now: float | None = None) -> str:
    """Check the heartbeat file of this machine's worker ``name``; return a one-line summary
    or raise ``ProbeFailed`` (exit 1) saying what is wrong.

    Alive: the worker process runs and its loop wrote the file within ``max_age`` seconds
    (a loop that hangs, is stopped or died stops writing). Ready, in addition: a store call
    got through within ``max_age`` seconds. Run it where the worker runs (same machine and
    PID namespace: the container for a pod), with the worker's ``--name`` and environment."""
    path = heartbeat_path(name)
    host = path.parent.name
    try:
        doc = json.loads(path.read_text())
        pid, at = int(doc["pid"]), float(doc["at"])
        store_ok_at = doc.get("store_ok_at")
    except FileNotFoundError:
        raise ProbeFailed(f"no cuectl worker {host!r} has run here: no heartbeat file {path}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ProbeFailed(f"worker {host!r}: unreadable heartbeat file {path}: {exc}") from None
    now = time.time() if now is None else now
    age = now - at
    if not _process_runs(pid):
        raise ProbeFailed(f"worker {host!r} (pid {pid}) is not running; last heartbeat {age:.0f} s ago")
    if age > max_age:
        raise ProbeFailed(
            f"worker {host!r} (pid {pid}) is stuck: last heartbeat {age:.0f} s ago (--max-age {max_age:g})"
        )
    store_age = None if store_ok_at is None else now - float(store_ok_at)
    if ready and (store_age is None or store_age > max_age):
        since = "yet" if store_age is None else f"for {store_age:.0f} s"
        raise ProbeFailed(
            f"worker {host!r} (pid {pid}) is alive but has not reached its store {since} (--max-age {max_age:g})"
        )
    store = "never" if store_age is None else f"{store_age:.0f} s ago"
    return f"worker {host!r} (pid {pid}) alive: last heartbeat {age:.0f} s ago, store reached {store}"


def _process_runs(pid: int) -> bool:
    """Is ``pid`` a running process (a zombie waiting for its parent is not)?"""
    from cuectl.run.lease.locks import pid_alive

    if not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc (macOS): kill(0) is all we can tell


def host_memory_bytes() -> int:
    """The machine's physical memory (what psutil.virtual_memory().total reports: the
    kernel's total RAM), without importing psutil at every worker's start (~15 ms)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # a platform without these names
        import psutil

        return int(psutil.virtual_memory().total)
