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
