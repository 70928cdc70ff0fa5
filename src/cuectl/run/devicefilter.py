"""Which of a host's GPUs a worker may use, and which someone outside cuectl is using now.

Two pure pieces for ``cuectl worker``:

- ``select_inventory``: ``--devices 1,2`` / ``--exclude-devices 0`` narrow the host's
  inventory once, at start-up, so a workstation can keep its display GPU for its owner.
- ``foreign_use``: GPU-aware NIMBY ("not in my back yard"). Before claiming a frame, the
  worker skips devices that show use above a threshold by something that holds no cuectl
  lease — an artist's viewport, a game, a job started by hand outside cuectl.

Devices are named as ``cuectl gpu list`` shows them: by ``Device.index`` or by UUID.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence

from cuectl.errors import InvalidInput
from cuectl.gpu.device import Device, DeviceSample
from cuectl.units import GIB, KIB, MIB

# A UUID prefix shorter than this would too easily match by accident ("GPU-" alone is 4).
MIN_UUID_PREFIX = 8


# --------------------------------------------------------------------------- selection


def select_inventory(
    devices: Sequence[Device],
    include: Sequence[str] | None,
    exclude: Sequence[str] = (),
    *,
    include_field: str = "--devices",
    exclude_field: str = "--exclude-devices",
) -> list[Device]:
    """The devices the worker may use, in the order of ``devices``.

    ``include`` None (or empty) means every device; ``exclude`` wins over ``include``. Each
    item is an index, a UUID (case-insensitive) or a unique UUID prefix of at least 8
    characters, and may itself be a comma list ("1,2"). Naming a MIG-enabled card (by its
    index if it is listed, or by its UUID) names its MIG instances too, since those are
    what is leased. The result may be empty (``--exclude-devices`` of every GPU makes a
    CPU-only worker); the caller decides whether that is an error.
    """
    include_ids = _items(include or (), include_field)
    if include is not None and include and not include_ids:
        raise InvalidInput(f"{include_field}: names no device (use indices or UUIDs from `cuectl gpu list`)")
    excluded = _resolve(devices, _items(exclude, exclude_field), exclude_field)
    chosen = _resolve(devices, include_ids, include_field) if include_ids else {d.uuid for d in devices}
    return [d for d in devices if _named(d, chosen) and not _named(d, excluded)]


def _items(values: Sequence[str], field: str) -> list[str]:
    """Flatten comma lists and drop blanks: ``["1,2", " 3 "]`` -> ``["1", "2", "3"]``."""
    if isinstance(values, str):  # a bare string would be iterated per character
        values = [values]
    return [part.strip() for value in values for part in str(value).split(",") if part.strip()]


def _named(device: Device, uuids: Collection[str]) -> bool:
    """A device is named by its own uuid or, for a MIG instance, by its card's uuid."""
    return device.uuid in uuids or (device.mig_parent_uuid is not None and device.mig_parent_uuid in uuids)


def _resolve(devices: Sequence[Device], ids: Sequence[str], field: str) -> set[str]:
    """Each id -> one uuid (a device's or a MIG card's); InvalidInput names an unknown id."""
    # MIG cards may be absent from the inventory (NVML lists only their instances) but are
    # still nameable by UUID.
    uuids = list(dict.fromkeys([d.uuid for d in devices] + [d.mig_parent_uuid for d in devices if d.mig_parent_uuid]))
    return {_resolve_one(devices, uuids, ident, field) for ident in ids}


def _resolve_one(devices: Sequence[Device], uuids: Sequence[str], ident: str, field: str) -> str:
    folded = ident.casefold()
    exact = [u for u in uuids if u.casefold() == folded]
    if exact:
        return exact[0]
    if re.fullmatch(r"\d+", ident):
        by_index = list(dict.fromkeys(d.uuid for d in devices if d.index == int(ident)))
        if len(by_index) == 1:
            return by_index[0]
        if len(by_index) > 1:
            raise InvalidInput(f"{field}: device index {ident} is ambiguous ({', '.join(by_index)}); name it by UUID")
    elif len(ident) >= MIN_UUID_PREFIX:
        prefixed = [u for u in uuids if u.casefold().startswith(folded)]
        if len(prefixed) == 1:
            return prefixed[0]
        if len(prefixed) > 1:
            raise InvalidInput(
                f"{field}: UUID prefix {ident!r} matches {len(prefixed)} devices "
                f"({', '.join(prefixed)}); give more of it"
            )
    indices = ", ".join(str(i) for i in sorted({d.index for d in devices})) or "none, no GPU found"
    raise InvalidInput(
        f"{field}: no device {ident!r} on this host (indices: {indices}; or a UUID from `cuectl gpu list`)"
    )


