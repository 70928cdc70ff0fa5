"""NVIDIA GPUs through the ``nvidia-smi`` command (the fallback when NVML cannot be loaded).

Discovery runs ``nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits``.
When a card has MIG enabled, its MIG instances are the leasable devices (the card itself is
left out: CUDA cannot use a MIG-enabled card as a whole): their UUIDs and profiles come from
``nvidia-smi -L`` and their memory from ``nvidia-smi -q -x``. Those two extra calls happen
only at discovery and only when some card has MIG on.

Sampling costs one ``nvidia-smi --query-gpu`` spawn for all devices, plus one
``--query-compute-apps`` spawn when per-process memory is asked for (nvidia-smi accepts a
single query per invocation). nvidia-smi has no per-process utilisation query; those
values are None. MIG instances sampled this way report None for utilisation (NVIDIA does
not report it under MIG) and for memory (``--query-gpu`` reports only the whole card).

The parsers take the text as printed and accept the CSV with or without a header and units
(a header, when present, decides the columns), nvidia-smi's placeholders (``[N/A]``,
``[Not Supported]``) and warning lines mixed into the output.
"""

from __future__ import annotations

import csv
import re
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace
from typing import Collection, Iterable, Sequence

from cuectl.errors import BackendOutputError, BackendUnavailable
from cuectl.gpu.base import Backend, ToolResult, clamp_pct, clean, free_bytes, parse_bytes, parse_float, run_tool
from cuectl.gpu.device import Device, DeviceHealth, DeviceSample, ProcessSample, normalize_pci_bus_id

TOOL = "nvidia-smi"
#: How often the health reading runs ``nvidia-smi -q -x`` at most (seconds); between, the last one.
HEALTH_EVERY_S = 60.0
INSTALL_HINT = (
    "install the NVIDIA driver (it ships nvidia-smi); inside a container run it with the "
    "NVIDIA container runtime (--gpus all)"
)

#: Discovery columns. ``compute_cap`` (driver >= ~510) and ``mig.mode.current`` (>= 450)
#: are optional: a driver that rejects one is asked again without it.
QUERY_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory.total",
    "memory.free",
    "memory.used",
    "utilization.gpu",
    "pci.bus_id",
    "driver_version",
    "compute_cap",
    "mig.mode.current",
)
OPTIONAL_FIELDS = frozenset({"compute_cap", "mig.mode.current"})
SAMPLE_FIELDS = ("uuid", "utilization.gpu", "memory.used", "memory.free")
APPS_FIELDS = ("pid", "gpu_uuid", "used_gpu_memory")
#: What a host loses when ``auto`` discovery falls back from NVML to nvidia-smi (said in the
#: worker's start-up warning).
FALLBACK_LIMITS = (
    "one nvidia-smi run per sample (slower), no per-process GPU utilisation, no live memory of MIG instances"
)

_FIELD_NAME_RE = re.compile(r"^[a-z][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")
_INVALID_FIELD_RE = re.compile(r'Field "([^"]+)" is not a valid field to query', re.IGNORECASE)
_WARNING_RE = re.compile(r"^\s*(warning|note)\b", re.IGNORECASE)

# (pattern in nvidia-smi's message, hint). The messages are fixed strings printed on stdout.
_ERROR_HINTS: tuple[tuple[str, str], ...] = (
    (
        "couldn't communicate with the nvidia driver",
        "the NVIDIA kernel module is not loaded: install the driver, reboot (or `sudo modprobe nvidia`), "
        "and check `dmesg` for errors",
    ),
    (
        "driver/library version mismatch",
        "the driver was upgraded but the old kernel module is still loaded: reboot, or reload the nvidia modules",
    ),
    (
        "no supported gpus were found",
        "no GPU is bound to the nvidia driver: check `lspci -k` and whether the GPU is passed to this machine",
    ),
    (
        "no devices were found",
        "the driver is loaded but sees no usable GPU: check `dmesg` (RmInitAdapter failed?) and whether this "
        "job/container was given a GPU",
    ),
    (
        "unknown error",
        "inside a container this usually follows a `systemctl daemon-reload` on the host: restart the container "
        "(see the NVIDIA container toolkit notes on cgroup device access)",
    ),
    ("nvml shared library not found", "install the NVIDIA driver (libnvidia-ml is part of it)"),
    ("insufficient permissions", "the user cannot open /dev/nvidia*: add it to the group that owns the device files"),
)


