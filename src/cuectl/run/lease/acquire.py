"""Acquiring leases: ``cuectl.lease()``, ``async_lease`` and ``acquire`` (``cuectl run``).

One acquisition is a static check (could any device here ever fit?), then attempts —
choose with the same matcher as frames (``cuectl.sched.match``), lock, and on a lost race
choose again — until one succeeds or the caller gives up. The sync and async APIs share
one wait loop (``_attempts``); they differ only in how they sleep and where free memory is
sampled (in a thread, for asyncio: it may run nvidia-smi).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Generator, Iterable, Mapping, NamedTuple, Sequence, Union

from cuectl import config
from cuectl.errors import DevicesBusy, InsufficientFreeMemory, InvalidInput, LeaseError, LeaseTimeout, NoMatchingDevice
from cuectl.gpu import Discovery, discover
from cuectl.gpu.device import Device
from cuectl.run.child import lease_label
from cuectl.run.lease import outofservice
from cuectl.run.lease.isolation import isolation_env
from cuectl.run.lease.locks import (
    KIND_API,
    DeviceLock,
    LeaseInfo,
    holder_info,
    lock_all,
    lock_path,
    prepare_lock_dir,
    provision_lock_files,
    update_holder,
)
from cuectl.run.lease.nested import LEVEL_VAR, Allocation, sublock_dir
from cuectl.run.lease.queue import WaitQueue, predicted_free, ticket_names
from cuectl.run.lease.request import LeaseRequest, fitting_uuids, make_request, resolve_devices
from cuectl.run.lease.shares import NoRoom, ShareLock, mps_running, share_env, share_infos, take_share
from cuectl.run.lockfile import elsewhere_warning, held_elsewhere
from cuectl.sched.match import MatchResult, select_devices
from cuectl.units import format_bytes, parse_duration

#: How often a waiter looks again; jittered so that waiters do not move in lock-step.
POLL_S = 0.05
MAX_POLL_S = 1.0
#: Free memory is re-read at most this often while waiting (nvidia-smi is not free).
SAMPLE_EVERY_S = 0.5
#: Without waiting, a holder with no record is looked at once more after this long: it
#: may be a `gpu leases` probe or a racer about to let go.
RECHECK_S = 0.002


# ============================================================================ discovery cache


_discoveries: dict[tuple[str, str | None, int], Discovery] = {}
_discovery_lock = threading.Lock()


def _discovery(backend: str, fake_file: str | None) -> Discovery:
    """Discover once per process (NVML init, nvidia-smi: tens to hundreds of ms), then reuse.

    A fake file is keyed by its mtime so that a test rewriting it sees the new devices.
    """
    return _discovered(_discovery_key(backend, fake_file))


def _discovery_key(backend: str, fake_file: str | None) -> tuple[str, str | None, int]:
    return (backend, fake_file, _fake_mtime(fake_file))


def _discovered(key: tuple[str, str | None, int]) -> Discovery:
    """``_discovery`` of the inventory ``key`` names."""
    with _discovery_lock:
        found = _discoveries.get(key)
        if found is None:
            found = discover(key[0], fake_file=key[1])
            _discoveries[key] = found
        return found


def _fake_mtime(fake_file: str | None) -> int:
    try:
        return os.stat(fake_file).st_mtime_ns if fake_file else 0
    except OSError:
        return -1


def forget_discovery() -> None:
    """Drop the cached discovery (after hot-plugging, or a MIG reconfiguration)."""
    with _discovery_lock:
        _discoveries.clear()
        _plans.clear()
        _ready.clear()


# ============================================================================ the lease


class Lease:
    """An exclusive lease on ``devices``; a context manager (sync and async).

    ``env`` holds the isolation variables for a child process (``{**os.environ,
    **lease.env}``), or to apply with ``os.environ.update`` before CUDA is initialised.
    ``release()`` is idempotent; the kernel releases everything if the process dies.
    """

    def __init__(
        self, locks: Sequence[DeviceLock], devices: Sequence[Device], env: Mapping[str, str], lock_dir: Path, label: str
    ) -> None:
        self._locks = list(locks)
        self.devices: tuple[Device, ...] = tuple(devices)
        self._env = env  # never changed here; ``env`` hands out copies
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
        for lock in self._locks:
            if lock.held:
                return False
        return True

    @property
    def fds(self) -> tuple[int, ...]:
        """The lock fds, for ``Popen(pass_fds=lease.fds)``: the child then keeps the devices
        leased for as long as it runs, even if this process dies."""
        return tuple(fd for lock in self._locks for fd in lock.share_fds())

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


# ============================================================================ one acquisition


class _Plan:
    """What a request comes to on one inventory (and inside one allocation): the candidates,
    the devices that fit, the static check passed, the first choice with nobody in the way
    and the environment of each grant — all fixed while the inventory is, so worked out
    once per process rather than on every lease. Never holds anything live (holders, free
    memory, the wait queue): those are read on every attempt."""

    def __init__(self, discovery: Discovery, request: LeaseRequest, allocation: Allocation | None) -> None:
        self.discovery = discovery
        self.request = request
        self.allocation = allocation
        inventory = [replace(d, memory_free_bytes=None) for d in discovery.devices]
        self.vendors = frozenset(d.vendor for d in inventory)
        self.candidates: tuple[Device, ...] = (
            resolve_devices(request.devices, inventory) if request.devices is not None else tuple(inventory)
        )
        if allocation is not None:
            self.candidates = allocation.restrict(self.candidates, inventory, named=request.devices is not None)
        gpu = request.gpu
        self.fitting = fitting_uuids(gpu, self.candidates)
        self.needs_sample = gpu.gpus > 0 and (gpu.gpu_memory_min_bytes > 0 or gpu.gpu_memory_free_min_bytes > 0)
        share = request.share_bytes
        if share is not None:
            # A share fits a device with at least its budget of memory; whether there is
            # room now is the ledger's to say, less what other programs use (sampled).
            self.fitting = frozenset(u for u in self.fitting if (self._total(u) or 0) >= share)
            self.needs_sample = True
        self._by_uuid = {d.uuid: d for d in self.candidates}
        self._first: MatchResult | None = None
        self._grants: dict[tuple[str, ...], tuple[list[Device], dict[str, str]]] = {}

    def _total(self, uuid: str) -> int | None:
        return next((d.memory_total_bytes for d in self.candidates if d.uuid == uuid), None)

    def first_choice(self, devices: Sequence[Device]) -> MatchResult:
        """``select_devices`` with nothing busy among ``devices`` (the candidates, free memory unknown)."""
        if self._first is None:
            self._first = select_devices(self.request.gpu, devices)
        return self._first

    def grant(self, uuids: tuple[str, ...]) -> tuple[list[Device], dict[str, str]]:
        """The devices and the child environment of a lease on ``uuids`` (shared by every such
        lease: ``Lease.env`` hands out copies)."""
        known = self._grants.get(uuids)
        if known is None:
            devices = [self._by_uuid[u] for u in uuids]
            env = isolation_env(devices, all_vendors_present=self.vendors)
            totals = [d.memory_total_bytes for d in devices if d.memory_total_bytes]
            # Same meaning as for frames: per-device memory granted, bytes (the smallest card's).
            env["CUE_GPU_MEMORY"] = str(min(totals) if totals and len(totals) == len(devices) else 0)
            if self.allocation is not None:
                # A lease inside this one takes its sub-locks one level deeper (no deadlock on ours).
                env[LEVEL_VAR] = str(self.allocation.level + 1)
            known = (devices, env)
            if len(self._grants) < 1024:
                self._grants[uuids] = known
        return known


#: (discovery, request, allocation) -> its plan; see ``_Plan``.
_plans: dict[tuple[int, LeaseRequest, Allocation | None], _Plan] = {}


class _Acquirer:
    """One acquisition: a static check up front, then attempts until success or give-up."""

    def __init__(
        self,
        request: LeaseRequest,
        *,
        lock_dir: Path,
        backend: str,
        fake_file: str | None,
        label: str,
        kind: str,
        allocation: Allocation | None = None,
    ) -> None:
        self.request = request
        self.gpu_request = request.gpu
        self.lock_dir = lock_dir
        self.label = label
        self.kind = kind
        self.allocation = allocation
        self.discovery_key = _discovery_key(backend, fake_file)
        self.discovery = discovery = _discovered(self.discovery_key)
        key = (id(discovery), request, allocation)
        plan = _plans.get(key)
        if plan is None or plan.discovery is not discovery:
            plan = _Plan(discovery, request, allocation)
            self.candidates = plan.candidates
            self._check_static()  # raises before the plan is kept: a refusal is never cached
            if len(_plans) >= 256:
                _plans.clear()
            _plans[key] = plan
        self.plan = plan
        self.vendors = plan.vendors
        self.candidates = plan.candidates
        # What we queue for and compete for: the candidates that fit the request. Not every
        # candidate — a waiter for an A100 must not hold back the idle 4090 it cannot use.
        self.fitting = plan.fitting
        self.needs_sample = plan.needs_sample
        self.queue = WaitQueue(lock_dir)
        self._free: dict[str, int | None] | None = None
        self._sampled_at = -1e9
        self.waiters_ahead = 0

    def _check_static(self) -> None:
        if self.gpu_request.gpus == 0:
            return
        share = self.request.share_bytes
        if share is not None and not any(
            (d.memory_total_bytes or 0) >= share and select_devices(self.gpu_request, [d]).could_ever_fit
            for d in self.candidates
        ):
            sizes = [d.memory_total_bytes for d in self.candidates if d.memory_total_bytes]
            largest = f" (the largest has {format_bytes(max(sizes))})" if sizes else ""
            raise InvalidInput(
                f"{self.request.share_label}: {format_bytes(share)} is more than the memory of every "
                f"{'matching ' if self.candidates else ''}device here{largest}"
            )
        result = select_devices(self.gpu_request, self.candidates)
        if not result.could_ever_fit and self.allocation is not None:
            raise self.allocation.refusal(self.gpu_request.gpus, self.candidates, result.reason)
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
        if self.gpu_request.gpus == 0:
            return self._lease([])
        if self.request.share_bytes is not None:
            return self._share_attempt(self.request.share_bytes)
        devices = self._devices_now()
        busy, waiters = self._queued_before_us()
        busy |= self._out_of_service()
        failed: list[Device] = []
        result = None
        # Choose among the devices not known busy, lock them, and on a lost race mark the
        # loser busy and choose again: the lock attempt is the only authority. Never
        # probe first — a probe's brief lock would make a concurrent acquirer fail.
        for _ in range(len(devices) + 1):
            if not busy and self._free is None:
                # Nobody ahead, nothing lost yet, no live memory figures: the choice is a
                # function of the request and the inventory, made once per process.
                result = self.plan.first_choice(devices)
            else:
                result = select_devices(self.gpu_request, devices, busy=busy)
            if result.devices is None:
                break
            locks, lost = lock_all(self.lock_dir, result.devices, holder=self.label, kind=self.kind, label=self.label)
            if locks is not None:
                return self._lease(locks)
            assert lost is not None
            busy.add(lost.uuid)
            failed.append(lost)
        raise self._refusal(devices, busy, failed, waiters, result.reason if result else None)

    def _share_attempt(self, share: int) -> Lease:
        """A share of ``share`` bytes of one device with room in its ledger, or raise
        ``DevicesBusy`` naming why each device tried had none."""
        devices = [d for d in self._devices_now() if d.uuid in self.fitting]
        busy, waiters = self._queued_before_us()
        tried = set(busy) | self._out_of_service()  # drained or lost: no share either
        refused: list[tuple[Device, NoRoom]] = []
        for _ in range(len(devices) + 1):
            result = select_devices(self.gpu_request, devices, busy=tried)
            if result.devices is None:
                break
            (device,) = result.devices
            used = None
            free = self._free.get(device.uuid) if self._free is not None else None
            if free is not None and device.memory_total_bytes:
                used = max(0, device.memory_total_bytes - free)
            got = take_share(
                self.lock_dir, device, share, holder=self.label, kind=self.kind, label=self.label, used_bytes=used
            )
            if isinstance(got, ShareLock):
                return self._lease([got])
            tried.add(device.uuid)
            refused.append((device, got))
        holders: list[dict[str, Any]] = []
        parts = []
        for device, why in refused:
            parts.append(why.reason)
            if why.exclusive:
                info = holder_info(lock_path(self.lock_dir, device.uuid), device, within=0.25)
                parts[-1] = info.describe()
                holders.append(info.to_json())
            else:
                holders += [dict(info.to_json(), budget_bytes=b) for info, b in share_infos(self.lock_dir, [device])]
        if waiters:
            parts.append(f"{waiters} earlier waiter{'s' if waiters != 1 else ''} queued before this share")
        message = f"cannot take a {format_bytes(share)} GPU share now: " + ("; ".join(parts) or "all busy")
        return_hint = "to queue for it instead, use --wait (Python: wait=True)"
        raise DevicesBusy(message, holders=holders, hint=return_hint)

    def _out_of_service(self) -> set[str]:
        """Devices their worker drained or found lost (lease/outofservice.py): never leased."""
        return set(outofservice.read(self.lock_dir))

    def _queued_before_us(self) -> tuple[set[str], int]:
        """Devices we must leave alone for older waiters, and how many of them there are.

        At the head of the queue (the usual case: nobody waits) that is nothing — we try
        every candidate, whatever the records say; so too when the older waiters all want
        other devices (an A100 waiter does not hold back a 4090 request). Behind waiters
        that want some of our devices, we may try only the devices that look free and that
        the older waiters would not take first (each takes only devices that fit it).
        """
        inventory = self.discovery.devices
        _, left, waiters = self.queue.claims(lambda: predicted_free(self.lock_dir, inventory), self.fitting)
        self.waiters_ahead = waiters
        if waiters == 0:
            return set(), 0
        return {d.uuid for d in inventory} - set(left), waiters

    def _lease(self, locks: list[DeviceLock]) -> Lease:
        devices, env = self.plan.grant(tuple(lock.uuid for lock in locks))
        if self.request.share_bytes is not None:
            # The program's budget, and MPS's limit of it where an MPS server runs; the
            # memory it is granted is its budget, not the device's.
            env = {**env, **share_env(self.request.share_bytes, mps=mps_running())}
            env["CUE_GPU_MEMORY"] = str(self.request.share_bytes)
        warn_if_held_elsewhere(self.lock_dir, locks)
        return Lease(locks, devices, env, self.lock_dir, self.label)

    def _refusal(
        self, devices: list[Device], busy: set[str], failed: list[Device], waiters: int, reason: str | None
    ) -> LeaseError:
        if self._free is not None:
            unknown_free = [replace(d, memory_free_bytes=None) for d in devices]
            if select_devices(self.gpu_request, unknown_free, busy=busy).devices is not None:
                return InsufficientFreeMemory(
                    f"not enough free memory on the matching devices now: {reason}",
                    hint="wait for it (--wait / wait=True), or lower the request",
                )
        # An error path: waiting a little for a brand-new holder's record costs nothing and
        # names the holder (a loaded CI machine needed more than the 2 ms this once allowed).
        holders: list[LeaseInfo] = []
        parts: list[str] = []
        for d in failed:
            shared = share_infos(self.lock_dir, [d])
            if shared:  # held by shares (whose shared lock says nothing of who holds it)
                holders += [info for info, _ in shared]
                parts.append(
                    f"gpu {d.index} shared by "
                    + ", ".join(f"pid {i.pid} ({i.holder}, {format_bytes(b)})" for i, b in shared)
                )
                continue
            holder = holder_info(lock_path(self.lock_dir, d.uuid), d, within=0.25)
            holders.append(holder)
            parts.append(holder.describe())
        if waiters:
            parts.append(
                f"{waiters} earlier waiter{'s' if waiters != 1 else ''} queued for {'them' if len(busy) > 1 else 'it'}"
            )
        need = f"{self.gpu_request.gpus} device{'s' if self.gpu_request.gpus != 1 else ''}"
        message = f"cannot lease {need} now: " + ("; ".join(parts) if parts else (reason or "all busy"))
        return DevicesBusy(
            message,
            holders=[h.to_json() for h in holders],
            hint="to queue for it instead, use --wait (Python: wait=True)",
        )

    # -- waiting ---------------------------------------------------------------------

    def queue_up(self) -> None:
        self.queue.join(self.fitting, self.gpu_request.gpus, self.label)

    def close(self) -> None:
        self.queue.leave()


# ============================================================================ the wait loop


class _SampleFree:
    """A wait-loop step: read the candidates' free memory now (``_Acquirer.read_free``)."""


