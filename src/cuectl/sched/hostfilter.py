"""GPU host filtering shared by `cuectl host list` and the API's `GET /api/v1/hosts`: a
device matches a vendor, a model and a memory minimum by the scheduler's own rules, so a
filter shows what a job's `gpu_vendor`, `gpu_models`, `gpu_memory_min` and version
minimums (`gpu_capability_min`, `gpu_driver_min`, `gpu_cuda_min`) would get."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from cuectl.errors import InvalidInput
from cuectl.gpu.device import VENDORS, normalize_vendor
from cuectl.sched.fields import version
from cuectl.sched.gpu_request import VERSION_MINIMUMS
from cuectl.sched.match import model_matches
from cuectl.units import memory_satisfies, parse_size, version_at_least


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


def parse_versions(given: Mapping[str, str | None], label: Callable[[str], str]) -> dict[str, str]:
    """The version minimums given (``{"gpu_cuda_min": "12.2"}``; None or "" is not given)
    as ``{device attribute: minimum}`` for ``device_matches``; a malformed version is an
    ``InvalidInput`` naming ``label(field)``, as on submit."""
    return {
        VERSION_MINIMUMS[field]: version(value, label(field))
        for field, value in given.items()
        if value is not None and value != ""
    }


def device_matches(
    device: Mapping[str, Any],
    *,
    vendor: str | None = None,
    model: str | None = None,
    memory_min: int | None = None,
    versions: Mapping[str, str] | None = None,
) -> bool:
    if vendor and (device.get("vendor") or "").lower() != vendor.lower():
        return False
    # A glob, else whole words: "A100" matches "NVIDIA A100-SXM4-80GB", "A10" does not.
    if model and not model_matches(model, device.get("model") or ""):
        return False
    # Nominal sizes: a "24G" card with 23.6 GiB usable matches 24G.
    if memory_min and not memory_satisfies(device.get("memory_total_bytes"), memory_min):
        return False
    # Versions numerically, as the scheduler: 8.9 < 8.10; a device without the value fails.
    return all(version_at_least(device.get(attribute), want) for attribute, want in (versions or {}).items())
