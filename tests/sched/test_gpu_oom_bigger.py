"""A GPU out-of-memory retried on a bigger GPU (``retry_on_gpu_oom: bigger``), on both
backends through the ``store`` fixture (a real SQLite file, a real PostgreSQL database):
the frame keeps the size it failed on, its next claim takes only bigger devices, and with
none in the farm it is DEAD at once with the reason (docs/scheduling.md, "Retries")."""

from __future__ import annotations

from typing import Any

import pytest

from cuectl.errors import InvalidInput
from cuectl.gpu.device import Device
from cuectl.sched import model as m
from cuectl.sched.preview import spec_json
from cuectl.sched.spec import spec_from_flags, spec_from_mapping
from cuectl.sched.store import FrameResult, HostInfo
from cuectl.sched.why import explain_job, frame_reasons

NOW = 1_700_000_000.0
GIB = 1024**3


def gpu(uuid: str, gib: int, index: int = 0, vendor: str = "NVIDIA", capability: str = "9.0") -> dict[str, Any]:
    return Device(
        index=index,
        uuid=uuid,
        vendor=vendor,
        model=f"Fake {gib}GB",
        backend="fake",
        memory_total_bytes=gib * GIB,
        compute_capability=capability,
    ).to_json()


def register(store, name: str, *gpus: dict[str, Any], now: float = NOW, tags: tuple[str, ...] = ()) -> None:
    store.register_host(HostInfo(name=name, cores=8, memory_bytes=16 * GIB, gpus=list(gpus), tags=tags), now=now)


def submit(store, **layer: Any) -> int:
    base = {"name": "a", "command": ["train"], "range": "1", "gpus": 1, "retries": 3, "retry_delay": 0}
    spec = spec_from_mapping({"name": "j", "layers": [{**base, **layer}]}, user="alice")
    return store.submit(spec, now=NOW)


def layer_id(store, job_id: int) -> int:
    return store.get_job(job_id)["layers"][0]["id"]


def claim(store, lid: int, host: str, uuids: list[str], now: float = NOW):
    return store.claim_frame(lid, host=host, worker=f"{host}:1", gpu_uuids=uuids, now=now, lease_s=60.0)


def oom(**kw: Any) -> FrameResult:
    return FrameResult(
        exit_code=1,
        started_at=NOW,
        ended_at=NOW + 1,
        failure_kind="gpu-oom",
        failure="GPU out of memory: CUDA out of memory",
        **kw,
    )


def test_spec_key_and_flag():
    spec = spec_from_mapping(
        {"name": "j", "layers": [{"name": "a", "command": "x", "gpus": 1, "retry_on_gpu_oom": "Bigger"}]}, user="u"
    )
    assert spec.layers[0].retry_on_gpu_oom == "bigger"
    plain = spec_from_mapping({"name": "j", "layers": [{"name": "a", "command": "x"}]}, user="u")
    assert plain.layers[0].retry_on_gpu_oom == "same"
    flags = spec_from_flags(name="j", command=["x"], user="u", gpus=1, retry_on_gpu_oom="bigger")
    assert flags.layers[0].retry_on_gpu_oom == "bigger"
    assert spec_json(flags)["layers"][0]["retry_on_gpu_oom"] == "bigger"  # submit --dry-run
    with pytest.raises(InvalidInput, match=r"--retry-on-gpu-oom: 'larger' is not one of same, bigger"):
        spec_from_flags(name="j", command=["x"], user="u", gpus=1, retry_on_gpu_oom="larger")
    with pytest.raises(InvalidInput, match=r"layers\[0\].retry_on_gpu_oom: only applies to GPU requests"):
        spec_from_mapping(
            {"name": "j", "layers": [{"name": "a", "command": "x", "retry_on_gpu_oom": "bigger"}]}, user="u"
        )


