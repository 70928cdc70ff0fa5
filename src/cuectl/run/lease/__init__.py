"""Exclusive device leases: kernel locks on files in a host-local lock directory (DESIGN §5).

The worker (queued frames), ``cuectl run`` and ``cuectl.lease()`` all take the same locks,
so ad-hoc work and queued frames never share a device. Every name is importable from here;
the modules split the work by responsibility:

- ``locks``: the lock directory, one kernel lock per device and the record in its file
  (``try_lock``, ``list_leases``, ``break_stale``, ...);
- ``queue``: the fair wait queue — FIFO among this host's waiters (``queued_reservations``);
- ``request``: user input to a ``LeaseRequest`` (``make_request``; the GPU part is
  ``GpuRequest.parse``, shared with ``cuectl submit`` and job specs);
- ``acquire``: acquisition and the held ``Lease`` (``lease``, ``async_lease``, ``acquire``);
- ``isolation``: the environment that confines a child to its devices (``isolation_env``).

Low level (the worker uses it directly)::

    lock = try_lock(lock_dir, device, holder="frame 42")     # None: someone else holds it
    proc = subprocess.Popen(cmd, pass_fds=[lock.share()])    # the frame keeps the device leased
    update_holder(lock, pid=proc.pid, holder="frame 42")      # `gpu leases` shows the frame's pid
    ...
    lock.release()

High level (``cuectl.lease`` and ``cuectl run``)::

    with cuectl.lease(gpus=1, gpu_memory_min="8G", wait=True, timeout=600, label="train-a") as l:
        subprocess.run(cmd, env={**os.environ, **l.env})
"""

from cuectl.run.lease.acquire import Lease, acquire, async_lease, forget_discovery, lease
from cuectl.run.lease.isolation import isolation_env, isolation_key
from cuectl.run.lease.locks import (
    KIND_API,
    KIND_RUN,
    KIND_WORKER,
    DeviceLock,
    LeaseInfo,
    break_stale,
    held_uuids,
    list_leases,
    lock_path,
    other_lock_dirs_in_use,
    prepare_lock_dir,
    try_lock,
    try_lock_all,
    update_holder,
)
from cuectl.run.lease.queue import queued_reservations
from cuectl.run.lease.request import LeaseRequest, make_request

__all__ = [
    "KIND_API",
    "KIND_RUN",
    "KIND_WORKER",
    "DeviceLock",
    "Lease",
    "LeaseInfo",
    "LeaseRequest",
    "acquire",
    "async_lease",
    "break_stale",
    "forget_discovery",
    "held_uuids",
    "isolation_env",
    "isolation_key",
    "lease",
    "list_leases",
    "lock_path",
    "make_request",
    "other_lock_dirs_in_use",
    "prepare_lock_dir",
    "queued_reservations",
    "try_lock",
    "try_lock_all",
    "update_holder",
]
