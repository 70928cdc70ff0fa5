"""Immutable device snapshots and live samples shared by every GPU backend.

A ``Device`` is what discovery returns (static identity plus the values read at that
moment); a ``DeviceSample`` is what one sampling call returns for live values. Values a
backend cannot know are ``None`` — "not supported" is a value, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

VENDORS = ("NVIDIA", "AMD", "Apple", "Intel")
_VENDOR_BY_LOWER = {v.lower(): v for v in VENDORS}
_VENDOR_ALIASES = {
    "nvidia corporation": "NVIDIA",
    "advanced micro devices, inc.": "AMD",
    "ati": "AMD",
    "0x10de": "NVIDIA",
    "0x1002": "AMD",
    "0x106b": "Apple",
    "0x8086": "Intel",
    "intel corporation": "Intel",
    "apple inc.": "Apple",
}


def normalize_vendor(value: str | None) -> str | None:
    """Map any spelling of a vendor (case, PCI id, corporate name) to the enum, or None."""
    if value is None:
        return None
    key = str(value).strip().lower()
    return _VENDOR_BY_LOWER.get(key) or _VENDOR_ALIASES.get(key)


def normalize_pci_bus_id(value: str | None) -> str | None:
    """``00000000:1A:00.0`` / ``1a:00.0`` -> ``0000:1a:00.0`` (lower case, 4-digit domain)."""
    if not value:
        return None
    text = str(value).strip().lower()
    parts = text.split(":")
    if len(parts) == 2:
        parts = ["0000", *parts]
    if len(parts) != 3:
        return text
    domain = parts[0][-4:].rjust(4, "0")
    return f"{domain}:{parts[1].rjust(2, '0')}:{parts[2]}"


@dataclass(frozen=True)
class Device:
    """One leasable GPU (a whole card, or a MIG instance when MIG is on)."""

    index: int
    uuid: str
    vendor: str
    model: str
    backend: str
    memory_total_bytes: int | None = None
    memory_free_bytes: int | None = None
    utilization_pct: float | None = None
    pci_bus_id: str | None = None
    driver_version: str | None = None
    compute_capability: str | None = None
    cuda_version: str | None = None  # the driver's CUDA version (NVIDIA): "12.2"
    # MIG: a MIG instance names its parent card; a card with MIG on lists its instances.
    mig_parent_uuid: str | None = None
    mig_profile: str | None = None
    # Apple: GPU core count and unified memory (memory_total_bytes is the host RAM then).
    gpu_cores: int | None = None
    unified_memory: bool = False
    api_version: str | None = None  # CUDA driver API, Metal family, ROCm version
    attributes: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_json(self) -> dict[str, Any]:
        """DESIGN §9 device shape (stable keys first, extras after)."""
        return {
            "index": self.index,
            "uuid": self.uuid,
            "vendor": self.vendor,
            "model": self.model,
            "memory_total_bytes": self.memory_total_bytes,
            "memory_free_bytes": self.memory_free_bytes,
            "utilization_pct": self.utilization_pct,
            "pci_bus_id": self.pci_bus_id,
            "driver_version": self.driver_version,
            "compute_capability": self.compute_capability,
            "cuda_version": self.cuda_version,
            "backend": self.backend,
            "mig_parent_uuid": self.mig_parent_uuid,
            "mig_profile": self.mig_profile,
            "gpu_cores": self.gpu_cores,
            "unified_memory": self.unified_memory,
            "api_version": self.api_version,
            "attributes": dict(self.attributes),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Device":
        """Inverse of ``to_json`` (hosts store their inventory as JSON)."""
        known = {f for f in cls.__dataclass_fields__}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs.setdefault("attributes", {})
        return cls(**kwargs)


@dataclass(frozen=True)
class ProcessSample:
    pid: int
    memory_used_bytes: int | None = None
    utilization_pct: float | None = None


@dataclass(frozen=True)
class DeviceSample:
    """Live values of one device at ``timestamp`` (epoch seconds)."""

    uuid: str
    timestamp: float
    utilization_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    processes: tuple[ProcessSample, ...] = ()


@dataclass(frozen=True)
class BackendStatus:
    """What ``gpu list --json`` reports under ``backends``."""

    name: str
    ok: bool
    error: str | None = None
    hint: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "error": self.error, "hint": self.hint}


#: Xid codes that mean the device needs attention before it runs more work (NVIDIA's Xid
#: catalogue, DCGM's and NVSentinel's "fatal" set): 48 double-bit ECC error, 63/64 page
#: retirement or row remapping event/failure, 74 NVLink error, 79 fallen off the bus, 92 high
#: single-bit ECC rate, 94/95 contained/uncontained ECC error. Others (13 graphics engine
#: exception, 31 MMU fault, 43 stopped on a user's bad kernel ...) are usually the program's
#: own fault: counted, not drained. docs/gpu-health.md, "The Xid list and why".
CRITICAL_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95})

#: What each Xid is, for the drain's reason (``Xid 79: GPU has fallen off the bus``).
XID_NAMES = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "video processor exception",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def xid_text(code: int) -> str:
    """``Xid 79: GPU has fallen off the bus`` (``Xid 12`` for one without a name here)."""
    name = XID_NAMES.get(code)
    return f"Xid {code}: {name}" if name else f"Xid {code}"


@dataclass(frozen=True)
class DeviceHealth:
    """What a backend can tell of one device's health at one reading (``Backend.health``).

    ``known``: the backend read something (False: it cannot tell; no signal either way).
    ``lost``: why the device is gone (NVML's GPU_IS_LOST, a tool's "GPU is lost"), else None.
    ``xids``: Xid events since the previous reading. ``problems``: conditions that persist
    until the device is reset (uncorrectable ECC errors, pending page retirement or row
    remapping), one line each. "Not supported" by the device is no problem, never an error.
    """

    uuid: str
    known: bool = True
    lost: str | None = None
    xids: tuple[int, ...] = ()
    problems: tuple[str, ...] = ()

    @classmethod
    def unknown(cls, uuid: str) -> "DeviceHealth":
        return cls(uuid=uuid, known=False)
