"""Apple GPUs (macOS) through ``system_profiler SPDisplaysDataType -json``.

- Apple Silicon GPUs share the host's memory: ``memory_total_bytes`` is the host RAM
  (``sysctl -n hw.memsize``) and ``unified_memory`` is True; ``gpu_cores`` comes from
  ``sppci_cores`` and the Metal support level goes into ``api_version``.
- Discrete GPUs of Intel Macs report ``spdisplays_vram``; they are listed with their own
  memory. Entries whose vendor cannot be told are skipped.
- Apple has no GPU UUID. The UUID is derived from host name, position and model, so it is
  stable on one machine and different across machines (``APPLE-<uuid5>``).
- macOS cannot hide a GPU from a process: there is no isolation, only usage reporting.
- Live values come from ``ioreg -r -d 1 -w 0 -c IOAccelerator`` ("Device Utilization %",
  "In use system memory") in one spawn per sample; where ioreg is missing or prints
  neither, the values are None. Per-process GPU use is not available (None).
"""

from __future__ import annotations

import json
import re
import time
import uuid as uuidlib
from typing import Any, Collection, Sequence

from cuectl import config
from cuectl.errors import BackendOutputError, BackendUnavailable, GpuError
from cuectl.gpu.base import Backend, clamp_pct, clean, parse_bytes, parse_float, run_tool
from cuectl.gpu.device import Device, DeviceSample, normalize_vendor

TOOL = "system_profiler"
INSTALL_HINT = "Apple GPUs are detected on macOS only (system_profiler is part of macOS)"
_UUID_NAMESPACE = uuidlib.UUID("1b4e28ba-2fa1-5d6e-8a6c-3c1f6a8e4b21")
_HEX_ID_RE = re.compile(r"0x[0-9a-f]{4}", re.IGNORECASE)
_IOREG_UTIL_RE = re.compile(r'"Device Utilization %"\s*=\s*(\d+)')
_IOREG_MEM_RE = re.compile(r'"In use system memory"\s*=\s*(\d+)')


def _vendor(entry: dict[str, Any]) -> str | None:
    """``sppci_vendor_Apple`` / ``Intel`` / ``AMD (0x1002)`` -> vendor enum, or None."""
    raw = clean(entry.get("spdisplays_vendor") or entry.get("sppci_vendor"))
    if raw is None:
        model = str(entry.get("sppci_model") or "")
        return "Apple" if model.startswith("Apple ") else None
    raw = re.sub(r"^sppci_vendor_", "", raw, flags=re.IGNORECASE)
    vendor = normalize_vendor(raw)
    if vendor:
        return vendor
    m = _HEX_ID_RE.search(raw)
    if m and normalize_vendor(m.group(0).lower()):
        return normalize_vendor(m.group(0).lower())
    return normalize_vendor(raw.split()[0]) if raw.split() else None


def metal_support(entry: dict[str, Any]) -> str | None:
    """The Metal support level as people write it: ``Metal 4``, ``Metal (GPU family Apple7)``."""
    for key in ("spdisplays_mtlgpufamilysupport", "spdisplays_metalfamily", "spdisplays_metal"):
        raw = clean(entry.get(key))
        if raw is None:
            continue
        value = re.sub(r"^spdisplays_", "", raw)
        m = re.fullmatch(r"metal(\d+)", value, re.IGNORECASE)
        if m:
            return f"Metal {m.group(1)}"
        m = re.fullmatch(r"mtlgpufamily(\D+?)(\d+)", value, re.IGNORECASE)
        if m:
            return f"Metal (GPU family {m.group(1).capitalize()}{m.group(2)})"
        if value.lower() == "supported":
            return "Metal"
        return value
    return None


def _model(entry: dict[str, Any]) -> str | None:
    for key in ("sppci_model", "_name"):
        value = clean(entry.get(key))
        if value and not value.startswith("kHW_"):  # "kHW_AppleM1Item" is a localisation key
            return value
    return None