_SAMPLE_FREE = _SampleFree()
#: What the wait loop asks of its driver between attempts: sleep this many seconds, or
#: sample free memory (slow: the async driver runs it in a thread, off the event loop).
_Step = Union[float, _SampleFree]
_OnWait = Callable[[LeaseError], None]


def _attempts(
    acq: _Acquirer, *, wait: bool, timeout_s: float | None, on_wait: _OnWait | None
) -> Generator[_Step, None, Lease]:
    """The one wait loop of the sync and async APIs: attempts until a lease (returned) or a
    give-up (raised), yielding to its driver what to do in between."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    rechecked = False
    while True:
        if acq.sample_due():
            yield _SAMPLE_FREE
        try:
            return acq.attempt()
        except (DevicesBusy, InsufficientFreeMemory) as exc:
            refusal: LeaseError = exc
        if not wait:
            if rechecked or not _holder_unknown(refusal):
                raise refusal
            rechecked = True
            yield RECHECK_S
            continue
        if deadline is not None and time.monotonic() >= deadline:
            raise _timeout_error(refusal, timeout_s or 0.0)
        if acq.queue.own is None:
            acq.queue_up()
            if on_wait is not None:
                on_wait(refusal)
        yield _poll_delay(acq, deadline)


def _holder_unknown(refusal: LeaseError) -> bool:
    return isinstance(refusal, DevicesBusy) and any(h["pid"] is None for h in refusal.holders)


def _poll_delay(acq: _Acquirer, deadline: float | None) -> float:
    # Far back in the queue nothing can change for us soon: look less often (up to 1 s),
    # which keeps 100 waiters from eating the CPU the holders need. Jitter avoids lock-step.
    import random  # here: only a waiter needs it, and it costs an uncontended lease's process ~1 ms

    rounds_behind = acq.waiters_ahead / max(1, len(acq.fitting))
    delay = min(MAX_POLL_S, POLL_S * max(1.0, rounds_behind)) * random.uniform(0.6, 1.4)
    if deadline is not None:
        delay = max(0.0, min(delay, deadline - time.monotonic()))
    return delay


def _timeout_error(last: LeaseError, timeout: float) -> LeaseTimeout:
    return LeaseTimeout(
        f"no lease after waiting {timeout:g} s; last: {last.message}", holders=list(getattr(last, "holders", []))
    )


def _drive(acq: _Acquirer, steps: Generator[_Step, None, Lease]) -> Lease:
    """Run the wait loop in this thread."""
    while True:
        try:
            step = next(steps)
        except StopIteration as done:
            lease: Lease = done.value
            return lease
        if isinstance(step, _SampleFree):
            acq.set_free(acq.read_free())
        else:
            time.sleep(step)


async def _drive_async(acq: _Acquirer, steps: Generator[_Step, None, Lease]) -> Lease:
    """Run the wait loop on the event loop; an attempt itself is file operations only
    (microseconds), sampling may run nvidia-smi and goes to a thread."""
    import asyncio  # here, not at the top: asyncio costs ~40 ms to import

    while True:
        try:
            step = next(steps)
        except StopIteration as done:
            lease: Lease = done.value
            return lease
        if isinstance(step, _SampleFree):
            acq.set_free(await asyncio.to_thread(acq.read_free))
        else:
            await asyncio.sleep(step)


# ============================================================================ for `cuectl run`'s quick path

#: One device ``cuectl.run.quick`` may lease: uuid, lock file, index, model, lease environment.
QuickGrant = tuple[str, str, int, str, dict[str, str]]


def quick_plan(lock_dir: Path, *, fake_file: str | None = None, backend: str = "auto") -> dict[int, list[QuickGrant]]:
    """What ``cuectl run --gpus 1`` and ``--gpus 0`` would lease here, worked out by this
    module's own matcher and isolation so that the quick path (``cuectl.run.quick``) leases
    exactly as ``acquire`` does without discovering the devices again.

    ``{1: grants in preference order, 0: [the no-device grant]}``: ``select_devices`` takes
    the first device of that order nobody holds (a busy device never reorders the rest),
    so the quick path takes the first it can lock. No ``1`` where no device fits (the full
    path words that refusal). Outside a frame only (no allocation), every device unknown free.
    """
    discovery = _discovery(backend, fake_file)
    out: dict[int, list[QuickGrant]] = {}
    nothing = _Plan(discovery, make_request(0), None)
    out[0] = [("", "", -1, "", nothing.grant(())[1])]
    plan = _Plan(discovery, make_request(1), None)
    order: list[QuickGrant] = []
    busy: set[str] = set()
    while True:
        result = select_devices(plan.request.gpu, plan.candidates, busy=busy)
        if not result.devices:
            break
        (device,) = result.devices
        order.append(
            (
                device.uuid,
                str(lock_path(lock_dir, device.uuid)),
                device.index,
                device.model,
                dict(plan.grant((device.uuid,))[1]),
            )
        )
        busy.add(device.uuid)
    if order:
        out[1] = order
    return out


# ============================================================================ the API


class _Options(NamedTuple):
    """How to acquire, as opposed to what (``LeaseRequest``); see ``lease``. A NamedTuple:
    immutable, and built on every lease at a fraction of a frozen dataclass's cost."""

    wait: bool = False
    timeout: float | str | None = None
    label: str | None = None
    lock_dir: str | Path | None = None
    backend: str = "auto"
    fake_file: str | Path | None = None
    kind: str = KIND_API
    on_wait: _OnWait | None = None


