"""NVIDIA GPUs through NVML (the ``nvidia-ml-py`` bindings, module ``pynvml``).

NVML is the preferred NVIDIA backend: in-process calls, no spawn per sample, per-process
utilisation and memory, MIG instances with their own UUIDs.

- ``pynvml`` is imported and ``nvmlInit`` called lazily, on the first discovery (the
  import alone costs ~100 ms). Tests pass a stand-in module object as ``nvml=``.
- MIG: when a card has MIG mode on, each MIG instance is a leasable device (model
  ``<card> MIG <profile>``, ``mig_parent_uuid``, ``mig_profile``) and the card itself is
  left out — CUDA cannot run work on a MIG-enabled card as a whole.
- Per-process utilisation comes from ``nvmlDeviceGetProcessUtilization``, which returns
  the samples newer than a timestamp; the newest timestamp seen is kept per device so each
  call reports what happened since the previous one.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Collection, Sequence, TypeVar

from cuectl.errors import BackendUnavailable
from cuectl.gpu.base import Backend, clamp_pct
from cuectl.gpu.device import Device, DeviceHealth, DeviceSample, ProcessSample, normalize_pci_bus_id

# NVML return codes (nvml.h; stable across releases). Kept here so that a stand-in module
# needs only NVMLError with a ``value``.
ERROR_UNINITIALIZED = 1
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_DRIVER_NOT_LOADED = 9
ERROR_TIMEOUT = 10
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_LIB_RM_VERSION_MISMATCH = 18
ERROR_UNKNOWN = 999
MIG_ENABLED = 1
#: NVML's "value not available" for 64-bit counters (older bindings pass it through).
_NOT_AVAILABLE_ULL = 2**64 - 1

_HINTS = {
    ERROR_LIBRARY_NOT_FOUND: (
        "NVML library (libnvidia-ml) not found",
        "install the NVIDIA driver; in a container use the NVIDIA container runtime "
        "(--gpus all) so the library is mounted",
    ),
    ERROR_DRIVER_NOT_LOADED: (
        "the NVIDIA driver is not loaded",
        "load the kernel module: reboot after installing the driver, or `sudo modprobe nvidia`",
    ),
    ERROR_LIB_RM_VERSION_MISMATCH: (
        "NVML library and kernel driver versions differ",
        "reboot (or reload the nvidia kernel modules) after a driver upgrade",
    ),
    ERROR_NO_PERMISSION: (
        "no permission to open the NVIDIA devices",
        "add the user to the group that owns /dev/nvidia*",
    ),
    ERROR_GPU_IS_LOST: ("a GPU fell off the bus", "check `dmesg` (Xid errors); the host may need a reboot"),
    ERROR_FUNCTION_NOT_FOUND: (
        "the installed NVIDIA driver is too old for this NVML call",
        "upgrade the NVIDIA driver",
    ),
    ERROR_TIMEOUT: ("NVML timed out", "a GPU or the driver may be hung; check `dmesg`"),
    ERROR_UNKNOWN: (
        "NVML reported an unknown error",
        "inside a container this often follows `systemctl daemon-reload` on the host: restart the container",
    ),
}

#: NVML errors meaning "this driver has no second memory struct" (FUNCTION_NOT_FOUND,
#: ARGUMENT_VERSION_MISMATCH): asked once, then the first struct is read directly.
_NO_MEMORY_V2 = frozenset({13, 25})
_MIG_NAME_RE = re.compile(r"\bMIG\s+(\S+)\s*$")
T = TypeVar("T")


def _text(value: Any) -> str:
    """pynvml returns ``bytes`` in old releases and ``str`` in new ones."""
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


@dataclass
class _Handle:
    handle: Any
    is_mig: bool


class NvmlBackend(Backend):
    name = "nvml"

    def __init__(self, nvml: ModuleType | Any | None = None) -> None:
        super().__init__()
        self._nvml = nvml
        self._initialised = False
        self._handles: dict[str, _Handle] = {}
        # uuid -> newest process-utilisation timestamp (µs) already reported.
        self._last_seen: dict[str, int] = {}
        #: Why GPUs that NVML counts were left out of the last discovery.
        self.skipped: list[str] = []
        #: False once the driver said it has no second memory struct (see _memory_info).
        self._memory_v2 = True

    # -- library access

    def _lib(self) -> Any:
        if self._nvml is None:
            try:
                import pynvml  # lazily: ~100 ms, and only hosts with NVIDIA GPUs need it
            except ImportError:
                raise BackendUnavailable(
                    "the nvidia-ml-py package (pynvml) is not installed", hint="pip install nvidia-ml-py"
                ) from None
            self._nvml = pynvml
        return self._nvml

    def _error(self, exc: Exception, doing: str) -> BackendUnavailable:
        code = getattr(exc, "value", None)
        known = _HINTS.get(code) if isinstance(code, int) else None
        if known:
            where = "" if doing == "nvmlInit" else f" ({doing})"
            return BackendUnavailable(f"{known[0]}{where}", hint=known[1])
        return BackendUnavailable(f"NVML: {doing} failed: {exc}")

    def _ensure_init(self) -> Any:
        lib = self._lib()
        if not self._initialised:
            try:
                lib.nvmlInit()
            except lib.NVMLError as exc:
                raise self._error(exc, "nvmlInit") from None
            except OSError as exc:  # a broken libnvidia-ml can fail to load with OSError
                raise BackendUnavailable(
                    f"NVML: cannot load libnvidia-ml: {exc}", hint=_HINTS[ERROR_LIBRARY_NOT_FOUND][1]
                ) from None
            self._initialised = True
        return lib

    def _optional(self, fn: Callable[[], T]) -> T | None:
        """A value that a card may not support: NVMLError -> None."""
        lib = self._lib()
        try:
            return fn()
        except lib.NVMLError:
            return None

    def close(self) -> None:
        """Release NVML (optional: the process exit does it too)."""
        if self._initialised:
            lib = self._lib()
            try:
                lib.nvmlShutdown()
            except lib.NVMLError:
                pass
            self._initialised = False
            self._handles.clear()

    # -- discovery

    def _discover(self) -> list[Device]:
        lib = self._ensure_init()
        try:
            count = lib.nvmlDeviceGetCount()
            driver = _text(lib.nvmlSystemGetDriverVersion())
        except lib.NVMLError as exc:
            raise self._error(exc, "listing devices") from None
        cuda = self._optional(lib.nvmlSystemGetCudaDriverVersion)
        cuda_version = f"{cuda // 1000}.{(cuda % 1000) // 10}" if isinstance(cuda, int) and cuda > 0 else None
        api = f"CUDA {cuda_version}" if cuda_version else None
        handles: dict[str, _Handle] = {}
        devices: list[Device] = []
        self.skipped = []
        for i in range(count):
            try:
                handle = lib.nvmlDeviceGetHandleByIndex(i)
                card = self._card(handle, i, driver, api, cuda_version)
            except lib.NVMLError as exc:
                # Under Slurm/cgroup device limits NVML counts every GPU but refuses the
                # ones this job was not given (NO_PERMISSION): those are not ours to lease.
                self.skipped.append(self._error(exc, f"GPU {i}").message)
                continue
            mode = self._optional(lambda: lib.nvmlDeviceGetMigMode(handle))
            if mode is not None and mode[0] == MIG_ENABLED:
                for mig_handle, mig in self._mig_devices(handle, card):
                    handles[mig.uuid] = _Handle(mig_handle, True)
                    devices.append(mig)
            else:
                handles[card.uuid] = _Handle(handle, False)
                devices.append(card)
        if count and not devices and self.skipped:
            raise BackendUnavailable(
                f"no GPU could be read: {'; '.join(self.skipped)}", hint=self._error_hint(self.skipped)
            )
        self._handles = handles
        return [_reindex(d, n) for n, d in enumerate(devices)]

    @staticmethod
    def _error_hint(messages: list[str]) -> str | None:
        return next((hint for text, hint in _HINTS.values() if any(m.startswith(text) for m in messages)), None)

    def _card(self, handle: Any, index: int, driver: str, api: str | None, cuda_version: str | None = None) -> Device:
        lib = self._lib()
        mem = self._memory_info(handle)
        util = self._optional(lambda: lib.nvmlDeviceGetUtilizationRates(handle))
        pci = self._optional(lambda: lib.nvmlDeviceGetPciInfo(handle))
        cc = self._optional(lambda: lib.nvmlDeviceGetCudaComputeCapability(handle))
        return Device(
            index=index,
            uuid=_text(lib.nvmlDeviceGetUUID(handle)),
            vendor="NVIDIA",
            model=_text(lib.nvmlDeviceGetName(handle)),
            backend="nvml",
            memory_total_bytes=_mem(mem, "total"),
            memory_free_bytes=_mem(mem, "free"),
            utilization_pct=clamp_pct(float(util.gpu)) if util is not None else None,
            pci_bus_id=normalize_pci_bus_id(_text(pci.busId)) if pci is not None else None,
            driver_version=driver,
            compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
            api_version=api,
            cuda_version=cuda_version,
            attributes={"vendor_index": index},
        )

    def _memory_info(self, handle: Any) -> Any:
        """The device's memory, with ``used`` not counting what the driver reserves for
        itself, as nvidia-smi shows it: NVML's first memory struct counts the reserved
        memory as used (615 MiB of an idle H200 on driver 580), so a frame that never touched
        its GPU would record that as its peak. The second struct (drivers from R510,
        nvidia-ml-py from 11.510) reports it apart; older ones get the first."""
        lib = self._lib()
        v2 = getattr(lib, "nvmlMemory_v2", None)
        if v2 is not None and self._memory_v2:
            try:
                return lib.nvmlDeviceGetMemoryInfo(handle, version=v2)
            except TypeError:  # an nvidia-ml-py whose call takes no version
                self._memory_v2 = False
            except lib.NVMLError as exc:
                if getattr(exc, "value", None) in _NO_MEMORY_V2:
                    self._memory_v2 = False  # the driver's answer for every device: not asked again
        return self._optional(lambda: lib.nvmlDeviceGetMemoryInfo(handle))

    def _mig_devices(self, handle: Any, card: Device) -> list[tuple[Any, Device]]:
        """The MIG instances of a MIG-enabled card (empty slots are skipped)."""
        lib = self._lib()
        slots = self._optional(lambda: lib.nvmlDeviceGetMaxMigDeviceCount(handle)) or 0
        out = []
        for slot in range(slots):
            try:
                mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except lib.NVMLError:
                continue  # NOT_FOUND: no instance in this slot
            try:
                uuid = _text(lib.nvmlDeviceGetUUID(mig))
            except lib.NVMLError as exc:
                raise self._error(exc, f"reading MIG device {slot} of {card.uuid}") from None
            name = self._optional(lambda: _text(lib.nvmlDeviceGetName(mig))) or ""
            m = _MIG_NAME_RE.search(name)
            profile = m.group(1) if m else None
            mem = self._memory_info(mig)
            gi = self._optional(lambda: lib.nvmlDeviceGetGpuInstanceId(mig))
            model = f"{card.model} MIG {profile}" if profile else (name or f"{card.model} MIG")
            out.append(
                (
                    mig,
                    Device(
                        index=0,
                        uuid=uuid,
                        vendor="NVIDIA",
                        model=model,
                        backend="nvml",
                        memory_total_bytes=_mem(mem, "total"),
                        memory_free_bytes=_mem(mem, "free"),
                        utilization_pct=None,
                        pci_bus_id=card.pci_bus_id,
                        driver_version=card.driver_version,
                        compute_capability=card.compute_capability,
                        mig_parent_uuid=card.uuid,
                        mig_profile=profile,
                        api_version=card.api_version,
                        cuda_version=card.cuda_version,
                        attributes={"vendor_index": card.index, "mig_device_index": slot, "gpu_instance_id": gi},
                    ),
                )
            )
        return out

    # -- health (docs/gpu-health.md)

    def health(self, uuids: Sequence[str]) -> dict[str, DeviceHealth]:
        """Xid events since the last call (an event set, read with a zero timeout), GPU_IS_LOST
        or an unknown error on every query (gone), uncorrectable volatile ECC errors, pending
        page retirement, pending or failed row remapping. NOT_SUPPORTED is no signal. A MIG
        instance is as healthy as its card (the queries are the card's)."""
        self.known_devices()
        lib = self._lib()
        xids = self._xid_events(lib)
        out: dict[str, DeviceHealth] = {}
        for u in uuids:
            h = self._handles.get(u)
            if h is None:
                continue
            card = (
                self._optional(lambda: lib.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h.handle)) if h.is_mig else None
            )
            out[u] = self._card_health(lib, u, card if card is not None else h.handle, tuple(xids.get(u, ())))
        return out

    def _card_health(self, lib: Any, uuid: str, handle: Any, xids: tuple[int, ...]) -> DeviceHealth:
        problems: list[str] = []
        errors: list[int] = []

        def ask(fn: Callable[[], T]) -> T | None:
            try:
                return fn()
            except lib.NVMLError as exc:
                errors.append(getattr(exc, "value", ERROR_UNKNOWN))
                return None

        uncorrected = getattr(lib, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
        volatile = getattr(lib, "NVML_VOLATILE_ECC", 0)
        ecc = ask(lambda: lib.nvmlDeviceGetTotalEccErrors(handle, uncorrected, volatile))
        if isinstance(ecc, int) and 0 < ecc < _NOT_AVAILABLE_ULL:
            problems.append(f"uncorrectable ECC errors: {ecc} since the last reset")
        pending = ask(lambda: lib.nvmlDeviceGetRetiredPagesPendingStatus(handle))
        if pending == getattr(lib, "NVML_FEATURE_ENABLED", 1):
            problems.append("page retirement pending (needs a reset)")
        rows = ask(lambda: lib.nvmlDeviceGetRemappedRows(handle))
        if isinstance(rows, (tuple, list)) and len(rows) >= 4:
            if rows[2]:
                problems.append("row remapping pending (needs a reset)")
            if rows[3]:
                problems.append("row remapping failed (needs a reset)")
        lost = None
        if ERROR_GPU_IS_LOST in errors:
            lost = "GPU is lost (NVML: GPU_IS_LOST)"
        elif errors and len(errors) == 3 and all(e == ERROR_UNKNOWN for e in errors):
            lost = "NVML answers every query with an unknown error"
        known = lost is not None or bool(xids) or len(errors) < 3  # something answered
        return DeviceHealth(uuid=uuid, known=known, lost=lost, xids=xids, problems=tuple(problems))

    def _xid_events(self, lib: Any) -> dict[str, list[int]]:
        """uuid -> the Xid codes NVML reported since the last call. The event set is made
        once (each whole card registered for critical Xid events; a card that cannot be is
        left out) and read without waiting."""
        event_set = getattr(self, "_event_set", None)
        if event_set is None:
            kind = getattr(lib, "nvmlEventTypeXidCriticalError", 8)
            try:
                event_set = lib.nvmlEventSetCreate()
            except (lib.NVMLError, AttributeError):
                self._event_set = False
                return {}
            for h in self._handles.values():
                if not h.is_mig:
                    self._optional(lambda: lib.nvmlDeviceRegisterEvents(h.handle, kind, event_set))
            self._event_set = event_set
        if event_set is False:
            return {}
        out: dict[str, list[int]] = {}
        for _ in range(256):  # bounded: a storm of events must not stall the worker
            try:
                data = lib.nvmlEventSetWait(event_set, 0)
            except lib.NVMLError:
                break  # TIMEOUT: nothing more (or the set is gone)
            raw = self._optional(lambda: lib.nvmlDeviceGetUUID(data.device))
            uuid = _text(raw) if raw is not None else None
            code = getattr(data, "eventData", None)
            if uuid and isinstance(code, int):
                out.setdefault(uuid, []).append(code)
                for u, h in self._handles.items():  # its MIG instances see it too
                    if h.is_mig and u not in out:
                        card = self._optional(lambda: lib.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h.handle))
                        parent = self._optional(lambda: lib.nvmlDeviceGetUUID(card)) if card is not None else None
                        if parent is not None and _text(parent) == uuid:
                            out.setdefault(u, []).append(code)
        return out

    # -- sampling

    def sample(
        self, uuids: Sequence[str], pids: Collection[int] = (), *, every_process: bool = False
    ) -> dict[str, DeviceSample]:
        self.known_devices()
        lib = self._lib()
        wanted_pids = set(pids)
        now = time.time()
        out: dict[str, DeviceSample] = {}
        for u in dict.fromkeys(uuids):
            h = self._handles.get(u)
            if h is None:
                continue
            mem = self._memory_info(h.handle)
            # Utilisation is not reported for MIG instances (NVML returns NOT_SUPPORTED).
            util = None if h.is_mig else self._optional(lambda: lib.nvmlDeviceGetUtilizationRates(h.handle))
            procs = (
                self._processes(u, h, None if every_process else wanted_pids) if wanted_pids or every_process else ()
            )
            out[u] = DeviceSample(
                uuid=u,
                timestamp=now,
                utilization_pct=clamp_pct(float(util.gpu)) if util is not None else None,
                memory_used_bytes=_mem(mem, "used"),
                memory_free_bytes=_mem(mem, "free"),
                processes=procs,
            )
        return out

    def _processes(self, uuid: str, h: _Handle, pids: set[int] | None) -> tuple[ProcessSample, ...]:
        """The processes of ``pids`` on the device (None: every one, compute and graphics:
        a viewport or a game holds memory too)."""
        lib = self._lib()
        running = list(self._optional(lambda: lib.nvmlDeviceGetComputeRunningProcesses(h.handle)) or [])
        if pids is None:
            running += list(self._optional(lambda: lib.nvmlDeviceGetGraphicsRunningProcesses(h.handle)) or [])
        memory: dict[int, int | None] = {}
        for p in running:
            if pids is None or p.pid in pids:
                used = getattr(p, "usedGpuMemory", None)
                memory[p.pid] = None if used is None or used >= _NOT_AVAILABLE_ULL else int(used)
        util = {} if h.is_mig else self._process_util(uuid, h, pids)
        return tuple(
            ProcessSample(pid=pid, memory_used_bytes=memory.get(pid), utilization_pct=util.get(pid))
            for pid in sorted(set(memory) | set(util))
        )

    def _process_util(self, uuid: str, h: _Handle, pids: set[int] | None) -> dict[int, float]:
        """Mean SM utilisation per pid over the samples NVML took since the last call."""
        lib = self._lib()
        since = self._last_seen.get(uuid, 0)
        samples = self._optional(lambda: lib.nvmlDeviceGetProcessUtilization(h.handle, since)) or []
        sums: dict[int, list[float]] = {}
        newest = since
        for s in samples:
            newest = max(newest, int(s.timeStamp))
            if pids is None or s.pid in pids:
                sums.setdefault(s.pid, []).append(float(s.smUtil))
        self._last_seen[uuid] = newest
        return {pid: min(100.0, max(0.0, sum(v) / len(v))) for pid, v in sums.items()}


def _mem(info: Any, attr: str) -> int | None:
    if info is None:
        return None
    value = getattr(info, attr, None)
    if value is None or value >= _NOT_AVAILABLE_ULL:
        return None
    return int(value)


def _reindex(device: Device, index: int) -> Device:
    from dataclasses import replace

    return replace(device, index=index)