# --------------------------------------------------------------------------- CSV parsing


def _strip_unit(name: str) -> str:
    """``memory.total [MiB]`` -> ``memory.total`` (headers carry units even with nounits)."""
    return name.split("[", 1)[0].strip()


def _is_header(cells: Sequence[str], fields: Sequence[str] | None) -> bool:
    """A header row names fields: dotted identifiers, optionally with a unit.

    When the caller knows which fields it asked for, a header must also name one of them,
    so that a data row of bare words (``Enabled``) is never taken for a header.
    """
    if not cells or not all(_FIELD_NAME_RE.match(_strip_unit(c)) for c in cells):
        return False
    return fields is None or any(_strip_unit(c) in fields for c in cells)


def _data_lines(text: str) -> list[str]:
    """Non-empty lines minus the warnings nvidia-smi mixes into its output."""
    return [ln for ln in text.splitlines() if ln.strip() and not _WARNING_RE.match(ln)]


def parse_csv(text: str, fields: Sequence[str] | None = None) -> list[dict[str, str | None]]:
    """Rows of a ``--query-*`` CSV as ``{field: value or None}``.

    With a header line the header names the columns (fixtures with 200+ columns, or a
    header that a driver printed despite ``noheader``); without one ``fields`` does.
    Placeholders (``[N/A]``, ``[Not Supported]``) become None, units stay in the value.
    """
    lines = _data_lines(text)
    if not lines:
        return []
    rows = list(csv.reader(lines, skipinitialspace=True))
    if _is_header(rows[0], fields):
        names = [_strip_unit(c) for c in rows[0]]
        rows = rows[1:]
    elif fields is not None:
        names = list(fields)
    else:
        raise BackendOutputError(f"{TOOL}: CSV without a header and no field list to read it by")
    out = []
    for lineno, row in enumerate(rows, 1):
        if len(row) != len(names):
            raise BackendOutputError(
                f"{TOOL}: unexpected output line {lineno}: expected {len(names)} comma-separated values, "
                f"got {len(row)}: {', '.join(row)[:120]!r}",
                hint="run the nvidia-smi command by hand; an unusual driver or wrapper may print extra text",
            )
        out.append({name: clean(value) for name, value in zip(names, row)})
    return out


@dataclass(frozen=True)
class SmiGpuRow:
    """One card as ``--query-gpu`` reports it. Fields not queried are None."""

    index: int | None
    uuid: str | None
    name: str | None
    memory_total_bytes: int | None
    memory_free_bytes: int | None
    memory_used_bytes: int | None
    utilization_pct: float | None
    pci_bus_id: str | None
    driver_version: str | None
    compute_capability: str | None
    mig_enabled: bool


def parse_query_gpu(text: str, fields: Sequence[str] | None = QUERY_FIELDS) -> list[SmiGpuRow]:
    """``nvidia-smi --query-gpu=...`` output -> one ``SmiGpuRow`` per card."""
    out = []
    for row in parse_csv(text, fields):
        index = parse_float(row.get("index"))
        mig = (row.get("mig.mode.current") or "").lower()
        out.append(
            SmiGpuRow(
                index=int(index) if index is not None else None,
                uuid=row.get("uuid") or row.get("gpu_uuid"),
                name=row.get("name") or row.get("gpu_name"),
                memory_total_bytes=parse_bytes(row.get("memory.total")),
                memory_free_bytes=parse_bytes(row.get("memory.free")),
                memory_used_bytes=parse_bytes(row.get("memory.used")),
                utilization_pct=clamp_pct(parse_float(row.get("utilization.gpu"))),
                pci_bus_id=normalize_pci_bus_id(row.get("pci.bus_id") or row.get("gpu_bus_id")),
                driver_version=row.get("driver_version"),
                compute_capability=row.get("compute_cap"),
                mig_enabled=mig == "enabled",
            )
        )
    return out