# ============================================================================ a repeated lease


#: A ``lease()`` call as ``_quick_key`` sees it: its plain arguments and their types, its
#: models and devices, the lock directory and fake-GPU file the environment names (None
#: where an argument names them), and the program's name (the default label).
_QuickKey = tuple[tuple[Any, ...], tuple[type, ...], Any, Any, Union[str, None], Union[str, None], str]
#: The types a plain argument may have in a key: values that compare and hash by what they
#: hold. The types go in the key too: 1 == True == 1.0, and a refused ``gpus=True`` must
#: not find the plan of ``gpus=1``.
_PLAIN = frozenset({type(None), str, int, float, bool, type(Path())})
#: What models and devices may hold in a key (exact types, for the same reason).
_PLAIN_ITEMS = frozenset({str, int})


class _Ready(NamedTuple):
    """What ``_setup`` made of one ``lease()`` call, kept for the next call with the same
    arguments in the same environment: a program that leases in a loop (a job runner, a
    test suite) then pays for the lock and its record, not for validating and planning the
    same request again (about half of an uncontended lease's instructions otherwise)."""

    plan: _Plan
    lock_dir: Path
    queue_dir: Path
    #: The fake-GPU file the plan's inventory came from, and its mtime then (``_discovery``'s key).
    fake_file: str | None
    fake_mtime: int
    label: str
    kind: str


