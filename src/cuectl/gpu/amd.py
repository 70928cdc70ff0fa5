"""AMD GPUs (Linux): ``amd-smi``, else ``rocm-smi``, else ``/sys/class/drm``.

The first source that finds at least one AMD GPU wins; its errors and the others' are
combined into one message when none finds any.

- UUID: ROCm's ``GPU-<16 hex digits of the unique id>`` (what ``rocminfo`` prints and
  ``ROCR_VISIBLE_DEVICES`` accepts). Cards that report no unique id (many Radeon consumer
  cards) get ``AMD-PCI-<bus id>``: such a card can only be isolated by index.
- Model: the marketing name. rocm-smi prints lspci-style ``Arcturus GL-XL [Instinct MI100]``;
  the bracketed part becomes ``AMD Instinct MI100`` (so that ``MI100`` matches as a word).
  Old rocm-smi prints the vendor id ``0x1002`` in place of the name: then the device id
  is all there is (``AMD GPU 0x73df``). The raw name is kept in ``attributes``.
- MI250/MI300 dies (GCDs) are separate devices, as ROCm shows them.
- Only vendor 0x1002 cards count. Intel GPUs in ``/sys/class/drm`` (i915/xe) are not listed:
  cuectl has no way to isolate or sample them yet.
- Sampling: one ``amd-smi metric`` or ``rocm-smi`` spawn, or a few sysfs reads. Per-process
  VRAM comes from the DRM ``fdinfo`` files of the asked-for pids in ``/proc`` (no spawn);
  per-process utilisation is not available (None).

No genuine ``amd-smi`` output was available as a fixture; its parser follows the shapes
documented for ``amd-smi static --json`` / ``amd-smi metric --json`` (a JSON list of
``{"gpu": N, ...}``; amd-smi >= 7 wraps it as ``{"gpu_data": [...]}``).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, Sequence

from cuectl.errors import BackendOutputError, BackendUnavailable, GpuError
from cuectl.gpu.base import (
    Backend,
    ToolMissing,
    ToolResult,
    clamp_pct,
    clean,
    free_bytes,
    lookup,
    parse_bytes,
    parse_float,
    run_tool,
)
from cuectl.gpu.device import Device, DeviceHealth, DeviceSample, ProcessSample, normalize_pci_bus_id

AMD_VENDOR_ID = "0x1002"
INSTALL_HINT = "install ROCm (it ships amd-smi and rocm-smi) and the amdgpu kernel driver"
DEFAULT_SYSFS_ROOT = Path("/sys/class/drm")
DEFAULT_PROC_ROOT = Path("/proc")
ROCM_SMI_DISCOVER_ARGS = (
    "--showproductname",
    "--showuniqueid",
    "--showbus",
    "--showmeminfo",
    "vram",
    "--showuse",
    "--showdriverversion",
    "--json",
)
ROCM_SMI_SAMPLE_ARGS = ("--showuse", "--showmeminfo", "vram", "--json")
AMD_SMI_DISCOVER_ARGS = ("static", "--json")
AMD_SMI_SAMPLE_ARGS = ("metric", "--usage", "--mem-usage", "--json")

_HEX_ONLY_RE = re.compile(r"^0x[0-9a-f]+$", re.IGNORECASE)
_BRACKETED_RE = re.compile(r"\[([^\]]+)\]")
_CARD_RE = re.compile(r"^card(\d+)$")


# --------------------------------------------------------------------------- shared


def amd_uuid(unique_id: object, pci_bus_id: str | None, fallback: str) -> str:
    """``GPU-<16 hex>`` from a unique id (``0x4edfb117a17a07d``), else a PCI- or name-based id."""
    text = clean(unique_id)
    if text:
        digits = text.lower().removeprefix("0x")
        if re.fullmatch(r"[0-9a-f]+", digits) and int(digits, 16) != 0:
            return f"GPU-{digits.rjust(16, '0')}"
    if pci_bus_id:
        return f"AMD-PCI-{pci_bus_id}"
    return f"AMD-{fallback}"


def amd_model(*names: object, device_id: object = None) -> str:
    """The marketing name among ``names`` (first usable), as ``AMD <name>``."""
    for raw in names:
        text = clean(raw)
        if not text or _HEX_ONLY_RE.match(text):
            continue  # rocm-smi < 5 prints the vendor id "0x1002" as the card series
        m = _BRACKETED_RE.search(text)
        name = m.group(1).strip() if m else text
        return name if name.upper().startswith("AMD") else f"AMD {name}"
    dev = clean(device_id)
    return f"AMD GPU {dev.lower()}" if dev else "AMD GPU"


def extract_json(text: str, tool: str) -> Any:
    """The JSON document in a tool's output; ROCm tools may print warning lines before it.

    The document is taken to start at the first line that begins with ``{`` or ``[``
    (a warning such as ``WARNING: ... [x]`` may contain brackets itself).
    """
    decoder = json.JSONDecoder()
    offset, error = 0, None
    for line in text.splitlines(keepends=True):
        stripped = line.lstrip()
        if stripped[:1] in ("{", "["):
            try:
                return decoder.raw_decode(text, offset + len(line) - len(stripped))[0]
            except ValueError as exc:
                error = exc
        offset += len(line)
    if error is not None:
        raise BackendOutputError(f"{tool}: malformed JSON ({error})")
    raise BackendOutputError(f"{tool}: no JSON in its output: {text.strip()[:120]!r}")


def _failed(tool: str, result: ToolResult) -> BackendUnavailable:
    message = " ".join(ln.strip() for ln in result.output.splitlines() if ln.strip())[:300] or "no output"
    hint = None
    if "amdgpu" in message.lower() or "driver not initialized" in message.lower():
        hint = "load the amdgpu kernel driver (`sudo modprobe amdgpu`) and check `dmesg`"
    return BackendUnavailable(f"{tool} failed (exit {result.returncode}): {message}", hint=hint)


# --------------------------------------------------------------------------- rocm-smi


def _card_items(data: Any) -> list[tuple[str, Mapping[str, Any]]]:
    if not isinstance(data, dict):
        raise BackendOutputError("rocm-smi: expected a JSON object of cards")
    cards = [(k, v) for k, v in data.items() if _CARD_RE.match(k) and isinstance(v, dict)]
    return sorted(cards, key=lambda kv: int(_CARD_RE.match(kv[0]).group(1)))  # type: ignore[union-attr]


def parse_rocm_smi(text: str) -> list[Device]:
    """``rocm-smi ... --json`` -> devices, one per ``cardN`` key (MI250 dies included)."""
    data = extract_json(text, "rocm-smi")
    cards = _card_items(data)
    driver = clean(lookup(data.get("system", {}), "Driver version")) if isinstance(data.get("system"), dict) else None
    devices = []
    for pos, (key, card) in enumerate(cards):
        bus = normalize_pci_bus_id(clean(lookup(card, "PCI Bus")))
        series = lookup(card, "Card Series", "Card series")
        device_id = lookup(card, "Device ID", "GPU ID")
        total = parse_bytes(lookup(card, "VRAM Total Memory (B)"), default_unit="B")
        used = parse_bytes(lookup(card, "VRAM Total Used Memory (B)"), default_unit="B")
        # MI250's second die reports its power as "N/A (Secondary die)": same card, own device.
        power = str(lookup(card, "Average Graphics Package Power (W)") or "")
        devices.append(
            Device(
                index=pos,
                uuid=amd_uuid(lookup(card, "Unique ID"), bus, key),
                vendor="AMD",
                model=amd_model(series, lookup(card, "Device Name"), device_id=device_id),
                backend="amd",
                memory_total_bytes=total,
                memory_free_bytes=free_bytes(total, used),
                utilization_pct=clamp_pct(parse_float(lookup(card, "GPU use (%)"))),
                pci_bus_id=bus,
                driver_version=driver,
                compute_capability=clean(lookup(card, "GFX Version")),
                attributes={
                    "vendor_index": pos,
                    "card": key,
                    "source": "rocm-smi",
                    "product_name_raw": clean(series),
                    "secondary_die": "secondary die" in power.lower(),
                },
            )
        )
    return devices


def parse_rocm_smi_sample(text: str) -> dict[str, tuple[float | None, int | None, int | None]]:
    """card key -> (utilisation %, VRAM used, VRAM total) of ``rocm-smi --showuse --showmeminfo vram``."""
    out = {}
    for key, card in _card_items(extract_json(text, "rocm-smi")):
        out[key] = (
            clamp_pct(parse_float(lookup(card, "GPU use (%)"))),
            parse_bytes(lookup(card, "VRAM Total Used Memory (B)"), default_unit="B"),
            parse_bytes(lookup(card, "VRAM Total Memory (B)"), default_unit="B"),
        )
    return out


# --------------------------------------------------------------------------- amd-smi


def _amd_smi_list(data: Any) -> list[Mapping[str, Any]]:
    if isinstance(data, dict):
        data = lookup(data, "gpu_data")
    if not isinstance(data, list):
        raise BackendOutputError('amd-smi: expected a JSON list of GPUs (or {"gpu_data": [...]})')
    return [e for e in data if isinstance(e, dict)]


def _amd_value(raw: Any, default_unit: str | None = None) -> Any:
    """amd-smi writes ``{"value": 12, "unit": "%"}``, or a bare value in older releases."""
    if isinstance(raw, dict) and "value" in raw:
        unit = raw.get("unit")
        value = raw.get("value")
        if default_unit is not None and unit and isinstance(value, (int, float)) and not isinstance(value, bool):
            return f"{value} {unit}"
        return value
    return raw


def _section(entry: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = lookup(entry, name)
    return value if isinstance(value, dict) else {}


def parse_amd_smi_static(text: str) -> list[Device]:
    """``amd-smi static --json`` -> devices."""
    devices = []
    for pos, entry in enumerate(_amd_smi_list(extract_json(text, "amd-smi"))):
        gpu = parse_float(lookup(entry, "gpu"))
        index = int(gpu) if gpu is not None else pos
        asic, bus, vram, driver = (_section(entry, s) for s in ("asic", "bus", "vram", "driver"))
        vendor_id = clean(lookup(asic, "vendor_id"))
        if vendor_id and vendor_id.lower() != AMD_VENDOR_ID:
            continue
        pci = normalize_pci_bus_id(clean(lookup(bus, "bdf")))
        total = parse_bytes(_amd_value(lookup(vram, "size"), "MiB"), default_unit="MiB")
        market = lookup(asic, "market_name")
        devices.append(
            Device(
                index=index,
                uuid=amd_uuid(lookup(asic, "asic_serial"), pci, f"gpu{index}"),
                vendor="AMD",
                model=amd_model(market, device_id=lookup(asic, "device_id")),
                backend="amd",
                memory_total_bytes=total,
                memory_free_bytes=None,
                pci_bus_id=pci,
                driver_version=clean(lookup(driver, "version")),
                compute_capability=clean(lookup(asic, "target_graphics_version")),
                attributes={
                    "vendor_index": index,
                    "gpu": index,
                    "source": "amd-smi",
                    "product_name_raw": clean(market),
                },
            )
        )
    return devices


def parse_amd_smi_metric(text: str) -> dict[int, tuple[float | None, int | None, int | None, int | None]]:
    """gpu index -> (utilisation %, VRAM used, VRAM free, VRAM total) of ``amd-smi metric --json``."""
    out = {}
    for pos, entry in enumerate(_amd_smi_list(extract_json(text, "amd-smi"))):
        gpu = parse_float(lookup(entry, "gpu"))
        usage, mem = _section(entry, "usage"), _section(entry, "mem_usage")

        def size(key: str) -> int | None:
            return parse_bytes(_amd_value(lookup(mem, key), "MiB"), default_unit="MiB")

        out[int(gpu) if gpu is not None else pos] = (
            clamp_pct(parse_float(_amd_value(lookup(usage, "gfx_activity")))),
            size("used_vram"),
            size("free_vram"),
            size("total_vram"),
        )
    return out


# --------------------------------------------------------------------------- sysfs


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def _uevent(device_dir: Path) -> dict[str, str]:
    text = _read(device_dir / "uevent") or ""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def read_sysfs(root: Path = DEFAULT_SYSFS_ROOT) -> list[Device]:
    """AMD cards under ``root`` (``/sys/class/drm``): ``cardN/device`` with vendor 0x1002."""
    if not root.is_dir():
        return []
    cards = sorted((int(m.group(1)), p) for p in root.iterdir() if (m := _CARD_RE.match(p.name)))
    devices: list[Device] = []
    for _, card in cards:
        dev = card / "device"
        uevent = _uevent(dev)
        vendor = (_read(dev / "vendor") or "").lower()
        if vendor != AMD_VENDOR_ID and not uevent.get("PCI_ID", "").upper().startswith("1002:"):
            continue
        pci = normalize_pci_bus_id(uevent.get("PCI_SLOT_NAME"))
        total = parse_bytes(_read(dev / "mem_info_vram_total"), default_unit="B")
        used = parse_bytes(_read(dev / "mem_info_vram_used"), default_unit="B")
        device_id = _read(dev / "device")
        pos = len(devices)
        devices.append(
            Device(
                index=pos,
                uuid=amd_uuid(_read(dev / "unique_id"), pci, card.name),
                vendor="AMD",
                model=amd_model(_read(dev / "product_name"), device_id=device_id),
                backend="amd",
                memory_total_bytes=total,
                memory_free_bytes=free_bytes(total, used),
                utilization_pct=clamp_pct(parse_float(_read(dev / "gpu_busy_percent"))),
                pci_bus_id=pci,
                attributes={"vendor_index": pos, "card": card.name, "source": "sysfs", "driver": uevent.get("DRIVER")},
            )
        )
    return devices


# --------------------------------------------------------------------------- fdinfo


@dataclass(frozen=True)
class FdinfoUsage:
    pdev: str | None
    client_id: str | None
    vram_bytes: int | None


def parse_fdinfo(text: str) -> FdinfoUsage | None:
    """A DRM fdinfo file (``drm-pdev``, ``drm-client-id``, ``drm-memory-vram``); None if not DRM.

    Kernels before the common DRM keys (amdgpu < 5.19) wrote ``pdev`` and ``vram mem``.
    """
    keys: dict[str, str] = {}
    for line in text.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            keys[k.strip().lower()] = v.strip()
    pdev = keys.get("drm-pdev") or keys.get("pdev")
    if pdev is None:
        return None
    vram = keys.get("drm-memory-vram") or keys.get("vram mem")
    return FdinfoUsage(
        pdev=normalize_pci_bus_id(pdev),
        client_id=keys.get("drm-client-id"),
        vram_bytes=parse_bytes(vram.replace("kB", "KiB") if vram else None, default_unit="B"),
    )


def ras_problems(ras_dir: Path) -> tuple[str, ...]:
    """Uncorrectable error counts of amdgpu's RAS blocks (``<block>_err_count`` files holding
    ``ue: N`` and ``ce: N`` lines, as the kernel documents them), one line per block with
    any: ``uncorrectable RAS errors in umc: 2``. Corrected errors (``ce``) are no problem."""
    try:
        names = sorted(n for n in os.listdir(ras_dir) if n.endswith("_err_count"))
    except OSError:
        return ()
    out = []
    for name in names:
        counts = {}
        for line in (_read(ras_dir / name) or "").splitlines():
            key, _, value = line.partition(":")
            if value.strip().isdigit():
                counts[key.strip().lower()] = int(value.strip())
        if counts.get("ue", 0) > 0:
            out.append(f"uncorrectable RAS errors in {name[: -len('_err_count')]}: {counts['ue']}")
    return tuple(out)


def _all_pids(proc_root: Path) -> list[int]:
    try:
        return [int(name) for name in os.listdir(proc_root) if name.isdigit()]
    except OSError:
        return []


def process_vram(pids: Collection[int], proc_root: Path = DEFAULT_PROC_ROOT) -> dict[str, dict[int, int]]:
    """PCI bus id -> {pid: VRAM bytes} for ``pids``, from their DRM file descriptors.

    A DRM client opened through several descriptors is counted once (``drm-client-id``).
    Processes that are gone or not readable are skipped.
    """
    out: dict[str, dict[int, int]] = {}
    for pid in pids:
        fd_dir = proc_root / str(pid) / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        seen: set[tuple[str | None, str | None]] = set()
        for fd in fds:
            try:
                # Only descriptors of /dev/dri/* have DRM fdinfo; skip the rest unread.
                if not os.readlink(fd_dir / fd).startswith("/dev/dri/"):
                    continue
            except OSError:
                continue
            usage = parse_fdinfo(_read(proc_root / str(pid) / "fdinfo" / fd) or "")
            if usage is None or usage.pdev is None or usage.vram_bytes is None:
                continue
            key = (usage.pdev, usage.client_id or f"fd{fd}")
            if key in seen:
                continue
            seen.add(key)
            per_pid = out.setdefault(usage.pdev, {})
            per_pid[pid] = per_pid.get(pid, 0) + usage.vram_bytes
    return out


# --------------------------------------------------------------------------- backend


class AmdBackend(Backend):
    name = "amd"

    def __init__(
        self, *, sysfs_root: Path | str = DEFAULT_SYSFS_ROOT, proc_root: Path | str = DEFAULT_PROC_ROOT
    ) -> None:
        super().__init__()
        self.sysfs_root = Path(sysfs_root)
        self.proc_root = Path(proc_root)
        self.source: str | None = None  # "amd-smi", "rocm-smi" or "sysfs" after discovery

    def _discover(self) -> list[Device]:
        sources: list[tuple[str, Callable[[], list[Device]]]] = [
            ("amd-smi", self._discover_amd_smi),
            ("rocm-smi", self._discover_rocm_smi),
            ("sysfs", lambda: read_sysfs(self.sysfs_root)),
        ]
        problems: list[GpuError] = []
        for name, fn in sources:
            try:
                devices = fn()
            except GpuError as exc:
                problems.append(exc)
                continue
            if devices:
                self.source = name
                return [replace(d, index=i) for i, d in enumerate(devices)]
        failures = [p for p in problems if not isinstance(p, ToolMissing)]
        if failures:
            raise BackendUnavailable(
                "; ".join(p.message for p in failures), hint=next((p.hint for p in failures if p.hint), INSTALL_HINT)
            )
        raise BackendUnavailable(
            f"no AMD GPU found (no amd-smi or rocm-smi on PATH, no amdgpu card under {self.sysfs_root})",
            hint=INSTALL_HINT,
        )

    def _tool_json(self, tool: str, args: Sequence[str]) -> str:
        result = run_tool(tool, args, install_hint=INSTALL_HINT)
        if result.returncode != 0:
            raise _failed(tool, result)
        return result.stdout

    def _discover_amd_smi(self) -> list[Device]:
        return parse_amd_smi_static(self._tool_json("amd-smi", AMD_SMI_DISCOVER_ARGS))

    def _discover_rocm_smi(self) -> list[Device]:
        return parse_rocm_smi(self._tool_json("rocm-smi", ROCM_SMI_DISCOVER_ARGS))

    def sample(
        self, uuids: Sequence[str], pids: Collection[int] = (), *, every_process: bool = False
    ) -> dict[str, DeviceSample]:
        known = self.known_devices()
        wanted = [known[u] for u in dict.fromkeys(uuids) if u in known]
        if not wanted:
            return {}
        now = time.time()
        live = self._live(wanted)
        if every_process:  # every process this user may read the descriptors of (all, as root)
            vram = process_vram(_all_pids(self.proc_root), self.proc_root)
        else:
            vram = process_vram(set(pids), self.proc_root) if pids else {}
        out = {}
        for d in wanted:
            util, used, free = live.get(d.uuid, (None, None, None))
            procs = tuple(
                ProcessSample(pid=pid, memory_used_bytes=b)
                for pid, b in sorted(vram.get(d.pci_bus_id or "", {}).items())
            )
            out[d.uuid] = DeviceSample(
                uuid=d.uuid,
                timestamp=now,
                utilization_pct=util,
                memory_used_bytes=used,
                memory_free_bytes=free,
                processes=procs,
            )
        return out

    def health(self, uuids: Sequence[str]) -> dict[str, DeviceHealth]:
        """What amdgpu's sysfs tells of each device (docs/gpu-health.md): uncorrectable RAS
        errors (``device/ras/<block>_err_count``: ``ue: N``) are a problem that persists until
        the device is reset; a card found through sysfs whose directory is gone is lost (fell
        off the bus, or its driver was unbound). A device sysfs cannot show (amd-smi's
        numbering, no ``ras`` directory: RAS off or not supported) gives no signal."""
        known = self.known_devices()
        out: dict[str, DeviceHealth] = {}
        for u in uuids:
            d = known.get(u)
            if d is None:
                continue
            card = d.attributes.get("card")
            dev = self.sysfs_root / str(card) / "device" if isinstance(card, str) and card else None
            if dev is None or not self.sysfs_root.is_dir():
                out[u] = DeviceHealth.unknown(u)
            elif not dev.exists():
                found_here = d.attributes.get("source") == "sysfs"
                out[u] = (
                    DeviceHealth(uuid=u, lost=f"{card} is gone from {self.sysfs_root} (fell off the bus, or unbound)")
                    if found_here
                    else DeviceHealth.unknown(u)
                )
            else:
                out[u] = DeviceHealth(uuid=u, problems=ras_problems(dev / "ras"))
        return out

    def _live(self, devices: Sequence[Device]) -> dict[str, tuple[float | None, int | None, int | None]]:
        """uuid -> (utilisation, used, free) from the source that found the devices."""
        out = {}
        if self.source == "amd-smi":
            metrics = parse_amd_smi_metric(self._tool_json("amd-smi", AMD_SMI_SAMPLE_ARGS))
            for d in devices:
                util, used, free, total = metrics.get(d.attributes["gpu"], (None, None, None, None))
                out[d.uuid] = (
                    util,
                    used,
                    free if free is not None else free_bytes(total or d.memory_total_bytes, used),
                )
        elif self.source == "rocm-smi":
            cards = parse_rocm_smi_sample(self._tool_json("rocm-smi", ROCM_SMI_SAMPLE_ARGS))
            for d in devices:
                util, used, total = cards.get(d.attributes["card"], (None, None, None))
                out[d.uuid] = (util, used, free_bytes(total or d.memory_total_bytes, used))
        else:
            for d in devices:
                dev = self.sysfs_root / d.attributes["card"] / "device"
                used = parse_bytes(_read(dev / "mem_info_vram_used"), default_unit="B")
                out[d.uuid] = (
                    clamp_pct(parse_float(_read(dev / "gpu_busy_percent"))),
                    used,
                    free_bytes(d.memory_total_bytes, used),
                )
        return out