@dataclass(frozen=True)
class SmiProcessRow:
    pid: int
    gpu_uuid: str | None
    memory_used_bytes: int | None  # None on Windows WDDM, where nvidia-smi prints [N/A]


def parse_compute_apps(text: str, fields: Sequence[str] | None = APPS_FIELDS) -> list[SmiProcessRow]:
    """``nvidia-smi --query-compute-apps=...`` output; header only or nothing = no processes."""
    out = []
    for row in parse_csv(text, fields):
        pid = parse_float(row.get("pid"))
        if pid is None:
            continue
        used = row.get("used_gpu_memory", row.get("used_memory"))
        out.append(SmiProcessRow(pid=int(pid), gpu_uuid=row.get("gpu_uuid"), memory_used_bytes=parse_bytes(used)))
    return out


# --------------------------------------------------------------------------- nvidia-smi -L


@dataclass(frozen=True)
class ListedMig:
    device_index: int  # "Device N" within its card; the <mig_device><index> of -q -x
    profile: str  # "3g.40gb", "1c.3g.71gb" (compute-instance prefix kept)
    uuid: str


@dataclass(frozen=True)
class ListedGpu:
    index: int
    name: str
    uuid: str
    migs: tuple[ListedMig, ...] = ()


_L_GPU_RE = re.compile(r"^GPU (\d+): (.*?) \(UUID: ([^)\s]+)\)\s*$")
_L_MIG_RE = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s+\(UUID:\s+([^)\s]+)\)\s*$")


def parse_list(text: str) -> list[ListedGpu]:
    """``nvidia-smi -L``: cards with their MIG instances (indented lines under each card)."""
    gpus: list[ListedGpu] = []
    for line in text.splitlines():
        m = _L_GPU_RE.match(line)
        if m:
            gpus.append(ListedGpu(index=int(m.group(1)), name=m.group(2).strip(), uuid=m.group(3)))
            continue
        m = _L_MIG_RE.match(line)
        if m and gpus:
            mig = ListedMig(device_index=int(m.group(2)), profile=m.group(1), uuid=m.group(3))
            gpus[-1] = replace(gpus[-1], migs=gpus[-1].migs + (mig,))
    return gpus


# --------------------------------------------------------------------------- nvidia-smi -q -x


@dataclass(frozen=True)
class XmlMig:
    index: int
    gpu_instance_id: int | None
    compute_instance_id: int | None
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    memory_free_bytes: int | None


@dataclass(frozen=True)
class XmlProcess:
    pid: int
    gpu_instance_id: int | None
    name: str | None
    memory_used_bytes: int | None


@dataclass(frozen=True)
class XmlGpu:
    device: Device
    mig_enabled: bool
    migs: tuple[XmlMig, ...] = ()
    processes: tuple[XmlProcess, ...] = ()


def _text(elem: ET.Element | None, path: str) -> str | None:
    if elem is None:
        return None
    found = elem.find(path)
    return clean(found.text) if found is not None and found.text is not None else None


def _int_text(elem: ET.Element | None, path: str) -> int | None:
    value = parse_float(_text(elem, path))
    return int(value) if value is not None else None