_ready: dict[_QuickKey, _Ready] = {}


def _quick_key(
    plain: tuple[Any, ...], gpu_models: Any, devices: Any, lock_dir: str | Path | None, fake_file: str | Path | None
) -> _QuickKey | None:
    """The key of ``_ready`` for one call, or None where the call must take the full path:
    inside a frame (every call checks that the frame still holds its devices) or with an
    argument that cannot be a key (a list of models, a generator of devices)."""
    if config.env("CUE_FRAME_ID") is not None and config.env("CUE_GPUS") is not None:
        return None
    types = tuple(map(type, plain))
    if not _PLAIN.issuperset(types):
        return None
    for many in (gpu_models, devices):
        if (
            many is not None
            and type(many) is not str
            and not (type(many) is tuple and _PLAIN_ITEMS.issuperset(map(type, many)))
        ):
            return None
    return (
        plain,
        types,
        gpu_models,
        devices,
        config.lock_dir_name() if lock_dir is None else None,
        config.fake_gpus_file() if fake_file is None else None,
        sys.argv[0] if sys.argv else "",
    )


def _remember(key: _QuickKey, acq: _Acquirer) -> None:
    """Keep what ``_setup`` made of the call ``key`` (it passed every check), unless its
    attempts read live free memory: only the full path samples it."""
    if acq.allocation is not None or acq.needs_sample:
        return
    if _discoveries.get(acq.discovery_key) is not acq.discovery:
        return  # forgotten meanwhile (forget_discovery)
    _, fake_file, mtime = acq.discovery_key
    if len(_ready) >= 256:
        _ready.clear()
    _ready[key] = _Ready(acq.plan, acq.lock_dir, acq.queue.dir, fake_file, mtime, acq.label, acq.kind)


