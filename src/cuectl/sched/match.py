"""Device matching (DESIGN §5): which devices of a host may run a frame or an ad-hoc lease.

Everything here is a pure function of its arguments — no store, no processes, no
environment — so the worker, the store's pending-reason explainer and the lease API all
get the same answer for the same inventory.

Rules, and the choices made where DESIGN is silent:

- **Per device.** A request for ``gpus`` devices needs that many *distinct* devices on one
  host, each matching vendor, model and memory on its own; summed memory never counts.
- **Static vs. now.** Vendor, model and total memory decide whether a device can *ever*
  run the request (``device_fits_statically``). Live free memory and leases held by others
  decide whether it can run it *now* (``device_fits_now`` / ``busy``). ``MatchResult``
  keeps the two apart (``could_ever_fit``) so callers can fail fast on impossible
  requests and wait on merely busy ones.
- **Free memory.** Where the backend reports free memory, the device needs
  ``gpu_memory_min_bytes`` free with the same nearest-GiB allowance §5 gives total memory
  (an idle "24 GB" card reports a few MiB less than 24 GiB free — it must still take a 24G
  frame, while a card a desktop session holds a GiB of must not), and
  ``gpu_memory_free_min_bytes`` free exactly (an explicit ad-hoc "I need this much free" is
  taken literally).
- **MIG.** When a card's MIG instances are listed as devices of their own, the card
  itself is not leasable (it would overlap its instances): any device whose uuid is
  another device's ``mig_parent_uuid`` is skipped. An instance whose parent uuid is
  busy counts as busy (the whole card is taken).
- **Preference.** Among eligible devices take the smallest first — by total memory
  (unknown = largest), then index, then uuid — keeping big GPUs for big frames. The
  order depends only on the devices, never on the order they are listed in.
- **Versions.** ``gpu_capability_min``, ``gpu_driver_min`` and ``gpu_cuda_min`` need the
  device's compute capability, driver version and CUDA version to be at least that,
  compared numerically part by part (``8.9 < 8.10``, ``535.104.05 < 550``). A device that
  does not report the value, or reports something that is not a dotted version (an AMD
  card's ``gfx90a``), does not meet the constraint.
- **Tags.** A layer with tags runs only on hosts that have *all* of them; tags compare
  case-insensitively (``GPU`` and ``gpu`` are one tag). One entry may list alternatives
  with ``|`` (``"desktop | render"``, OpenCue's spelling): a host with *any* of them
  satisfies that entry. No tags: any host.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from cuectl.gpu.device import Device, normalize_vendor
from cuectl.sched.gpu_request import VERSION_MINIMUMS, GpuRequest
from cuectl.units import GIB, format_bytes, memory_satisfies, version_at_least

__all__ = [
    "CpuPool",
    "GpuRequest",
    "MatchResult",
    "cpu_fits",
    "device_fits",
    "device_fits_now",
    "device_fits_statically",
    "explain_hosts",
    "model_matches",
    "select_devices",
    "tags_fit",
]

# Words of a model name: split at runs of whitespace, '-' and '_' (DESIGN §5).
_WORD_SPLIT = re.compile(r"[\s_\-]+")
# At most this many entries in one "(host has …)" / "(gpu 0 busy; …)" list: one line.
_LIST_LIMIT = 4
# Cores are floats (0.5, 1.5…); sums of them pick up rounding noise.
_CORE_EPSILON = 1e-9


@dataclass(frozen=True)
class MatchResult:
    """The outcome of ``select_devices``.

    ``devices`` is the chosen set (``()`` for a request of 0 GPUs) or None; ``reason``
    says why none fits (None when devices were chosen); ``could_ever_fit`` is False when
    the host lacks ``gpus`` statically matching devices, whoever holds what.
    """

    devices: tuple[Device, ...] | None
    reason: str | None
    could_ever_fit: bool


@dataclass(frozen=True)
class CpuPool:
    """Free cores and host memory of a worker's CPU pool (separate from its GPU pool)."""

    cores: float
    memory_bytes: int


# --------------------------------------------------------------------------- models


