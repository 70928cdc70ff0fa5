"""Fake GPUs from a YAML file (DESIGN §7): tests, demos and CI without GPUs.

```yaml
host: render-01            # optional: host name the worker registers as
state_dir: state           # optional: live values, relative to this file's directory
devices:
  - model: "Tesla V100-SXM2-16GB"
    vendor: NVIDIA         # optional, default NVIDIA
    memory: 16160MiB       # a size string (bare number = MiB) or an int of bytes
    uuid: GPU-...          # optional: default derived from host + position
    pci_bus_id: "0000:1a:00.0"   # optional, quoted: orders the vendor's devices, as NVML does
    driver_version: "535.104.05"  # optional, quoted: what --gpu-driver-min compares
    compute_capability: "7.0"     # optional, quoted: --gpu-capability-min (AMD: the gfx name)
    cuda_version: "12.2"          # optional, quoted: the driver's CUDA version, --gpu-cuda-min
  - model: "NVIDIA H100 80GB HBM3"
    memory: 81559MiB
    mig:                   # MIG on: the instances are the devices, the card is not
      - {profile: 3g.40gb, memory: 40448MiB, uuid: MIG-...}   # uuid optional
  - model: "Apple M3 Max"
    vendor: Apple
    memory: 64GiB          # the host RAM
    unified_memory: true   # as the apple backend: free memory unknown (None)
  - model: "Tesla T4"
    memory: 15360MiB
    healthy: false         # or error: "...": left out, as NVML leaves out a GPU it cannot read
    error: "GPU has fallen off the bus"
```

The devices come out as the real backends would give them (CI runs on this backend, so
``CUDA_VISIBLE_DEVICES`` must be what it would be on the real host): grouped by the
backend that would find them in ``auto`` discovery (NVIDIA, then AMD, then Apple and Intel
together), within a group ordered by PCI bus id where given (NVML's order, and CUDA's under
``CUDA_DEVICE_ORDER=PCI_BUS_ID``), then by listing order. ``attributes["vendor_index"]``
counts within the group, as each vendor's tools number their own devices.

Sampling reads ``<state_dir>/<p>.json`` for the device at position ``p`` of the file
(``<p>.<m>.json`` for its MIG instance ``m``), whatever its place after ordering::

    {"utilization_pct": 73, "memory_used_bytes": 5368709120,
     "processes": [{"pid": 1234, "memory_used_bytes": 1073741824, "utilization_pct": 40}]}

The same file carries the device's health (``Backend.health``, docs/gpu-health.md), read at
each health reading (every sampling interval of a worker)::

    {"xid": [79], "lost": true, "ecc_uncorrectable": 2,
     "retirement_pending": true, "remap_pending": true}

``xid`` lists Xid events since the last read: a list is reported once per change of the
file (its size, time and inode), so a test that writes ``{"xid": [79]}`` gets one event,
not one per reading. ``lost: true`` is a GPU that fell off the bus (NVML's GPU_IS_LOST).
``ecc_uncorrectable`` is the volatile uncorrectable ECC count, ``retirement_pending`` and
``remap_pending`` NVML's pending page retirement and row remapping: conditions that last
until the device is reset, read at every call.

A missing file means an idle device (0 % and 0 bytes used). A file that cannot be read as
such JSON (a test frame may be half-way through writing it) gives ``None`` values for that
sample rather than an error: a sampler must not die on one bad reading. As on real
hardware, MIG instances report no utilisation and unified-memory devices no free memory.
"""

from __future__ import annotations

import json
import re
import time
import uuid as uuidlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Collection, Iterator, Mapping, Sequence

from cuectl import config
from cuectl.errors import BackendUnavailable, InvalidInput
from cuectl.gpu.base import Backend, clamp_pct, free_bytes
from cuectl.gpu.device import (
    VENDORS,
    Device,
    DeviceHealth,
    DeviceSample,
    ProcessSample,
    normalize_pci_bus_id,
    normalize_vendor,
)
from cuectl.units import MIB, parse_size