def _quick_lease(key: _QuickKey) -> Lease | None:
    """The full path's first attempt for a call seen before, when nobody waits: its first
    choice, locked. None (the full path decides, and words any refusal) when the call is
    new, the fake inventory changed, a waiter queued, or a device was busy."""
    ready = _ready.get(key)
    if ready is None:
        return None
    if ready.fake_file and _fake_mtime(ready.fake_file) != ready.fake_mtime:
        return None  # rewritten: ``_discovery`` reads it again
    plan = ready.plan
    if plan.request.gpu.gpus == 0:
        return _granted(ready, [])
    if ticket_names(ready.queue_dir):
        return None
    if outofservice.any_present(ready.lock_dir):
        return None  # a device is drained: the full path leaves it out
    choice = plan.first_choice(plan.candidates)
    if choice.devices is None:
        return None
    locks, _ = lock_all(ready.lock_dir, choice.devices, holder=ready.label, kind=ready.kind, label=ready.label)
    return None if locks is None else _granted(ready, locks)


def _granted(ready: _Ready, locks: list[DeviceLock]) -> Lease:
    devices, env = ready.plan.grant(tuple([lock.uuid for lock in locks]))
    warn_if_held_elsewhere(ready.lock_dir, locks)
    return Lease(locks, devices, env, ready.lock_dir, ready.label)


