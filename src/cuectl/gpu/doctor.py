"""Explain, backend by backend, what GPU discovery can and cannot see on this host.

``cuectl admin doctor`` and ``cuectl gpu list`` use this. Unlike ``discover("auto")``,
every real backend is probed (nvidia-smi too when NVML works), so the report says what
each one would find and, when one cannot run, what to install or fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from cuectl import config
from cuectl.errors import GpuError, InvalidInput
from cuectl.gpu import AUTO_ORDER, get_backend
from cuectl.gpu.base import Backend


@dataclass(frozen=True)
class BackendCheck:
    name: str
    ok: bool
    detail: str
    hint: str | None = None

    def line(self) -> str:
        return self.detail if not self.hint else f"{self.detail} (hint: {self.hint})"


def check_backends(
    *, fake_file: str | Path | None = None, make_backend: Callable[[str], Backend] | None = None
) -> list[BackendCheck]:
    """One check per real backend, plus ``fake`` when a fake-GPU file is configured."""
    path = fake_file if fake_file is not None else config.fake_gpus_file()
    names = list(AUTO_ORDER) + (["fake"] if path else [])
    checks = []
    for name in names:
        try:
            backend = make_backend(name) if make_backend else get_backend(name, fake_file=path)
            devices = backend.discover()
        except (GpuError, InvalidInput) as exc:
            checks.append(BackendCheck(name, False, exc.message, exc.hint))
            continue
        if not devices:
            checks.append(BackendCheck(name, True, "works, no GPU found"))
            continue
        models = sorted({d.model for d in devices})
        detail = f"{len(devices)} device(s): {', '.join(models)}"
        if name == "fake":
            detail += f" (from {path}; real backends are not used while CUECTL_FAKE_GPUS is set)"
        if name == "apple":
            detail += " (no isolation on macOS: frames see every GPU)"
        checks.append(BackendCheck(name, True, detail))
    return checks