_TOP_KEYS = {"host", "state_dir", "devices"}
_DEVICE_KEYS = {
    "model",
    "vendor",
    "memory",
    "uuid",
    "pci_bus_id",
    "driver_version",
    "compute_capability",
    "cuda_version",
    "mig",
    "unified_memory",
    "healthy",
    "error",
}
_MIG_KEYS = {"profile", "memory", "uuid"}
#: Namespace of the default fake UUIDs, so that the same host + index always gives the
#: same UUID (leases and stored inventories key on it).
_UUID_NAMESPACE = uuidlib.UUID("6f1d2a4c-3b7e-5c55-9a0e-2f4b8c1d7e90")
#: Which real backend would find a vendor's devices, in ``auto`` discovery's order
#: (gpu.AUTO_ORDER: nvml/smi, amd, apple). The apple backend lists the Intel GPUs of Intel
#: Macs too, numbered together with the rest of system_profiler's list.
_DISCOVERY_GROUP = {"NVIDIA": 0, "AMD": 1, "Apple": 2, "Intel": 2}
_PCI_RE = re.compile(r"([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{1,2})\.([0-7])")
_UNHEALTHY = "marked unhealthy in the fake GPU file"


@dataclass(frozen=True)
class FakeConfig:
    path: Path
    host: str | None
    state_dir: Path | None
    #: The leasable devices, ordered and indexed as real discovery would give them.
    devices: tuple[Device, ...]
    #: uuid -> stem of the device's state file (``"2"``, ``"2.0"`` for a MIG instance).
    state_files: Mapping[str, str] = field(default_factory=dict)
    #: Unhealthy devices left out, with why (NVML's ``skipped``).
    skipped: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Mig:
    profile: str
    memory: int
    uuid: str


@dataclass(frozen=True)
class _Entry:
    """One entry of ``devices:`` as written, before ordering."""

    position: int
    card: Device
    migs: tuple[_Mig, ...] | None  # None: MIG off; () MIG on without instances
    unhealthy: str | None  # why the device is unhealthy; None when healthy


def default_fake_uuid(host: str, index: int) -> str:
    """Stable UUID of fake device ``index`` on ``host``: ``GPU-`` + a name-based UUID."""
    return f"GPU-{uuidlib.uuid5(_UUID_NAMESPACE, f'{host}/{index}')}"


def default_fake_mig_uuid(host: str, index: int, slot: int) -> str:
    """Stable UUID of MIG instance ``slot`` of fake device ``index``: ``MIG-`` + a name-based UUID."""
    return f"MIG-{uuidlib.uuid5(_UUID_NAMESPACE, f'{host}/{index}/mig/{slot}')}"


def load_fake_config(path: str | Path, *, default_host: str | None = None) -> FakeConfig:
    """Read and validate a fake-GPU file; every problem is ``InvalidInput`` with a field path."""
    file = Path(path)
    data = _read_yaml(file)
    unknown = sorted(set(map(str, data)) - _TOP_KEYS)
    if unknown:
        raise InvalidInput(f"{unknown[0]}: unknown key in fake GPU file (allowed: {', '.join(sorted(_TOP_KEYS))})")

    host = data.get("host")
    if host is not None and (not isinstance(host, str) or not host.strip()):
        raise InvalidInput(f"host: expected a non-empty string, got {host!r}")
    state_dir = data.get("state_dir")
    if state_dir is not None and (not isinstance(state_dir, str) or not state_dir.strip()):
        raise InvalidInput(f"state_dir: expected a path, got {state_dir!r}")
    raw_devices = data.get("devices", [])
    if raw_devices is None:
        raw_devices = []
    if not isinstance(raw_devices, list):
        raise InvalidInput("devices: expected a list of devices")

    uuid_host = host or default_host or config.hostname()
    entries = [_parse_entry(i, raw, uuid_host) for i, raw in enumerate(raw_devices)]
    _check_unique(entries)
    devices, state_files, skipped = _discovered(entries)
    # A relative state_dir is relative to the YAML file, so a file and its state
    # directory can be moved together (tests create both in one tmp dir).
    state = (file.parent / state_dir) if state_dir else None
    return FakeConfig(
        path=file, host=host, state_dir=state, devices=tuple(devices), state_files=state_files, skipped=tuple(skipped)
    )


