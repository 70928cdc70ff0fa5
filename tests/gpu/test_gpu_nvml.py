"""NVML backend: against the pynvml double, and for real against this machine's pynvml."""

from __future__ import annotations

import ctypes
import re
import sys

import pytest
from gpu_support import StubTools
from nvml_double import FakeGpu, FakeMig, FakeNvml, h100_box

from cuectl.errors import BackendUnavailable
from cuectl.gpu import discover
from cuectl.gpu.nvml import NvmlBackend

GIB = 1024**3


def two_card_host(**kw) -> FakeNvml:
    plain = FakeGpu(
        uuid="GPU-aaaa",
        name="NVIDIA RTX A6000",
        total=48 * GIB,
        used=2 * GIB,
        util=37,
        bus_id="00000000:1A:00.0",
        cc=(8, 6),
        mig_mode=None,
        processes=[(100, 1 * GIB), (200, None), (300, 2**64 - 1)],
        proc_samples=[(100, 10, 20), (100, 20, 40), (999, 20, 90)],
    )
    mig = FakeGpu(
        uuid="GPU-bbbb",
        name="NVIDIA A100-SXM4-80GB",
        total=80 * GIB,
        used=0,
        util=None,
        bus_id="00000000:B1:00.0",
        cc=(8, 0),
        mig_mode=1,
        migs=[
            FakeMig(
                uuid="MIG-1111",
                profile="3g.40gb",
                total=40 * GIB,
                used=5 * GIB,
                slot=0,
                gpu_instance_id=2,
                processes=[(100, 3 * GIB)],
            ),
            FakeMig(uuid="MIG-2222", profile="1g.10gb", total=10 * GIB, slot=3, gpu_instance_id=9),
        ],
    )
    return FakeNvml([plain, mig], **kw)


def test_discovery_lists_cards_and_mig_instances_not_mig_parents() -> None:
    lib = two_card_host(as_bytes=True)  # old pynvml releases return bytes
    devices = NvmlBackend(nvml=lib).discover()
    assert [d.uuid for d in devices] == ["GPU-aaaa", "MIG-1111", "MIG-2222"]
    assert [d.index for d in devices] == [0, 1, 2]
    card = devices[0]
    assert (card.model, card.memory_total_bytes, card.memory_free_bytes, card.utilization_pct) == (
        "NVIDIA RTX A6000",
        48 * GIB,
        46 * GIB,
        37.0,
    )
    assert (card.pci_bus_id, card.compute_capability, card.driver_version, card.api_version) == (
        "0000:1a:00.0",
        "8.6",
        "550.54.15",
        "CUDA 12.4",
    )
    mig = devices[1]
    assert (mig.model, mig.mig_profile, mig.mig_parent_uuid) == (
        "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
        "3g.40gb",
        "GPU-bbbb",
    )
    assert (mig.memory_total_bytes, mig.memory_free_bytes, mig.utilization_pct) == (40 * GIB, 35 * GIB, None)
    assert (mig.pci_bus_id, mig.compute_capability) == ("0000:b1:00.0", "8.0")
    assert mig.attributes == {"vendor_index": 1, "mig_device_index": 0, "gpu_instance_id": 2}
    assert devices[2].attributes["mig_device_index"] == 3


def test_init_happens_once() -> None:
    lib = two_card_host()
    backend = NvmlBackend(nvml=lib)
    backend.discover()
    backend.discover()
    backend.sample(["GPU-aaaa"])
    assert lib.calls["nvmlInit"] == 1


@pytest.mark.parametrize(
    "code, message, hint",
    [
        (12, "NVML library (libnvidia-ml) not found", "install the NVIDIA driver"),
        (9, "the NVIDIA driver is not loaded", "modprobe nvidia"),
        (18, "versions differ", "reboot"),
        (4, "no permission", "group"),
        (999, "unknown error", "restart the container"),
        (15, "fell off the bus", "Xid"),
    ],
)
def test_init_errors_become_clear_unavailable(code: int, message: str, hint: str) -> None:
    with pytest.raises(BackendUnavailable, match=re.escape(message)) as err:
        NvmlBackend(nvml=FakeNvml([], init_error=code)).discover()
    assert hint in (err.value.hint or "")


def test_unmapped_error_code_still_says_what_failed() -> None:
    with pytest.raises(BackendUnavailable, match="NVML: nvmlInit failed: NVML error 42"):
        NvmlBackend(nvml=FakeNvml([], init_error=42)).discover()


def test_gpus_refused_by_the_cgroup_are_skipped() -> None:
    lib = h100_box(3)
    lib.gpus[1].handle_error = 4  # NO_PERMISSION, as under Slurm's ConstrainDevices
    backend = NvmlBackend(nvml=lib)
    assert [d.uuid for d in backend.discover()] == [lib.gpus[0].uuid, lib.gpus[2].uuid]
    assert backend.skipped == ["no permission to open the NVIDIA devices (GPU 1)"]
    for gpu in lib.gpus:
        gpu.handle_error = 4
    with pytest.raises(BackendUnavailable, match="no GPU could be read") as err:
        backend.discover()
    assert "group" in (err.value.hint or "")