def test_retried_only_on_a_bigger_device(store):
    register(store, "small", gpu("s0", 24))
    register(store, "big", gpu("b0", 80))
    job_id = submit(store, retry_on_gpu_oom="bigger")
    lid = layer_id(store, job_id)
    assert store.get_job(job_id)["layers"][0]["retry_on_gpu_oom"] == "bigger"
    c = claim(store, lid, "small", ["s0"])
    assert c is not None
    assert store.complete_frame(c.frame_id, c.attempt, oom(), now=NOW + 1) == m.WAITING
    frame = store.get_frame(c.frame_id)
    assert frame["gpu_oom_bytes"] == 24 * GIB
    (layer,) = [x for x in store.runnable_layers() if x.layer_id == lid]
    assert layer.gpu_oom_bytes == 24 * GIB
    assert store.get_job(job_id)["layers"][0]["waiting_gpu_oom_bytes"] == 24 * GIB
    # The 24 GiB device is offered again: the claim takes nothing; the 80 GiB one takes it.
    assert claim(store, lid, "small", ["s0"], now=NOW + 2) is None
    again = claim(store, lid, "big", ["b0"], now=NOW + 3)
    assert again is not None and again.frame_id == c.frame_id and again.attempt == 2
    store.complete_frame(again.frame_id, again.attempt, FrameResult(exit_code=0), now=NOW + 4)
    assert store.get_frame(c.frame_id)["state"] == m.SUCCEEDED


def test_dead_at_once_without_a_bigger_device(store):
    register(store, "small", gpu("s0", 24), gpu("s1", 24, index=1))
    # Bigger devices that do not count: a DOWN host, another vendor, too old a device, a
    # host without the tag.
    register(store, "gone", gpu("g0", 80), now=NOW - 3600)
    register(store, "amd", gpu("a0", 192, vendor="AMD"))
    register(store, "old", gpu("o0", 80, capability="8.0"), tags=("render",))
    register(store, "untagged", gpu("u0", 80))
    register(store, "tagged", gpu("t0", 80), tags=("render",))
    job_id = submit(
        store, retry_on_gpu_oom="bigger", gpu_vendor="NVIDIA", gpu_capability_min="8.9", tags=["render"], retries=5
    )
    lid = layer_id(store, job_id)
    store.set_host_locked("tagged", True)  # a locked host still counts: an admin unlocks it
    c = claim(store, lid, "small", ["s1"])
    assert store.complete_frame(c.frame_id, c.attempt, oom(), now=NOW + 1) == m.WAITING

    job_id = submit(
        store, retry_on_gpu_oom="bigger", gpu_vendor="NVIDIA", gpu_capability_min="8.9", tags=["render"], retries=5
    )
    lid = layer_id(store, job_id)
    register(store, "tagged", gpu("t0", 24), tags=("render",))  # re-registered with a small device
    c = claim(store, lid, "small", ["s0"])
    assert store.complete_frame(c.frame_id, c.attempt, oom(), now=NOW + 1) == m.DEAD
    frame = store.get_frame(c.frame_id)
    assert frame["attempts"] == 1  # its retries unburnt
    assert frame["failure"] == (
        "gpu-oom: no GPU bigger than 24.0 GiB (retry_on_gpu_oom: bigger); GPU out of memory: CUDA out of memory"
    )
    history = store.frame_attempts([c.frame_id])[c.frame_id]
    assert [(h["failure_kind"], h["failure"]) for h in history] == [
        ("gpu-oom", "GPU out of memory: CUDA out of memory")
    ]


def test_same_is_todays_behaviour(store):
    register(store, "small", gpu("s0", 24))
    job_id = submit(store)
    lid = layer_id(store, job_id)
    c = claim(store, lid, "small", ["s0"])
    assert store.complete_frame(c.frame_id, c.attempt, oom(), now=NOW + 1) == m.WAITING
    assert store.get_frame(c.frame_id)["gpu_oom_bytes"] is None
    again = claim(store, lid, "small", ["s0"], now=NOW + 2)
    assert again is not None and again.attempt == 2


