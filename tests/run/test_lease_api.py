"""The Python API ``cuectl.lease()`` / ``async_lease()`` against real holder processes."""

from __future__ import annotations

import asyncio
import fcntl
import gc
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

import cuectl
from cuectl.errors import (
    DevicesBusy,
    InsufficientFreeMemory,
    InvalidDevice,
    InvalidInput,
    LeaseError,
    LeaseTimeout,
    NoMatchingDevice,
)
from cuectl.run.lease import Lease, async_lease, list_leases, lock_path, prepare_lock_dir
from cuectl.units import GIB


def test_acquire_when_free_gives_devices_and_isolation_env(gpus4):
    with cuectl.lease(gpus=1, gpu_memory_min="16G", label="svc") as held:
        [device] = held.devices
        assert device.index == 0 and device.uuid == gpus4.uuids[0]
        env = held.env
        assert env["CUDA_VISIBLE_DEVICES"] == "0"
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert env["NVIDIA_VISIBLE_DEVICES"] == gpus4.uuids[0]
        assert (env["CUE_GPUS"], env["CUE_GPU_CORES"], env["CUE_GPU_UUIDS"]) == ("1", "0", gpus4.uuids[0])
        assert env["CUE_GPU_MEMORY"] == str(16160 * 1024 * 1024)
        assert [i.uuid for i in list_leases(held.lock_dir)] == [gpus4.uuids[0]]
    assert held.released
    assert list_leases(held.lock_dir) == []


def test_refused_while_another_process_holds_it(gpus4, spawn):
    holder = spawn(devices=[0], label="train-a")
    holder.event("acquired")
    with pytest.raises(DevicesBusy) as caught:
        cuectl.lease(devices=[0])
    assert caught.value.exit_code == 1
    assert "train-a" in caught.value.message and f"pid {holder.pid}" in caught.value.message
    [who] = caught.value.holders
    assert (who["pid"], who["label"], who["kind"], who["index"]) == (holder.pid, "train-a", "api", 0)


def test_released_when_the_holder_exits_normally(gpus4, spawn):
    holder = spawn(gpus=4)
    holder.event("acquired")
    with pytest.raises(DevicesBusy):
        cuectl.lease(gpus=1)
    holder.close_stdin()
    assert holder.wait() == 0
    with cuectl.lease(gpus=4) as held:
        assert len(held.devices) == 4


def test_released_at_once_after_kill_9_of_the_holders_process_group(gpus4, spawn):
    holder = spawn(gpus=4, label="doomed")
    holder.event("acquired")
    holder.kill_group(signal.SIGKILL)
    assert holder.wait() == -signal.SIGKILL
    with cuectl.lease(gpus=4, wait=False) as held:  # no retry, no grace period: free now
        assert len(held.devices) == 4


def test_several_processes_hold_different_devices_at_once(gpus4, spawn):
    holders = [spawn(gpus=1, label=f"p{i}") for i in range(4)]
    taken = [h.event("acquired")["uuids"][0] for h in holders]
    assert sorted(taken) == sorted(gpus4.uuids)
    with pytest.raises(DevicesBusy) as caught:
        cuectl.lease(gpus=1)
    assert sorted(h["pid"] for h in caught.value.holders) == sorted(h.pid for h in holders)


def test_any_free_selection_takes_the_free_devices(gpus4, spawn):
    for index in (0, 2):
        spawn(devices=[index]).event("acquired")
    with cuectl.lease(gpus=1) as first, cuectl.lease(gpus=1) as second:
        assert (first.devices[0].index, second.devices[0].index) == (1, 3)
        with pytest.raises(DevicesBusy):
            cuectl.lease(gpus=1)


def test_multi_device_lease_is_all_or_nothing(gpus4, spawn):
    spawn(devices=[1]).event("acquired")
    with cuectl.lease(gpus=3) as held:
        assert [d.index for d in held.devices] == [0, 2, 3]
        assert held.env["CUDA_VISIBLE_DEVICES"] == "0,2,3"
    with pytest.raises(DevicesBusy):
        cuectl.lease(gpus=4)
    with cuectl.lease(gpus=3):  # the failed 4-device attempt left nothing behind
        pass


@pytest.mark.parametrize("ident", [7, "7", "GPU-00000000-dead-beef-0000-000000000000", "-1", ""])
def test_an_invalid_device_id_is_rejected(gpus4, ident):
    with pytest.raises(InvalidDevice) as caught:
        cuectl.lease(devices=[ident])
    assert caught.value.exit_code == 2


def test_explicit_device_by_uuid_and_index(gpus4):
    with cuectl.lease(devices=[gpus4.uuids[2].lower(), 3]) as held:
        assert [d.index for d in held.devices] == [2, 3]