def _words(text: str) -> list[str]:
    return [w for w in _WORD_SPLIT.split(text.casefold()) if w]


def model_matches(pattern: str, model: str) -> bool:
    """DESIGN §5 model matching.

    A pattern containing ``*`` or ``?`` is a case-insensitive glob (fnmatch) on the full
    model name. Otherwise the pattern's words must appear as consecutive whole words of
    the model name, both split at spaces, ``-`` and ``_``: ``A100`` matches ``NVIDIA
    A100-SXM4-80GB``, ``A10`` does not. A blank pattern matches nothing (spec validation
    rejects it; here it simply never matches rather than matching everything).
    """
    if not pattern or not pattern.strip():
        return False
    if "*" in pattern or "?" in pattern:
        return fnmatch.fnmatchcase(model.casefold(), pattern.strip().casefold())
    want = _words(pattern)
    have = _words(model)
    if not want:  # only separators, e.g. "-": no word to look for
        return False
    n = len(want)
    return any(have[i : i + n] == want for i in range(len(have) - n + 1))


# --------------------------------------------------------------------------- one device


def _vendor_key(vendor: str | None) -> str:
    # Requests are normalised upstream, inventories by the backends; compare through
    # normalize_vendor and casefold anyway so "nvidia" vs "NVIDIA" can never bite.
    text = (vendor or "").strip()
    return (normalize_vendor(text) or text).casefold()


def _vendor_ok(request: GpuRequest, device: Device) -> bool:
    return request.gpu_vendor is None or _vendor_key(request.gpu_vendor) == _vendor_key(device.vendor)


def _model_ok(request: GpuRequest, device: Device) -> bool:
    return not request.gpu_models or any(model_matches(p, device.model) for p in request.gpu_models)


def _memory_ok(request: GpuRequest, device: Device) -> bool:
    total = device.memory_total_bytes
    if not memory_satisfies(total, request.gpu_memory_min_bytes):
        return False
    # Free memory can never exceed the total: a card smaller than min_free never fits.
    if request.gpu_memory_free_min_bytes > 0 and total is not None and total < request.gpu_memory_free_min_bytes:
        return False
    return True


def _size(n: int | None) -> str:
    return "unknown" if n is None else format_bytes(n)


def _request_size(n: int) -> str:
    """Request sizes as the user most likely typed them: ``24 GiB``, else ``1.5 GiB``."""
    return f"{n // GIB} GiB" if n % GIB == 0 and n > 0 else format_bytes(n)


def device_fits_statically(request: GpuRequest, device: Device) -> str | None:
    """None if ``device`` could ever run ``request`` (vendor, model, total memory).

    Otherwise a short reason naming the first failing constraint, device value first:
    ``vendor AMD != NVIDIA``, ``model 'Tesla V100' not in ['A100']``,
    ``memory 16.0 GiB < 24.0 GiB``.
    """
    if not _vendor_ok(request, device):
        return f"vendor {device.vendor} != {request.gpu_vendor}"
    if not _model_ok(request, device):
        return f"model {device.model!r} not in {list(request.gpu_models)!r}"
    if not _memory_ok(request, device):
        need = max(request.gpu_memory_min_bytes, request.gpu_memory_free_min_bytes)
        return f"memory {_size(device.memory_total_bytes)} < {format_bytes(need)}"
    return _versions_fail(request, device)


#: How a failed version minimum reads: ``compute capability 7.0 < 8.0``.
_VERSION_NAMES = {
    "compute_capability": "compute capability",
    "driver_version": "driver",
    "cuda_version": "CUDA",
}


def _versions_fail(request: GpuRequest, device: Device) -> str | None:
    for field, attribute in VERSION_MINIMUMS.items():
        want = getattr(request, field)
        if want is None:
            continue
        have = getattr(device, attribute)
        if not version_at_least(have, want):
            shown = "unknown" if have is None else str(have)
            return f"{_VERSION_NAMES[attribute]} {shown} < {want}"
    return None


