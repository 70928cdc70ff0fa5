"""Fake GPUs from a YAML file (DESIGN §7): tests, demos and CI without GPUs.

```yaml
host: render-01            # optional: host name the worker registers as
state_dir: state           # optional: live values, relative to this file's directory
devices:
  - model: "Tesla V100-SXM2-16GB"
    vendor: NVIDIA         # optional, default NVIDIA
    memory: 16160MiB       # a size string (bare number = MiB) or an int of bytes
    uuid: GPU-...          # optional: default derived from host + index
```

Sampling device ``i`` reads ``<state_dir>/<i>.json``::

    {"utilization_pct": 73, "memory_used_bytes": 5368709120,
     "processes": [{"pid": 1234, "memory_used_bytes": 1073741824, "utilization_pct": 40}]}

A missing file means an idle device (0 % and 0 bytes used). A file that cannot be read as
such JSON (a test frame may be half-way through writing it) gives ``None`` values for that
sample rather than an error: a sampler must not die on one bad reading.
"""

from __future__ import annotations

import json
import time
import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Mapping, Sequence

from cuectl import config
from cuectl.errors import InvalidInput
from cuectl.gpu.base import Backend, clamp_pct, free_bytes
from cuectl.gpu.device import VENDORS, Device, DeviceSample, ProcessSample, normalize_pci_bus_id, normalize_vendor
from cuectl.units import MIB, parse_size

_TOP_KEYS = {"host", "state_dir", "devices"}
_DEVICE_KEYS = {"model", "vendor", "memory", "uuid", "pci_bus_id", "driver_version", "compute_capability"}
#: Namespace of the default fake UUIDs, so that the same host + index always gives the
#: same UUID (leases and stored inventories key on it).
_UUID_NAMESPACE = uuidlib.UUID("6f1d2a4c-3b7e-5c55-9a0e-2f4b8c1d7e90")


@dataclass(frozen=True)
class FakeConfig:
    path: Path
    host: str | None
    state_dir: Path | None
    devices: tuple[Device, ...]


def default_fake_uuid(host: str, index: int) -> str:
    """Stable UUID of fake device ``index`` on ``host``: ``GPU-`` + a name-based UUID."""
    return f"GPU-{uuidlib.uuid5(_UUID_NAMESPACE, f'{host}/{index}')}"