def parse_xml(text: str) -> list[XmlGpu]:
    """``nvidia-smi -q -x`` -> one ``XmlGpu`` per ``<gpu>`` element (whole cards).

    ``<attached_gpus>`` is not trusted: trimmed logs hold fewer ``<gpu>`` elements than it
    says. The position of a ``<gpu>`` is its index (nvidia-smi lists cards in PCI order).
    """
    try:
        root = ET.fromstring(text.strip())
    except ET.ParseError as exc:
        raise BackendOutputError(f"{TOOL} -q -x: not XML ({exc})") from None
    if root.tag != "nvidia_smi_log":
        raise BackendOutputError(f"{TOOL} -q -x: unexpected root element <{root.tag}>")
    driver = _text(root, "driver_version")
    cuda = _text(root, "cuda_version")
    out = []
    for index, gpu in enumerate(root.findall("gpu")):
        uuid = _text(gpu, "uuid")
        name = _text(gpu, "product_name")
        if uuid is None or name is None:
            raise BackendOutputError(f"{TOOL} -q -x: <gpu> {index} has no uuid or product_name")
        fb = gpu.find("fb_memory_usage")
        device = Device(
            index=index,
            uuid=uuid,
            vendor="NVIDIA",
            model=name,
            backend="smi",
            memory_total_bytes=parse_bytes(_text(fb, "total")),
            memory_free_bytes=parse_bytes(_text(fb, "free")),
            utilization_pct=clamp_pct(parse_float(_text(gpu, "utilization/gpu_util"))),
            pci_bus_id=normalize_pci_bus_id(_text(gpu, "pci/pci_bus_id") or gpu.get("id")),
            driver_version=driver,
            api_version=f"CUDA {cuda}" if cuda else None,
            cuda_version=cuda or None,
            attributes={"vendor_index": index},
        )
        mig_enabled = (_text(gpu, "mig_mode/current_mig") or "").lower() == "enabled"
        out.append(XmlGpu(device=device, mig_enabled=mig_enabled, migs=_xml_migs(gpu), processes=_xml_processes(gpu)))
    return out


#: What nvidia-smi prints for a card it cannot reach any more (on stdout, per card):
#: ``Unable to determine the device handle for GPU 0000:3B:00.0: GPU is lost. Reboot ...``.
_LOST_RE = re.compile(r"Unable to determine the device handle for GPU\s+([0-9A-Fa-f:.]+)\s*:\s*([^\n]*)")


def parse_xml_health(text: str) -> dict[str, DeviceHealth]:
    """``nvidia-smi -q -x`` -> each card's health (docs/gpu-health.md): uncorrectable ECC
    errors since the last reset (the volatile counts: ``*_uncorrectable``, or the older
    ``double_bit/total``), pending page retirement, pending or failed row remapping. "N/A"
    (not supported) is no problem. Xid events are not in nvidia-smi's output."""
    try:
        root = ET.fromstring(text.strip())
    except ET.ParseError as exc:
        raise BackendOutputError(f"{TOOL} -q -x: not XML ({exc})") from None
    out: dict[str, DeviceHealth] = {}
    for gpu in root.findall("gpu"):
        uuid = _text(gpu, "uuid")
        if uuid is None:
            continue
        problems = []
        volatile = gpu.find("ecc_errors/volatile")
        uncorrectable = 0
        if volatile is not None:
            counts = [e for e in volatile.iter() if "uncorrectable" in e.tag]
            counts += [t for db in volatile.iter("double_bit") for t in db.iter("total")]  # older drivers
            uncorrectable = sum(int(parse_float(e.text) or 0) for e in counts if e.text)
        if uncorrectable:
            problems.append(f"uncorrectable ECC errors: {uncorrectable} since the last reset")
        if "yes" in (
            (_text(gpu, "retired_pages/pending_retirement") or "").lower(),
            (_text(gpu, "retired_pages/pending_blacklist") or "").lower(),
        ):
            problems.append("page retirement pending (needs a reset)")
        if (_text(gpu, "remapped_rows/remapped_row_pending") or "").lower() == "yes":
            problems.append("row remapping pending (needs a reset)")
        if (_text(gpu, "remapped_rows/remapped_row_failure") or "").lower() == "yes":
            problems.append("row remapping failed (needs a reset)")
        out[uuid] = DeviceHealth(uuid=uuid, problems=tuple(problems))
    return out