def device_fits_now(request: GpuRequest, device: Device) -> str | None:
    """None unless the device's known free memory rules it out right now.

    Unknown free memory (backend cannot tell) never rules a device out. See the module
    docstring for why ``gpu_memory_min_bytes`` gets the nearest-GiB allowance and
    ``gpu_memory_free_min_bytes`` does not.
    """
    free = device.memory_free_bytes
    if free is None:
        return None
    need = max(request.gpu_memory_min_bytes, request.gpu_memory_free_min_bytes)
    if not memory_satisfies(free, request.gpu_memory_min_bytes) or free < request.gpu_memory_free_min_bytes:
        return f"free memory {format_bytes(free)} < {format_bytes(need)}"
    return None


def device_fits(request: GpuRequest, device: Device) -> str | None:
    """None if this one device satisfies the request now; else the first failing reason.

    Static reasons (``device_fits_statically``) come first: a device that can never fit
    is reported as such even when its free memory is also short.
    """
    return device_fits_statically(request, device) or device_fits_now(request, device)


# --------------------------------------------------------------------------- one host


def _leasable(devices: Sequence[Device]) -> list[Device]:
    """The devices that may be leased, in preference order, each uuid once.

    MIG parents whose instances are listed are left out. A malformed inventory listing a
    uuid twice must never yield it twice (it would be "two" devices), so keep the first.
    """
    parents = {d.mig_parent_uuid for d in devices if d.mig_parent_uuid}
    out: list[Device] = []
    seen: set[str] = set()
    for d in sorted(devices, key=_preference):
        if d.uuid not in parents and d.uuid not in seen:
            seen.add(d.uuid)
            out.append(d)
    return out


def _preference(device: Device) -> tuple[float, int, str]:
    """Smallest first; unknown memory last; index then uuid make the order total."""
    total = device.memory_total_bytes
    return (math.inf if total is None else float(total), device.index, device.uuid)


def _is_busy(device: Device, busy: Collection[str]) -> bool:
    return device.uuid in busy or (device.mig_parent_uuid is not None and device.mig_parent_uuid in busy)


_Check = Callable[[Device], bool]


def _constraints(request: GpuRequest) -> list[tuple[str, str, _Check]]:
    """(kind, label, check) of each static constraint the request sets, in reason order."""
    out: list[tuple[str, str, _Check]] = []
    if request.gpu_vendor is not None:
        out.append(("vendor", f"vendor {request.gpu_vendor}", lambda d: _vendor_ok(request, d)))
    if request.gpu_models:
        out.append(("model", f"model {_models_label(request.gpu_models)}", lambda d: _model_ok(request, d)))
    if request.gpu_memory_min_bytes > 0 or request.gpu_memory_free_min_bytes > 0:
        out.append(("memory", _memory_label(request), lambda d: _memory_ok(request, d)))
    for field, attribute in VERSION_MINIMUMS.items():
        want = getattr(request, field)
        if want is not None:
            out.append((attribute, f"{_VERSION_NAMES[attribute]} >= {want}", _version_check(attribute, want)))
    return out


def _version_check(attribute: str, want: str) -> _Check:
    return lambda d: version_at_least(getattr(d, attribute), want)


def _models_label(models: Sequence[str]) -> str:
    return " or ".join(repr(m) for m in models)


def _memory_label(request: GpuRequest) -> str:
    parts = []
    if request.gpu_memory_min_bytes > 0:
        parts.append(f"memory >= {_request_size(request.gpu_memory_min_bytes)}")
    if request.gpu_memory_free_min_bytes > 0:
        parts.append(f">= {_request_size(request.gpu_memory_free_min_bytes)} free")
    return ", ".join(parts)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _describe_request(request: GpuRequest) -> str:
    """``2 NVIDIA devices matching 'A100' with >= 24 GiB`` — the whole request, one phrase."""
    text = f"{request.gpus} {request.gpu_vendor + ' ' if request.gpu_vendor else ''}"
    text += "device" if request.gpus == 1 else "devices"
    if request.gpu_models:
        text += f" matching {_models_label(request.gpu_models)}"
    sizes = []
    if request.gpu_memory_min_bytes > 0:
        sizes.append(f">= {_request_size(request.gpu_memory_min_bytes)}")
    if request.gpu_memory_free_min_bytes > 0:
        sizes.append(f">= {_request_size(request.gpu_memory_free_min_bytes)} free")
    sizes += [
        f"{_VERSION_NAMES[attribute]} >= {getattr(request, field)}"
        for field, attribute in VERSION_MINIMUMS.items()
        if getattr(request, field) is not None
    ]
    if sizes:
        text += " with " + " and ".join(sizes)
    return text