def test_sample_values_processes_and_process_utilisation_window() -> None:
    lib = two_card_host()
    backend = NvmlBackend(nvml=lib)
    backend.discover()
    first = backend.sample(["GPU-aaaa", "MIG-1111", "GPU-bbbb", "nope"], pids={100, 200, 300})
    # The MIG-enabled parent is not a device; unknown uuids are skipped.
    assert set(first) == {"GPU-aaaa", "MIG-1111"}
    card = first["GPU-aaaa"]
    assert (card.utilization_pct, card.memory_used_bytes, card.memory_free_bytes) == (37.0, 2 * GIB, 46 * GIB)
    # Mean SM utilisation of pid 100 over its two samples; pid 999 was not asked for.
    assert [(p.pid, p.memory_used_bytes, p.utilization_pct) for p in card.processes] == [
        (100, 1 * GIB, 30.0),
        (200, None, None),
        (300, None, None),
    ]
    mig = first["MIG-1111"]
    assert (mig.utilization_pct, mig.memory_used_bytes) == (None, 5 * GIB)
    assert [(p.pid, p.memory_used_bytes, p.utilization_pct) for p in mig.processes] == [(100, 3 * GIB, None)]
    # Next call: only samples newer than the newest seen count.
    lib.gpus[0].proc_samples.append((100, 30, 80))
    again = backend.sample(["GPU-aaaa"], pids={100})["GPU-aaaa"]
    assert [(p.pid, p.utilization_pct) for p in again.processes] == [(100, 80.0)]
    quiet = backend.sample(["GPU-aaaa"], pids={100})["GPU-aaaa"]
    assert [(p.pid, p.utilization_pct) for p in quiet.processes] == [(100, None)]


def test_sample_without_pids_makes_no_process_calls() -> None:
    lib = h100_box(8)
    backend = NvmlBackend(nvml=lib)
    uuids = [d.uuid for d in backend.discover()]
    lib.calls.clear()
    samples = backend.sample(uuids)
    assert len(samples) == 8 and all(s.processes == () for s in samples.values())
    assert lib.calls["nvmlDeviceGetComputeRunningProcesses"] == 0
    assert lib.calls["nvmlDeviceGetCount"] == 0  # no rediscovery per sample
    assert lib.calls["nvmlDeviceGetMemoryInfo"] == 8


def _libnvml_loadable() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1" if sys.platform != "win32" else "nvml.dll")
    except OSError:
        return False
    return True


def test_real_pynvml_on_this_machine() -> None:
    """The real nvidia-ml-py: on a machine without the driver (CI, this build box) a clear
    BackendUnavailable; on one with the driver, real devices with NVIDIA identities."""
    backend = NvmlBackend()
    if not _libnvml_loadable():
        with pytest.raises(BackendUnavailable) as err:
            backend.discover()
        assert err.value.message == "NVML library (libnvidia-ml) not found"
        assert "install the NVIDIA driver" in (err.value.hint or "")
        return
    devices = backend.discover()
    assert all(d.vendor == "NVIDIA" and d.uuid.startswith(("GPU-", "MIG-")) for d in devices)
    samples = backend.sample([d.uuid for d in devices])
    assert set(samples) == {d.uuid for d in devices}


def test_real_auto_discovery_reports_nvml_and_does_not_crash(tools: StubTools, tmp_path) -> None:
    found = discover("auto", fake_file="")  # "" = no fake file, whatever the environment says
    by_name = {b.name: b for b in found.backends}
    assert list(by_name)[0] == "nvml" and "amd" in by_name and "apple" in by_name
    if not _libnvml_loadable():
        assert by_name["nvml"].ok is False and "libnvidia-ml" in by_name["nvml"].error
        assert by_name["smi"].ok is False and by_name["smi"].error == "nvidia-smi not found on PATH"
        assert all(d.backend != "nvml" for d in found.devices)
    assert found.to_json()["backends"][0]["name"] == "nvml"


# What NVML gave on an idle H200 (driver 580.159.04, 2026-12-04), then with a process
# holding 1 GiB: the first struct counts the driver's 615 MiB as used, the second (and
# nvidia-smi's memory.used: 0 MiB idle) does not.
H200_TOTAL, H200_RESERVED, H200_BUSY_USED = 150_754_820_096, 644_939_776, 1_626_144_768


@pytest.mark.parametrize("memory_v2, idle_used", [(True, 0), (False, H200_RESERVED), ("old-driver", H200_RESERVED)])
def test_used_memory_leaves_out_what_the_driver_reserves_where_nvml_says(memory_v2, idle_used) -> None:
    gpu = FakeGpu(uuid="GPU-793a", name="NVIDIA H200", total=H200_TOTAL, reserved=H200_RESERVED, util=0, cc=(9, 0))
    backend = NvmlBackend(nvml=FakeNvml([gpu], memory_v2=memory_v2))
    (device,) = backend.discover()
    assert device.memory_free_bytes == H200_TOTAL - H200_RESERVED  # free is the same either way
    assert backend.sample(["GPU-793a"])["GPU-793a"].memory_used_bytes == idle_used
    gpu.used = H200_BUSY_USED
    assert backend.sample(["GPU-793a"])["GPU-793a"].memory_used_bytes == idle_used + H200_BUSY_USED


def test_a_driver_without_the_second_memory_struct_is_asked_once() -> None:
    """nvidia-ml-py knows ``nvmlMemory_v2`` but the driver (before R510) does not: the first
    refusal is remembered, and each sample then reads the first struct with one call."""
    gpus = [FakeGpu(uuid=f"GPU-{i}", name="Tesla V100-SXM2-16GB", total=16 << 30, util=0, cc=(7, 0)) for i in range(2)]
    nvml = FakeNvml(gpus, memory_v2="old-driver")
    backend = NvmlBackend(nvml=nvml)
    backend.discover()
    for _ in range(5):
        backend.sample(["GPU-0", "GPU-1"])
    assert nvml.calls["nvmlDeviceGetMemoryInfo(version)"] == 1
    assert nvml.calls["nvmlDeviceGetMemoryInfo"] == 1 + 2 + 5 * 2  # the refused one, discovery, samples
