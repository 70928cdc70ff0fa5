"""The store interface: every state change of jobs, frames and hosts goes through it.

Two implementations satisfy it — SQLite (``store.sqlite``, the default) and PostgreSQL
(``store.postgres``, for farms), both built on the shared SQL of ``store.sql`` — and one
contract test suite runs against each. Nothing outside the store package writes SQL. Methods return plain, JSON-ready values in the shapes of
DESIGN §9 (``job_json``/``frame_json``/``host_json``) so the CLI only renders.

Every method that changes state is one transaction. Worker-facing methods are built so
that the write transaction stays tiny: the worker reads what is runnable
(``runnable_layers``), matches devices in Python, and only then claims one frame of a
chosen layer with a conditional update (``claim_frame``), which may lose the race and
return None.
"""

from __future__ import annotations

import abc
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from cuectl.sched.model import JobSpec, Notify
from cuectl.sched.usage_sql import UsageGroup


@dataclass(frozen=True)
class RunnableLayer:
    """A layer with WAITING frames that is not paused, in dispatch order."""

    layer_id: int
    job_id: int
    job: str
    layer: str
    priority: int
    gpus: int
    gpu_vendor: str | None
    gpu_models: tuple[str, ...]
    gpu_memory_min_bytes: int
    cores: float
    memory_bytes: int
    tags: tuple[str, ...]
    waiting: int
    # Per-device version minimums (LayerSpec's; None: any).
    gpu_capability_min: str | None = None
    gpu_driver_min: str | None = None
    gpu_cuda_min: str | None = None
    user: str = ""  # the submitting user (workers may restrict whose work they run)
    # What proves ``user`` submitted it (sched/identity.py): the server-recorded role, or
    # the name of the submitter's receipt file.
    submitted_by: str | None = None
    receipt: str | None = None
    # Where it sorts in dispatch order: ``runnable_layers(after=...)`` reads on from here.
    order_key: tuple[Any, ...] | None = None
    # ``retry_on_gpu_oom: bigger`` and every WAITING frame ran out of GPU memory last time:
    # the smallest device total memory they failed on, which each device given to the
    # layer's next claim must exceed (0: no such bound; docs/scheduling.md).
    gpu_oom_bytes: int = 0
    # Part of one GPU by memory budget (None: whole devices; docs/gpu-health.md).
    gpu_share_bytes: int | None = None


@dataclass(frozen=True)
class HostShape:
    """What a host could ever run, by size alone (``runnable_layers(host=...)``): its GPU
    count and largest device, its CPU pool, and whether it takes CPU work at all."""

    gpus: int
    gpu_memory_max_bytes: int
    cores: float
    memory_bytes: int
    gpu_only: bool = False


@dataclass(frozen=True)
class ClaimedFrame:
    """Everything the worker needs to launch one frame attempt."""

    frame_id: int
    job_id: int
    job: str
    user: str
    layer_id: int
    layer: str
    number: int
    frames: tuple[int, ...]
    attempt: int
    command: tuple[str, ...] | str
    layer_range: str
    chunk: int
    cores: float
    memory_bytes: int
    gpus: int
    gpu_memory_min_bytes: int
    gpu_uuids: tuple[str, ...]
    timeout_s: float | None
    env: Mapping[str, str]
    retries: int
    log_path: str
    log_limit_bytes: int | None = None  # the layer's cap on the attempt's log (None: the worker's)
    submitted_by: str | None = None  # proof of ``user`` (see RunnableLayer)
    receipt: str | None = None
    cwd: str | None = None  # where it runs (None: the worker's own directory)
    show: str | None = None  # the job's show and shot (CUE_SHOW, CUE_SHOT); None: none
    shot: str | None = None
    # The layer's GPU policies (LayerSpec's; None: the worker's own setting) and its share
    # of one GPU (None: whole devices); docs/gpu-health.md.
    gpu_escape: str | None = None
    gpu_idle_limit_s: float | None = None
    gpu_idle_action: str | None = None
    gpu_idle_util: float | None = None
    gpu_share_bytes: int | None = None
    gpu_share_enforce: str | None = None


@dataclass(frozen=True)
class FrameResult:
    """What a worker reports when a frame attempt ends."""

    exit_code: int | None
    exit_signal: int | None = None
    timed_out: bool = False
    started_at: float | None = None
    ended_at: float | None = None
    max_rss_bytes: int | None = None
    cpu_seconds: float | None = None
    # Set when the worker killed the frame because a user asked (kill/retry/eat).
    user_action: str | None = None
    usage: Mapping[str, Any] = field(default_factory=dict)
    # Why it failed (run/failure.py): a stable kind ("exit", "gpu-oom", …) and one line; a
    # permanent failure (exit 126/127, a frame that could not be started) does not retry.
    failure_kind: str | None = None
    failure: str | None = None
    permanent: bool = False


@dataclass(frozen=True)
class Token:
    """An API token as the store keeps it (never the secret itself)."""

    id: int
    user: str
    role: str  # admin | user | viewer
    label: str | None
    created_at: float
    created_by: str
    revoked_at: float | None = None
    last_used_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        from cuectl.units import iso

        return {
            "id": self.id,
            "user": self.user,
            "role": self.role,
            "label": self.label,
            "created_at": iso(self.created_at),
            "created_by": self.created_by,
            "revoked_at": iso(self.revoked_at),
            "last_used_at": iso(self.last_used_at),
        }


