"""GPU discovery and sampling backends (nvml, smi, apple, amd, fake).

```python
found = discover()                 # auto: fake file if configured, else every real backend
found.devices                      # [Device], index 0..n-1 across backends
found.backends                     # [BackendStatus]: what was tried, ok or why not
found.sample(pids={1234})          # {uuid: DeviceSample}, one batch call per backend
found.found_by()                   # ["nvml"]: the backends that found devices
found.warnings()                   # e.g. NVML failed and nvidia-smi stood in
```

Backends are imported lazily: importing ``cuectl.gpu`` costs nothing beyond the device
model, and ``pynvml``/``yaml`` load only when their backend runs.

Modules: ``device`` (immutable ``Device``/``DeviceSample`` snapshots), ``base`` (the
backend interface), one per backend (``nvml``, ``smi``, ``amd``, ``apple``, ``fake``), and
``doctor`` (what discovery can and cannot see here, backend by backend).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable, Collection, Sequence

from cuectl import config
from cuectl.errors import GpuError, InvalidInput
from cuectl.gpu.base import Backend
from cuectl.gpu.device import (
    VENDORS,
    BackendStatus,
    Device,
    DeviceHealth,
    DeviceSample,
    ProcessSample,
    normalize_pci_bus_id,
    normalize_vendor,
)

BACKEND_NAMES = ("nvml", "smi", "apple", "amd", "fake")
#: The order ``auto`` tries the real backends in; smi only runs when nvml found no GPU.
AUTO_ORDER = ("nvml", "smi", "amd", "apple")

__all__ = [
    "BACKEND_NAMES",
    "Backend",
    "BackendStatus",
    "Device",
    "DeviceSample",
    "Discovery",
    "ProcessSample",
    "VENDORS",
    "discover",
    "fake_host_name",
    "get_backend",
    "normalize_pci_bus_id",
    "normalize_vendor",
]


def _check_name(name: str, *, allow_auto: bool) -> str:
    key = str(name).strip().lower()
    allowed = (("auto",) if allow_auto else ()) + BACKEND_NAMES
    if key not in allowed:
        raise InvalidInput(f"unknown GPU backend {name!r} (use one of: {', '.join(allowed)})")
    return key


def get_backend(name: str, *, fake_file: str | Path | None = None) -> Backend:
    """A new backend instance by name. ``fake`` needs ``fake_file`` or ``CUECTL_FAKE_GPUS``."""
    key = _check_name(name, allow_auto=False)
    if key == "nvml":
        from cuectl.gpu.nvml import NvmlBackend

        return NvmlBackend()
    if key == "smi":
        from cuectl.gpu.smi import SmiBackend

        return SmiBackend()
    if key == "apple":
        from cuectl.gpu.apple import AppleBackend

        return AppleBackend()
    if key == "amd":
        from cuectl.gpu.amd import AmdBackend

        return AmdBackend()
    path = fake_file if fake_file is not None else config.fake_gpus_file()
    if not path:
        raise InvalidInput(
            "the fake backend needs a device file",
            hint="set CUECTL_FAKE_GPUS=FILE (see docs/gpu-setup.md for its format)",
        )
    from cuectl.gpu.fake import FakeBackend

    return FakeBackend(path)


def fake_host_name(fake_file: str | Path | None = None) -> str | None:
    """The ``host`` key of the fake-GPU file (``CUECTL_FAKE_GPUS`` by default), or None."""
    path = fake_file if fake_file is not None else config.fake_gpus_file()
    if not path:
        return None
    from cuectl.gpu.fake import fake_host_name as _read_host

    return _read_host(path)


class Discovery:
    """The devices found on this host and the backends that found them.

    ``devices[i].index == i``; the order is the order of ``AUTO_ORDER`` (or the one forced
    backend), each backend's devices in its own order. ``attributes["vendor_index"]`` keeps
    the device's index within its vendor tool.
    """

    def __init__(self, found: Sequence[tuple[Backend, Sequence[Device]]], backends: Sequence[BackendStatus]) -> None:
        self.devices: list[Device] = []
        self.backends: list[BackendStatus] = list(backends)
        #: backend name -> message of the last sample() that failed for it.
        self.sample_errors: dict[str, str] = {}
        self._route: dict[str, Backend] = {}
        self._backends = [backend for backend, _ in found]
        for backend, devices in found:
            for d in devices:
                if d.uuid in self._route:
                    continue  # the same card seen twice (masked UUIDs): keep the first
                self._route[d.uuid] = backend
                self.devices.append(replace(d, index=len(self.devices)))

    def sample(
        self, uuids: Sequence[str] | None = None, pids: Collection[int] = (), *, every_process: bool = False
    ) -> dict[str, DeviceSample]:
        """Live values of ``uuids`` (default: every device); unknown uuids are skipped.

        One batch call per backend. A backend whose tool fails leaves its devices out of
        the result and records why in ``sample_errors``; the others still report.
        """
        out: dict[str, DeviceSample] = {}
        for backend, group in self._by_backend(uuids):
            try:
                out.update(backend.sample(group, pids, every_process=every_process))
                self.sample_errors.pop(backend.name, None)
            except GpuError as exc:
                self.sample_errors[backend.name] = exc.message
        return out

    def health(self, uuids: Sequence[str] | None = None) -> dict[str, DeviceHealth]:
        """Each device's health (``Backend.health``), one batch per backend; a backend that
        fails leaves its devices unknown (its error is in ``sample_errors``)."""
        out: dict[str, DeviceHealth] = {}
        for backend, group in self._by_backend(uuids):
            try:
                out.update(backend.health(group))
            except GpuError as exc:
                self.sample_errors[backend.name] = exc.message
                out.update({u: DeviceHealth.unknown(u) for u in group})
        return out

    def _by_backend(self, uuids: Sequence[str] | None) -> list[tuple[Backend, list[str]]]:
        """``uuids`` (default: every device) grouped by the backend that found them, each
        once, unknown ones left out: what one batch call per backend asks about."""
        wanted = [d.uuid for d in self.devices] if uuids is None else list(dict.fromkeys(uuids))
        groups: dict[int, tuple[Backend, list[str]]] = {}
        for u in wanted:
            backend = self._route.get(u)
            if backend is not None:
                groups.setdefault(id(backend), (backend, []))[1].append(u)
        return list(groups.values())

    def backend_of(self, uuid: str) -> Backend | None:
        return self._route.get(uuid)

    def found_by(self) -> list[str]:
        """The backends that found devices, in discovery order (``["nvml"]``, ``["smi"]``...)."""
        return list(dict.fromkeys(d.backend for d in self.devices))

    def problems(self) -> dict[str, str]:
        """Backend name -> why it offers fewer devices than it might: the error of a backend
        that failed, or the devices it left out (``skipped``: NVML cannot read a GPU). The
        worker names these when a device it had is gone."""
        out = {b.name: b.error for b in self.backends if not b.ok and b.error}
        for backend in self._backends:
            skipped = getattr(backend, "skipped", None)
            if skipped and backend.name not in out:
                out[backend.name] = "; ".join(map(str, skipped))
        return out

    def warnings(self) -> list[str]:
        """What the user should know about how the GPUs were found: ``auto`` fell back to
        nvidia-smi because NVML could not be used (slower sampling, less per-process data)."""
        nvml = next((b for b in self.backends if b.name == "nvml"), None)
        if nvml is None or "smi" not in self.found_by():
            return []
        from cuectl.gpu.smi import FALLBACK_LIMITS

        why = nvml.error if not nvml.ok and nvml.error else "it found no GPU"
        fix = f" ({nvml.hint})" if nvml.hint else ""
        return [f"NVML is not usable: {why}{fix}; using nvidia-smi instead: {FALLBACK_LIMITS}"]

    def to_json(self) -> dict:
        return {"devices": [d.to_json() for d in self.devices], "backends": [b.to_json() for b in self.backends]}


def _try(backend: Backend) -> tuple[list[Device], BackendStatus]:
    try:
        devices = backend.discover()
    except GpuError as exc:
        return [], BackendStatus(backend.name, ok=False, error=exc.message, hint=exc.hint)
    return devices, BackendStatus(backend.name, ok=True)


def discover(
    backend: str = "auto", *, fake_file: str | Path | None = None, make_backend: Callable[[str], Backend] | None = None
) -> Discovery:
    """Find this host's GPUs.

    ``auto``: the fake file when one is given or configured (and only it); otherwise nvml,
    then nvidia-smi only when NVML found no NVIDIA GPU, then AMD, then Apple — every backend
    that finds devices contributes. A named backend runs alone, on any platform.

    A backend that cannot run is reported in ``backends`` (ok=False with the reason), never
    raised: no GPU is not an error. Invalid input (unknown name, bad fake file) raises
    ``InvalidInput``. ``fake_file=None`` means ``CUECTL_FAKE_GPUS``; ``""`` means no fake
    file, whatever the environment says. ``make_backend`` replaces ``get_backend`` (tests
    inject doubles).
    """
    key = _check_name(backend, allow_auto=True)
    path = fake_file if fake_file is not None else config.fake_gpus_file()

    def make(name: str) -> Backend:
        return make_backend(name) if make_backend else get_backend(name, fake_file=path)

    if key != "auto":
        names: Sequence[str] = (key,)
    elif path:
        names = ("fake",)
    else:
        names = AUTO_ORDER
    found: list[tuple[Backend, Sequence[Device]]] = []
    statuses: list[BackendStatus] = []
    nvidia_found = False
    for name in names:
        if name == "smi" and key == "auto" and nvidia_found:
            continue  # NVML already listed the NVIDIA GPUs; nvidia-smi would list them again
        instance = make(name)
        devices, status = _try(instance)
        statuses.append(status)
        found.append((instance, devices))
        if name == "nvml" and devices:
            nvidia_found = True
    return Discovery(found, statuses)
