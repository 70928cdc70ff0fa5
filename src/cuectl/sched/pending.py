"""Why a job's frames are not running: the ``pending_reason`` of ``job show``/``job list``
and the API.

The reasons come from ``cuectl.sched.why`` (the same logic as ``cuectl job why``), in
short form: each layer's reason, ``layer NAME: …``, joined by ``; ``. Definite blockers
(paused, no host, no host could ever fit a layer's request, dependencies, dead upstream
frames) and what the workers publish with their heartbeats (hosts DOWN or locked, outside
their schedule, ``--allow-user``, busy devices and who holds them, too little free GPU
memory, reservations for higher-priority frames, reached caps). A layer some host could
run now — or whose only fitting hosts publish nothing (older workers) — has no reason.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from cuectl.gpu.device import Device
from cuectl.sched import (
    identity,
    why,  # (why never imports this module: no cycle)
)
from cuectl.sched import model as m
from cuectl.sched.match import GpuRequest, explain_hosts, tags_fit
from cuectl.sched.store import Store


def layer_blocker(layer: Mapping[str, Any], hosts: Mapping[str, tuple[Sequence[Device], Sequence[str]]]) -> str | None:
    """Why no registered, unlocked host could ever run this layer's frames (or None), from
    inventories alone (kept for callers without a store; ``why`` says more)."""
    if not hosts:
        return "no host registered (start `cuectl worker`)"
    tagged = {name: devs for name, (devs, tags) in hosts.items() if tags_fit(layer["tags"], tags)}
    if not tagged:
        return f"no unlocked host has the tags {', '.join(layer['tags'])}"
    if layer["gpus"] <= 0:
        return None
    return explain_hosts(GpuRequest.from_record(layer), tagged)


def pending_reason(
    store: Store,
    job: Mapping[str, Any],
    unproven: str | None = None,
    *,
    farm: Any = None,
    caps: Mapping[int, str | None] | None = None,
) -> str | None:
    """Why the job's waiting frames are not running (``job`` from ``store.get_job``);
    ``unproven``: why nothing proves that its user submitted it (``identity.proof_problem``)."""
    counts = job["frame_counts"]
    if not counts.get(m.WAITING) and not counts.get(m.DEPEND):
        return None
    if job["paused"]:
        return "job is paused (`cuectl job resume`)"
    farm = farm or why.Farm.read(store, store.clock())
    return why.explain_loaded(store, job, farm, unproven=unproven, hosts_lines=False, caps=caps).reason


def usable_hosts(store: Store) -> dict[str, tuple[list[Device], list[str]]]:
    """Registered, unlocked hosts with their device inventory and tags."""
    hosts: dict[str, tuple[list[Device], list[str]]] = {}
    for name, (devices, locked, tags) in store.host_inventories().items():
        if not locked:
            hosts[name] = ([Device.from_json(d) for d in devices], list(tags))
    return hosts


def describe_job(store: Store, ref: str | int, *, show_secrets: bool = False) -> dict[str, Any]:
    """``job show``: the job with layers and a ``pending_reason``. Secret-looking env
    values are masked unless ``show_secrets``."""
    from cuectl.sched.views import mask_env

    job = store.get_job(ref)
    job["pending_reason"] = pending_reason(store, job, unproven(store, job))
    if not show_secrets:
        for layer in job.get("layers", []):
            layer["env"] = mask_env(layer.get("env") or {})
    return job


def describe_jobs(store: Store, *, include_finished: bool = True) -> list[dict[str, Any]]:
    """``job list``: jobs without layers; the pending reason still considers them."""
    return add_pending_reasons(store, store.list_jobs(include_finished=include_finished))


def add_pending_reasons(store: Store, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fill in ``pending_reason`` of ``list_jobs`` rows (in place; returned): only jobs with
    waiting frames need one, and only unpaused ones their layers and the hosts."""
    need = []
    for job in jobs:
        counts = job["frame_counts"]
        if not (counts.get(m.WAITING) or counts.get(m.DEPEND)):
            continue
        if job["paused"]:
            job["pending_reason"] = "job is paused (`cuectl job resume`)"  # needs no layers
            continue
        need.append(job)
    if not need:
        return jobs
    farm = why.Farm.read(store, store.clock())
    # Every job and cap in one call each: behind a socket, 1,000 waiting jobs were 2,000 trips.
    fulls = store.get_jobs([job["id"] for job in need])
    caps = store.caps_reached([layer["id"] for full in fulls for layer in full.get("layers") or []])
    for job, full in zip(need, fulls):
        job["pending_reason"] = pending_reason(store, full, unproven(store, full), farm=farm, caps=caps)
    return jobs


def unproven(store: Store, job: Mapping[str, Any]) -> str | None:
    return identity.job_proof_problem(job, store.receipt_dir)