TOKEN_ROLES = ("admin", "user", "viewer")

# Upper bounds (seconds) of the lease-duration histogram: a second to a day.
LEASE_BUCKETS_S = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 12 * 3600.0, 86400.0)


@dataclass(frozen=True)
class FarmFigures:
    """The store's side of /metrics, read in one snapshot (``Store.farm_figures``).

    Device leases as the store sees them: every attempt that held GPUs is one acquisition
    (``lease_acquisitions``: finished attempts plus RUNNING frames holding devices), and each
    finished one adds its duration to the histogram (``lease_bucket_counts``: cumulative,
    one per ``LEASE_BUCKETS_S`` bound)."""

    frames_by_state: Mapping[str, int]
    active_jobs: int
    # (job id, job name, layer name, WAITING frames) for layers with frames waiting
    queue_depth: Sequence[tuple[int, str, str, int]]
    lease_acquisitions: int
    lease_count: int
    lease_seconds_sum: float
    lease_bucket_counts: Sequence[int]


@dataclass(frozen=True)
class LiveUsage:
    """A RUNNING attempt's GPU usage so far, as the worker publishes it every sampling
    interval (``Store.record_live_usage``): the latest values and the series up to now."""

    frame_id: int
    attempt: int
    sampled_at: float  # when the latest sample was taken (the store's clock)
    util_pct: float | None  # mean utilisation over the frame's devices, now
    memory_used_bytes: int | None  # the most memory used on any one of its devices, now
    # uuid -> the bounded series so far (``[[t, util, mem], ...]``, as the final report stores)
    samples: Mapping[str, Sequence[Sequence[Any]]] = field(default_factory=dict)


#: What a worker records about its devices (docs/gpu-health.md): a frame's process on a device
#: it does not hold, another program's memory on a held device, devices held idle, a share
#: over its budget, a device's own trouble (Xid, lost, ECC) and its drains.
GPU_EVENT_KINDS = (
    "escape",
    "foreign",
    "idle",
    "over-budget",
    "xid",
    "lost",
    "ecc",
    "drained",
    "undrained",
    "suspect",
)


@dataclass(frozen=True)
class GpuEvent:
    """One thing a worker saw on a device (``Store.record_gpu_events``). ``frame_id`` and
    ``attempt`` name the attempt concerned (None: a lease's, or the device's own event);
    ``device_uuid``/``device_index`` the device; ``pid``/``memory_bytes`` the process and its
    memory there when one is concerned; ``detail`` one line for people."""

    kind: str
    at: float
    device_uuid: str | None = None
    device_index: int | None = None
    pid: int | None = None
    memory_bytes: int | None = None
    detail: str | None = None
    frame_id: int | None = None
    attempt: int | None = None
    host: str | None = None  # filled in by the store from the recording host

    def to_json(self) -> dict[str, Any]:
        """``frame show --json``'s ``gpu_events`` entry: ``kind``, ``device`` (its uuid),
        ``pid``, ``at`` (ISO time), ``detail``, then the rest."""
        from cuectl.units import iso

        return {
            "kind": self.kind,
            "device": self.device_uuid,
            "pid": self.pid,
            "at": iso(self.at),
            "detail": self.detail,
            "device_index": self.device_index,
            "memory_bytes": self.memory_bytes,
            "host": self.host,
            "frame_id": self.frame_id,
            "attempt": self.attempt,
        }


#: A device's service state on its host (docs/gpu-health.md): ``ok`` (no row, or undrained),
#: ``drained`` (no new frame or lease; by hand or because it is sick) and ``lost`` (gone).
DEVICE_STATES = ("ok", "drained", "lost")
#: The longest drain reason kept; longer ones are cut (a worker's) or refused (a person's).
DEVICE_REASON_MAX = 200


@dataclass(frozen=True)
class DeviceState:
    """One device's service state on ``host`` (``Store.device_states``). ``automatic``: the
    worker drained it (sick); such a drain ends only by ``undrain``. ``since``: epoch seconds
    of the last change; ``by_user``: who changed it (the worker's user when automatic)."""

    host: str
    uuid: str
    state: str = "ok"
    reason: str | None = None
    since: float | None = None
    by_user: str | None = None
    automatic: bool = False

    @property
    def in_service(self) -> bool:
        return self.state == "ok"

    def to_json(self) -> dict[str, Any]:
        from cuectl.units import iso

        return {
            "host": self.host,
            "uuid": self.uuid,
            "state": self.state,
            "reason": self.reason,
            "since": iso(self.since),
            "by": self.by_user,
            "automatic": self.automatic,
        }


@dataclass(frozen=True)
class Actor:
    """The caller, for ownership checks: a SQLite store's OS user (admin: root or the
    store file's owner); a PostgreSQL session role (admin: superuser, a member of
    cuectl_admin, or the owner of the tables)."""

    name: str
    admin: bool