def load_fake_config(path: str | Path, *, default_host: str | None = None) -> FakeConfig:
    """Read and validate a fake-GPU file; every problem is ``InvalidInput`` with a field path."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"fake GPU file {str(file)!r}: {exc.strerror or exc}",
                           hint="CUECTL_FAKE_GPUS must name a readable YAML file") from None
    import yaml  # lazily: yaml costs tens of ms and only fake GPUs need it here

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidInput(f"fake GPU file {str(file)!r}: malformed YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InvalidInput(f"fake GPU file {str(file)!r}: expected a mapping with a 'devices' list")
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
    devices = tuple(_parse_device(i, raw, uuid_host) for i, raw in enumerate(raw_devices))
    seen: dict[str, int] = {}
    for d in devices:
        if d.uuid in seen:
            raise InvalidInput(f"devices[{d.index}].uuid: {d.uuid!r} already used by devices[{seen[d.uuid]}]")
        seen[d.uuid] = d.index
    # A relative state_dir is relative to the YAML file, so a file and its state
    # directory can be moved together (tests create both in one tmp dir).
    state = (file.parent / state_dir) if state_dir else None
    return FakeConfig(path=file, host=host, state_dir=state, devices=devices)


def _parse_device(index: int, raw: Any, uuid_host: str) -> Device:
    where = f"devices[{index}]"
    if not isinstance(raw, dict):
        raise InvalidInput(f"{where}: expected a mapping with model and memory")
    unknown = sorted(set(map(str, raw)) - _DEVICE_KEYS)
    if unknown:
        raise InvalidInput(f"{where}.{unknown[0]}: unknown key (allowed: {', '.join(sorted(_DEVICE_KEYS))})")
    model = raw.get("model")
    if not isinstance(model, str) or not model.strip():
        raise InvalidInput(f"{where}.model: required, a non-empty string")
    vendor_raw = raw.get("vendor", "NVIDIA")
    vendor = normalize_vendor(vendor_raw) if isinstance(vendor_raw, str) else None
    if vendor is None:
        raise InvalidInput(f"{where}.vendor: unknown vendor {vendor_raw!r} (use one of {', '.join(VENDORS)})")
    if "memory" not in raw:
        raise InvalidInput(f"{where}.memory: required, e.g. 16160MiB, 80GiB or a number of bytes")
    memory_raw = raw["memory"]
    if not isinstance(memory_raw, (str, int)) or isinstance(memory_raw, bool):
        raise InvalidInput(f"{where}.memory: invalid size {memory_raw!r}")
    memory = parse_size(memory_raw, field=f"{where}.memory")
    if memory <= 0:
        raise InvalidInput(f"{where}.memory: must be more than 0")
    if isinstance(memory_raw, int) and memory < MIB:
        # A YAML number is bytes; "memory: 16160" almost surely meant MiB. Say so.
        raise InvalidInput(f"{where}.memory: {memory_raw} bytes is less than 1 MiB",
                           hint=f"a YAML number is bytes: write {memory_raw}MiB or '{memory_raw}' for MiB")
    device_uuid = raw.get("uuid")
    if device_uuid is None:
        device_uuid = default_fake_uuid(uuid_host, index)
    elif not isinstance(device_uuid, str) or not device_uuid.strip() or any(c.isspace() for c in device_uuid):
        raise InvalidInput(f"{where}.uuid: expected a string without spaces, got {device_uuid!r}")
    optional = {}
    for key in ("pci_bus_id", "driver_version", "compute_capability"):
        value = raw.get(key)
        if value is not None and not isinstance(value, (str, int, float)):
            raise InvalidInput(f"{where}.{key}: expected a string, got {value!r}")
        optional[key] = None if value is None else str(value)
    return Device(index=index, uuid=device_uuid, vendor=vendor, model=model.strip(), backend="fake",
                  memory_total_bytes=memory, memory_free_bytes=memory, utilization_pct=0.0,
                  pci_bus_id=normalize_pci_bus_id(optional["pci_bus_id"]),
                  driver_version=optional["driver_version"],
                  compute_capability=optional["compute_capability"],
                  attributes={"vendor_index": index})


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


def read_state(state_dir: Path | None, index: int) -> _Reading:
    """Live values of fake device ``index``; see the module doc for the file format."""
    if state_dir is None:
        return _IDLE
    try:
        text = (state_dir / f"{index}.json").read_text(encoding="utf-8")
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
    return _Reading(clamp_pct(_number(data.get("utilization_pct", 0))),
                    _int(data.get("memory_used_bytes", 0)),
                    _processes(data.get("processes")))


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
            out.append(ProcessSample(pid=entry["pid"], memory_used_bytes=_int(entry.get("memory_used_bytes")),
                                     utilization_pct=clamp_pct(_number(entry.get("utilization_pct")))))
    return tuple(out)


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
        devices = []
        for d in cfg.devices:
            reading = read_state(cfg.state_dir, d.index)
            devices.append(_with_reading(d, reading))
        return devices

    def sample(self, uuids: Sequence[str], pids: Collection[int] = ()) -> dict[str, DeviceSample]:
        cfg = self.config
        by_uuid = {d.uuid: d for d in cfg.devices}
        wanted = set(pids)
        now = time.time()
        out: dict[str, DeviceSample] = {}
        for u in uuids:
            device = by_uuid.get(u)
            if device is None:
                continue
            reading = read_state(cfg.state_dir, device.index)
            out[u] = DeviceSample(
                uuid=u, timestamp=now, utilization_pct=reading.utilization_pct,
                memory_used_bytes=reading.memory_used_bytes,
                memory_free_bytes=free_bytes(device.memory_total_bytes, reading.memory_used_bytes),
                processes=tuple(p for p in reading.processes if p.pid in wanted))
        return out


def _with_reading(device: Device, reading: _Reading) -> Device:
    from dataclasses import replace

    return replace(device, utilization_pct=reading.utilization_pct,
                   memory_free_bytes=free_bytes(device.memory_total_bytes, reading.memory_used_bytes))
