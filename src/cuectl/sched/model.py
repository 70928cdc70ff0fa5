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
# States that satisfy a dependency. OpenCue's default (Cuebot's
# depend.satisfy_only_on_frame_success=true) is SUCCEEDED alone: the dependents of an EATEN
# frame keep waiting (and a layer releases its dependents once all its frames SUCCEEDED).
# The store setting depend.satisfy_on_eaten (SATISFY_ON_EATEN) makes EATEN count too.
RELEASING_STATES = (SUCCEEDED,)
RELEASING_STATES_WITH_EATEN = (SUCCEEDED, EATEN)

# Store-wide settings (the meta table; `cuectl admin setting`): name -> (default, help).
SATISFY_ON_EATEN = "depend.satisfy_on_eaten"
SETTINGS: dict[str, tuple[bool, str]] = {
    SATISFY_ON_EATEN: (False, "an EATEN frame satisfies its dependents, as a SUCCEEDED one does "
                              "(OpenCue's depend.satisfy_only_on_frame_success=false)"),
}

# A host is DOWN when its worker has not heartbeated for this long (the default frame lease
# timeout): by then its frames are presumed lost too.
HOST_DOWN_AFTER_S = 60.0

# A failed frame waits this long before its next attempt, doubled for each further failure
# and capped (a layer's ``retry_delay`` overrides the first figure; 0 retries at once).
DEFAULT_RETRY_DELAY_S = 2.0
MAX_RETRY_DELAY_S = 600.0


def retry_delay(first_s: float | None, failures: int) -> float:
    """Seconds before the next attempt after ``failures`` failed ones (1 = the first)."""
    base = DEFAULT_RETRY_DELAY_S if first_s is None else first_s
    if base <= 0:
        return 0.0
    return min(base * 2 ** max(0, failures - 1), max(MAX_RETRY_DELAY_S, base))

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
    # At most this many frames of the layer RUNNING at once, farm-wide (None: no cap).
    max_running: int | None = None
    # Named limits (``cuectl admin limit set NAME N``) each running frame of the layer holds one of.
    limits: tuple[str, ...] = ()
    # Seconds before a failed frame runs again; doubled for each further failure (None: the default).
    retry_delay_s: float | None = None
    # The directory its frames run in (absolute; None: the worker's own, for specs built by
    # library callers that capture nothing).
    cwd: str | None = None
    type: str = "Render"  # OpenCue's layer type: Render, Util, or Post (runs after the others)


NOTIFY_EVENTS = ("finished", "failed", "dead")
NOTIFY_KINDS = ("command", "webhook", "email")


@dataclass(frozen=True)
class Notify:
    """One ``notify:`` entry: tell ``target`` (a shell command, an http(s) URL or an email
    address, by ``kind``) on each of the events ``on`` (docs/notifications.md)."""

    kind: str  # one of NOTIFY_KINDS
    target: str
    on: tuple[str, ...] = ("finished", "failed")

    def to_json(self) -> dict[str, object]:
        return {"on": list(self.on), self.kind: self.target}


@dataclass(frozen=True)
class JobSpec:
    name: str
    user: str
    layers: tuple[LayerSpec, ...]
    priority: int = 0
    paused: bool = False
    project: str | None = None  # a label for quotas and reports (``--project``)
    # Caps on the whole job's RUNNING frames, farm-wide (OpenCue's maxcores/maxgpus); None: none.
    max_running: int | None = None
    max_cores: float | None = None
    max_gpus: int | None = None
    # Who is told when the job finishes, fails or a frame goes DEAD (``notify:``).
    notify: tuple[Notify, ...] = ()
    # The expanded frames of each layer, computed once at validation (same order as layers):
    # each entry is a tuple of chunks, each chunk a tuple of frame numbers.
    chunks: tuple[tuple[tuple[int, ...], ...], ...] = field(default=(), compare=False)