# --------------------------------------------------------------------------- NIMBY


def foreign_use(
    devices: Sequence[Device],
    leased: Collection[str],
    *,
    max_memory_bytes: int | None,
    max_util_pct: float | None,
    samples: Mapping[str, DeviceSample] | None = None,
    cuectl_pids: Collection[int] = (),
) -> dict[str, str]:
    """Devices someone outside cuectl is using now: uuid -> a reason for the pending line.

    ``leased``: uuids held by any cuectl lease (frames, ``cuectl run``, ``cuectl.lease()``):
    their use is ours, never foreign. A MIG instance whose card is leased, and a card whose
    MIG instances are listed (its use is theirs), are skipped as well.

    Live values come from ``samples[uuid]`` where given (a fresh ``Backend.sample``), else
    from the ``Device`` snapshot. Used memory is ``memory_used_bytes``, else total - free
    when both are known. Where the sample lists processes whose pid is in ``cuectl_pids``
    (backends list exactly the pids they are asked about), their memory and utilisation are
    ours and are subtracted; if such a process's share is unknown, that value is unknown.
    Unknown values never trigger. A threshold of None turns its check off; a device
    triggers when a value is strictly above its threshold.

    The reason's form is stable, e.g. ``in use by another process: 3.1 GiB used, 45 % busy
    (NIMBY threshold 1 GiB / 20 %)``; it lists the known values and the checks that are on.
    """
    if max_memory_bytes is not None and max_memory_bytes < 0:
        raise InvalidInput("NIMBY memory threshold must be 0 or more")
    if max_util_pct is not None and max_util_pct < 0:
        raise InvalidInput("NIMBY utilisation threshold must be 0 or more")
    if max_memory_bytes is None and max_util_pct is None:
        return {}
    samples = samples or {}
    parents = {d.mig_parent_uuid for d in devices if d.mig_parent_uuid}
    out: dict[str, str] = {}
    for device in devices:
        if (
            device.uuid in leased
            or device.uuid in parents
            or (device.mig_parent_uuid is not None and device.mig_parent_uuid in leased)
        ):
            continue
        memory, util = _foreign_values(device, samples.get(device.uuid), cuectl_pids)
        over_memory = max_memory_bytes is not None and memory is not None and memory > max_memory_bytes
        over_util = max_util_pct is not None and util is not None and util > max_util_pct
        if over_memory or over_util:
            out[device.uuid] = _reason(memory, util, max_memory_bytes, max_util_pct)
    return out


def _foreign_values(
    device: Device, sample: DeviceSample | None, cuectl_pids: Collection[int]
) -> tuple[int | None, float | None]:
    """(used memory, utilisation) not accounted for by cuectl's own processes."""
    if sample is not None:
        memory = sample.memory_used_bytes
        if memory is None:
            memory = _used(device.memory_total_bytes, sample.memory_free_bytes)
        util = sample.utilization_pct
        ours = [p for p in sample.processes if p.pid in cuectl_pids]
    else:
        memory = _used(device.memory_total_bytes, device.memory_free_bytes)
        util = device.utilization_pct
        ours = []
    if ours:
        own_memory = [p.memory_used_bytes for p in ours]
        own_util = [p.utilization_pct for p in ours]
        memory = None if memory is None or None in own_memory else max(0, memory - sum(m or 0 for m in own_memory))
        util = None if util is None or None in own_util else max(0.0, util - sum(u or 0.0 for u in own_util))
    return memory, util


def _used(total: int | None, free: int | None) -> int | None:
    if total is None or free is None:
        return None
    return max(0, total - free)


def _reason(memory: int | None, util: float | None, max_memory: int | None, max_util: float | None) -> str:
    seen = []
    if memory is not None:
        seen.append(f"{_size(memory)} used")
    if util is not None:
        seen.append(f"{util:.0f} % busy")
    limits = []
    if max_memory is not None:
        limits.append(_size(max_memory))
    if max_util is not None:
        limits.append(f"{max_util:g} %")
    return f"in use by another process: {', '.join(seen)} (NIMBY threshold {' / '.join(limits)})"


def _size(n: int) -> str:
    """Like ``units.format_bytes`` but without a useless ``.0``: thresholds are round numbers."""
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= scale:
            value = n / scale
            text = f"{value:.0f}" if value >= 100 or value == int(value) else f"{value:.1f}"
            if text.endswith(".0"):
                text = text[:-2]
            return f"{text} {unit}"
    return f"{n} B"
