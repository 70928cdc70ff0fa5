"""The frame lifecycle, as pure functions shared by every store backend.

These are the core rules of the product (DESIGN §4–5): which state a frame enters when an
attempt ends or its worker is presumed dead, what a submitted job's rows look like, and
what a worker is handed when it claims a frame. The stores only read and write rows; they
decide nothing of this themselves, so the backends cannot drift apart.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from cuectl.gpu.device import Device
from cuectl.sched import model as m
from cuectl.sched.dialect import Dialect
from cuectl.sched.frameset import compact_range, parse_frameset
from cuectl.sched.store import depends as depends_mod
from cuectl.sched.store.base import ClaimedFrame, FrameResult
from cuectl.units import format_bytes

# A stored chunk was validated at submit time; re-reading it must not depend on this
# process's CUECTL_FRAME_LIMIT (a worker may run with a smaller one than the submitter).
STORED_CHUNK_LIMIT = 2**31
# User actions on a frame (``cuectl frame retry|kill|eat``); on a RUNNING frame they are
# flagged for its worker and the final state is decided when the attempt ends.
ACTIONS = ("retry", "kill", "eat")


def _succeeded(result: FrameResult) -> bool:
    """Exit 0 in time, and no failure the worker found beside the exit status (``log-lost``:
    the log's filesystem was full, so output was lost)."""
    return result.exit_code == 0 and not result.timed_out and result.failure_kind is None


#: The attempt outcome (and failure kind) of a frame stopped because its device was drained
#: as sick while it ran (docs/gpu-health.md): not the frame's failure, so its retries are not
#: spent — the frame waits again at once, and these attempts are left out of the count.
DEVICE_FAILED = "device-failed"
#: Outcomes that do not count against a frame's retries.
UNCOUNTED_OUTCOMES = (DEVICE_FAILED,)


def next_state(
    result: FrameResult, action: str | None, attempt: int, retries: int, uncounted: int = 0
) -> tuple[str, str]:
    """The frame's state after an attempt ends, and the attempt's outcome label.
    ``uncounted``: how many of the frame's earlier attempts did not count (``device-failed``):
    the retries are compared with the attempts that did."""
    if action == "eat":
        return m.EATEN, "eaten"
    if action == "kill":
        return m.DEAD, "killed"
    if action == "retry":
        return m.WAITING, "retried"
    if _succeeded(result):
        return m.SUCCEEDED, "succeeded"
    if result.failure_kind == DEVICE_FAILED:
        return m.WAITING, DEVICE_FAILED  # the device's failure, not the frame's
    outcome = "timeout" if result.timed_out else "failed"
    # A failure that can never succeed (command not found, no such user here) would only
    # burn the retries: DEAD at once, with its reason.
    return (m.WAITING if attempt - uncounted <= retries and not result.permanent else m.DEAD), outcome


def failure_text(result: FrameResult) -> str | None:
    """The line a failed attempt is remembered by: the worker's reason, else one from the
    exit status (a worker older than the reasons)."""
    if _succeeded(result):
        return None
    if result.failure:
        return result.failure
    if result.timed_out:
        return "timed out"
    if result.exit_signal:
        return f"killed by signal {result.exit_signal}"
    return f"exit {result.exit_code}" if result.exit_code is not None else "failed"


LOST_FAILURE = "worker lost (no heartbeat)"


# -- a GPU out-of-memory retried on a bigger GPU (``retry_on_gpu_oom: bigger``) ------------
def bigger_devices(devices: Sequence[Device], gpu_oom_bytes: int) -> list[Device]:
    """The devices with more total memory than ``gpu_oom_bytes`` (all when it is 0); a
    device of unknown size is never bigger."""
    if gpu_oom_bytes <= 0:
        return list(devices)
    return [d for d in devices if d.memory_total_bytes is not None and d.memory_total_bytes > gpu_oom_bytes]


def failed_device_bytes(gpu_uuids: Sequence[str], inventory: Sequence[Mapping[str, Any]]) -> int | None:
    """The total memory of the largest of an attempt's devices, from its host's registered
    inventory: the size its next attempt must exceed. None when none of them is known (no
    devices, or the host re-registered without them): the frame is retried as usual."""
    sizes = [
        int(d["memory_total_bytes"])
        for d in inventory
        if d.get("uuid") in gpu_uuids and isinstance(d.get("memory_total_bytes"), int)
    ]
    return max(sizes) if sizes else None


def bigger_gpu_host(
    layer: Mapping[str, Any], hosts: Sequence[Mapping[str, Any]], gpu_oom_bytes: int, now: float
) -> str | None:
    """A host that could ever run ``layer`` (a row with its GPU request and tags) on devices
    bigger than ``gpu_oom_bytes``: registered, UP (a heartbeat within HOST_DOWN_AFTER_S and
    not signed off), with the layer's tags, and ``gpus`` devices that meet the layer's
    vendor, model, memory and version constraints and each have more memory. Locked hosts
    and busy or leased devices count: those are passing states. None: no such host in the
    farm."""
    from cuectl.sched.match import GpuRequest, device_fits_statically

    request = GpuRequest(
        gpus=int(layer["gpus"]),
        gpu_vendor=layer["gpu_vendor"],
        gpu_models=tuple(json.loads(layer["gpu_models"] or "[]")),
        gpu_memory_min_bytes=int(layer["gpu_memory_min_bytes"] or 0),
        gpu_capability_min=layer["gpu_capability_min"],
        gpu_driver_min=layer["gpu_driver_min"],
        gpu_cuda_min=layer["gpu_cuda_min"],
    )
    tags = set(json.loads(layer["tags"] or "[]"))
    for host in hosts:
        live = json.loads(host["live"]) if host["live"] else None
        signed_off = isinstance(live, dict) and live.get("signed_off") is True
        if signed_off or host["last_heartbeat"] is None or now - host["last_heartbeat"] > m.HOST_DOWN_AFTER_S:
            continue
        if not tags <= set(json.loads(host["tags"] or "[]")):
            continue
        devices = [Device.from_json(d) for d in json.loads(host["gpus"] or "[]")]
        fitting = [d for d in bigger_devices(devices, gpu_oom_bytes) if device_fits_statically(request, d) is None]
        if len(fitting) >= request.gpus:
            return str(host["name"])
    return None


def no_bigger_gpu(gpu_oom_bytes: int) -> str:
    """The DEAD frame's reason when the farm has no device bigger than it failed on."""
    return f"gpu-oom: no GPU bigger than {format_bytes(gpu_oom_bytes)} (retry_on_gpu_oom: bigger)"


# What a user's kill leaves on a frame as its failure: who ended it, so a job that ends
# FAILED for it says so ("1 frame killed by alice"), not only that a frame is DEAD.
_KILLED_BY = " (frame kill)"


def killed_by(user: str) -> str:
    return f"killed by {user}{_KILLED_BY}"


def outcome_reason(dead: Mapping[str | None, int]) -> str | None:
    """Why a job ended FAILED, from its DEAD frames counted by their failure: the users
    who killed frames by name, then the rest as failed (``1 frame killed by alice, 2 frames
    failed``); None without DEAD frames."""
    killers: dict[str, int] = {}
    failed = 0
    for failure, count in dead.items():
        if failure and failure.startswith("killed by ") and failure.endswith(_KILLED_BY):
            user = failure[len("killed by ") : -len(_KILLED_BY)]
            killers[user] = killers.get(user, 0) + count
        else:
            failed += count
    parts = [f"{_frames(n)} killed by {user}" for user, n in sorted(killers.items(), key=lambda kv: (-kv[1], kv[0]))]
    if failed:
        parts.append(f"{_frames(failed)} failed")
    return ", ".join(parts) or None


def _frames(count: int) -> str:
    return f"{count} frame{'' if count == 1 else 's'}"


def reaped_state(action: str | None, attempt: int, retries: int, uncounted: int = 0) -> str:
    """The state of a RUNNING frame whose worker went silent (its lease expired): the
    attempt counts (``uncounted`` earlier ones did not), and a pending user action still
    applies."""
    if action == "eat":
        return m.EATEN
    if action == "kill":
        return m.DEAD
    if action == "retry" or attempt - uncounted <= retries:
        return m.WAITING
    return m.DEAD


def retried_state(frame_waits_on: int, layer_waits_on: int) -> str:
    """Where a finished frame goes when a user retries it: back behind its dependencies."""
    return m.DEPEND if (frame_waits_on or layer_waits_on) else m.WAITING


# -- submitting ------------------------------------------------------------------------------
FRAME_COLUMNS = ("id", "job_id", "layer_id", "number", "frames", "state", "depend_count", "waiting_since")


@dataclass(frozen=True)
class DependRow:
    """One ``depends`` row: what a user asked for, in OpenCue's terms (ids of this job's rows)."""

    type: str  # one of m.OPENCUE_DEPEND_TYPES
    layer_id: int | None  # the waiting layer (None: the whole job)
    on_layer_id: int | None
    on_frame_id: int | None = None
    any_frame: bool = False


@dataclass(frozen=True)
class SubmitPlan:
    """Every row a submitted job adds besides its job and layer rows, in insert order. The
    edges name their dependency by its index in ``depends`` (the store maps it to the id)."""

    frames: list[tuple[Any, ...]]  # FRAME_COLUMNS
    depends: list[DependRow]
    frame_deps: list[tuple[int, int, int]]  # (frame_id, on_frame_id, depend index)
    layer_deps: list[tuple[int, int, int, int]]  # (layer_id, on_layer_id, any_frame, depend index)
    edges: list[tuple[int, int | None, int | None, str, int]]  # (depend index, layer_id, frame_id, on_kind, on_id)


def plan_submit(
    spec: m.JobSpec, job_id: int, layer_ids: Mapping[str, int], frame_ids: Sequence[int], now: float
) -> SubmitPlan:
    """The frame rows of ``spec`` with their final state and dependency count, and the
    dependency rows of its dependencies inside the job, given the ids the store reserved
    for the frames (``frame_ids``, one per chunk, ascending: dispatch order by id is the
    spec's order). Computing everything here lets a store write each row once. Dependencies
    on other jobs are the store's to add afterwards (they read other jobs' rows)."""
    by_number: dict[str, dict[int, int]] = {}  # layer -> frame number -> frame id
    chunk_ids: dict[str, list[tuple[int, tuple[int, ...]]]] = {}
    ids = iter(frame_ids)
    for layer, chunks in zip(spec.layers, spec.chunks):
        numbers: dict[int, int] = {}
        rows = []
        for chunk in chunks:
            frame_id = next(ids)
            rows.append((frame_id, chunk))
            for n in chunk:
                numbers.setdefault(n, frame_id)
        by_number[layer.name] = numbers
        chunk_ids[layer.name] = rows
    depends: list[DependRow] = []
    frame_deps: dict[tuple[int, int], int] = {}
    layer_deps: list[tuple[int, int, int, int]] = []
    edges: list[tuple[int, int | None, int | None, str, int]] = []
    layer_waits: dict[str, int] = {}
    for layer in spec.layers:
        mine = layer_ids[layer.name]
        for dep in layer.depends:
            if dep.job is not None or dep.on is None:
                continue  # on another job: the store adds it
            index = len(depends)
            theirs = layer_ids[dep.on]
            if dep.frame is not None:
                on_frame = by_number[dep.on][dep.frame]
                depends.append(DependRow("layer-on-frame", mine, theirs, on_frame))
                edges.append((index, mine, None, "frame", on_frame))
                layer_waits[layer.name] = layer_waits.get(layer.name, 0) + 1
            elif dep.type in ("layer", "any"):
                depends.append(DependRow("layer-on-layer", mine, theirs, any_frame=dep.type == "any"))
                layer_deps.append((mine, theirs, int(dep.type == "any"), index))
                layer_waits[layer.name] = layer_waits.get(layer.name, 0) + 1
            else:
                kind = "frame-by-frame" if dep.type == "frame" else "previous-frame"
                depends.append(DependRow(kind, mine, theirs))
                for pair in depends_mod.frame_pairs(kind, chunk_ids[layer.name], chunk_ids[dep.on]):
                    frame_deps.setdefault(pair, index)
    waits_on: dict[int, int] = {}
    for mine_frame, _ in frame_deps:
        waits_on[mine_frame] = waits_on.get(mine_frame, 0) + 1
    frames: list[tuple[Any, ...]] = []
    for layer in spec.layers:
        layer_blocked = layer_waits.get(layer.name, 0) > 0
        for frame_id, chunk in chunk_ids[layer.name]:
            count = waits_on.get(frame_id, 0)
            state = m.DEPEND if (count or layer_blocked) else m.WAITING
            frames.append(
                (
                    frame_id,
                    job_id,
                    layer_ids[layer.name],
                    chunk[0],
                    compact_range(chunk) if len(chunk) > 1 else str(chunk[0]),
                    state,
                    count,
                    now,
                )
            )
    return SubmitPlan(frames, depends, sorted((a, b, i) for (a, b), i in frame_deps.items()), sorted(layer_deps), edges)


def layer_waits_within(layer: m.LayerSpec) -> int:
    """How many dependencies inside its job a layer as a whole waits on (its depend_count at
    submit): layer-on-layer (all or any frame) and layer-on-frame; frame-level ones count
    on the frames."""
    return sum(
        1
        for d in layer.depends
        if d.job is None and d.on is not None and (d.frame is not None or d.type in ("layer", "any"))
    )


def layer_row(job_id: int, idx: int, layer: m.LayerSpec) -> tuple[Any, ...]:
    """The values of ``LAYER_INSERT_COLUMNS`` for one layer of a submitted job."""
    command = layer.command if isinstance(layer.command, str) else list(layer.command)
    return (
        job_id,
        idx,
        layer.name,
        json.dumps(command),
        layer.range,
        layer.chunk,
        layer.gpus,
        layer.gpu_vendor,
        json.dumps(list(layer.gpu_models)),
        layer.gpu_memory_min_bytes,
        layer.cores,
        layer.memory_bytes,
        layer.retries,
        layer.timeout_s,
        json.dumps(dict(layer.env)),
        json.dumps(list(layer.tags)),
        json.dumps([d.to_json() for d in layer.depends]),
        layer.log_limit_bytes,
        layer.max_running,
        json.dumps(list(layer.limits)),
        layer.retry_delay_s,
        layer.cwd,
        None if layer.retry_on_gpu_oom == m.RETRY_ON_GPU_OOM[0] else layer.retry_on_gpu_oom,
        layer.gpu_capability_min,
        layer.gpu_driver_min,
        layer.gpu_cuda_min,
        layer.gpu_escape,
        layer.gpu_idle_limit_s,
        layer.gpu_idle_action,
        layer.gpu_idle_util,
        layer.gpu_share_bytes,
        layer.gpu_share_enforce,
        layer_waits_within(layer),
    )


LAYER_COLUMNS = (
    "id, job_id, idx, name, command, range, chunk, gpus, gpu_vendor, gpu_models, "
    "gpu_memory_min_bytes, cores, memory_bytes, retries, timeout_s, env, tags, depends, log_limit_bytes, "
    "max_running, limits, retry_delay_s, cwd, retry_on_gpu_oom, gpu_capability_min, gpu_driver_min, gpu_cuda_min, "
    "gpu_escape, gpu_idle_limit_s, gpu_idle_action, gpu_idle_util, gpu_share_bytes, gpu_share_enforce"
)
LAYER_INSERT_COLUMNS = LAYER_COLUMNS.replace("id, ", "", 1) + ", depend_count"
LAYER_INSERT_COUNT = LAYER_INSERT_COLUMNS.count(",") + 1


# -- claiming ---------------------------------------------------------------------------------
def claimed_frame(
    layer: Mapping[str, Any],
    *,
    frame_id: int,
    attempt: int,
    number: int,
    frames: str,
    gpu_uuids: Sequence[str],
    log_path: str,
) -> ClaimedFrame:
    """What a worker is handed for one claimed attempt: the claimed frame row's values and
    its layer row (with ``job_name`` and ``user`` of its job)."""
    # (A layer's frames share its command and environment: each JSON text is parsed once.
    # A chunk of one frame, the usual case, needs no frameset parser: up to 9 digits it is
    # always within MAX_FRAME; anything longer is the parser's to accept or refuse.
    # ``number`` is an integer as every writer but a hostile one stores it; SQLite keeps any
    # value in an INTEGER column (``UPDATE frames SET number = 'x'``), and such a value is
    # handed on as it is, for the launch to refuse, as ``_env`` does: never an error here.)
    return ClaimedFrame(
        frame_id=int(frame_id),
        job_id=layer["job_id"],
        job=layer["job_name"],
        user=layer["user"],
        layer_id=layer["id"],
        layer=layer["name"],
        number=number,
        frames=(int(frames),)
        if frames.isascii() and frames.isdigit() and len(frames) <= 9
        else tuple(parse_frameset(frames, limit=STORED_CHUNK_LIMIT)),
        attempt=int(attempt),
        command=_command(layer["command"]),
        layer_range=layer["range"],
        chunk=layer["chunk"],
        cores=layer["cores"],
        memory_bytes=layer["memory_bytes"],
        gpus=layer["gpus"],
        gpu_memory_min_bytes=layer["gpu_memory_min_bytes"],
        gpu_uuids=tuple(gpu_uuids),
        timeout_s=layer["timeout_s"],
        env=_env(layer["env"]),
        retries=layer["retries"],
        log_path=log_path,
        log_limit_bytes=layer["log_limit_bytes"],
        submitted_by=layer["submitted_by"],
        receipt=layer["receipt"],
        cwd=layer["cwd"],
        show=layer.get("show"),
        shot=layer.get("shot"),
        gpu_escape=layer.get("gpu_escape"),
        gpu_idle_limit_s=layer.get("gpu_idle_limit_s"),
        gpu_idle_action=layer.get("gpu_idle_action"),
        gpu_idle_util=layer.get("gpu_idle_util"),
        gpu_share_bytes=layer.get("gpu_share_bytes"),
        gpu_share_enforce=layer.get("gpu_share_enforce"),
    )


@functools.lru_cache(maxsize=1024)
def _command(text: str) -> str | tuple[str, ...]:
    """A layer's stored command: a shell string, or argv (a tuple: shared between claims)."""
    command = json.loads(text)
    return command if isinstance(command, str) else tuple(command)


def _env(text: str) -> Any:
    """A layer's stored environment: a dict of its own for each claim. A row that holds
    something else (a hostile writer of the store) is handed on as parsed, as it always
    was, for the launch to refuse: it must not stop the claim path."""
    items = _env_items(text)
    return dict(items) if items is not None else json.loads(text)


@functools.lru_cache(maxsize=1024)
def _env_items(text: str) -> tuple[tuple[str, Any], ...] | None:
    """The items of a layer's stored environment (None: not a JSON object)."""
    env = json.loads(text)
    return tuple(env.items()) if isinstance(env, dict) else None


def log_path_sql(dialect: Dialect, alias: str = "") -> str:
    """Where an attempt's log goes, as the SQL expression a claim statement stores:
    ``<log dir>/<job id>/<NNNN>-<layer>.<attempt>.log``, from two ``?`` parameters (the log
    dir, the layer name) and the claimed row's columns (``alias``: its table alias). The name
    has one definition, sched/logname.py, which the readers use too (the log dir is
    resolved once, by ``open_store``). Layer names are validated to [A-Za-z0-9_.-], so a path
    cannot leave the log dir."""
    from cuectl.sched.logname import log_path_sql

    return log_path_sql(dialect, alias)
