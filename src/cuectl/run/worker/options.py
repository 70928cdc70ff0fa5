"""What a worker is told (``WorkerOptions``, built by run/service.py) and what one discovery
of the GPUs gives it (``Inventory``, with its ``Sampler``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence

from cuectl.gpu.device import CRITICAL_XIDS, Device
from cuectl.run import launch
from cuectl.run.hostschedule import Schedule
from cuectl.sched.model import DEFAULT_GPU_IDLE_UTIL


@dataclass(frozen=True)
class WorkerOptions:
    name: str
    lock_dir: Path
    state_dir: Path  # host-local: run files of this worker's frames
    log_dir: str
    cores: float
    memory_bytes: int
    poll_s: float = 1.0
    sample_interval_s: float = 10.0
    lease_timeout_s: float = 60.0
    gpu_only: bool = False
    tags: tuple[str, ...] = ()
    max_frames: int | None = None
    until_idle: bool = False
    kill_grace_s: float = 5.0
    crash_at: str | None = None  # test hook: os._exit at a named point (chaos tests)
    # Security (docs/security.md): run only these users' jobs (empty = anyone's), and run
    # each frame as its submitting user (a root worker does, as OpenCue's RQD).
    allowed_users: tuple[str, ...] = ()
    run_as_submitter: bool = False
    log_limit_bytes: int = launch.DEFAULT_LOG_LIMIT  # per attempt, unless the layer sets its own
    # Look for GPUs again this often (0: only on SIGHUP): MIG reconfigured, a GPU fell off the bus.
    rediscover_interval_s: float = 300.0
    # `cuectl worker --probe` reads this file (None: not written): the loop is alive, the store answers.
    heartbeat_file: Path | None = None
    # GPU-aware NIMBY: a device that a process not of cuectl's uses above either figure gets
    # no new frame until that use is gone (None: that check off).
    nimby_memory_bytes: int | None = None
    nimby_util_pct: float | None = None
    # When this worker takes new frames (``--available``; None: always).
    schedule: Schedule | None = None
    # How long the highest-priority GPU frame that does not fit yet may hold the free devices
    # it could use (a reservation) before backfill gets them again for as long (0: never reserve).
    reservation_timeout_s: float = 1800.0
    # Sick GPUs (docs/gpu-health.md): the Xid codes that drain a device (the critical ones,
    # and any the admin adds with --gpu-xid-drain), and how many different jobs must fail on
    # a device while they succeed elsewhere to drain it as suspect (0: never).
    gpu_xid_drain: frozenset[int] = CRITICAL_XIDS
    gpu_suspect_jobs: int = 3
    # The farm's GPU policies (docs/gpu-health.md), for layers that set none: a frame's
    # process on a device it was not given (warn|kill); every held device under
    # ``gpu_idle_util`` % for ``gpu_idle_limit_s`` (None: no idle rule), then warn|kill.
    gpu_escape: str = "warn"
    gpu_idle_limit_s: float | None = None
    gpu_idle_action: str = "warn"
    gpu_idle_util: float = DEFAULT_GPU_IDLE_UTIL


class Sampler(Protocol):
    """``sampler(uuids, pids)``: live values of those devices (``cuectl.gpu.Discovery.sample``);
    ``every_process``: with every process on each device, not only ``pids``."""

    def __call__(self, uuids: Sequence[str], pids: Sequence[int], *, every_process: bool = False) -> dict: ...


#: ``health(uuids)``: uuid -> ``DeviceHealth`` (``cuectl.gpu.Discovery.health``).
HealthReader = Callable[[Sequence[str]], dict]


@dataclass(frozen=True)
class Inventory:
    """What one discovery found: the devices to lease and how to sample them, and what each
    backend had to say about devices it could not offer (backend name -> why), so that a
    device missing from the next inventory can be explained."""

    devices: tuple[Device, ...]
    sampler: Sampler | None = None
    problems: Mapping[str, str] = field(default_factory=dict)
    # ``health(uuids)``: each device's health (``cuectl.gpu.Discovery.health``); None: unknown.
    health: HealthReader | None = None
