"""A stand-in for the ``pynvml`` module: the functions NvmlBackend calls, over plain data.

It follows pynvml's conventions where the backend depends on them: ``NVMLError`` carries
the NVML return code in ``value``; MIG device handles come from
``nvmlDeviceGetMigDeviceHandleByIndex`` and raise NOT_FOUND for empty slots; utilisation
of a MIG handle is NOT_SUPPORTED; ``nvmlDeviceGetProcessUtilization(handle, ts)`` returns
the samples newer than ``ts`` and raises NOT_FOUND when there are none; strings come back
as ``bytes`` when ``as_bytes`` is set (old pynvml releases). Every call is counted.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace

NOT_SUPPORTED = 3
NOT_FOUND = 6


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return f"NVML error {self.value}"


@dataclass
class FakeMig:
    uuid: str
    profile: str
    total: int
    used: int = 0  # allocated by processes
    reserved: int = 0  # set aside by the driver: "used" in NVML's first memory struct
    slot: int = 0
    gpu_instance_id: int = 1
    processes: list[tuple[int, int | None]] = field(default_factory=list)


@dataclass
class FakeGpu:
    uuid: str
    name: str
    total: int
    used: int = 0  # allocated by processes
    reserved: int = 0  # set aside by the driver: "used" in NVML's first memory struct
    util: int | None = 0  # None: NOT_SUPPORTED
    bus_id: str = "00000000:1A:00.0"
    cc: tuple[int, int] = (8, 0)
    mig_mode: int | None = None  # None: NOT_SUPPORTED (pre-Ampere), 0 off, 1 on
    migs: list[FakeMig] = field(default_factory=list)
    max_migs: int = 7
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used bytes)
    proc_samples: list[tuple[int, int, int]] = field(default_factory=list)  # (pid, timestamp µs, smUtil)
    handle_error: int | None = None  # e.g. NO_PERMISSION: a GPU a cgroup does not grant


class FakeNvml:
    NVMLError = NVMLError

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        driver: str = "550.54.15",
        cuda: int = 12040,
        init_error: int | None = None,
        as_bytes: bool = False,
        memory_v2: bool | str = False,
    ) -> None:
        self.gpus = gpus
        if memory_v2:  # pynvml from 11.510: it knows the second memory struct
            self.nvmlMemory_v2 = 0x02000028
        # "old-driver": such a pynvml on a driver before R510, which has no second struct.
        self.memory_v2_supported = memory_v2 is True
        self.driver = driver
        self.cuda = cuda
        self.init_error = init_error
        self.as_bytes = as_bytes
        self.calls: Counter[str] = Counter()

    def _s(self, text: str) -> str | bytes:
        return text.encode() if self.as_bytes else text

    def _count(self, name: str) -> None:
        self.calls[name] += 1

    # handles: ("gpu", i) or ("mig", i, slot)
    def _gpu(self, handle: tuple) -> FakeGpu:
        return self.gpus[handle[1]]

    def _target(self, handle: tuple) -> FakeGpu | FakeMig:
        gpu = self._gpu(handle)
        if handle[0] == "mig":
            return next(m for m in gpu.migs if m.slot == handle[2])
        return gpu

    def nvmlInit(self) -> None:
        self._count("nvmlInit")
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self._count("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._count("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlSystemGetDriverVersion(self):
        self._count("nvmlSystemGetDriverVersion")
        return self._s(self.driver)

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._count("nvmlSystemGetCudaDriverVersion")
        return self.cuda

    def nvmlDeviceGetHandleByIndex(self, i: int) -> tuple:
        self._count("nvmlDeviceGetHandleByIndex")
        if self.gpus[i].handle_error is not None:
            raise NVMLError(self.gpus[i].handle_error)
        return ("gpu", i)

    def nvmlDeviceGetUUID(self, handle: tuple):
        self._count("nvmlDeviceGetUUID")
        return self._s(self._target(handle).uuid)

    def nvmlDeviceGetName(self, handle: tuple):
        self._count("nvmlDeviceGetName")
        gpu = self._gpu(handle)
        if handle[0] == "mig":
            return self._s(f"{gpu.name} MIG {self._target(handle).profile}")
        return self._s(gpu.name)

    def nvmlDeviceGetMemoryInfo(self, handle: tuple, version: int | None = None):
        """As the real one: the first struct counts the driver's reserved memory as used;
        ``version=nvmlMemory_v2`` reports it apart (what the H200 of 2026-12-04 gave)."""
        self._count("nvmlDeviceGetMemoryInfo")
        t = self._target(handle)
        free = t.total - t.used - t.reserved
        if version is not None:
            self.calls["nvmlDeviceGetMemoryInfo(version)"] += 1
            if version != getattr(self, "nvmlMemory_v2", None) or not self.memory_v2_supported:
                raise NVMLError(13)  # FUNCTION_NOT_FOUND: a driver without the second struct
            return SimpleNamespace(version=2, total=t.total, reserved=t.reserved, used=t.used, free=free)
        return SimpleNamespace(total=t.total, used=t.used + t.reserved, free=free)

    def nvmlDeviceGetUtilizationRates(self, handle: tuple):
        self._count("nvmlDeviceGetUtilizationRates")
        if handle[0] == "mig" or self._gpu(handle).util is None:
            raise NVMLError(NOT_SUPPORTED)
        return SimpleNamespace(gpu=self._gpu(handle).util, memory=0)

    def nvmlDeviceGetPciInfo(self, handle: tuple):
        self._count("nvmlDeviceGetPciInfo")
        return SimpleNamespace(busId=self._s(self._gpu(handle).bus_id))

    def nvmlDeviceGetCudaComputeCapability(self, handle: tuple):
        self._count("nvmlDeviceGetCudaComputeCapability")
        return self._gpu(handle).cc

    def nvmlDeviceGetMigMode(self, handle: tuple):
        self._count("nvmlDeviceGetMigMode")
        mode = self._gpu(handle).mig_mode
        if mode is None:
            raise NVMLError(NOT_SUPPORTED)
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: tuple) -> int:
        self._count("nvmlDeviceGetMaxMigDeviceCount")
        return self._gpu(handle).max_migs

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: tuple, slot: int) -> tuple:
        self._count("nvmlDeviceGetMigDeviceHandleByIndex")
        if not any(m.slot == slot for m in self._gpu(handle).migs):
            raise NVMLError(NOT_FOUND)
        return ("mig", handle[1], slot)

    def nvmlDeviceGetGpuInstanceId(self, handle: tuple) -> int:
        self._count("nvmlDeviceGetGpuInstanceId")
        return self._target(handle).gpu_instance_id

    def nvmlDeviceGetComputeRunningProcesses(self, handle: tuple):
        self._count("nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self._target(handle).processes]

    def nvmlDeviceGetProcessUtilization(self, handle: tuple, since: int):
        self._count("nvmlDeviceGetProcessUtilization")
        if handle[0] == "mig":
            raise NVMLError(NOT_SUPPORTED)
        newer = [
            SimpleNamespace(pid=p, timeStamp=ts, smUtil=sm, memUtil=0, encUtil=0, decUtil=0)
            for p, ts, sm in self._gpu(handle).proc_samples
            if ts > since
        ]
        if not newer:
            raise NVMLError(NOT_FOUND)
        return newer


def h100_box(n: int = 8) -> FakeNvml:
    """``n`` H100s, for benchmarks and routing tests."""
    gpus = [
        FakeGpu(
            uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000",
            name="NVIDIA H100 80GB HBM3",
            total=85520809984,
            used=i * 1024**3,
            util=10 * i,
            bus_id=f"00000000:{0x10 + i:02X}:00.0",
            cc=(9, 0),
            mig_mode=0,
            processes=[(1000 + i, 512 * 1024**2)],
            proc_samples=[(1000 + i, 1_000_000, 50)],
        )
        for i in range(n)
    ]
    return FakeNvml(gpus)