def _read_yaml(file: Path) -> dict[Any, Any]:
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(
            f"fake GPU file {str(file)!r}: {exc.strerror or exc}",
            hint="CUECTL_FAKE_GPUS must name a readable YAML file",
        ) from None
    import yaml  # lazily: yaml costs tens of ms and only fake GPUs need it here

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidInput(f"fake GPU file {str(file)!r}: malformed YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InvalidInput(f"fake GPU file {str(file)!r}: expected a mapping with a 'devices' list")
    return data


# --------------------------------------------------------------------------- one entry


def _parse_entry(index: int, raw: Any, uuid_host: str) -> _Entry:
    where = f"devices[{index}]"
    if not isinstance(raw, dict):
        raise InvalidInput(f"{where}: expected a mapping with model and memory")
    unknown = sorted(set(map(str, raw)) - _DEVICE_KEYS)
    if unknown:
        raise InvalidInput(f"{where}.{unknown[0]}: unknown key (allowed: {', '.join(sorted(_DEVICE_KEYS))})")
    card = _parse_card(index, raw, uuid_host)
    migs = _parse_migs(where, raw, card, uuid_host, index)
    if _flag(where, raw, "unified_memory", default=False):
        if migs is not None:
            raise InvalidInput(f"{where}.unified_memory: a MIG card has memory of its own")
        # As the apple backend: the memory is the host's, and nobody says how much is free.
        card = replace(card, unified_memory=True, memory_free_bytes=None)
    return _Entry(position=index, card=card, migs=migs, unhealthy=_parse_health(where, raw))


def _parse_card(index: int, raw: Mapping[str, Any], uuid_host: str) -> Device:
    where = f"devices[{index}]"
    model = raw.get("model")
    if not isinstance(model, str) or not model.strip():
        raise InvalidInput(f"{where}.model: required, a non-empty string")
    vendor_raw = raw.get("vendor", "NVIDIA")
    vendor = normalize_vendor(vendor_raw) if isinstance(vendor_raw, str) else None
    if vendor is None:
        raise InvalidInput(f"{where}.vendor: unknown vendor {vendor_raw!r} (use one of {', '.join(VENDORS)})")
    if "memory" not in raw:
        raise InvalidInput(f"{where}.memory: required, e.g. 16160MiB, 80GiB or a number of bytes")
    memory = _memory(f"{where}.memory", raw["memory"])
    device_uuid = _uuid(f"{where}.uuid", raw.get("uuid")) or default_fake_uuid(uuid_host, index)
    optional = {}
    for key in ("pci_bus_id", "driver_version", "compute_capability", "cuda_version"):
        value = raw.get(key)
        if value is not None and not isinstance(value, (str, int, float)):
            raise InvalidInput(f"{where}.{key}: expected a string, got {value!r}")
        optional[key] = None if value is None else str(value)
    return Device(
        index=index,
        uuid=device_uuid,
        vendor=vendor,
        model=model.strip(),
        backend="fake",
        memory_total_bytes=memory,
        memory_free_bytes=memory,
        utilization_pct=0.0,
        pci_bus_id=_pci_bus_id(f"{where}.pci_bus_id", raw.get("pci_bus_id")),
        driver_version=optional["driver_version"],
        compute_capability=optional["compute_capability"],
        cuda_version=optional["cuda_version"],
    )


def _memory(where: str, value: Any) -> int:
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise InvalidInput(f"{where}: invalid size {value!r}")
    memory = parse_size(value, field=where)
    if memory <= 0:
        raise InvalidInput(f"{where}: must be more than 0")
    if isinstance(value, int) and memory < MIB:
        # A YAML number is bytes; "memory: 16160" almost surely meant MiB. Say so.
        raise InvalidInput(
            f"{where}: {value} bytes is less than 1 MiB",
            hint=f"a YAML number is bytes: write {value}MiB or '{value}' for MiB",
        )
    return memory


def _uuid(where: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value):
        raise InvalidInput(f"{where}: expected a string without spaces, got {value!r}")
    return value


def _pci_bus_id(where: str, value: Any) -> str | None:
    bus = normalize_pci_bus_id(None if value is None else str(value))
    # Checked because it decides the order (and so CUDA's indices): a typo must not
    # silently renumber the devices.
    if bus is not None and not _PCI_RE.fullmatch(bus):
        # YAML 1.1 reads an unquoted 0000:10:00.0 as a base-60 number (36000.0).
        hint = None if isinstance(value, str) else 'quote it: pci_bus_id: "0000:10:00.0"'
        raise InvalidInput(f"{where}: expected a PCI bus id like 0000:1a:00.0, got {value!r}", hint=hint)
    return bus


def _flag(where: str, raw: Mapping[str, Any], key: str, *, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise InvalidInput(f"{where}.{key}: expected true or false, got {value!r}")
    return value


def _parse_health(where: str, raw: Mapping[str, Any]) -> str | None:
    """Why the device is unhealthy (``healthy: false`` and/or ``error``), or None."""
    healthy = _flag(where, raw, "healthy", default="error" not in raw)
    error = raw.get("error")
    if error is not None and (not isinstance(error, str) or not error.strip()):
        raise InvalidInput(f"{where}.error: expected a message, got {error!r}")
    if healthy and error is not None:
        raise InvalidInput(f"{where}.error: a healthy device has no error (set healthy: false, or drop error)")
    return None if healthy else (error.strip() if error else _UNHEALTHY)


def _parse_migs(
    where: str, raw: Mapping[str, Any], card: Device, uuid_host: str, index: int
) -> tuple[_Mig, ...] | None:
    if "mig" not in raw:
        return None
    value = raw["mig"]
    if card.vendor != "NVIDIA":
        raise InvalidInput(f"{where}.mig: MIG is NVIDIA only, this device is {card.vendor}")
    if value is None:
        value = []
    if not isinstance(value, list):
        raise InvalidInput(f"{where}.mig: expected a list of MIG instances (profile, memory, uuid)")
    return tuple(
        _parse_mig(f"{where}.mig[{slot}]", item, default_fake_mig_uuid(uuid_host, index, slot))
        for slot, item in enumerate(value)
    )


def _parse_mig(where: str, raw: Any, default_uuid: str) -> _Mig:
    if not isinstance(raw, dict):
        raise InvalidInput(f"{where}: expected a mapping with profile and memory")
    unknown = sorted(set(map(str, raw)) - _MIG_KEYS)
    if unknown:
        raise InvalidInput(f"{where}.{unknown[0]}: unknown key (allowed: {', '.join(sorted(_MIG_KEYS))})")
    profile = raw.get("profile")
    if not isinstance(profile, str) or not profile.strip() or any(c.isspace() for c in profile.strip()):
        raise InvalidInput(f"{where}.profile: required, a MIG profile such as 1g.10gb")
    if "memory" not in raw:
        raise InvalidInput(f"{where}.memory: required, the instance's own memory, e.g. 9984MiB")
    return _Mig(
        profile=profile.strip(),
        memory=_memory(f"{where}.memory", raw["memory"]),
        uuid=_uuid(f"{where}.uuid", raw.get("uuid")) or default_uuid,
    )


def _check_unique(entries: Sequence[_Entry]) -> None:
    """No UUID (cards and MIG instances) and no PCI bus id may be used twice."""
    uuids: dict[str, str] = {}
    buses: dict[str, str] = {}
    for e in entries:
        where = f"devices[{e.position}]"
        _claim(uuids, e.card.uuid, f"{where}.uuid")
        if e.card.pci_bus_id is not None:
            _claim(buses, e.card.pci_bus_id, f"{where}.pci_bus_id")
        for slot, mig in enumerate(e.migs or ()):
            _claim(uuids, mig.uuid, f"{where}.mig[{slot}].uuid")


def _claim(seen: dict[str, str], value: str, where: str) -> None:
    if value in seen:
        raise InvalidInput(f"{where}: {value!r} already used by {seen[value].rsplit('.', 1)[0]}")
    seen[value] = where


# --------------------------------------------------------------------------- order


def _pci_order(bus: str | None) -> tuple[int, ...]:
    m = _PCI_RE.fullmatch(bus) if bus else None
    return tuple(int(part, 16) for part in m.groups()) if m else ()


def _order_key(entry: _Entry) -> tuple[int, int, tuple[int, ...], int]:
    bus = _pci_order(entry.card.pci_bus_id)
    # Devices with a bus id first, in bus order; those without after them, as listed.
    return (_DISCOVERY_GROUP[entry.card.vendor], 0 if bus else 1, bus, entry.position)


def _discovered(entries: Sequence[_Entry]) -> tuple[list[Device], dict[str, str], list[str]]:
    """The leasable devices in discovery order, their state-file stems, the skipped ones."""
    devices: list[Device] = []
    state_files: dict[str, str] = {}
    skipped: list[str] = []
    counters: dict[int, int] = {}
    for entry in sorted(entries, key=_order_key):
        group = _DISCOVERY_GROUP[entry.card.vendor]
        # An unhealthy device still takes its number, as a GPU NVML cannot read keeps
        # its NVML index and the others keep theirs.
        vendor_index = counters.get(group, 0)
        counters[group] = vendor_index + 1
        if entry.unhealthy is not None:
            skipped.append(f"devices[{entry.position}] ({entry.card.uuid}): {entry.unhealthy}")
            continue
        for stem, device in _leasable(entry, vendor_index):
            state_files[device.uuid] = stem
            devices.append(replace(device, index=len(devices)))
    return devices, state_files, skipped


def _leasable(entry: _Entry, vendor_index: int) -> Iterator[tuple[str, Device]]:
    """(state-file stem, device) of an entry: the card, or its MIG instances when MIG is on."""
    card = replace(entry.card, attributes={"vendor_index": vendor_index})
    if entry.migs is None:
        yield str(entry.position), card
        return
    # As NVML: a MIG-enabled card is not leasable as a whole (CUDA cannot use it), each
    # instance is a device of its own, named after the card and its profile.
    for slot, mig in enumerate(entry.migs):
        yield (
            f"{entry.position}.{slot}",
            replace(
                card,
                uuid=mig.uuid,
                model=f"{card.model} MIG {mig.profile}",
                memory_total_bytes=mig.memory,
                memory_free_bytes=mig.memory,
                utilization_pct=None,
                mig_parent_uuid=card.uuid,
                mig_profile=mig.profile,
                attributes={"vendor_index": vendor_index, "mig_device_index": slot, "gpu_instance_id": None},
            ),
        )


def fake_host_name(fake_file: str | Path | None = None) -> str | None:
    """The ``host`` key of the fake-GPU file (``CUECTL_FAKE_GPUS`` by default), or None."""
    path = fake_file if fake_file is not None else config.fake_gpus_file()
    if not path:
        return None
    return load_fake_config(path, default_host="-").host


@dataclass(frozen=True)
class _Reading:
    utilization_pct: float | None
    memory_used_bytes: int | None
    processes: tuple[ProcessSample, ...]


_IDLE = _Reading(0.0, 0, ())
_UNKNOWN = _Reading(None, None, ())


def read_state(state_dir: Path | None, stem: int | str) -> _Reading:
    """Live values from ``<state_dir>/<stem>.json``; see the module doc for the file format."""
    if state_dir is None:
        return _IDLE
    try:
        text = (state_dir / f"{stem}.json").read_text(encoding="utf-8")
    except FileNotFoundError:
        return _IDLE
    except OSError:
        return _UNKNOWN
    try:
        data = json.loads(text)
    except ValueError:
        return _UNKNOWN
    if not isinstance(data, dict):
        return _UNKNOWN
    return _Reading(
        clamp_pct(_number(data.get("utilization_pct", 0))),
        _int(data.get("memory_used_bytes", 0)),
        _processes(data.get("processes")),
    )


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return int(value)


def _processes(raw: Any) -> tuple[ProcessSample, ...]:
    if not isinstance(raw, list):
        return ()
    out = []
    for entry in raw:
        if isinstance(entry, Mapping) and isinstance(entry.get("pid"), int) and not isinstance(entry.get("pid"), bool):
            out.append(
                ProcessSample(
                    pid=entry["pid"],
                    memory_used_bytes=_int(entry.get("memory_used_bytes")),
                    utilization_pct=clamp_pct(_number(entry.get("utilization_pct"))),
                )
            )
    return tuple(out)


#: State file -> (mtime, size, inode) when its ``xid`` list was last reported: per process,
#: not per backend, so a re-discovery (a new backend) does not report the same events again.
_XID_SEEN: dict[str, tuple[int, int, int]] = {}


class FakeBackend(Backend):
    name = "fake"

    def __init__(self, fake_file: str | Path, *, default_host: str | None = None) -> None:
        super().__init__()
        self.fake_file = Path(fake_file)
        self._default_host = default_host
        self._config: FakeConfig | None = None

    @property
    def config(self) -> FakeConfig:
        # The file is static metadata: read and validated once per backend instance.
        if self._config is None:
            self._config = load_fake_config(self.fake_file, default_host=self._default_host)
        return self._config

    def _discover(self) -> list[Device]:
        cfg = self.config
        if not cfg.devices and cfg.skipped:
            # As NVML when no GPU can be read: the backend has nothing to offer.
            raise BackendUnavailable(
                f"no GPU could be read: {'; '.join(cfg.skipped)}", hint="the fake GPU file marks every device unhealthy"
            )
        return [_with_reading(d, self._reading(d)) for d in cfg.devices]

    def _reading(self, device: Device) -> _Reading:
        cfg = self.config
        return read_state(cfg.state_dir, cfg.state_files.get(device.uuid, str(device.index)))

    def health(self, uuids: Sequence[str]) -> dict[str, DeviceHealth]:
        cfg = self.config
        known = {d.uuid for d in cfg.devices}
        out: dict[str, DeviceHealth] = {}
        for u in uuids:
            if u not in known:
                continue
            stem = cfg.state_files.get(u)
            out[u] = self._health(u, None if cfg.state_dir is None or stem is None else cfg.state_dir / f"{stem}.json")
        return out

    def _health(self, uuid: str, path: Path | None) -> DeviceHealth:
        if path is None:
            return DeviceHealth(uuid=uuid)
        try:
            st = path.stat()
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return DeviceHealth(uuid=uuid)
        except (OSError, ValueError):
            return DeviceHealth.unknown(uuid)  # half-written: no signal this time
        if not isinstance(data, dict):
            return DeviceHealth.unknown(uuid)
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        xids: tuple[int, ...] = ()
        raw = data.get("xid")
        if isinstance(raw, list) and _XID_SEEN.get(str(path)) != stamp:
            _XID_SEEN[str(path)] = stamp
            xids = tuple(x for x in raw if isinstance(x, int) and not isinstance(x, bool) and 0 < x < 1 << 16)
        problems = []
        ecc = _int(data.get("ecc_uncorrectable"))
        if ecc:
            problems.append(f"uncorrectable ECC errors: {ecc} since the last reset")
        if data.get("retirement_pending") is True:
            problems.append("page retirement pending (needs a reset)")
        if data.get("remap_pending") is True:
            problems.append("row remapping pending (needs a reset)")
        lost = "GPU is lost (fallen off the bus)" if data.get("lost") is True else None
        return DeviceHealth(uuid=uuid, lost=lost, xids=xids, problems=tuple(problems))

    def sample(
        self, uuids: Sequence[str], pids: Collection[int] = (), *, every_process: bool = False
    ) -> dict[str, DeviceSample]:
        by_uuid = {d.uuid: d for d in self.config.devices}
        wanted = set(pids)
        now = time.time()
        out: dict[str, DeviceSample] = {}
        for u in uuids:
            device = by_uuid.get(u)
            if device is None:
                continue
            reading = self._reading(device)
            out[u] = DeviceSample(
                uuid=u,
                timestamp=now,
                utilization_pct=_utilization(device, reading),
                memory_used_bytes=reading.memory_used_bytes,
                memory_free_bytes=_free(device, reading),
                processes=reading.processes
                if every_process
                else tuple(p for p in reading.processes if p.pid in wanted),
            )
        return out


def _utilization(device: Device, reading: _Reading) -> float | None:
    # NVIDIA reports no utilisation for MIG instances (NVML: NOT_SUPPORTED).
    return None if device.mig_parent_uuid else reading.utilization_pct


def _free(device: Device, reading: _Reading) -> int | None:
    # Unified memory is the host's: the apple backend cannot say how much of it is free.
    return None if device.unified_memory else free_bytes(device.memory_total_bytes, reading.memory_used_bytes)


def _with_reading(device: Device, reading: _Reading) -> Device:
    return replace(device, utilization_pct=_utilization(device, reading), memory_free_bytes=_free(device, reading))
