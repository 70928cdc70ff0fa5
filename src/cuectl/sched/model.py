"""The job model: what a job spec says (``JobSpec``/``LayerSpec``) and the frame states.

Specs are plain, validated values; the store turns them into rows. Parsing and validation
live in ``cuectl.sched.spec``; frame range expansion in ``cuectl.sched.frameset``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

WAITING = "WAITING"
DEPEND = "DEPEND"
RUNNING = "RUNNING"
SUCCEEDED = "SUCCEEDED"
DEAD = "DEAD"
EATEN = "EATEN"
FRAME_STATES = (WAITING, DEPEND, RUNNING, SUCCEEDED, DEAD, EATEN)
DONE_STATES = (SUCCEEDED, DEAD, EATEN)
# States that satisfy a dependency (OpenCue: an eaten frame counts as done for dependents).
RELEASING_STATES = (SUCCEEDED, EATEN)

# A host is DOWN when its worker has not heartbeated for this long (the default frame lease
# timeout): by then its frames are presumed lost too.
HOST_DOWN_AFTER_S = 60.0

JOB_PENDING = "PENDING"
JOB_FINISHED = "FINISHED"

DependType = Literal["layer", "frame"]


@dataclass(frozen=True)
class Dependency:
    """``layer``: wait for every frame of ``on``; ``frame``: frame N waits for frame N of ``on``."""

    on: str
    type: DependType = "layer"


@dataclass(frozen=True)
class LayerSpec:
    name: str
    command: tuple[str, ...] | str  # argv, or one shell string run by /bin/sh -c
    range: str = "1"
    chunk: int = 1
    gpus: int = 0
    gpu_vendor: str | None = None  # normalised: NVIDIA, AMD, Apple, Intel
    gpu_models: tuple[str, ...] = ()
    gpu_memory_min_bytes: int = 0
    cores: float = 1.0
    memory_bytes: int = 0
    retries: int = 3
    timeout_s: float | None = None
    env: tuple[tuple[str, str], ...] = ()
    tags: tuple[str, ...] = ()
    depends: tuple[Dependency, ...] = ()
    log_limit_bytes: int | None = None  # cap on each attempt's log; None = the worker's


@dataclass(frozen=True)
class JobSpec:
    name: str
    user: str
    layers: tuple[LayerSpec, ...]
    priority: int = 0
    paused: bool = False
    # The expanded frames of each layer, computed once at validation (same order as layers):
    # each entry is a tuple of chunks, each chunk a tuple of frame numbers.
    chunks: tuple[tuple[tuple[int, ...], ...], ...] = field(default=(), compare=False)
