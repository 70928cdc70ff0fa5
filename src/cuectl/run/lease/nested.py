"""Leases taken inside a frame: drawn only from the frame's own devices.

A frame's devices are leased for it already: the worker's lock fds are inherited by the
frame's processes. A ``cuectl.lease()`` or ``cuectl run`` inside the frame therefore does
not take those locks again (it would wait for its own frame), and never another device
(that would break the frame's isolation and the scheduler's accounting). Instead:

- the candidates are the frame's devices (``CUE_GPU_UUIDS``); a request the frame's devices
  can never satisfy — more devices than the frame has, a device outside it, a model or
  memory it lacks — is refused with ``NoMatchingDevice`` / ``InvalidDevice``;
- the lease takes *sub-locks* of those devices, in ``<lock dir>/nested/<uid>/<level>/``: they are
  the same kind of kernel lock, so two sub-leases of one frame (``cuectl run --gpus 1`` twice
  in a 2-GPU frame) get different devices, wait for each other with ``--wait``, and are
  released when their holders die. Only the frame holding a device ever uses its sub-lock;
  its processes run as one user (the frame's), whose directory of sub-locks is her own
  (``sublock_dir``): in a shared lock directory a directory another user made, or could
  remove, would be refused (``lockfile.check_lock_dir``), and one user's frame would stop
  the next user's nested leases;
- the lease's environment names its devices (a subset of the frame's) and one level more
  (``CUE_LEASE_LEVEL``), so a lease inside *that* one uses the next level's sub-locks.

"Inside a frame" is what the frame environment says (``CUE_FRAME_ID`` and ``CUE_GPUS``), as
for every other frame variable; it is checked against the kernel: each of the frame's
devices must be leased right now, or the environment is a stale copy and the lease is
refused. Leases are cooperative (docs/security.md): a process that lies in its environment
can equally ignore ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from cuectl import config
from cuectl.errors import InvalidDevice, LeaseError, NoMatchingDevice
from cuectl.gpu.device import Device
from cuectl.run.lease.locks import NESTED_DIRNAME, lock_path
from cuectl.run.lockfile import probe_held

#: How deep the lease whose environment we run in is nested (a frame's own: 0).
LEVEL_VAR = "CUE_LEASE_LEVEL"


@dataclass(frozen=True)
class Allocation:
    """The devices of the frame (or nested lease) this process runs in."""

    frame: str
    uuids: tuple[str, ...]
    level: int = 0

    @classmethod
    def enclosing(cls) -> "Allocation | None":
        """The allocation the environment describes, or None outside any frame."""
        frame = config.env("CUE_FRAME_ID")
        if frame is None or config.env("CUE_GPUS") is None:
            return None
        uuids = tuple(u for u in (config.env("CUE_GPU_UUIDS") or "").split(",") if u)
        try:
            level = max(0, int(config.env(LEVEL_VAR) or 0))
        except ValueError:
            level = 0
        return cls(frame=frame, uuids=uuids, level=level)

    def _listing(self, inventory: Sequence[Device]) -> str:
        if not self.uuids:
            return "no GPU"
        index = {d.uuid: d.index for d in inventory}
        names = ", ".join(f"gpu {index[u]}" if u in index else u for u in self.uuids)
        return f"{len(self.uuids)} device{'s' if len(self.uuids) != 1 else ''} ({names})"

    def restrict(self, candidates: Sequence[Device], inventory: Sequence[Device], *, named: bool) -> tuple[Device, ...]:
        """The candidates that belong to the frame; a device named outside it is an error."""
        known = {d.uuid for d in inventory}
        missing = [u for u in self.uuids if u not in known]
        if missing:
            raise NoMatchingDevice(
                f"inside frame {self.frame}: its device {missing[0]} is not among this host's GPUs",
                hint="the GPU discovery here differs from the worker's (CUECTL_FAKE_GPUS?)",
            )
        if named:
            outside = [d for d in candidates if d.uuid not in self.uuids]
            if outside:
                d = outside[0]
                raise InvalidDevice(
                    f"inside frame {self.frame}: device {d.index} ({d.uuid}) is not one of the "
                    f"frame's devices; the frame has {self._listing(inventory)}",
                    hint="a lease inside a frame can use only the frame's devices",
                )
        return tuple(d for d in candidates if d.uuid in self.uuids)

    def refusal(self, gpus: int, candidates: Sequence[Device], reason: str | None) -> NoMatchingDevice:
        has = self._listing(candidates)
        if gpus > len(self.uuids):
            message = (
                f"inside frame {self.frame}: asks for {gpus} device{'s' if gpus != 1 else ''} but the frame "
                f"has {has}; a lease inside a frame can use only the frame's devices"
            )
        else:
            message = f"inside frame {self.frame}: none of its {has} can satisfy the request: {reason}"
        return NoMatchingDevice(message, hint="request the devices in the frame's layer (gpus, gpu_models, ...)")

    def check_held(self, lock_dir: Path) -> None:
        """Each of the frame's devices must be leased now (by the frame): otherwise the
        environment outlived its frame, and sub-locks would guard nothing."""
        for uuid in self.uuids:
            if not probe_held(lock_path(lock_dir, uuid)):
                raise LeaseError(
                    f"the environment says this runs inside frame {self.frame}, but its device {uuid} "
                    f"is not leased: the frame has ended, or this environment was copied from it",
                    hint="unset CUE_FRAME_ID and CUE_GPUS to take a lease of your own",
                )


def sublock_dir(lock_dir: Path, level: int) -> Path:
    """Where the sub-locks of nesting ``level`` (1: a lease inside a frame) live: below
    ``nested/``, in a directory of this user's own."""
    return lock_dir / NESTED_DIRNAME / str(os.geteuid()) / str(level)
