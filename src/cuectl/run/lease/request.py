"""A lease request from user input: the GPU request plus the devices to choose from.

The GPU part goes through ``GpuRequest.parse``, the validator ``cuectl submit`` and YAML
specs use too, so ``cuectl run``, ``cuectl.lease()`` and a queued frame accept and refuse
the same requests with the same messages.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from cuectl.errors import InvalidDevice, InvalidInput
from cuectl.gpu.device import Device
from cuectl.sched.fields import Label, keyword_label, size_bytes
from cuectl.sched.gpu_request import GpuRequest
from cuectl.sched.match import device_fits_statically

#: The Python API's keywords before they were named like the flags -> their new names.
#: Still accepted, with a DeprecationWarning: scripts in the wild use them.
RENAMED_KEYWORDS = {
    "vendor": "gpu_vendor",
    "models": "gpu_models",
    "min_memory": "gpu_memory_min",
    "min_free_memory": "gpu_memory_free_min",
}


@dataclass(frozen=True)
class LeaseRequest:
    """A validated lease request (see ``make_request``)."""

    gpu: GpuRequest
    devices: tuple[str, ...] | None = None  # explicit ids (index or uuid) to choose from
    #: A share of one device by memory budget (``gpu_share``), bytes; None: whole devices.
    share_bytes: int | None = None
    #: How messages name ``share_bytes``: ``--gpu-share`` or ``gpu_share``.
    share_label: str = "gpu_share"


def make_request(
    gpus: int | None = None,
    *,
    gpu_vendor: str | None = None,
    gpu_models: str | Iterable[str] = (),
    gpu_memory_min: str | int | None = None,
    gpu_memory_free_min: str | int | None = None,
    gpu_capability_min: str | float | None = None,
    gpu_driver_min: str | float | None = None,
    gpu_cuda_min: str | float | None = None,
    devices: Iterable[str | int] | str | int | None = None,
    gpu_share: str | int | None = None,
    field_label: Label = keyword_label,
    deprecated: Mapping[str, Any] | None = None,
) -> LeaseRequest:
    """Validate user input into a ``LeaseRequest``; ``InvalidInput`` (exit 2) otherwise.

    ``gpus`` defaults to the number of explicit ``devices``, else 1. Sizes are bytes (int)
    or strings as in DESIGN §5 (``8G``; a bare number is MiB). ``field_label`` names a field
    in messages (``flag_label`` for ``cuectl run``); ``deprecated`` holds values given
    under the old keyword names (``RENAMED_KEYWORDS``).
    """
    given: dict[str, Any] = {
        "gpu_vendor": gpu_vendor,
        "gpu_models": gpu_models,
        "gpu_memory_min": gpu_memory_min,
        "gpu_memory_free_min": gpu_memory_free_min,
        "gpu_capability_min": gpu_capability_min,
        "gpu_driver_min": gpu_driver_min,
        "gpu_cuda_min": gpu_cuda_min,
    }
    label = _take_renamed(given, deprecated or {}, field_label)
    ids = _device_ids(devices)
    share = None
    if gpu_share is not None:
        share = _share(gpu_share, gpus, label)
        gpus = 1
    if gpus is None:
        gpus = len(ids) if ids else 1
    gpu = GpuRequest.parse(gpus=gpus, label=label, **given)
    if share is None:
        return LeaseRequest(gpu, ids)
    return LeaseRequest(gpu, ids, share, label("gpu_share"))


def _share(value: str | int, gpus: Any, label: Label) -> int:
    """``gpu_share`` in bytes, checked as the job spec's key is: more than 0, and only
    with one GPU (a share is part of one device)."""
    where = label("gpu_share")
    if gpus is not None and not (type(gpus) is int and gpus == 1):
        raise InvalidInput(f"{where}: a share is part of one GPU; {label('gpus')} is {gpus}, set it to 1")
    share = size_bytes(value, where)
    if share <= 0:
        raise InvalidInput(f"{where}: must be more than 0 (leave it out for whole devices)")
    return share


def _take_renamed(given: dict[str, Any], deprecated: Mapping[str, Any], field_label: Label) -> Label:
    """Move values given under old keyword names into ``given``, warning once each.

    Returns the labels to use in messages: a field given under its old name is named so,
    since that is what the caller wrote.
    """
    spelled: dict[str, str] = {}
    for old, value in deprecated.items():
        new = RENAMED_KEYWORDS.get(old)
        if new is None:
            raise TypeError(f"unexpected keyword argument {old!r}")
        # stacklevel: this helper, make_request, lease()/async_lease(), then the caller's line.
        warnings.warn(f"the {old}= keyword is deprecated; use {new}=", DeprecationWarning, stacklevel=4)
        if given[new] not in (None, ()):
            raise InvalidInput(f"{old}: the old name of {new}; give only {new}")
        given[new] = value
        spelled[new] = old
    if not spelled:
        return field_label
    return lambda field: spelled.get(field) or field_label(field)


def _device_ids(devices: Iterable[str | int] | str | int | None) -> tuple[str, ...] | None:
    if devices is None:
        return None
    if isinstance(devices, (str, int)):
        devices = [devices]
    ids = tuple(dict.fromkeys(_device_id(d) for d in devices))
    if not ids:
        raise InvalidInput("devices: empty list (leave it out to choose from every device)")
    return ids


def _device_id(value: str | int) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise InvalidDevice(f"invalid device id {value!r} (use an index from `cuectl gpu list` or a UUID)")
    return str(value).strip()


def resolve_devices(ids: Sequence[str], inventory: Sequence[Device]) -> tuple[Device, ...]:
    """Explicit ids -> devices of this host. Indices are host-wide (as `gpu list` shows)."""
    parents = {d.mig_parent_uuid for d in inventory if d.mig_parent_uuid}
    chosen: dict[str, Device] = {}
    for ident in ids:
        if re.fullmatch(r"\d+", ident):
            matches = [d for d in inventory if d.index == int(ident)]
        else:
            matches = [d for d in inventory if d.uuid.casefold() == ident.casefold()]
        if not matches:
            have = ", ".join(f"{d.index} ({d.uuid})" for d in inventory[:8]) or "no GPU"
            raise InvalidDevice(
                f"no device {ident!r} on this host (it has: {have})", hint="use an index or UUID from `cuectl gpu list`"
            )
        if len(matches) > 1:
            raise InvalidDevice(
                f"device {ident!r} is ambiguous: {', '.join(d.uuid for d in matches)}", hint="name it by UUID"
            )
        device = matches[0]
        if device.uuid in parents:
            raise InvalidDevice(
                f"device {ident!r} is split into MIG instances; lease one of them",
                hint="their UUIDs are listed by `cuectl gpu list`",
            )
        chosen[device.uuid] = device
    return tuple(chosen.values())


def fitting_uuids(request: GpuRequest, devices: Sequence[Device]) -> frozenset[str]:
    """UUIDs of ``devices`` that could ever serve ``request`` (vendor, model, total memory;
    DESIGN §5), leaving out a MIG-split card (its instances are the devices) — what a
    waiter queues for. Live free memory and holders do not count: they change."""
    parents = {d.mig_parent_uuid for d in devices if d.mig_parent_uuid}
    return frozenset(d.uuid for d in devices if d.uuid not in parents and device_fits_statically(request, d) is None)