def parse_system_profiler(text: str, memsize: int | None, *, host: str = "localhost") -> list[Device]:
    """GPUs of ``system_profiler SPDisplaysDataType -json``; ``memsize`` is ``hw.memsize``."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise BackendOutputError(f"{TOOL}: output is not JSON ({exc})") from None
    entries = data.get("SPDisplaysDataType") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise BackendOutputError(f"{TOOL}: no SPDisplaysDataType list in its output")
    devices: list[Device] = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        kind = clean(entry.get("sppci_device_type"))
        if kind is not None and kind != "spdisplays_gpu":
            continue
        vendor, model = _vendor(entry), _model(entry)
        if vendor is None or model is None:
            continue
        index = len(devices)
        vram = parse_bytes(entry.get("spdisplays_vram") or entry.get("_spdisplays_vram"), default_unit="MiB")
        unified = vendor == "Apple" or vram is None
        cores = parse_float(entry.get("sppci_cores"))
        devices.append(
            Device(
                index=index,
                uuid=f"APPLE-{uuidlib.uuid5(_UUID_NAMESPACE, f'{host}/{index}/{model}')}",
                vendor=vendor,
                model=model,
                backend="apple",
                memory_total_bytes=memsize if unified else vram,
                memory_free_bytes=None,
                utilization_pct=None,
                gpu_cores=int(cores) if cores is not None else None,
                unified_memory=unified,
                api_version=metal_support(entry),
                attributes={"vendor_index": index, "isolation": "none"},
            )
        )
    return devices


def parse_ioreg(text: str) -> list[tuple[float | None, int | None]]:
    """(utilisation %, in-use memory bytes) per IOAccelerator, in ioreg's order."""
    out = []
    for block in re.split(r"^\+-o ", text, flags=re.MULTILINE)[1:]:
        util = _IOREG_UTIL_RE.search(block)
        mem = _IOREG_MEM_RE.search(block)
        if util or mem:
            out.append((clamp_pct(float(util.group(1))) if util else None, int(mem.group(1)) if mem else None))
    return out


class AppleBackend(Backend):
    name = "apple"

    def __init__(self, *, host: str | None = None) -> None:
        super().__init__()
        self._host = host

    def _discover(self) -> list[Device]:
        result = run_tool(TOOL, ["SPDisplaysDataType", "-json"], install_hint=INSTALL_HINT)
        if result.returncode != 0:
            raise BackendUnavailable(f"{TOOL} failed (exit {result.returncode}): {result.output.strip()[:200]}")
        memsize = self._memsize()
        return parse_system_profiler(result.stdout, memsize, host=self._host or config.hostname())

    def _memsize(self) -> int | None:
        """Host RAM in bytes; None (not an error) when sysctl cannot tell."""
        try:
            result = run_tool("sysctl", ["-n", "hw.memsize"], install_hint=INSTALL_HINT)
        except BackendUnavailable:
            return None
        value = parse_float(result.stdout) if result.returncode == 0 else None
        return int(value) if value is not None else None

    def sample(
        self, uuids: Sequence[str], pids: Collection[int] = (), *, every_process: bool = False
    ) -> dict[str, DeviceSample]:
        known = self.known_devices()
        wanted = [u for u in dict.fromkeys(uuids) if u in known]
        if not wanted:
            return {}
        readings = self._ioreg()
        devices = sorted(known.values(), key=lambda d: d.index)
        # ioreg lists accelerators in its own order; trust positions only when the counts agree.
        by_uuid = {d.uuid: readings[i] for i, d in enumerate(devices)} if len(readings) == len(devices) else {}
        now = time.time()
        out = {}
        for u in wanted:
            util, used = by_uuid.get(u, (None, None))
            out[u] = DeviceSample(uuid=u, timestamp=now, utilization_pct=util, memory_used_bytes=used)
        return out

    def _ioreg(self) -> list[tuple[float | None, int | None]]:
        try:
            result = run_tool("ioreg", ["-r", "-d", "1", "-w", "0", "-c", "IOAccelerator"], install_hint=INSTALL_HINT)
        except GpuError:
            return []
        return parse_ioreg(result.stdout) if result.returncode == 0 else []
