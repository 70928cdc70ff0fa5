"""The job model: what a job spec says (``JobSpec``/``LayerSpec``) and the frame states.

Specs are plain, validated values; the store turns them into rows. Parsing and validation
live in ``cuectl.sched.spec``; frame range expansion in ``cuectl.sched.frameset``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal, Mapping

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
    SATISFY_ON_EATEN: (
        False,
        "an EATEN frame satisfies its dependents, as a SUCCEEDED one does "
        "(OpenCue's depend.satisfy_only_on_frame_success=false)",
    ),
}

# A host is DOWN when its worker has not heartbeated for this long (the default frame lease
# timeout): by then its frames are presumed lost too.
HOST_DOWN_AFTER_S = 60.0

# A failed frame waits this long before its next attempt, doubled for each further failure
# and capped (a layer's ``retry_delay`` overrides the first figure; 0 retries at once).
DEFAULT_RETRY_DELAY_S = 2.0
MAX_RETRY_DELAY_S = 600.0


# The values of a layer's ``retry_on_gpu_oom`` (the first is the default).
RETRY_ON_GPU_OOM = ("same", "bigger")
# What the worker does when a GPU policy trips (docs/gpu-health.md): ``gpu_escape``,
# ``gpu_idle_action`` and ``gpu_share_enforce`` take one of these.
GPU_POLICY_ACTIONS = ("warn", "kill")
# The utilisation under which a held device counts as idle, unless a layer says otherwise.
DEFAULT_GPU_IDLE_UTIL = 5.0


def retry_delay(first_s: float | None, failures: int) -> float:
    """Seconds before the next attempt after ``failures`` failed ones (1 = the first)."""
    base = DEFAULT_RETRY_DELAY_S if first_s is None else first_s
    if base <= 0:
        return 0.0
    return min(base * 2 ** max(0, failures - 1), max(MAX_RETRY_DELAY_S, base))


JOB_PENDING = "PENDING"
JOB_FINISHED = "FINISHED"
# Never stored: what views show for a PENDING job with a running frame (views.job_display_state).
JOB_RUNNING = "RUNNING"

# How a layer waits on a layer: ``layer`` for all its frames, ``frame`` frame by frame (frame N
# on frame N), ``previous`` frame N on the frame before N's place (OpenCue's previous-frame),
# ``any`` for any one of its frames (OpenCue's layer-on-layer with anyframe).
DependType = Literal["layer", "frame", "previous", "any"]
DEPEND_TYPES: tuple[str, ...] = ("layer", "frame", "previous", "any")
# OpenCue's dependency types (DependType in its proto), spelled as `job depend --type` takes
# them; each stored dependency is one of these.
OPENCUE_DEPEND_TYPES = (
    "job-on-job",
    "job-on-layer",
    "job-on-frame",
    "layer-on-job",
    "layer-on-layer",
    "layer-on-frame",
    "frame-on-job",
    "frame-on-layer",
    "frame-on-frame",
    "frame-by-frame",
    "previous-frame",
    "layer-on-sim-frame",
)


@dataclass(frozen=True)
class Dependency:
    """What a layer (or, in ``JobSpec.depends``, a whole job) waits for.

    ``on``: a layer (None: the whole job ``job``); ``job``: another job, by name or id (None:
    this job); ``frame``: one frame number of layer ``on`` (the frame holding it, when
    chunked) instead of the whole layer; ``type``: how a layer waits on a layer (DependType).
    """

    on: str | None
    type: DependType = "layer"
    job: str | None = None
    frame: int | None = None

    @property
    def kind(self) -> str:
        """The target half of its OpenCue type: ``job``, ``layer`` or ``frame``."""
        return "job" if self.on is None else ("frame" if self.frame is not None else "layer")

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {}
        if self.job is not None:
            out["job"] = self.job
        if self.on is not None:
            out["layer"] = self.on
        if self.frame is not None:
            out["frame"] = self.frame
        if self.on is not None and self.frame is None:
            out["type"] = self.type
        return out


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
    # Per-device version minimums, dotted texts as given (None: any): CUDA compute
    # capability, driver version, the driver's CUDA version (sched/match.py compares them).
    gpu_capability_min: str | None = None
    gpu_driver_min: str | None = None
    gpu_cuda_min: str | None = None
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
    # Where an attempt that ran out of GPU memory (failure kind ``gpu-oom``) runs again:
    # ``same`` (any fitting device, like any failure) or ``bigger`` (only devices with more
    # memory than the one it failed on; DEAD at once when the farm has none). RETRY_ON_GPU_OOM.
    retry_on_gpu_oom: str = "same"
    # GPU policies (docs/gpu-health.md); None: the worker's own setting (its flags of the
    # same names). ``gpu_escape``: a frame's process on a device it was not given (warn|kill);
    # ``gpu_idle_limit_s``: every held device under ``gpu_idle_util`` % for this long is
    # idle, then ``gpu_idle_action`` (warn|kill).
    gpu_escape: str | None = None
    gpu_idle_limit_s: float | None = None
    gpu_idle_action: str | None = None
    gpu_idle_util: float | None = None
    # Part of one GPU by memory budget (None: whole devices): frames with shares go on one
    # device while their budgets fit it; over budget, ``gpu_share_enforce`` (warn|kill, None: kill).
    gpu_share_bytes: int | None = None
    gpu_share_enforce: str | None = None
    # The directory its frames run in (absolute; None: the worker's own, for specs built by
    # library callers that capture nothing).
    cwd: str | None = None
    type: str = "Render"  # OpenCue's layer type: Render, Util, or Post (runs after the others)
    # The service (``cuectl admin service``) whose defaults fill the resource fields the layer
    # does not set itself: a name (it must exist), or several (OpenCue's rule: the first the
    # store has, else ``default``; the XML importer writes these). None: the ``default`` one.
    service: str | tuple[str, ...] | None = None
    # Which of cuectl.sched.services.FIELDS the spec set itself (a service never overrides
    # those). None: not known (a LayerSpec built in code): every field that differs from its
    # default counts.
    explicit: frozenset[str] | None = field(default=None, compare=False)


# ``gpu_idle``: a frame held its GPUs idle past its layer's limit (docs/gpu-health.md).
NOTIFY_EVENTS = ("finished", "failed", "dead", "gpu_idle")
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
    # OpenCue's show and shot: labels for `job list --show/--shot`, `admin report --by show`
    # and the frames' CUE_SHOW/CUE_SHOT (None: none).
    show: str | None = None
    shot: str | None = None
    # Caps on the whole job's RUNNING frames, farm-wide (OpenCue's maxcores/maxgpus); None: none.
    max_running: int | None = None
    max_cores: float | None = None
    max_gpus: int | None = None
    # Who is told when the job finishes, fails or a frame goes DEAD (``notify:``).
    notify: tuple[Notify, ...] = ()
    # What the whole job waits for (``depends:`` at the top level: other jobs, their layers
    # or frames; each of its layers waits).
    depends: tuple[Dependency, ...] = ()
    # The expanded frames of each layer, computed once at validation (same order as layers):
    # each entry is a tuple of chunks, each chunk a tuple of frame numbers.
    chunks: tuple[tuple[tuple[int, ...], ...], ...] = field(default=(), compare=False)


def with_job_ids(spec: JobSpec, ids: Mapping[str, str]) -> JobSpec:
    """``spec`` with its dependencies on the jobs named in ``ids`` naming their ids instead
    (the jobs of one OpenCue spec, submitted together, wait on each other, not on any older
    job of the same name)."""
    if not ids:
        return spec

    def swap(deps: tuple[Dependency, ...]) -> tuple[Dependency, ...]:
        return tuple(replace(d, job=ids[d.job]) if d.job is not None and d.job in ids else d for d in deps)

    return replace(
        spec,
        depends=swap(spec.depends),
        layers=tuple(replace(layer, depends=swap(layer.depends)) for layer in spec.layers),
    )