class LeaseWarning(UserWarning):
    """A lease was granted, but something outside this lock directory uses its device."""


def warn_if_held_elsewhere(lock_dir: Path, locks: Sequence[DeviceLock]) -> None:
    """Every lease path says when a device it just leased is held through another lock
    directory of this machine (leases there never see ours: the GPU is used twice), as
    the worker does at start. A ``LeaseWarning``; `cuectl run` prints it as a warning line."""
    if not locks:
        return
    uuids = {lock_path(lock_dir, lock.uuid).name: lock.uuid for lock in locks}
    for name, other, pid in held_elsewhere(str(lock_dir), tuple(uuids)):
        warnings.warn(elsewhere_warning(uuids[name], other, pid, str(lock_dir)), LeaseWarning, stacklevel=4)


def _setup(request: LeaseRequest, opts: _Options) -> tuple[_Acquirer, float | None]:
    """Check the options and do the static check; may discover GPUs (slow the first time)."""
    timeout_s = None if opts.timeout is None else parse_duration(opts.timeout, field="timeout")
    if timeout_s is not None and not opts.wait:
        raise InvalidInput("timeout: only meaningful when waiting (wait=True / --wait)")
    given = opts.lock_dir if opts.lock_dir is not None else config.env("CUECTL_LOCK_DIR")
    # prepare_lock_dir answers a directory it checked before from a per-process cache.
    directory = prepare_lock_dir(given if given is not None else config.lock_dir())
    fake = str(opts.fake_file) if opts.fake_file is not None else config.fake_gpus_file()
    # Root (or a shared lock directory's owner) makes the lock file of every device here,
    # which other users may only open: the first `sudo cuectl run` sets a machine up.
    provision_lock_files(directory, _discovery(opts.backend, fake).devices)
    text = lease_label(opts.label)
    allocation = Allocation.enclosing()
    if allocation is not None:
        # Inside a frame: its devices are leased already (by the frame: taking their locks
        # again would wait for ourselves). Sub-leases among the frame's processes use
        # sub-locks of those devices, one directory per user and nesting level.
        allocation.check_held(directory)
        directory = prepare_lock_dir(sublock_dir(directory, allocation.level + 1), create=True)
    acquirer = _Acquirer(
        request,
        lock_dir=directory,
        backend=opts.backend,
        fake_file=fake,
        label=text,
        kind=opts.kind,
        allocation=allocation,
    )
    return acquirer, timeout_s


