"""The inventory as the store knows it: registering the host (and signing it off), finding
the GPUs again (``--rediscover-interval``, SIGHUP) and telling the store what changed, with
the devices that are gone listed as unavailable."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from cuectl import __version__
from cuectl.errors import CuectlError, StoreError
from cuectl.gpu.device import Device
from cuectl.sched.store import HostInfo
from cuectl.units import iso

if TYPE_CHECKING:
    from cuectl.run.worker.core import Worker


@dataclass
class HostInventory:
    worker: "Worker"
    next_rediscover: float | None = None
    rediscover_asked: bool = False  # SIGHUP: look again at the next iteration
    register_due: bool = False  # the inventory changed: the store's copy must follow
    registered: bool = False  # this process registered its host (so it may sign it off)
    # The first heartbeat always sends the unavailable list (empty or not), so that what a
    # previous worker of this host reported is replaced; later ones only while it matters.
    unavailable_sent: bool = True

    def register(self, now: float) -> None:
        w = self.worker
        w.store.register_host(
            HostInfo(
                name=w.opts.name,
                cores=w.opts.cores,
                memory_bytes=w.opts.memory_bytes,
                gpus=[d.to_json() for d in w.devices],
                tags=w.opts.tags,
                worker_pid=os.getpid(),
                version=__version__,
            ),
            now=now,
        )
        self.register_due = False
        self.registered = True
        w.link.ok_at = time.time()

    def sign_off(self) -> None:
        """The worker is stopping: mark its host DOWN now, so that `host list` and pending
        reasons do not show a stopped worker as alive for HOST_DOWN_AFTER_S, and `host
        forget` need not wait. Best effort: a store that does not answer leaves the host to
        read DOWN after that silence, as a killed worker's does."""
        if not self.registered:
            return
        w = self.worker
        try:
            w.store.sign_off_host(w.opts.name, os.getpid(), now=w.store.clock())
        except StoreError:
            pass

    def due(self, now: float) -> bool:
        """Is it time to find the GPUs again (asked, or the interval is over)?"""
        w = self.worker
        if w.rediscover is None:
            return False
        interval = w.opts.rediscover_interval_s
        if self.next_rediscover is None:  # the first iteration: the inventory is fresh
            self.next_rediscover = now + interval if interval > 0 else float("inf")
        return self.rediscover_asked or now >= self.next_rediscover

    def refresh(self, now: float) -> None:
        """Find the GPUs again. A device that is no longer found (fell off the bus, MIG
        reconfigured, its backend failed) leaves the inventory, so no new frame gets it, and
        is listed in ``unavailable`` for `host show`; one that comes back rejoins. Frames
        already running keep their devices and their locks: they finish or fail on their own."""
        w = self.worker
        assert w.rediscover is not None
        self.rediscover_asked = False
        interval = w.opts.rediscover_interval_s
        self.next_rediscover = now + interval if interval > 0 else float("inf")
        try:
            inventory = w.rediscover()
        except CuectlError as exc:  # e.g. a fake GPU file being edited: keep what we have
            w.tell_warn(f"GPU re-discovery failed, keeping the current inventory: {exc.message}")
            return
        found = {d.uuid for d in inventory.devices}
        for d in w.devices:
            if d.uuid not in found:
                why = inventory.problems.get(d.backend)
                w.unavailable[d.uuid] = {
                    "uuid": d.uuid,
                    "model": d.model,
                    "index": d.index,
                    "since": iso(now),
                    "reason": f"{d.backend}: {why}" if why else None,
                }
                w.tell_warn(
                    f"GPU {d.index} {d.uuid} ({d.model}) is gone{f' ({why})' if why else ''}: no new frames will use it"
                )
        known = {d.uuid for d in w.devices}
        for d in inventory.devices:
            back = w.unavailable.pop(d.uuid, None) is not None
            if back or d.uuid not in known:
                w.tell_warn(f"GPU {d.index} {d.uuid} ({d.model}) {'is back' if back else 'found'}")
        changed = _identity(inventory.devices) != _identity(w.devices)
        if changed:
            w.dispatch.inventory_changed()
        w.devices = list(inventory.devices)
        w.sampler = inventory.sampler
        w.health_reader = inventory.health
        if changed:
            self.register_due = True  # the store's inventory (host show, pending reasons)
            w.next_heartbeat = now  # and the unavailable list, at once

    def unavailable_doc(self, doc: dict[str, Any]) -> dict[str, Any] | None:
        """``doc`` with the devices that are unavailable now (while there are any, and once
        after); None for nothing to publish."""
        unavailable = self.worker.unavailable
        if not unavailable and not self.unavailable_sent:
            return doc or None
        return {**doc, "unavailable": list(unavailable.values())}


def _identity(devices: Sequence[Device]) -> list[tuple[Any, ...]]:
    """What the store's copy of the inventory must follow (live values aside)."""
    return [(d.index, d.uuid, d.vendor, d.model, d.backend, d.memory_total_bytes, d.mig_parent_uuid) for d in devices]