@pytest.mark.parametrize(
    "request_kwargs, words",
    [
        ({"gpu_vendor": "AMD"}, "vendor AMD"),
        ({"gpus": 5}, "5 GPU devices"),
        ({"gpu_models": ["A100"]}, "A100"),
        ({"gpu_memory_min": "32G"}, "memory"),
        ({"devices": [0, 1], "gpus": 3}, "devices named"),
    ],
)
def test_no_device_could_ever_match(gpus4, request_kwargs, words):
    with pytest.raises(NoMatchingDevice, match=words):
        cuectl.lease(wait=True, **request_kwargs)  # fails at once even when waiting


def test_bad_arguments_are_invalid_input(gpus4):
    with pytest.raises(InvalidInput, match="gpu_vendor"):
        cuectl.lease(gpu_vendor="Matrox")
    with pytest.raises(InvalidInput, match="gpus"):
        cuectl.lease(gpus=-1)
    with pytest.raises(InvalidInput, match="gpu_memory_min"):
        cuectl.lease(gpu_memory_min="lots")
    with pytest.raises(InvalidInput, match="timeout"):
        cuectl.lease(timeout=5)  # a timeout without wait=True is a mistake, not a no-op


def test_explicit_early_release_frees_the_device_for_others(gpus4, spawn):
    held = cuectl.lease(devices=[0])
    held.release()
    held.release()  # idempotent
    assert held.released
    other = spawn(devices=[0])
    assert other.event("acquired")["uuids"] == [gpus4.uuids[0]]


def test_free_memory_threshold_refusal_from_fake_state(gpus4):
    for index in range(4):
        gpus4.set_used(index, 12 * GIB)  # ~3.8 GiB free on each 16 GB card
    with pytest.raises(InsufficientFreeMemory, match="free memory"):
        cuectl.lease(gpu_memory_free_min="8G")
    with pytest.raises(InsufficientFreeMemory):
        cuectl.lease(gpu_memory_min="16G")  # DESIGN §5: too little free memory is not eligible now
    gpus4.set_used(2, 1 * GIB)
    with cuectl.lease(gpu_memory_free_min="8G") as held:
        assert held.devices[0].index == 2


def test_waiting_for_free_memory(gpus4, spawn):
    for index in range(4):
        gpus4.set_used(index, 15 * GIB)
    waiter = spawn(gpu_memory_free_min="8G", wait=True, timeout=30)
    assert "free memory" in waiter.event("waiting")["message"]
    gpus4.set_used(1, 0)
    assert waiter.event("acquired")["uuids"] == [gpus4.uuids[1]]


def test_wait_gives_up_after_the_timeout_naming_the_holders(gpus4, spawn):
    holder = spawn(gpus=4, label="hog")
    holder.event("acquired")
    with pytest.raises(LeaseTimeout, match=r"after waiting 0\.3 s") as caught:
        cuectl.lease(wait=True, timeout=0.3)
    assert {h["pid"] for h in caught.value.holders} == {holder.pid}