def _acquire(request: LeaseRequest, opts: _Options, quick_key: _QuickKey | None = None) -> Lease:
    acq, timeout_s = _setup(request, opts)
    if quick_key is not None:
        _remember(quick_key, acq)
    try:
        return _drive(acq, _attempts(acq, wait=opts.wait, timeout_s=timeout_s, on_wait=opts.on_wait))
    finally:
        acq.close()


def acquire(
    request: LeaseRequest,
    *,
    wait: bool = False,
    timeout: float | str | None = None,
    label: str | None = None,
    lock_dir: str | Path | None = None,
    backend: str = "auto",
    fake_file: str | Path | None = None,
    kind: str = KIND_API,
    on_wait: _OnWait | None = None,
) -> Lease:
    """Acquire ``request`` (blocking while ``wait``); see ``lease`` for the arguments."""
    return _acquire(
        request,
        _Options(
            wait=wait,
            timeout=timeout,
            label=label,
            lock_dir=lock_dir,
            backend=backend,
            fake_file=fake_file,
            kind=kind,
            on_wait=on_wait,
        ),
    )


def lease(
    gpus: int | None = None,
    *,
    gpu_vendor: str | None = None,
    gpu_models: str | Iterable[str] = (),
    gpu_memory_min: str | int | None = None,
    gpu_memory_free_min: str | int | None = None,
    gpu_capability_min: str | float | None = None,
    gpu_driver_min: str | float | None = None,
    gpu_cuda_min: str | float | None = None,
    devices: Iterable[str | int] | None = None,
    gpu_share: str | int | None = None,
    wait: bool = False,
    timeout: float | str | None = None,
    label: str | None = None,
    lock_dir: str | Path | None = None,
    backend: str = "auto",
    fake_file: str | Path | None = None,
    on_wait: _OnWait | None = None,
    **deprecated: Any,
) -> Lease:
    """Lease ``gpus`` matching local devices exclusively; use as a context manager.

    ``gpu_vendor`` (NVIDIA, AMD, Apple, Intel), ``gpu_models`` (any of; DESIGN §5
    matching), ``gpu_memory_min`` (per device, total), ``gpu_memory_free_min`` (per
    device, free now), ``gpu_capability_min``, ``gpu_driver_min``, ``gpu_cuda_min``
    (dotted versions per device, at least: ``"8.9"``, ``"535.104.05"``), ``devices`` (explicit indices/UUIDs to choose from) — named and
    validated as the ``cuectl run`` flags. ``gpu_share`` (``"8G"`` or bytes): part of one
    device by memory budget, beside other shares, instead of whole devices
    (docs/gpu-health.md); ``lease.env`` then carries ``CUE_GPU_SHARE_BYTES``. ``wait``: block until free, FIFO among this
    host's waiters; ``timeout`` (seconds or ``"10m"``) bounds the wait. ``label`` is what
    `cuectl gpu leases` shows. ``on_wait`` is called once, with the reason, when the call
    starts waiting. The old keywords ``vendor``, ``models``, ``min_memory`` and
    ``min_free_memory`` still work, with a ``DeprecationWarning``.

    Raises ``InvalidInput`` for bad arguments; ``NoMatchingDevice`` (no device here could
    ever match), ``DevicesBusy`` (with ``.holders``), ``InsufficientFreeMemory``,
    ``InvalidDevice``, ``LeaseTimeout`` — all ``LeaseError``.
    """
    key = None
    if not deprecated and on_wait is None:
        key = _quick_key(
            (
                gpus,
                gpu_vendor,
                gpu_memory_min,
                gpu_memory_free_min,
                gpu_capability_min,
                gpu_driver_min,
                gpu_cuda_min,
                gpu_share,
                wait,
                timeout,
                label,
                lock_dir,
                backend,
                fake_file,
            ),
            gpu_models,
            devices,
            lock_dir,
            fake_file,
        )
        if key is not None:
            quick = _quick_lease(key)
            if quick is not None:
                return quick
    request = make_request(
        gpus,
        gpu_vendor=gpu_vendor,
        gpu_models=gpu_models,
        gpu_memory_min=gpu_memory_min,
        gpu_memory_free_min=gpu_memory_free_min,
        gpu_capability_min=gpu_capability_min,
        gpu_driver_min=gpu_driver_min,
        gpu_cuda_min=gpu_cuda_min,
        devices=devices,
        gpu_share=gpu_share,
        deprecated=deprecated,
    )
    return _acquire(
        request,
        _Options(
            wait=wait,
            timeout=timeout,
            label=label,
            lock_dir=lock_dir,
            backend=backend,
            fake_file=fake_file,
            on_wait=on_wait,
        ),
        key,
    )


