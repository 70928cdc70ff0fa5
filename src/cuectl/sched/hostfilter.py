"""GPU host filtering shared by `cuectl host list` and the API's `GET /api/v1/hosts`: a
device matches a vendor, a model and a memory minimum by the scheduler's own rules, so a
filter shows what a job's `gpu_vendor`, `gpu_models` and `gpu_memory_min` would get."""

from __future__ import annotations

from typing import Any, Mapping

from cuectl.errors import InvalidInput
from cuectl.gpu.device import VENDORS, normalize_vendor
from cuectl.sched.match import model_matches
from cuectl.units import memory_satisfies, parse_size


def parse_memory_min(value: str | None, field: str) -> int | None:
    """``24G`` -> bytes; a bare number is MiB, as in the job spec; None or "" -> None."""
    if value is None or value == "":
        return None
    return int(value) * 1024**2 if value.isdigit() else parse_size(value, field=field)


def parse_vendor(value: str | None, field: str) -> str | None:
    """A vendor filter in any spelling (``nvidia``, ``0x10de``) -> ``NVIDIA``; a vendor no
    device can have is refused, not answered with an empty list. None or "" -> None."""
    if value is None or value == "":
        return None
    vendor = normalize_vendor(value)
    if vendor is None:
        raise InvalidInput(f"{field}: unknown vendor {value!r} (expected one of {', '.join(VENDORS)})")
    return vendor


def device_matches(
    device: Mapping[str, Any], *, vendor: str | None = None, model: str | None = None, memory_min: int | None = None
) -> bool:
    if vendor and (device.get("vendor") or "").lower() != vendor.lower():
        return False
    # A glob, else whole words: "A100" matches "NVIDIA A100-SXM4-80GB", "A10" does not.
    if model and not model_matches(model, device.get("model") or ""):
        return False
    # Nominal sizes: a "24G" card with 23.6 GiB usable matches 24G.
    return not (memory_min and not memory_satisfies(device.get("memory_total_bytes"), memory_min))