def lost_bus_ids(output: str) -> dict[str, str]:
    """PCI bus id -> why, for the cards nvidia-smi says it cannot reach ("GPU is lost")."""
    return {
        str(normalize_pci_bus_id(m.group(1))): clean(m.group(2).rstrip(". ")) or "GPU is lost"
        for m in _LOST_RE.finditer(output)
    }


def parse_smi_xml(text: str) -> list[Device]:
    """The whole cards of an ``nvidia-smi -q -x`` log as devices (MIG instances aside)."""
    return [g.device for g in parse_xml(text)]


def _xml_migs(gpu: ET.Element) -> tuple[XmlMig, ...]:
    out = []
    for mig in gpu.findall("mig_devices/mig_device"):
        index = _int_text(mig, "index")
        if index is None:
            continue
        fb = mig.find("fb_memory_usage")
        out.append(
            XmlMig(
                index=index,
                gpu_instance_id=_int_text(mig, "gpu_instance_id"),
                compute_instance_id=_int_text(mig, "compute_instance_id"),
                memory_total_bytes=parse_bytes(_text(fb, "total")),
                memory_used_bytes=parse_bytes(_text(fb, "used")),
                memory_free_bytes=parse_bytes(_text(fb, "free")),
            )
        )
    return tuple(out)


def _xml_processes(gpu: ET.Element) -> tuple[XmlProcess, ...]:
    out = []
    for proc in gpu.findall("processes/process_info"):
        pid = _int_text(proc, "pid")
        if pid is None:
            continue
        out.append(
            XmlProcess(
                pid=pid,
                gpu_instance_id=_int_text(proc, "gpu_instance_id"),
                name=_text(proc, "process_name"),
                memory_used_bytes=parse_bytes(_text(proc, "used_memory")),
            )
        )
    return tuple(out)


# --------------------------------------------------------------------------- errors


def error_from_output(result: ToolResult) -> BackendUnavailable:
    """Turn a failed nvidia-smi run into a clear ``BackendUnavailable`` with a hint."""
    message = " ".join(ln.strip() for ln in result.output.splitlines() if ln.strip())
    lowered = message.lower()
    hint = next((h for pattern, h in _ERROR_HINTS if pattern in lowered), None)
    if not message:
        message = "no output"
    return BackendUnavailable(f"{TOOL} failed (exit {result.returncode}): {message}", hint=hint)


def invalid_field(result: ToolResult) -> str | None:
    """The field a driver rejected (``Field "compute_cap" is not a valid field to query.``)."""
    m = _INVALID_FIELD_RE.search(result.output)
    return m.group(1) if m else None


# --------------------------------------------------------------------------- backend