@dataclass(frozen=True)
class HostInfo:
    name: str
    cores: float
    memory_bytes: int
    gpus: Sequence[Mapping[str, Any]]  # Device.to_json() dicts
    tags: tuple[str, ...] = ()
    worker_pid: int | None = None
    version: str | None = None


class Store(abc.ABC):
    """The whole interface every backend implements (see the contract tests): callers never
    need to know which backend they hold."""

    url: str  # for messages: a path, or a server URL with its password masked
    log_dir: Path  # where the frame logs of this store go (``open_store`` resolves it)
    local_path: Path | None  # the store's file when it is one on this machine (SQLite), else None
    receipt_dir: Path | None  # where submitters' receipts live (SQLite), else None (sched/identity.py)
    # How long a call waits for a lost database server before it raises StoreUnreachable
    # (a worker keeps it short, to stay responsive), and since when (time.monotonic) the
    # call under way has been waiting for the server (None: no call).
    reconnect_s: float = 0.0
    calling_since: float | None = None
    # Whom the calls are made for when not this process's own user (``acting_as``).
    acting: Actor | None = None
    # True behind a transaction pooler (PostgreSQL with ``pgbouncer=true``): nothing lives
    # in a session, so acting for another user (``cuectl serve``) is refused.
    pooled: bool = False
    # Log directories this store once wrote to and still reads, never writes (a SQLite
    # store's shared ``logs/`` of releases before each store had its own; ``open_store``).
    older_log_dirs: tuple[Path, ...] = ()

    def log_dir_of(self, path: str | None) -> Path:
        """The log directory that holds the log ``path`` (a frame's ``log_path``): this
        store's, or an older one it still reads; its own when neither does (reading a log
        outside it is then refused: run/logs.open_log)."""
        import os

        if path:
            for root in (self.log_dir, *self.older_log_dirs):
                rel = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
                if rel != ".." and not rel.startswith(".." + os.sep):
                    return Path(root)
        return self.log_dir

    # -- lifecycle ---------------------------------------------------------------------
    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def schema_version(self) -> int: ...

    # -- jobs ----------------------------------------------------------------------------
    @abc.abstractmethod
    def submit(self, spec: JobSpec, *, now: float) -> int:
        """Insert the job, its layers and frames in one transaction; return the job id."""

    @abc.abstractmethod
    def list_jobs(
        self,
        *,
        include_finished: bool = True,
        user: str | None = None,
        state: str | None = None,
        name: str | None = None,
        limit: int | None = None,
        offset: int = 0,
        newest_first: bool = False,
        show: str | None = None,
        shot: str | None = None,
        ids: Sequence[int] | None = None,
        keep_failed: bool = False,
    ) -> list[dict[str, Any]]:
        """Jobs (oldest first, or ``newest_first``) with their frame counts, filtered by exact
        ``user``, ``state``, ``name``, ``show`` and ``shot`` (and ``ids``: only these, at
        most 1000); ``limit``/``offset``: one page. ``keep_failed`` with ``include_finished``
        False: also the FINISHED jobs with DEAD frames, not killed (OpenCue's cue keeps them)."""

    @abc.abstractmethod
    def count_jobs(
        self,
        *,
        include_finished: bool = True,
        user: str | None = None,
        state: str | None = None,
        name: str | None = None,
        show: str | None = None,
        shot: str | None = None,
    ) -> int:
        """How many jobs ``list_jobs`` would list with these filters and no page."""

    @abc.abstractmethod
    def get_job(self, ref: str | int) -> dict[str, Any]:
        """The job by id or unique name, with layers and ``pending_reason``. NotFound/Conflict."""

    def get_jobs(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        """``get_job`` of each id, in order, in one call (as ``caps_reached``)."""
        return [self.get_job(int(i)) for i in ids]

    @abc.abstractmethod
    def set_job_paused(self, ref: str | int, paused: bool, *, force: bool = False) -> dict[str, Any]:
        """Pause or resume. This and every other method that changes a job or its frames for
        a user (not a worker) raises ``NotOwner`` unless the caller owns the job or is an
        admin (``actor``); ``force`` overrides that where the store cannot enforce it anyway
        (SQLite: anyone who can write the file can change it)."""

    @abc.abstractmethod
    def set_job_priority(self, ref: str | int, priority: int, *, force: bool = False) -> dict[str, Any]: ...

    @abc.abstractmethod
    def kill_job(self, ref: str | int, *, now: float, force: bool = False) -> dict[str, Any]: ...

    @abc.abstractmethod
    def retry_job(self, ref: str | int, *, now: float, force: bool = False) -> dict[str, Any]: ...

    # Bulk forms: one ownership check for all the jobs (all or nothing: ``NotOwner`` naming
    # the first ones not the caller's, nothing changed) and one transaction; ``job list``'s
    # shape back (no layers), in the order given. Refs are ids or unique names.
    @abc.abstractmethod
    def kill_jobs(self, refs: Sequence[str | int], *, now: float, force: bool = False) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def retry_jobs(self, refs: Sequence[str | int], *, now: float, force: bool = False) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def set_jobs_paused(
        self, refs: Sequence[str | int], paused: bool, *, force: bool = False
    ) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def set_jobs_priority(
        self, refs: Sequence[str | int], priority: int, *, force: bool = False
    ) -> list[dict[str, Any]]: ...

    # -- frames --------------------------------------------------------------------------
    @abc.abstractmethod
    def list_frames(
        self,
        *,
        job: str | int | None = None,
        layer: str | None = None,
        state: str | None = None,
        limit: int = 1000,
        after: int | None = None,
        ids: Sequence[int] | None = None,
        changed_since: float | None = None,
    ) -> tuple[list[dict[str, Any]], int]:
        """Frames in dispatch order, at most ``limit`` (only ids above ``after``: the next
        page; only ``ids``, when given: at most 1000); also the total that matched (ignoring
        ``after``). ``changed_since`` (epoch seconds): only frames that started, ended or
        became WAITING/DEPEND again (a retry, a released dependency) at or after it, and
        every RUNNING frame (its usage changes all the time)."""

    @abc.abstractmethod
    def frame_attempts(self, frame_ids: Sequence[int]) -> dict[int, list[dict[str, Any]]]:
        """Each frame's finished attempts, oldest first, with their outcome and GPU usage."""

    @abc.abstractmethod
    def get_frame(self, frame_id: int) -> dict[str, Any]: ...

    @abc.abstractmethod
    def frame_id(self, ref: str | int) -> int:
        """The id of the frame ``ref`` names: its id (ASCII digits), or ``JOB/FRAME`` — the
        job's id or unique name, ``/``, the frame's name as ``job show`` and ``frame list``
        print it (``sweep2/0003-main``; the number alone where one layer has it).
        ``NotFound`` for no such job or frame, ``Conflict`` for an ambiguous one."""

    @abc.abstractmethod
    def frame_action(
        self, frame_ids: Sequence[int], action: str, *, now: float, force: bool = False
    ) -> list[dict[str, Any]]:
        """``retry``, ``kill`` or ``eat`` frames; running ones are flagged for their worker."""

    @abc.abstractmethod
    def frames_action(
        self, frame_ids: Sequence[int], action: str, *, now: float, force: bool = False
    ) -> list[dict[str, Any]]:
        """``frame_action`` for many frames at once (one transaction); ``frame list``'s shape back."""

    @abc.abstractmethod
    def select_frames(
        self,
        job: str | int,
        *,
        layer: str | None = None,
        state: str | None = None,
        numbers: Iterable[int] | None = None,
    ) -> list[int]:
        """Ids of a job's frames by layer, state and frame number (``frame kill --job J …``)."""

    # -- hosts ---------------------------------------------------------------------------
    @abc.abstractmethod
    def register_host(self, host: HostInfo, *, now: float) -> None: ...

    @abc.abstractmethod
    def list_hosts(self, *, now: float, down_after: float) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def get_host(self, name: str, *, now: float, down_after: float) -> dict[str, Any]: ...

    @abc.abstractmethod
    def set_host_locked(self, name: str, locked: bool) -> dict[str, Any]: ...

    @abc.abstractmethod
    def sign_off_host(self, name: str, worker_pid: int | None, *, now: float) -> bool:
        """A worker that stops cleanly says so: its host reads DOWN at once (not after
        ``down_after`` of silence), its pid and live sample are dropped. Fenced: only the
        worker that registered the host (``worker_pid``) signs it off; False if another has
        registered it since, or it is unknown."""

    @abc.abstractmethod
    def host_inventories(self) -> dict[str, tuple[list[Mapping[str, Any]], bool, list[str]]]:
        """name -> (device dicts, locked, tags) for every registered host (pending reasons)."""

    # -- worker --------------------------------------------------------------------------
    @abc.abstractmethod
    def runnable_layers(
        self, *, limit: int = 500, after: tuple[Any, ...] | None = None, host: HostShape | None = None
    ) -> list[RunnableLayer]:
        """Read-only: layers with WAITING frames of unpaused jobs, in dispatch order."""

    @abc.abstractmethod
    def claim_frame(
        self,
        layer_id: int,
        *,
        host: str,
        worker: str,
        gpu_uuids: Sequence[str],
        now: float,
        lease_s: float,
        log_dir: Path | str | None = None,
    ) -> ClaimedFrame | None:
        """Atomically move the layer's next WAITING frame to RUNNING; None if none left.
        The attempt's log goes under ``log_dir`` (default: the store's ``log_dir``)."""

    @abc.abstractmethod
    def heartbeat(
        self,
        host: str,
        frame_ids: Iterable[int],
        *,
        now: float,
        lease_s: float,
        live: Mapping[str, Any] | None = None,
        attempts: Mapping[int, int] | None = None,
    ) -> dict[int, str | None]:
        """Extend the host's and its frames' leases; return each frame's pending user action
        (``kill``/``retry``/``eat``, or ``lost`` when the frame is no longer ours — another
        host, or another attempt than ``attempts`` says)."""

    @abc.abstractmethod
    def record_live_usage(self, host: str, usage: Sequence[LiveUsage], *, now: float) -> list[int]:
        """In one transaction, store each RUNNING attempt's latest GPU values (the frame's
        ``gpu_util_pct``/``gpu_memory_used_bytes``/``gpu_sampled_at``) and upsert its sample
        series so far (one row per device, replaced each time: bounded, not a row per
        sample). Fenced like completions: frames not RUNNING ``attempt`` on ``host`` are
        skipped. Returns the frame ids written."""

    @abc.abstractmethod
    def record_gpu_events(self, host: str, events: Sequence[GpuEvent]) -> int:
        """Keep what ``host``'s worker saw on its devices (docs/gpu-health.md), in one
        transaction. An event naming a frame is kept with the frame's job (and goes with
        it) and only while that frame exists. Returns how many were kept."""

    @abc.abstractmethod
    def gpu_events(
        self,
        *,
        frame_id: int | None = None,
        job_id: int | None = None,
        host: str | None = None,
        kinds: Sequence[str] | None = None,
        limit: int = 1000,
    ) -> list[GpuEvent]:
        """Recorded GPU events, oldest first, narrowed by what is given (the newest
        ``limit`` of them)."""

    @abc.abstractmethod
    def gpu_event_counts(self) -> dict[str, int]:
        """How many events of each kind the store keeps (``/metrics`` counters; pruning a
        job removes its events, which a scraper takes for a counter reset); ``xid:<code>``
        counts each Xid code on its own."""

    # -- device states (docs/gpu-health.md) -----------------------------------------------------
    @abc.abstractmethod
    def device_states(self, host: str | None = None) -> list[DeviceState]:
        """Devices with a recorded state (all hosts, or ``host``'s), by host and uuid; a
        device without one is ok."""

    @abc.abstractmethod
    def set_device_state(self, host: str, uuid: str, state: str, reason: str | None, *, now: float) -> bool:
        """The worker of ``host`` takes a sick device out of service (``drained``) or finds
        it gone (``lost``), automatically: it comes back only by ``undrain_device``. The
        reason is cleaned (control characters) and cut to ``DEVICE_REASON_MAX``. Whether it
        changed anything."""

    @abc.abstractmethod
    def drain_device(self, host: str, device: str, *, reason: str, now: float) -> DeviceState:
        """A person drains ``device`` (its uuid, or its index on ``host``) by hand: no new
        frame or lease gets it; a frame running on it finishes. Admins, or the host's owner
        (the user its worker runs as; on PostgreSQL admins only): else ``NotOwner``.
        ``InvalidInput`` for an empty, multi-line or over-long reason, ``NotFound`` for an
        unknown host or device; nothing changed then."""

    @abc.abstractmethod
    def undrain_device(self, host: str, device: str, *, now: float) -> DeviceState:
        """Back in service (a drain by hand or the worker's, a lost device found again); the
        same rights as ``drain_device``."""

    @abc.abstractmethod
    def failed_attempts(self, host: str, since: float) -> list[tuple[int, tuple[str, ...], float]]:
        """(job id, devices, ended at) of the attempts that failed on ``host``'s GPUs and
        ended after ``since`` (``failed`` outcome, kind exit or signal): the suspect rule's
        evidence (docs/gpu-health.md), oldest first."""

    @abc.abstractmethod
    def jobs_succeeded_elsewhere(self, job_ids: Sequence[int], host: str, uuid: str) -> set[int]:
        """Those of ``job_ids`` with an attempt that succeeded without ``uuid`` of ``host``
        (another device or another host)."""

    @abc.abstractmethod
    def complete_frame(self, frame_id: int, attempt: int, result: FrameResult, *, now: float) -> str | None:
        """Record the end of an attempt (fenced: ignored unless ``attempt`` is current and the
        frame is RUNNING). Returns the new state, or None when the report was stale."""

    def complete_and_claim(
        self,
        reports: Sequence[tuple[int, int, FrameResult]],
        layer_id: int,
        *,
        reported_at: float,
        host: str,
        worker: str,
        gpu_uuids: Sequence[str],
        now: float,
        lease_s: float,
        log_dir: Path | str | None = None,
    ) -> tuple[list[str | None], ClaimedFrame | None]:
        """``complete_frame(frame_id, attempt, result, now=reported_at)`` for each report, in
        order, then ``claim_frame(layer_id, ...)``: the new states and the claim. A worker's
        frame that ended and the frame it starts next in the slot go together this way.

        A backend that can writes all of it in one transaction (SQLite: one commit, and
        the pages the two share written once). Either way, after an error some reports may
        have been recorded: reporting them again is harmless (fenced), and no frame was
        claimed unless this returned."""
        states = [
            self.complete_frame(frame_id, attempt, result, now=reported_at) for frame_id, attempt, result in reports
        ]
        return states, self.claim_frame(
            layer_id, host=host, worker=worker, gpu_uuids=gpu_uuids, now=now, lease_s=lease_s, log_dir=log_dir
        )

    def complete_and_claim_many(
        self,
        reports: Sequence[tuple[int, int, FrameResult]],
        layer_id: int,
        count: int,
        *,
        reported_at: float,
        host: str,
        worker: str,
        gpu_uuids: Sequence[str] = (),
        now: float,
        lease_s: float,
        log_dir: Path | str | None = None,
    ) -> tuple[list[str | None], list[ClaimedFrame]]:
        """``complete_and_claim`` claiming up to ``count`` frames of the layer (fewer when it
        has fewer, or its caps allow fewer): a worker whose CPU slots all freed at once
        (``gpu_uuids``: the devices of a GPU frame, claimed one at a time). The same
        guarantees; a backend that can writes it all in one transaction."""
        states, claim = self.complete_and_claim(
            reports,
            layer_id,
            reported_at=reported_at,
            host=host,
            worker=worker,
            gpu_uuids=gpu_uuids,
            now=now,
            lease_s=lease_s,
            log_dir=log_dir,
        )
        claims = [claim] if claim is not None else []
        while claim is not None and len(claims) < count:
            claim = self.claim_frame(
                layer_id, host=host, worker=worker, gpu_uuids=gpu_uuids, now=now, lease_s=lease_s, log_dir=log_dir
            )
            if claim is not None:
                claims.append(claim)
        return states, claims

    @abc.abstractmethod
    def requeue_frame(self, frame_id: int, attempt: int, *, now: float, reason: str) -> str | None:
        """Give a RUNNING attempt back to the queue (a draining worker's second signal)."""

    @abc.abstractmethod
    def layer_frame_counts(self, job_id: int) -> dict[int, dict[str, int]]:
        """Frames per state of each layer of the job ``job_id`` (layer id -> {state: n});
        layers without frames are absent."""

    @abc.abstractmethod
    def running_bookings(self, host: str | None = None) -> list[dict[str, Any]]:
        """Every RUNNING frame (on ``host`` only, when given) with what it books: its
        layer's ``cores``, ``memory_bytes``, ``gpus`` and ``gpu_memory_min_bytes``, its
        ``gpu_uuids``, and its job's ``job_name``, ``job_user`` and ``job_show`` — what a
        host's free share and a process list are computed from, in one query. Times are
        epoch seconds (``started_at``, ``lease_expires``)."""

    @abc.abstractmethod
    def running_on_host(self, host: str) -> list[dict[str, Any]]:
        """Frames the store thinks are RUNNING on ``host`` (restarted-worker recovery)."""

    @abc.abstractmethod
    def reap(self, *, now: float) -> list[int]:
        """Requeue (or fail, when retries are spent) RUNNING frames whose lease expired."""

    @abc.abstractmethod
    def running_count(self) -> int:
        """Frames RUNNING anywhere in the store."""

    @abc.abstractmethod
    def has_unfinished_work(self) -> bool:
        """True while any frame is WAITING, DEPEND or RUNNING."""

    # -- accounting ----------------------------------------------------------------------
    @abc.abstractmethod
    def usage_summary(
        self, *, since: float, until: float, by: str | None, with_total: bool = True
    ) -> tuple[list[UsageGroup], UsageGroup | None]:
        """``cuectl admin report``'s sums (``usage_sql``): one group per value of ``by``
        (``usage_sql.GROUPINGS``; None for one group) over the attempts that ended in
        [since, until), in no order, and the whole window as one more group when
        ``with_total``; all read from one snapshot."""

    # -- caps: named limits and quotas (``cuectl admin limit|quota``; store/caps.py) --------
    def set_limit(self, name: str, max_running: int | None) -> dict[str, Any] | None:
        """Create or change the named limit ``name`` (at most ``max_running`` frames of the
        layers that name it RUNNING at once); None removes it (Conflict while unfinished
        frames hold it). Admins only. Returns the limit as ``list_limits`` shows it."""
        raise NotImplementedError

    def list_limits(self) -> list[dict[str, Any]]:
        """Every named limit: ``name``, ``max_running``, ``running`` and ``waiting`` frames."""
        raise NotImplementedError

    def set_quota(
        self, kind: str, name: str, *, max_gpus: int | None, max_cores: float | None, delete: bool = False
    ) -> dict[str, Any] | None:
        """Set (replace) the GPU and core caps of a user's or project's running frames
        (``kind`` user|project; None: that cap off), or remove the quota with ``delete``.
        Admins only. Returns the quota as ``list_quotas`` shows it."""
        raise NotImplementedError

    def list_quotas(self) -> list[dict[str, Any]]:
        """Every quota: ``kind``, ``name``, ``max_gpus``, ``max_cores``, ``gpus_in_use``,
        ``cores_in_use``."""
        raise NotImplementedError

    def cap_reached(self, layer_id: int) -> str | None:
        """Which cap holds this layer's next frame back now (pending reasons), or None."""
        raise NotImplementedError

    def caps_reached(self, layer_ids: Sequence[int]) -> dict[int, str | None]:
        """``cap_reached`` of each layer, in one call: a store behind a socket answers a
        list's pending reasons in one trip instead of one a layer."""
        return {int(i): self.cap_reached(int(i)) for i in layer_ids}

    # -- services: named resource defaults (``cuectl admin service``; sched/services.py) ------
    def set_service(self, name: str, values: Mapping[str, Any]) -> dict[str, Any]:
        """Create the service ``name`` or change it: ``values`` maps fields of
        ``services.FIELDS`` to their new value (None: the service gives none for it); fields
        not in ``values`` keep theirs. Admins only. Returns it as ``list_services`` shows it."""
        raise NotImplementedError

    def list_services(self) -> list[dict[str, Any]]:
        """Every service: ``name`` and each of ``services.FIELDS`` (null: no default)."""
        raise NotImplementedError

    def delete_service(self, name: str) -> None:
        """Remove a service (NotFound if there is none). Admins only. Jobs already submitted
        keep the values they took from it."""
        raise NotImplementedError

    # -- API tokens (``cuectl admin token``; the REST API authenticates with them) ----------
    @abc.abstractmethod
    def create_token(self, user: str, *, role: str, label: str | None, now: float) -> tuple[Token, str]:
        """A new token for ``user`` (admins only); returns it with its secret, which the
        store does not keep (only its SHA-256) and nobody can see again."""

    @abc.abstractmethod
    def list_tokens(self) -> list[Token]:
        """Every token, revoked ones too (admins only)."""

    @abc.abstractmethod
    def revoke_token(self, token_id: int, *, now: float) -> Token:
        """Revoke a token (admins only); NotFound if there is none with that id."""

    @abc.abstractmethod
    def authenticate(self, secret: str, *, now: float) -> Token | None:
        """The live (not revoked) token with this secret, its use recorded; else None."""

    @abc.abstractmethod
    def farm_figures(self) -> FarmFigures:
        """Counts for monitoring: frames per state, queue depth per layer, device leases."""

    # -- maintenance -------------------------------------------------------------------
    @abc.abstractmethod
    def prune(self, *, before: float) -> list[int]:
        """Delete FINISHED jobs that finished before ``before`` (with frames, attempts,
        samples) — every user's for an admin, else the caller's own; return their ids so the
        caller can remove their log directories."""

    @abc.abstractmethod
    def actor(self) -> Actor:
        """Who this connection acts as, as the store sees it, and whether that is an admin."""

    @contextlib.contextmanager
    def acting_as(self, actor: Actor) -> Iterator[None]:
        """Make the calls inside on behalf of ``actor``: the user an API server proved by a
        token (cuectl/serve). Ownership checks and the submitter's proof are ``actor``'s:
        on SQLite a root server gives the receipt to the user's uid and ``actor.admin`` is
        taken as given; on PostgreSQL the session switches role (``SET ROLE``), so the server
        itself records and enforces who acts, and the login role needs to be granted it."""
        previous = self.acting
        self._begin_acting(actor)
        self.acting = actor
        try:
            yield
        finally:
            self.acting = previous
            self._end_acting(previous)

    def _begin_acting(self, actor: Actor) -> None:
        """Backend hook: switch to ``actor`` (raise ``NotOwner`` when this store cannot)."""

    def _end_acting(self, previous: Actor | None) -> None:
        """Backend hook: switch back to ``previous`` (None: the connection's own user)."""

    @abc.abstractmethod
    def backup(self, dest: Path, *, force: bool = False) -> None:
        """A consistent copy of the store written to ``dest`` while workers run; stores that
        cannot (a server) raise ``InvalidInput`` naming the tool to use instead. ``dest``
        must not be the store itself (or its -wal/-shm) nor anything but a regular file,
        and an existing file is replaced only with ``force``."""

    @abc.abstractmethod
    def integrity_problems(self) -> list[str] | None:
        """What ``cuectl admin doctor`` found wrong with the store, one line per problem ([]
        when sound): SQLite's ``integrity_check`` of the file; on PostgreSQL, the schema
        against this cuectl's and the rows against the rules every transaction keeps (the
        server checks its own files). None when a backend can check nothing from a client."""

    def stall(self, seconds: float, why: str = "stopped answering") -> None:
        """A call hung and was abandoned: for ``seconds``, fail calls at once (StoreStalled,
        saying ``why``) rather than wait on the server again. No-op for stores without a
        server."""

    def clock(self) -> float:
        """Now, on the clock every ``now=`` given to this store should come from: the local
        clock for a local store, the database server's for a shared one."""
        return time.time()

    # -- schema upgrades and wake-ups (no-op defaults) -----------------------------------
    def migrate(self) -> tuple[int, int]:
        """Bring the schema up to date; return (version before, version after). Stores that
        always migrate when opened (SQLite) have nothing left to do: (v, v)."""
        version = self.schema_version()
        return version, version

    def notify_fileno(self) -> int | None:
        """A file descriptor that becomes readable when work may have been queued
        (PostgreSQL LISTEN/NOTIFY), for the worker to select() on beside its other fds;
        None (the default) when the store cannot tell, and the worker polls. Never raises."""
        return None

    def drain_notifications(self) -> bool:
        """Consume what made ``notify_fileno`` readable, without blocking; True if there was
        something. Never raises."""
        return False

    def wait_for_work(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds until work may have been queued; True if woken.
        The default returns False at once: the caller sleeps (polls) as before."""
        return False

    # -- maintenance: pruning preview, forgetting hosts -----------------------------------
    @abc.abstractmethod
    def prunable_jobs(self, *, before: float) -> list[dict[str, Any]]:
        """What ``prune(before=…)`` would delete, changing nothing: one dict per job (``id``,
        ``name``, ``user``, ``finished_at``), by id; the same jobs ``prune`` selects."""

    @abc.abstractmethod
    def forget_host(self, name: str, *, now: float, down_after: float, force: bool = False) -> dict[str, Any]:
        """Remove a dead host (and with it its GPUs) from the store (admins only, else
        ``NotOwner``; ``NotFound`` for an unknown host). Refuses (``Conflict``) a host that
        is UP (heartbeat within ``down_after`` of ``now``) or has RUNNING frames, unless
        ``force``: then those frames are lost as ``reap`` loses them (requeued, or DEAD when
        their retries are spent). Returns ``name``, its ``state`` and ``last_heartbeat``
        then, its ``gpus`` (UUIDs) and the ids of the frames ``requeued``."""

    # -- store settings (model.SETTINGS; docs/opencue.md) ---------------------------------
    @abc.abstractmethod
    def settings(self) -> list[dict[str, Any]]:
        """Every store setting: ``name``, ``value`` (the default when unset), ``default``,
        ``help``."""

    @abc.abstractmethod
    def set_setting(self, name: str, value: str | bool, *, now: float) -> list[dict[str, Any]]:
        """Set one setting (admins only, else ``NotOwner``; ``InvalidInput`` for an unknown
        name or a value that is not true/false) and return ``settings()``. Turning
        ``depend.satisfy_on_eaten`` on also releases, in the same transaction, what already
        waits on EATEN frames."""

    # -- dependencies of every OpenCue type (store/depends.py; docs/opencue.md) -----------
    @abc.abstractmethod
    def add_depend(
        self,
        job: str | int,
        *,
        layer: str | None = None,
        frame: int | None = None,
        on_job: str | int | None = None,
        on_layer: str | None = None,
        on_frame: int | None = None,
        how: str = "layer",
        kind: str | None = None,
        now: float,
        force: bool = False,
    ) -> dict[str, Any]:
        """Make ``job`` (or its ``layer``, or that layer's ``frame``) wait on ``on_job`` (this
        job when None; or its ``on_layer``, or that layer's ``on_frame``). ``how``: how a
        layer waits on a layer (layer, frame, previous, any); ``kind``: an OpenCue type
        (model.OPENCUE_DEPEND_TYPES) the options must make. A target already done is
        recorded as satisfied. Owner or admin only (``NotOwner``); ``InvalidInput`` for a
        combination OpenCue has no type for, a self-dependency or a cycle between jobs;
        ``NotFound`` for a missing job, layer or frame. Returns the dependency's JSON."""

    @abc.abstractmethod
    def drop_depends(
        self, job: str | int, ids: Sequence[int] | None, *, now: float, force: bool = False
    ) -> list[dict[str, Any]]:
        """Satisfy the job's dependencies ``ids`` (None: all it waits on); owner or admin."""

    @abc.abstractmethod
    def list_depends(self, job: str | int) -> dict[str, list[dict[str, Any]]]:
        """``depends``: what the job waits on; ``dependents``: what other jobs wait on it."""

    @abc.abstractmethod
    def sweep_depends(self, *, now: float) -> int:
        """Release dependencies whose target is done (workers run it with ``reap``)."""

    # -- notifications (docs/notifications.md) --------------------------------------------
    @abc.abstractmethod
    def notify_defaults(self) -> list[dict[str, Any]]:
        """The farm's notification defaults (entries as in a spec's ``notify:``)."""

    @abc.abstractmethod
    def set_notify_defaults(self, entries: Sequence[Notify]) -> list[dict[str, Any]]:
        """Replace the farm defaults (empty: clear them); admins only, else ``NotOwner``."""

    @abc.abstractmethod
    def list_notifications(
        self, *, job: str | int | None = None, pending: bool = False, limit: int = 1000
    ) -> list[dict[str, Any]]:
        """Recorded notifications (all, one job's, or those not delivered yet), by id."""

    @abc.abstractmethod
    def claim_notifications(
        self, worker: str, *, now: float, limit: int = 10, lease_s: float = 120.0
    ) -> list[dict[str, Any]]:
        """Take up to ``limit`` due notifications (not delivered, ``next_at`` reached, no live
        claim) for ``lease_s`` seconds: no two deliverers get the same row. Each comes with
        its job's ``job``, ``user``, ``submitted_by``, ``receipt`` and ``job_notify``."""

    @abc.abstractmethod
    def notification_delivered(self, notification_id: int, claimed_by: str, *, now: float) -> bool:
        """Record a delivery (only by the claim's holder); False if the claim was lost."""

    @abc.abstractmethod
    def notification_failed(
        self, notification_id: int, claimed_by: str, error: str, *, now: float, give_up: bool = False
    ) -> bool:
        """Record a failed try: due again after the back-off, or given up after the last
        (or at once: ``give_up``, for one that can never succeed)."""

    @abc.abstractmethod
    def release_notifications(self, claimed_by_prefix: str, *, keep: str | None = None) -> int:
        """Make the claims of a deliverer known dead due again (not ``keep``'s)."""
