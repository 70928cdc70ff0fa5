"""Assemble a worker from the machine (discovery, cores, memory) and run it.

Separate from ``worker.py`` so the loop stays free of environment lookups: everything
host-specific is decided here, once, and passed in as ``WorkerOptions``.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from cuectl import config
from cuectl.errors import InvalidInput, StoreUnreachable
from cuectl.run.worker import Supervisor, Worker, WorkerOptions
from cuectl.sched.store import Store

_HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,252}$")


T = TypeVar("T")


WORKER_RECONNECT_S = 1.0


def wait_for_store(open_store: Callable[[], T], *, warn: Callable[[str], None], first_delay: float = 1.0,
                   max_delay: float = 30.0, sleep: Callable[[float], None] = time.sleep) -> T:
    """Open the store, waiting for as long as its server is unreachable (backing off from
    ``first_delay`` to ``max_delay`` seconds, one warning per try): a worker host that
    boots before the database server — a power cut, a cluster where both start together
    — should start working when the server does, not depend on its service manager's
    restart policy. Every other error (bad credentials, no such database, a schema too
    new) is raised at once: waiting would not fix it."""
    delay = first_delay
    while True:
        try:
            return open_store()
        except StoreUnreachable as exc:
            warn(f"{exc}; trying again in {delay:g} s")
            sleep(delay)
            delay = min(delay * 2, max_delay)


def build_worker(store: Store, *, name: str | None, until_idle: bool, max_frames: int | None,
                 poll: float, sample_interval: float, lease_timeout: float, gpu_only: bool,
                 lock_dir: Path | None, tags: Sequence[str], cores: float | None, backend: str = "auto",
                 allowed_users: Sequence[str] = (), run_as_submitter: bool | None = None,
                 log_limit: int | None = None):
    import psutil

    from cuectl.gpu import discover, fake_host_name
    from cuectl.run.lease import prepare_lock_dir

    discovery = discover(backend)
    host = name or fake_host_name(None) or config.hostname()
    if not _HOST_RE.match(host):
        raise InvalidInput(f"invalid host name {host!r} (letters, digits, '.', '_' and '-')")
    locks = Path(lock_dir) if lock_dir else config.lock_dir()
    prepare_lock_dir(locks)
    opts = WorkerOptions(
        name=host, lock_dir=locks, state_dir=config.state_home() / "cuectl" / "worker" / host,
        log_dir=str(store.log_dir), cores=float(cores or psutil.cpu_count() or 1),
        memory_bytes=int(psutil.virtual_memory().total), poll_s=poll, sample_interval_s=sample_interval,
        lease_timeout_s=lease_timeout, gpu_only=gpu_only, tags=tuple(tags), max_frames=max_frames,
        until_idle=until_idle, kill_grace_s=config.kill_grace(),
        log_limit_bytes=config.log_limit() if log_limit is None else log_limit,
        crash_at=config.test_hook(), allowed_users=tuple(allowed_users),
        # A root worker runs frames as their submitters unless told otherwise: anyone who
        # can write the store could otherwise run commands as root on every host.
        run_as_submitter=(os.geteuid() == 0) if run_as_submitter is None else run_as_submitter)
    worker = Worker(store=store, opts=opts, devices=list(discovery.devices),
                    sampler=lambda uuids, pids: discovery.sample(uuids, pids))
    # A call that waits long for a lost server stalls the whole loop: frames that end meanwhile
    # are reaped (and timed) late, and signals wait. The loop retries every iteration anyway.
    store.reconnect_s = min(store.reconnect_s, WORKER_RECONNECT_S)
    # One worker per host name on this machine: a second one is refused here, before it
    # registers the host or touches the first one's run files (WorkerAlreadyRunning).
    worker.prepare()
    return worker, discovery


def run_worker(worker: Worker, *, on_iteration: Callable[[Worker], None] | None = None) -> int:
    """Run the worker under its supervisor until it is done (or stopped by signals)."""
    sup = Supervisor(worker, on_iteration=on_iteration)
    sup.install_signals()
    return sup.run()