def _device_name(device: Device) -> str:
    """``NVIDIA Tesla V100-SXM2-16GB``; no doubled vendor for ``NVIDIA A100-SXM4-80GB``."""
    model = device.model.strip()
    if device.vendor and not model.casefold().startswith(device.vendor.casefold()):
        return f"{device.vendor} {model}".strip()
    return model or device.vendor or "unknown"


def _inventory(devices: Sequence[Device], *, with_memory: bool, version: str | None = None) -> str:
    """``NVIDIA Tesla V100-SXM2-16GB ×4`` — identical devices grouped, in index order;
    ``version``: a device attribute (``driver_version``) to show beside each, when a
    version minimum is what rules them out."""
    if not devices:
        return "no GPUs"
    groups: dict[str, int] = {}
    for d in sorted(devices, key=lambda d: (d.index, d.uuid)):
        name = _device_name(d)
        if with_memory:
            name += f" {_size(d.memory_total_bytes)}"
        if version is not None:
            name += f" ({_VERSION_NAMES[version]} {getattr(d, version) or 'unknown'})"
        groups[name] = groups.get(name, 0) + 1
    items = [name if n == 1 else f"{name} ×{n}" for name, n in groups.items()]
    return _cap(items, ", ")


def _cap(items: Sequence[str], sep: str, noun: str = "more") -> str:
    if len(items) <= _LIST_LIMIT:
        return sep.join(items)
    return sep.join(items[:_LIST_LIMIT]) + f"{sep}+{len(items) - _LIST_LIMIT} {noun}"


@dataclass(frozen=True)
class _Shortfall:
    """Why no host could ever fit: the binding constraint and how close the best host got."""

    labels: tuple[str, ...]  # constraints up to and including the binding one; () = count alone
    best: int  # most leasable devices matching ``labels`` on one host
    best_host: str | None
    memory_bound: bool  # the binding constraint is memory: show sizes in summaries
    version: str | None = None  # the binding constraint is this device version: show it


def _shortfall(request: GpuRequest, hosts: Mapping[str, Sequence[Device]]) -> _Shortfall | None:
    """None if some host has ``gpus`` statically matching devices.

    Adds the request's constraints one at a time (count alone, vendor, model, memory) and
    stops at the first that leaves every host short: that is the one worth naming.
    """
    leasable = {name: _leasable(devs) for name, devs in sorted(hosts.items())}
    steps: list[tuple[str, str, _Check]] = [("count", "", lambda d: True), *_constraints(request)]
    labels: list[str] = []
    checks: list[_Check] = []
    for kind, label, check in steps:
        if label:
            labels.append(label)
        checks.append(check)
        best, best_host = 0, None
        for name, devs in leasable.items():  # sorted: ties go to the first name
            count = sum(1 for d in devs if all(c(d) for c in checks))
            if count > best:
                best, best_host = count, name
        if best < request.gpus:
            return _Shortfall(
                tuple(labels),
                best,
                best_host,
                memory_bound=kind == "memory",
                version=kind if kind in _VERSION_NAMES else None,
            )
    return None


def _host_static_reason(request: GpuRequest, devices: Sequence[Device], short: _Shortfall) -> str:
    if not short.labels:
        have = "no GPU" if short.best == 0 else f"only {short.best}"
        return f"needs {_plural(request.gpus, 'GPU device')}; host has {have}"
    matching = ", ".join(short.labels)
    if short.best == 0:
        return f"no device matches {matching} (host has {_inventory(devices, with_memory=short.memory_bound, version=short.version)})"
    return f"needs {_plural(request.gpus, 'device')} matching {matching}; host has {short.best} matching"


