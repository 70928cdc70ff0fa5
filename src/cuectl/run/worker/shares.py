"""Frames that share one GPU by memory budget (``gpu_share``; docs/gpu-health.md): their
dispatch onto a device with room in its budget ledger, their environment, the check of
each sample against the budget, and their accounting (a share is budget/memory of the
device's time).

Dispatch takes a share with the same ledger as `cuectl run --gpu-share`
(``cuectl.run.lease.shares``), so frames of this worker, ad-hoc shares and exclusive
leases of anyone see each other. A budget is enforced by sampling, not by the driver
(unless an MPS server pins it): each sample compares the memory of the frame's own
processes on its device with its budget; over it is an ``over-budget`` event, and under
``gpu_share_enforce: kill`` (the default) the frame is stopped after
``OVER_SAMPLES_TO_KILL`` samples in a row over it, so that one frame cannot starve its
neighbours of memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

from cuectl.errors import StoreError
from cuectl.gpu.device import Device
from cuectl.run import failure as failures
from cuectl.run.lease.locks import DeviceLock
from cuectl.run.lease.shares import ShareLock, mps_running, share_env, shared_uuids, take_share
from cuectl.sched.match import GpuRequest, select_devices
from cuectl.sched.store import GpuEvent, RunnableLayer
from cuectl.units import format_bytes

if TYPE_CHECKING:
    from cuectl.run.worker.core import Worker
    from cuectl.run.worker.dispatch import Dispatcher
    from cuectl.run.worker.running import RunningFrame

#: Samples in a row over budget before ``gpu_share_enforce: kill`` stops the frame: one
#: sample over may be a moment's peak the frame frees at once.
OVER_SAMPLES_TO_KILL = 2
#: What ``gpu_share_enforce`` is when the layer leaves it out.
DEFAULT_ENFORCE = "kill"


def could_fit(layer: RunnableLayer, devices: Sequence[Device]) -> bool:
    """Could a share of ``layer`` ever fit a device of ``devices`` (memory at least its budget)?"""
    share = layer.gpu_share_bytes or 0
    request = GpuRequest.from_record(layer)
    return any((d.memory_total_bytes or 0) >= share and select_devices(request, [d]).could_ever_fit for d in devices)


def claim_shares(
    d: "Dispatcher", layer: RunnableLayer, offered: Sequence[Device], reserved: set[str], now: float
) -> None:
    """Claim frames of the share layer ``layer`` while a device of ``offered`` has room for
    one more budget: each frame on the first device, in the matcher's order, whose ledger
    takes it. Devices held whole (an exclusive frame or lease), out of service, queued for,
    reserved or used by another program (NIMBY) are left alone."""
    w = d.worker
    share = layer.gpu_share_bytes
    assert share is not None
    request = GpuRequest.from_record(layer)
    fits = [x for x in offered if (x.memory_total_bytes or 0) >= share]
    tried: set[str] = set()
    while not w.reached_max():
        busy, _ = d.busy(fits, for_share=True)
        result = select_devices(request, fits, busy=busy | reserved | tried)
        if not result.devices:
            return
        (device,) = result.devices
        used = None
        if device.memory_free_bytes is not None and device.memory_total_bytes:
            used = max(0, device.memory_total_bytes - device.memory_free_bytes)
        got = take_share(w.opts.lock_dir, device, share, holder=f"{w.opts.name} claiming", used_bytes=used)
        if not isinstance(got, ShareLock):
            tried.add(device.uuid)  # no room there now (or held whole): the next device
            continue
        w.crash_point("after_lock")
        locks: list[DeviceLock] = [got]
        try:
            if not d.claim(layer, locks, now, devices=[device]):
                return
        finally:
            if not any(r.locks is locks for r in w.running.values()):
                got.release()


def shared_here(d: "Dispatcher", devices: Sequence[Device]) -> set[str]:
    """Devices with a live share: this worker's share frames' and anyone's (ledgers)."""
    w = d.worker
    mine = {u for r in w.running.values() if r.claim.gpu_share_bytes for u in r.claim.gpu_uuids}
    return mine | shared_uuids(w.opts.lock_dir, devices)


def frame_env(share_bytes: int, environ: Mapping[str, str]) -> dict[str, str]:
    """A share frame's own variables: its budget, and MPS's pinned memory limit of it where
    an MPS control daemon runs for the frame's environment (``environ``)."""
    return share_env(share_bytes, mps=mps_running(dict(environ)))


def fraction(rf: "RunningFrame") -> float | None:
    """The part of its device a share frame holds (budget / device memory), for its
    accounting; None for a frame of whole devices."""
    share = rf.claim.gpu_share_bytes
    if not share or len(rf.devices) != 1:
        return None
    total = rf.devices[0].memory_total_bytes
    return min(1.0, share / total) if total else None


def check(worker: "Worker", frames: Sequence["RunningFrame"], now: float) -> None:
    """Compare each share frame's own memory on its device, as just sampled, with its
    budget: over it is an ``over-budget`` event (once per stretch over), a warning at the
    end of its log, and under ``gpu_share_enforce: kill`` the frame is stopped after
    ``OVER_SAMPLES_TO_KILL`` samples in a row over it (failure ``gpu-over-budget``)."""
    events: list[GpuEvent] = []
    for rf in frames:
        share = rf.claim.gpu_share_bytes
        if not share or rf.lost or rf.stopped_for is not None or len(rf.devices) != 1:
            continue
        device = rf.devices[0]
        used = rf.usage.own_memory(device.uuid)
        if used is None:
            continue  # the backend did not list the frame's processes: nothing to judge by
        if used <= share:
            rf.watch["share_over"] = 0
            continue
        over = rf.watch.get("share_over", 0) + 1
        rf.watch["share_over"] = over
        policy = rf.claim.gpu_share_enforce or DEFAULT_ENFORCE
        text = (
            f"GPU share over budget: {format_bytes(used)} on GPU {device.index} "
            f"(budget {format_bytes(share)}) for {over} sample{'s' if over != 1 else ''}"
        )
        if over == 1:
            pid = rf.usage.own_biggest_pid(device.uuid)
            events.append(
                GpuEvent(
                    kind="over-budget",
                    at=now,
                    device_uuid=device.uuid,
                    device_index=device.index,
                    pid=pid,
                    memory_bytes=used,
                    detail=f"{text}; gpu_share_enforce: {policy}",
                    frame_id=rf.claim.frame_id,
                    attempt=rf.claim.attempt,
                )
            )
            if policy != "kill":
                rf.proc.add_footer_note(f"warning: {text}")
                worker.tell_warn(f"frame {rf.claim.frame_id} (job {rf.claim.job}): {text}")
        if policy == "kill" and over >= OVER_SAMPLES_TO_KILL:
            worker.frames.stop(rf, failures.Failure("gpu-over-budget", text, False))
    if events:
        try:
            worker.store.record_gpu_events(worker.opts.name, events)
        except StoreError:
            pass  # best effort: the frame's log and the worker's output say it too
