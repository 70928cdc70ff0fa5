"""A waiter's place in the queue covers only the devices that fit its request.

On a mixed host a waiter constrained by model or memory must not reserve devices it can
never use: not from a younger `cuectl run --no-wait` / ``lease(wait=False)``, nor from
the worker (``queued_reservations``). Devices it *can* use stay reserved for it (no
starvation). Holders and waiters are real processes (lease_child.py, `cuectl run`), the
queue is real ticket files in the test's lock directory.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

import cuectl
from cuectl.errors import DevicesBusy
from cuectl.gpu import discover
from cuectl.gpu.device import Device
from cuectl.run.lease import queued_reservations

T4 = {"model": "Tesla T4", "vendor": "NVIDIA", "memory": "15360MiB", "pci_bus_id": "0000:17:00.0"}
RTX4090 = {"model": "NVIDIA GeForce RTX 4090", "vendor": "NVIDIA", "memory": "24564MiB", "pci_bus_id": "0000:31:00.0"}
A100_A = {"model": "NVIDIA A100-SXM4-80GB", "vendor": "NVIDIA", "memory": "81920MiB", "pci_bus_id": "0000:4b:00.0"}
A100_B = {"model": "NVIDIA A100-SXM4-80GB", "vendor": "NVIDIA", "memory": "81920MiB", "pci_bus_id": "0000:ca:00.0"}


@dataclass
class MixedHost:
    devices: list[Device]

    def uuid(self, index: int) -> str:
        return self.devices[index].uuid

    @property
    def t4(self) -> str:
        return self.uuid(0)

    @property
    def rtx4090(self) -> str:
        return self.uuid(1)

    @property
    def a100s(self) -> list[str]:
        return [self.uuid(2), self.uuid(3)]


@pytest.fixture
def mixed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> MixedHost:
    """gpu 0 T4 16 GB, gpu 1 RTX 4090 24 GB, gpus 2 and 3 A100 80 GB (CUECTL_FAKE_GPUS)."""
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump({"host": "mixed", "devices": [T4, RTX4090, A100_A, A100_B]}))
    monkeypatch.setenv("CUECTL_FAKE_GPUS", str(path))
    devices = list(discover("fake", fake_file=path).devices)
    assert [d.index for d in devices] == [0, 1, 2, 3]
    assert [d.model for d in devices] == [T4["model"], RTX4090["model"], A100_A["model"], A100_B["model"]]
    return MixedHost(devices)


def _run(lease_cli, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(lease_cli("run", *args), capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def _tickets(lock_dir: Path) -> list[dict]:
    queue = lock_dir / "queue"
    return [json.loads(p.read_text()) for p in sorted(queue.glob("*.ticket"))]


def test_model_waiter_does_not_keep_an_idle_4090_from_no_wait(mixed, spawn, lock_dir, lease_cli):
    # Both A100s busy; a 2-A100 request cannot be served and queues.
    holder = spawn(devices=[2], label="a100-holder")
    holder.event("acquired")
    waiter = spawn(gpus=2, gpu_models="A100", wait=True, timeout=60, label="a100-waiter")
    waiter.event("waiting")

    # The 4090 is idle and the waiter can never use it: --no-wait for it succeeds.
    out = _run(lease_cli, "--no-wait", "--gpu-model", "4090", "--", "true")
    assert out.returncode == 0, out.stderr
    assert "leased gpu 1" in out.stderr
    with cuectl.lease(gpu_models="RTX 4090") as held:
        assert held.uuids == (mixed.rtx4090,)
    # ...and so does an unconstrained request, which gets the smallest card.
    with cuectl.lease(gpus=2) as held:
        assert set(held.uuids) == {mixed.t4, mixed.rtx4090}

    # The free A100 stays promised to the older waiter (no starvation of big requests).
    with pytest.raises(DevicesBusy, match="earlier waiter"):
        cuectl.lease(gpu_models="A100")
    refused = _run(lease_cli, "--no-wait", "--gpu-model", "A100", "--", "true")
    assert refused.returncode == 1 and "earlier waiter" in refused.stderr, refused.stderr

    holder.send("release")
    holder.event("released")
    assert set(waiter.event("acquired")["uuids"]) == set(mixed.a100s)


def test_queued_reservations_name_only_devices_the_waiter_can_use(mixed, spawn, lock_dir):
    holder = spawn(devices=[3], label="a100-holder")
    holder.event("acquired")
    waiter = spawn(gpus=2, gpu_models=["A100"], wait=True, timeout=60, label="a100-waiter")
    waiter.event("waiting")
    # What the worker skips: the free A100 the waiter is gathering, never the T4 or 4090.
    assert queued_reservations(lock_dir, mixed.devices) == {mixed.a100s[0]}
    holder.send("release")
    holder.event("released")
    waiter.event("acquired")


def test_a_single_a100_waiter_reserves_nothing_it_cannot_use(mixed, spawn, lock_dir, lease_cli):
    holder = spawn(gpus=2, gpu_models="A100", label="sweep")
    holder.event("acquired")
    waiter = spawn(gpu_models="A100", wait=True, timeout=60, label="a100-waiter")
    waiter.event("waiting")

    # (a) the ticket lists only the A100s
    [ticket] = _tickets(lock_dir)
    assert sorted(ticket["candidates"]) == sorted(mixed.a100s) and ticket["gpus"] == 1
    # (b) neither the worker nor a younger caller is kept from the T4 or the 4090
    assert queued_reservations(lock_dir, mixed.devices) == set()
    out = _run(lease_cli, "--no-wait", "--gpus", "2", "--", "true")
    assert out.returncode == 0, out.stderr
    # A refusal for a device the waiter cannot use does not blame the waiter.
    blocker = spawn(gpu_models="4090", label="desk")
    blocker.event("acquired")
    with pytest.raises(DevicesBusy) as caught:
        cuectl.lease(gpu_models="4090")
    assert "waiter" not in caught.value.message and "desk" in caught.value.message

    holder.send("release")
    holder.event("released")
    assert waiter.event("acquired")["uuids"][0] in mixed.a100s


def test_memory_constrained_waiter_reserves_only_big_enough_devices(mixed, spawn, lock_dir, lease_cli):
    holder = spawn(gpus=2, gpu_memory_min="40G", label="big-holder")
    holder.event("acquired")
    waiter = spawn(gpu_memory_min="40G", wait=True, timeout=60, label="big-waiter")
    waiter.event("waiting")

    [ticket] = _tickets(lock_dir)
    assert sorted(ticket["candidates"]) == sorted(mixed.a100s)
    assert queued_reservations(lock_dir, mixed.devices) == set()
    with cuectl.lease(gpus=2, wait=False) as held:
        assert set(held.uuids) == {mixed.t4, mixed.rtx4090}
    out = _run(lease_cli, "--no-wait", "--gpu-memory-min", "20G", "--", "true")
    assert out.returncode == 0 and "leased gpu 1" in out.stderr, out.stderr

    holder.send("release")
    holder.event("released")
    assert waiter.event("acquired")["uuids"][0] in mixed.a100s


def test_memory_waiter_still_goes_before_a_younger_caller_for_the_same_devices(mixed, spawn, lock_dir):
    holder = spawn(devices=[2], label="a100-holder")
    holder.event("acquired")
    # Needs 2 devices of >= 24G: the 4090 and the free A100 fit, only one A100 is held.
    blocker = spawn(devices=[1], label="desk")
    blocker.event("acquired")
    waiter = spawn(gpus=2, gpu_memory_min="24G", wait=True, timeout=60, label="big-waiter")
    waiter.event("waiting")
    [ticket] = _tickets(lock_dir)
    assert sorted(ticket["candidates"]) == sorted([mixed.rtx4090, *mixed.a100s])
    # It keeps the free A100 from younger callers and the worker, but not the T4.
    assert queued_reservations(lock_dir, mixed.devices) == {mixed.a100s[1]}
    with pytest.raises(DevicesBusy):
        cuectl.lease(gpu_memory_min="24G")
    with cuectl.lease() as held:
        assert held.uuids == (mixed.t4,)
    blocker.send("release")
    blocker.event("released")
    assert set(waiter.event("acquired")["uuids"]) == {mixed.rtx4090, mixed.a100s[1]}