def select_devices(request: GpuRequest, devices: Sequence[Device], *, busy: Collection[str] = ()) -> MatchResult:
    """Choose ``request.gpus`` distinct devices of one host for a frame or lease.

    ``devices`` is the host's full inventory (live free memory where known); ``busy`` the
    uuids leased or claimed by others right now. Picks the smallest eligible devices (see
    the module docstring); deterministic whatever order ``devices`` comes in.
    """
    if request.gpus <= 0:
        return MatchResult(devices=(), reason=None, could_ever_fit=True)
    leasable = _leasable(devices)
    short = _shortfall(request, {"": leasable})
    if short is not None:
        return MatchResult(devices=None, reason=_host_static_reason(request, leasable, short), could_ever_fit=False)

    busy_set = frozenset(busy)
    static_ok = [d for d in leasable if device_fits_statically(request, d) is None]  # preference order
    chosen: list[Device] = []
    blocked: list[str] = []
    for d in static_ok:
        if _is_busy(d, busy_set):
            blocked.append(f"gpu {d.index} busy")
        elif (why := device_fits_now(request, d)) is not None:
            blocked.append(f"gpu {d.index} {why}")
        elif len(chosen) < request.gpus:
            chosen.append(d)
    if len(chosen) == request.gpus:
        return MatchResult(devices=tuple(chosen), reason=None, could_ever_fit=True)
    reason = (
        f"needs {_describe_request(request)}; host has {len(static_ok)} matching, "
        f"{len(chosen)} available ({_cap(blocked, '; ')})"
    )
    return MatchResult(devices=None, reason=reason, could_ever_fit=True)


# --------------------------------------------------------------------------- the farm


def explain_hosts(request: GpuRequest, hosts: Mapping[str, Sequence[Device]]) -> str | None:
    """One line for ``job show``'s pending_reason, or None if some host could ever fit.

    Names the constraint that leaves every registered host short, e.g. ``no registered
    host has 1 device matching vendor AMD (hosts have: NVIDIA Tesla V100-SXM2-16GB ×4 on
    render-01)`` or ``no registered host has 9 GPU devices (most: 4 on render-01)``. Only
    static facts count here: busy devices are a reason to wait, not to explain.
    """
    if not hosts:
        return "no host registered"
    if request.gpus <= 0:
        return None
    short = _shortfall(request, hosts)
    if short is None:
        return None
    if short.labels:
        noun = f"{_plural(request.gpus, 'device')} matching {', '.join(short.labels)}"
    else:
        noun = _plural(request.gpus, "GPU device")
    if short.best > 0:
        return f"no registered host has {noun} (most: {short.best} on {short.best_host})"
    summaries = [
        f"{_inventory(devs, with_memory=short.memory_bound, version=short.version)} on {name}"
        for name, devs in sorted(hosts.items())
        if _leasable(devs)
    ]
    have = _cap(summaries, "; ", "more hosts") if summaries else "no GPUs"
    return f"no registered host has {noun} (hosts have: {have})"


# --------------------------------------------------------------------------- CPU and tags


def cpu_fits(need_cores: float, need_memory: int, free: CpuPool) -> str | None:
    """None if a frame's cores and host memory fit the CPU pool's free share, else why.

    CPU frames draw from their own pool, so GPU frames never starve them (DESIGN §5).
    """
    if need_cores > free.cores + _CORE_EPSILON:
        return f"cores {need_cores:g} > {free.cores:g} free"
    if need_memory > 0 and need_memory > free.memory_bytes:
        return f"memory {format_bytes(need_memory)} > {format_bytes(free.memory_bytes)} free"
    return None


def _tag_set(tags: Collection[str]) -> set[str]:
    return {t.strip().casefold() for t in tags if t and t.strip()}


def tags_fit(layer_tags: Collection[str], host_tags: Collection[str]) -> bool:
    """A layer with tags runs only on hosts having ALL of its entries (case-insensitive); an
    entry ``a | b`` is satisfied by either (OpenCue's any-of); no tags: any host."""
    have = _tag_set(host_tags)
    return all(_tag_set(entry.split("|")) & have for entry in layer_tags if entry and entry.strip("| "))