class SmiBackend(Backend):
    name = "smi"

    def __init__(self, *, timeout: float | None = None) -> None:
        super().__init__()
        self._timeout = timeout
        # Optional query fields this driver rejected (asked for once, then never again).
        self._dropped_fields: set[str] = set()
        # MIG instance uuid -> parent card uuid, from the last discovery.
        self._mig_parent: dict[str, str] = {}

    # -- health (docs/gpu-health.md): one ``-q -x`` a minute at most (it costs ~0.1-1 s)

    def health(self, uuids: Sequence[str]) -> dict[str, DeviceHealth]:
        now = time.monotonic()
        cached = getattr(self, "_health_cache", None)
        if cached is None or now - cached[0] >= HEALTH_EVERY_S:
            result = self._run(["-q", "-x"])
            lost = lost_bus_ids(result.output)
            readings = parse_xml_health(result.stdout) if result.returncode == 0 and result.stdout.strip() else {}
            for device in self.known_devices().values():
                bus = device.pci_bus_id
                if bus is not None and bus in lost and device.mig_parent_uuid is None:
                    readings[device.uuid] = DeviceHealth(uuid=device.uuid, lost=lost[bus])
            self._health_cache = cached = (now, readings)
        readings = cached[1]
        out: dict[str, DeviceHealth] = {}
        for u in uuids:
            h = readings.get(u)
            parent = readings.get(self._mig_parent.get(u, ""))
            # A MIG instance is as healthy as its card.
            out[u] = h if h is not None else replace(parent, uuid=u) if parent is not None else DeviceHealth.unknown(u)
        return out

    # -- running nvidia-smi

    def _run(self, args: Sequence[str]) -> ToolResult:
        kwargs = {} if self._timeout is None else {"timeout": self._timeout}
        return run_tool(TOOL, args, install_hint=INSTALL_HINT, **kwargs)

    def _checked(self, args: Sequence[str]) -> str:
        result = self._run(args)
        if result.returncode != 0:
            raise error_from_output(result)
        return result.stdout

    def _query_gpu(self) -> tuple[str, tuple[str, ...]]:
        """Run the discovery query, dropping optional fields an old driver rejects.

        Each rejected field is remembered for the life of this backend, so the retry
        costs one extra spawn once, not on every discovery.
        """
        while True:
            fields = tuple(f for f in QUERY_FIELDS if f not in self._dropped_fields)
            result = self._run([f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
            if result.returncode == 0:
                return result.stdout, fields
            bad = invalid_field(result)
            if bad in OPTIONAL_FIELDS and bad not in self._dropped_fields:
                self._dropped_fields.add(bad)
                continue
            raise error_from_output(result)

    # -- discovery

    def _discover(self) -> list[Device]:
        text, fields = self._query_gpu()
        rows = parse_query_gpu(text, fields)
        self._mig_parent.clear()
        devices: list[Device] = []
        mig_cards = [r for r in rows if r.mig_enabled]
        listed = {g.uuid: g for g in parse_list(self._checked(["-L"]))} if mig_cards else {}
        xml = {g.device.uuid: g for g in parse_xml(self._checked(["-q", "-x"]))} if mig_cards else {}
        for pos, row in enumerate(rows):
            if row.uuid is None or row.name is None:
                raise BackendOutputError(f"{TOOL}: a card without uuid or name in the query output")
            vendor_index = row.index if row.index is not None else pos
            if row.mig_enabled:
                devices.extend(self._mig_devices(row, vendor_index, listed.get(row.uuid), xml.get(row.uuid)))
            else:
                devices.append(_row_device(row, vendor_index))
        return [replace(d, index=i) for i, d in enumerate(devices)]

    def _mig_devices(
        self, row: SmiGpuRow, vendor_index: int, listed: ListedGpu | None, xml: XmlGpu | None
    ) -> list[Device]:
        """The MIG instances of a MIG-enabled card; the card itself is not leasable."""
        if listed is None:
            return []
        mem = {m.index: m for m in (xml.migs if xml else ())}
        out = []
        for mig in listed.migs:
            info = mem.get(mig.device_index)
            self._mig_parent[mig.uuid] = row.uuid or ""
            out.append(
                Device(
                    index=0,
                    uuid=mig.uuid,
                    vendor="NVIDIA",
                    model=f"{row.name} MIG {mig.profile}",
                    backend="smi",
                    memory_total_bytes=info.memory_total_bytes if info else None,
                    memory_free_bytes=info.memory_free_bytes if info else None,
                    utilization_pct=None,
                    pci_bus_id=row.pci_bus_id,
                    driver_version=row.driver_version,
                    compute_capability=row.compute_capability,
                    cuda_version=xml.device.cuda_version if xml else None,
                    mig_parent_uuid=row.uuid,
                    mig_profile=mig.profile,
                    attributes={
                        "vendor_index": vendor_index,
                        "mig_device_index": mig.device_index,
                        "gpu_instance_id": info.gpu_instance_id if info else None,
                    },
                )
            )
        return out

    # -- sampling

    def sample(
        self, uuids: Sequence[str], pids: Collection[int] = (), *, every_process: bool = False
    ) -> dict[str, DeviceSample]:
        known = self.known_devices()
        wanted = [u for u in dict.fromkeys(uuids) if u in known]
        if not wanted:
            return {}
        now = time.time()
        rows: dict[str | None, SmiGpuRow] = {}
        if any(u not in self._mig_parent for u in wanted):  # MIG instances get nothing from this query
            rows = {
                r.uuid: r
                for r in parse_query_gpu(
                    self._checked([f"--query-gpu={','.join(SAMPLE_FIELDS)}", "--format=csv,noheader,nounits"]),
                    SAMPLE_FIELDS,
                )
            }
        procs = self._processes(wanted, None if every_process else set(pids)) if pids or every_process else {}
        out = {}
        for u in wanted:
            row = rows.get(u)
            if u in self._mig_parent or row is None:
                out[u] = DeviceSample(uuid=u, timestamp=now, processes=procs.get(u, ()))
                continue
            used = row.memory_used_bytes
            free = row.memory_free_bytes
            if free is None:
                free = free_bytes(known[u].memory_total_bytes, used)
            out[u] = DeviceSample(
                uuid=u,
                timestamp=now,
                utilization_pct=row.utilization_pct,
                memory_used_bytes=used,
                memory_free_bytes=free,
                processes=procs.get(u, ()),
            )
        return out

    def _processes(self, wanted: Sequence[str], pids: set[int] | None) -> dict[str, tuple[ProcessSample, ...]]:
        """Per-process memory of ``pids`` (None: every compute process) on ``wanted``
        devices (one extra spawn).

        nvidia-smi names the parent card, not the MIG instance, for processes in a MIG
        instance; such a process is credited to the instance when exactly one of the
        wanted devices is an instance of that card (a frame holds its own instance).
        """
        rows = parse_compute_apps(
            self._checked([f"--query-compute-apps={','.join(APPS_FIELDS)}", "--format=csv,noheader,nounits"]),
            APPS_FIELDS,
        )
        target: dict[str, str] = {u: u for u in wanted}
        by_parent: dict[str, list[str]] = {}
        for u in wanted:
            parent = self._mig_parent.get(u)
            if parent is not None:
                by_parent.setdefault(parent, []).append(u)
        for parent, instances in by_parent.items():
            if len(instances) == 1:
                target[parent] = instances[0]
        out: dict[str, list[ProcessSample]] = {}
        for r in rows:
            dest = target.get(r.gpu_uuid or "")
            if dest is None or (pids is not None and r.pid not in pids):
                continue
            out.setdefault(dest, []).append(ProcessSample(pid=r.pid, memory_used_bytes=r.memory_used_bytes))
        return {u: tuple(v) for u, v in out.items()}


def _row_device(row: SmiGpuRow, vendor_index: int) -> Device:
    free = row.memory_free_bytes
    if free is None:
        free = free_bytes(row.memory_total_bytes, row.memory_used_bytes)
    return Device(
        index=vendor_index,
        uuid=row.uuid or "",
        vendor="NVIDIA",
        model=row.name or "",
        backend="smi",
        memory_total_bytes=row.memory_total_bytes,
        memory_free_bytes=free,
        utilization_pct=row.utilization_pct,
        pci_bus_id=row.pci_bus_id,
        driver_version=row.driver_version,
        compute_capability=row.compute_capability,
        attributes={"vendor_index": vendor_index},
    )


def rows_to_devices(rows: Iterable[SmiGpuRow]) -> list[Device]:
    """Whole-card devices of query rows that carry a uuid and a name (for tests and tools)."""
    return [_row_device(r, r.index if r.index is not None else i) for i, r in enumerate(rows) if r.uuid and r.name]
