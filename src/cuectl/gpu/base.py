"""The backend interface and the helpers every backend shares.

A backend turns one vendor tool or library into immutable ``Device`` snapshots and
``DeviceSample`` readings. Rules every backend keeps:

- ``discover`` raises ``BackendUnavailable`` (library/tool missing, no driver, tool
  failed) or ``BackendOutputError`` (the tool ran but printed something unparseable);
  a value the hardware does not report is ``None``, never an exception.
- ``sample`` costs one batch of calls for all the devices asked for, never one per device.
- Tools are looked up on ``PATH`` at call time (tests put stub executables there) and run
  with a timeout; a tool that hangs is ``BackendUnavailable``, not a hung worker.
"""

from __future__ import annotations

import abc
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Collection, Mapping, Sequence

from cuectl.errors import BackendUnavailable
from cuectl.gpu.device import Device, DeviceHealth, DeviceSample
from cuectl.units import GIB, KIB, MIB, TIB

#: Seconds any GPU tool may take. nvidia-smi on a host with a wedged GPU can block for
#: minutes; a worker must notice and carry on instead.
TOOL_TIMEOUT_S = 10.0


class Backend(abc.ABC):
    """One way of finding GPUs. Instances cache what they learnt in ``discover``."""

    name: str = ""

    def __init__(self) -> None:
        # uuid -> Device of the last discovery; sample() needs it to map uuids to the
        # backend's own handles (index, card name, NVML handle ...).
        self._known: dict[str, Device] | None = None

    def discover(self) -> list[Device]:
        """Every leasable device this backend sees, with the live values of this moment."""
        devices = self._discover()
        self._known = {d.uuid: d for d in devices}
        return devices

    @abc.abstractmethod
    def _discover(self) -> list[Device]:
        """Backend-specific discovery; ``Device.index`` is the backend's own order."""

    @abc.abstractmethod
    def sample(
        self, uuids: Sequence[str], pids: Collection[int] = (), *, every_process: bool = False
    ) -> dict[str, DeviceSample]:
        """Live utilisation and memory of ``uuids`` (unknown ones are skipped).

        ``DeviceSample.processes`` lists only processes whose pid is in ``pids``, or, with
        ``every_process``, every process the tool sees on the device (whoever runs it: the
        worker's ownership map, docs/gpu-health.md); the pids of another PID namespace are
        as the tool gives them.
        """

    def health(self, uuids: Sequence[str]) -> dict[str, DeviceHealth]:
        """What the backend can tell of each device's health (docs/gpu-health.md): gone,
        Xid events since the last call, uncorrectable ECC errors, pending retirement or
        remapping. The default, for a backend that cannot tell: unknown for each (no
        signal). Like ``sample``: one batch for all of ``uuids``; never raises for a value
        the device does not report."""
        return {u: DeviceHealth.unknown(u) for u in uuids}

    def known_devices(self) -> dict[str, Device]:
        """The devices of the last discovery, discovering once if nothing is known yet."""
        if self._known is None:
            self.discover()
        assert self._known is not None
        return self._known


# --------------------------------------------------------------------------- tools


class ToolMissing(BackendUnavailable):
    """The tool is not on PATH: the usual, quiet reason a backend does not apply here."""


@dataclass(frozen=True)
class ToolResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        """stdout and stderr together: nvidia-smi prints its errors on stdout, others not."""
        if self.stderr.strip():
            return f"{self.stdout}\n{self.stderr}" if self.stdout.strip() else self.stderr
        return self.stdout


def find_tool(tool: str) -> str | None:
    """Full path of ``tool`` on the current ``PATH`` (looked up at every call, not cached)."""
    return shutil.which(tool)


def run_tool(tool: str, args: Sequence[str], *, install_hint: str, timeout: float = TOOL_TIMEOUT_S) -> ToolResult:
    """Run ``tool args...`` and capture its output; never raises for a non-zero exit.

    Raises ``BackendUnavailable`` when the tool is not on PATH, cannot be executed or
    does not finish within ``timeout`` seconds.
    """
    path = find_tool(tool)
    if path is None:
        raise ToolMissing(f"{tool} not found on PATH", hint=install_hint)
    argv = (path, *args)
    posix = sys.platform != "win32"
    try:
        # A session of its own so that a timeout kills the tool *and* anything it
        # started (a wrapper script's children would otherwise keep the pipes open).
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            encoding="utf-8",
            errors="replace",
            start_new_session=posix,
        )
    except OSError as exc:
        raise BackendUnavailable(f"cannot run {path}: {exc.strerror or exc}", hint=install_hint) from None
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc, posix)
        proc.communicate()
        raise BackendUnavailable(
            f"{tool} did not answer within {timeout:g} s",
            hint="a GPU or its driver may be hung; check `dmesg` and the tool by hand",
        ) from None
    return ToolResult(argv, proc.returncode, stdout, stderr)


def _kill(proc: subprocess.Popen, posix: bool) -> None:
    try:
        if posix:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except (ProcessLookupError, PermissionError):
        pass


# --------------------------------------------------------------------------- values

#: What vendor tools print for "no value": nvidia-smi uses bracketed words, rocm-smi
#: "N/A" and suffixed variants such as "N/A (Secondary die)".
_MISSING_RE = re.compile(r"^\s*(\[.*\]|n/?a\b.*|none|unknown|-|)\s*$", re.IGNORECASE)


def clean(value: object) -> str | None:
    """A tool's text value, stripped, or None for N/A-style placeholders."""
    if value is None:
        return None
    text = str(value).strip()
    if _MISSING_RE.match(text):
        return None
    return text


_NUMBER_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([a-z%]*)\s*$", re.IGNORECASE)
_UNIT_BYTES = {
    "": 1,
    "b": 1,
    "kib": KIB,
    "kb": KIB,
    "mib": MIB,
    "mb": MIB,
    "gib": GIB,
    "gb": GIB,
    "tib": TIB,
    "tb": TIB,
}


def parse_float(value: object) -> float | None:
    """``"73 %"`` / ``"73"`` / ``73`` -> 73.0; placeholders and garbage -> None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    text = clean(value)
    if text is None:
        return None
    m = _NUMBER_RE.match(text)
    return float(m.group(1)) if m else None


def parse_bytes(value: object, *, default_unit: str = "MiB") -> int | None:
    """``"81559 MiB"`` -> bytes; a bare number is in ``default_unit``.

    Vendor tools write ``MB``/``GB`` for binary units (nvidia-smi, amd-smi, macOS), so
    those are read as MiB/GiB.
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return int(value * _UNIT_BYTES[default_unit.lower()])
    text = clean(value)
    if text is None:
        return None
    m = _NUMBER_RE.match(text)
    if not m:
        return None
    unit = (m.group(2) or default_unit).lower()
    if unit not in _UNIT_BYTES:
        return None
    return int(float(m.group(1)) * _UNIT_BYTES[unit])


def clamp_pct(value: float | None) -> float | None:
    """Utilisation readings outside 0..100 are tool glitches; keep them in range."""
    if value is None:
        return None
    return min(100.0, max(0.0, value))


def lookup(mapping: Mapping[str, object], *keys: str) -> object | None:
    """First present key, case-insensitively (tools change key casing between releases)."""
    lowered = {str(k).lower(): v for k, v in mapping.items()}
    for key in keys:
        if key.lower() in lowered:
            return lowered[key.lower()]
    return None


def free_bytes(total: int | None, used: int | None) -> int | None:
    if total is None or used is None:
        return None
    return max(0, total - used)