def test_other_failures_keep_the_bound_and_spend_retries(store):
    register(store, "small", gpu("s0", 24))
    register(store, "mid", gpu("m0", 48))
    register(store, "big", gpu("b0", 80))
    job_id = submit(store, retry_on_gpu_oom="bigger", retries=1)
    lid = layer_id(store, job_id)
    c = claim(store, lid, "small", ["s0"])
    store.complete_frame(c.frame_id, c.attempt, oom(), now=NOW + 1)
    c = claim(store, lid, "mid", ["m0"], now=NOW + 2)
    # The second OOM raises the bound to 48 GiB; its retries (1) are spent: DEAD as usual.
    assert store.complete_frame(c.frame_id, c.attempt, oom(), now=NOW + 3) == m.DEAD
    frame = store.get_frame(c.frame_id)
    assert frame["gpu_oom_bytes"] == 48 * GIB and frame["failure"] == "GPU out of memory: CUDA out of memory"


def test_why_says_it_waits_for_a_bigger_gpu(store):
    register(store, "small", gpu("s0", 24))
    register(store, "big", gpu("b0", 80))
    job_id = submit(store, retry_on_gpu_oom="bigger")
    lid = layer_id(store, job_id)
    c = claim(store, lid, "small", ["s0"])
    store.complete_frame(c.frame_id, c.attempt, oom(), now=NOW + 1)
    why = explain_job(store, job_id, now=NOW + 2)
    (layer,) = why.layers
    lines = {line.host: line for line in layer.hosts}
    assert lines["small"].check == "devices"
    assert lines["small"].reason == (
        "ran out of GPU memory on 24.0 GiB: waits for a GPU bigger than 24.0 GiB; this host has none"
    )
    assert lines["big"].check != "devices"
    frames, _ = store.list_frames(job=job_id)
    (frame,) = frame_reasons(store, frames, now=NOW + 2)
    assert frame["pending_reason"].startswith("ran out of GPU memory on 24.0 GiB: waits for a GPU bigger than 24.0 GiB")
    # The big host gone: the layer's reason says no registered host has one.
    store.forget_host("big", now=NOW + 2, down_after=m.HOST_DOWN_AFTER_S, force=True)
    (layer,) = explain_job(store, job_id, now=NOW + 2).layers
    assert layer.waiting_reason == (
        "ran out of GPU memory on 24.0 GiB: waits for a GPU bigger than 24.0 GiB; no registered host has one "
        "(`cuectl frame retry` once one is added)"
    )


def test_every_way_in_takes_it():
    """The Python API, the REST API's mapping (intake.load_mapping), the flags a CLI fast
    path reads (SubmitFlags) and OpenCue XML (cuectl's extension element) all give it."""
    from cuectl.api import Job
    from cuectl.sched import intake
    from cuectl.sched.opencue_xml import parse_opencue_xml

    context = intake.SubmitContext(user="u", frame_limit=None, cwd=None, environ=None)
    mapping = Job("j").layer("a", ["x"], gpus=1, retry_on_gpu_oom="bigger").to_spec()
    assert intake.load_mapping(mapping, context).layers[0].retry_on_gpu_oom == "bigger"
    flags = intake.SubmitFlags.from_options({"--gpus": 1, "--retry-on-gpu-oom": "bigger"})
    assert flags.job_spec(["x"], context, name="j").layers[0].retry_on_gpu_oom == "bigger"
    ((xml, notes),) = parse_opencue_xml(
        "<spec><show>demo</show><job name='shot'><layers><layer name='beauty' type='Render'>"
        "<cmd>render #IFRAME#</cmd><range>1-4</range><gpus>1</gpus>"
        "<retry_on_gpu_oom>Bigger</retry_on_gpu_oom></layer></layers></job></spec>"
    )
    assert notes == [] and spec_from_mapping(xml, user="u").layers[0].retry_on_gpu_oom == "bigger"
    with pytest.raises(InvalidInput, match=r"retry_on_gpu_oom: 'always' is not one of same, bigger"):
        intake.load_mapping({"name": "j", "layers": [{**mapping["layers"][0], "retry_on_gpu_oom": "always"}]}, context)