class async_lease:
    """``lease`` for asyncio, with the same arguments: ``async with async_lease(gpus=1,
    wait=True) as l:`` or ``l = await async_lease(...)``. Waiting sleeps on the event loop;
    discovery and free-memory sampling (which may run nvidia-smi) run in a worker thread.
    Cancelling the waiting task leaves the queue and takes nothing."""

    def __init__(
        self,
        gpus: int | None = None,
        *,
        gpu_vendor: str | None = None,
        gpu_models: str | Iterable[str] = (),
        gpu_memory_min: str | int | None = None,
        gpu_memory_free_min: str | int | None = None,
        gpu_capability_min: str | float | None = None,
        gpu_driver_min: str | float | None = None,
        gpu_cuda_min: str | float | None = None,
        devices: Iterable[str | int] | None = None,
        gpu_share: str | int | None = None,
        wait: bool = False,
        timeout: float | str | None = None,
        label: str | None = None,
        lock_dir: str | Path | None = None,
        backend: str = "auto",
        fake_file: str | Path | None = None,
        on_wait: _OnWait | None = None,
        **deprecated: Any,
    ) -> None:
        self._request = make_request(
            gpus,
            gpu_vendor=gpu_vendor,
            gpu_models=gpu_models,
            gpu_memory_min=gpu_memory_min,
            gpu_memory_free_min=gpu_memory_free_min,
            gpu_capability_min=gpu_capability_min,
            gpu_driver_min=gpu_driver_min,
            gpu_cuda_min=gpu_cuda_min,
            devices=devices,
            gpu_share=gpu_share,
            deprecated=deprecated,
        )
        self._opts = _Options(
            wait=wait,
            timeout=timeout,
            label=label,
            lock_dir=lock_dir,
            backend=backend,
            fake_file=fake_file,
            on_wait=on_wait,
        )
        self._lease: Lease | None = None

    async def _acquire(self) -> Lease:
        import asyncio

        acq, timeout_s = await asyncio.to_thread(_setup, self._request, self._opts)
        try:
            steps = _attempts(acq, wait=self._opts.wait, timeout_s=timeout_s, on_wait=self._opts.on_wait)
            return await _drive_async(acq, steps)
        finally:
            acq.close()

    def __await__(self) -> Generator[Any, None, Lease]:
        return self._acquire().__await__()

    async def __aenter__(self) -> Lease:
        self._lease = await self._acquire()
        return self._lease

    async def __aexit__(self, *exc: object) -> None:
        if self._lease is not None:
            self._lease.release()