def _first_to_acquire(children: list, timeout: float = 30.0):
    """Whichever of ``children`` reports ``acquired`` first (a handshake over several)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in children:
            try:
                text = child.line(timeout=0.02)
            except AssertionError:
                continue
            assert json.loads(text)["event"] == "acquired", text
            return child
    raise AssertionError("nobody acquired")


def test_waiters_are_served_first_come_first_served(gpus4, spawn):
    holder = spawn(devices=[0], label="first")
    holder.event("acquired")
    waiters = []
    for i in range(4):
        waiter = spawn(devices=[0], wait=True, label=f"w{i}")
        waiter.event("waiting")  # queued before the next one starts
        waiters.append(waiter)
    served = []
    current = holder
    pending = list(waiters)
    while pending:
        current.send("release")
        current.event("released")
        current = _first_to_acquire(pending)
        pending.remove(current)
        served.append(current)
    assert [w.pid for w in served] == [w.pid for w in waiters]


def test_a_newcomer_does_not_jump_the_queue(gpus4, spawn):
    holder = spawn(devices=[0], label="first")
    holder.event("acquired")
    waiter = spawn(devices=[0], wait=True, label="queued")
    waiter.event("waiting")
    holder.send("release")
    holder.event("released")
    # The device is free now, but promised to the queued waiter: a no-wait newcomer
    # must not take it, however quick it is.
    with pytest.raises(DevicesBusy), cuectl.lease(devices=[0]):
        pass
    waiter.event("acquired")


def test_gpus_zero_hides_every_device(gpus4):
    with cuectl.lease(gpus=0) as held:
        assert held.devices == ()
        env = held.env
    assert env["CUDA_VISIBLE_DEVICES"] == "-1"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env["CUE_GPUS"] == "0"


def test_a_dropped_lease_warns_and_frees_its_devices(gpus4):
    held = cuectl.lease(gpus=4)
    with pytest.warns(ResourceWarning, match="unreleased"):
        del held
        gc.collect()
    cuectl.lease(gpus=4).release()


def test_lease_errors_share_one_base():
    for cls in (NoMatchingDevice, DevicesBusy, InsufficientFreeMemory, InvalidDevice, LeaseTimeout):
        assert issubclass(cls, LeaseError)


def test_async_lease_waits_without_blocking_the_event_loop(gpus4, spawn):
    holder = spawn(devices=[0], label="sync-holder")
    holder.event("acquired")

    async def scenario() -> tuple[int, int]:
        queued = asyncio.Event()
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.005)
                ticks += 1

        async def take() -> int:
            async with async_lease(devices=[0], wait=True, timeout=30, on_wait=lambda exc: queued.set()) as held:
                return held.devices[0].index

        tick_task = asyncio.create_task(ticker())
        take_task = asyncio.create_task(take())
        await asyncio.wait_for(queued.wait(), 30)
        ticks_when_queued = ticks
        await asyncio.to_thread(holder.send, "release")
        index = await asyncio.wait_for(take_task, 30)
        tick_task.cancel()
        return index, ticks - ticks_when_queued

    index, ticks_while_waiting = asyncio.run(scenario())
    assert index == 0
    assert ticks_while_waiting > 0  # the loop kept running while the lease was awaited


def test_async_lease_can_be_awaited_and_refuses_when_busy(gpus4, spawn):
    spawn(gpus=3).event("acquired")

    async def scenario() -> None:
        held = await async_lease(gpus=1)
        assert not held.released
        with pytest.raises(DevicesBusy):
            await async_lease(gpus=1)
        held.release()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("old", "new", "value"),
    [
        ("vendor", "gpu_vendor", "nvidia"),
        ("models", "gpu_models", ["V100"]),
        ("min_memory", "gpu_memory_min", "16G"),
        ("min_free_memory", "gpu_memory_free_min", "8G"),
    ],
)
def test_the_old_keywords_still_work_with_a_deprecation_warning(gpus4, old, new, value):
    with pytest.warns(DeprecationWarning, match=f"the {old}= keyword is deprecated; use {new}=") as warned:
        held = cuectl.lease(**{old: value})
    assert [w.filename for w in warned] == [__file__]  # the caller's line, not ours
    with held:
        assert held.devices[0].index == 0
    with pytest.warns(DeprecationWarning, match=f"use {new}="):
        async_lease(**{old: value})


def test_an_old_keyword_is_named_in_errors_and_cannot_be_mixed_with_its_new_name(gpus4):
    with pytest.warns(DeprecationWarning), pytest.raises(InvalidInput, match=r"^min_memory: invalid size 'lots'"):
        cuectl.lease(min_memory="lots")
    with pytest.warns(DeprecationWarning), pytest.raises(InvalidInput, match="give only gpu_vendor"):
        cuectl.lease(vendor="AMD", gpu_vendor="NVIDIA")
    with pytest.raises(TypeError, match="unexpected keyword argument 'gpu_model'"):
        cuectl.lease(gpu_model="V100")


def _hold_without_record(lock_dir: Path, uuid: str) -> int:
    """Lock a device as a `gpu leases` probe does, or a holder that has only just locked:
    no record in the lock file."""
    prepare_lock_dir(lock_dir)
    fd = os.open(lock_path(lock_dir, uuid), os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


async def _await_lease(**kwargs) -> Lease:
    return await async_lease(**kwargs)


@pytest.mark.parametrize("api", ["sync", "async"])
def test_no_wait_looks_again_once_when_the_holder_has_no_record(gpus4, lock_dir, api):
    # One wait loop serves both APIs: the async one used to say "busy" at once here.
    cuectl.lease(devices=[0]).release()  # discover now: the timing below is the acquisition's alone
    fd = _hold_without_record(lock_dir, gpus4.uuids[0])
    # Let go while the refused first attempt looks for the holder's record (up to 0.25 s),
    # so only the second look can find the device free.
    letting_go = threading.Timer(0.05, os.close, [fd])
    letting_go.start()
    try:
        held = cuectl.lease(devices=[0]) if api == "sync" else asyncio.run(_await_lease(devices=[0]))
    finally:
        letting_go.join()
    with held:
        assert held.uuids == (gpus4.uuids[0],)
