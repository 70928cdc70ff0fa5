"""``cuectl.sched.why``: every cause a waiting frame can have, named on a real SQLite store.

Hosts register through the store and heartbeat with the ``live["dispatch"]`` document a
worker publishes (docs/scheduling.md, "Why a job waits"), so these tests stand in for the
worker side; jobs are submitted and frames claimed through the store as a worker would.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from cuectl.errors import NotFound
from cuectl.gpu.device import Device
from cuectl.sched.pending import describe_job
from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import HostInfo, open_store
from cuectl.sched.why import explain_job, frame_reasons

GIB = 1024**3
NOW = time.time()


def gpu(index: int, uuid: str, model: str = "NVIDIA A100-SXM4-80GB", memory: int = 80 * GIB) -> dict[str, Any]:
    return Device(
        index=index, uuid=uuid, vendor="NVIDIA", model=model, backend="fake", memory_total_bytes=memory
    ).to_json()


def dispatch(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "at": NOW,
        "accepting": True,
        "schedule": None,
        "allowed_users": [],
        "gpu_only": False,
        "cores": 16.0,
        "cores_free": 16.0,
        "memory_bytes": 64 * GIB,
        "memory_free_bytes": 64 * GIB,
        "devices": {},
        "reservation": None,
    }
    doc.update(changes)
    return doc


@pytest.fixture
def store(tmp_path: Path):
    s = open_store(str(tmp_path / "why.db"))
    yield s
    s.close()


def host(
    store,
    name: str,
    gpus=(),
    *,
    cores: float = 16,
    memory: int = 64 * GIB,
    tags=(),
    at: float = NOW,
    dispatch_doc: dict[str, Any] | None = None,
) -> None:
    store.register_host(
        HostInfo(name=name, cores=cores, memory_bytes=memory, gpus=list(gpus), tags=tuple(tags)), now=at
    )
    if dispatch_doc is not None:
        store.heartbeat(name, [], now=at, lease_s=60.0, live={"at": at, "devices": [], "dispatch": dispatch_doc})


def submit(store, name: str, *layers: dict[str, Any], user: str = "ada", **job: Any) -> int:
    data = {"name": name, "layers": [{"command": ["true"], **layer} for layer in layers], **job}
    return store.submit(spec_from_mapping(data, user=user), now=NOW)


def layer_id(store, job: int, index: int = 0) -> int:
    return store.get_job(job)["layers"][index]["id"]


def claim(store, job: int, host_name: str, uuids=(), index: int = 0) -> int:
    claimed = store.claim_frame(
        layer_id(store, job, index),
        host=host_name,
        worker=f"{host_name}:1",
        gpu_uuids=list(uuids),
        now=NOW,
        lease_s=600.0,
    )
    assert claimed is not None
    return claimed.frame_id


def why(store, job: int):
    return explain_job(store, job, now=NOW)


def reason(store, job: int, index: int = 0) -> str:
    text = why(store, job).layers[index].reason
    assert text is not None
    return text


def test_no_host_registered(store):
    job = submit(store, "j", {"name": "main"})
    assert reason(store, job) == "no host registered (start `cuectl worker`)"
    assert "layer main: no host registered" in describe_job(store, job)["pending_reason"]


def test_no_worker_alive_names_the_last_heartbeat(store):
    host(store, "old", at=NOW - 3600, dispatch_doc=dispatch())
    host(store, "older", at=NOW - 7200)
    job = submit(store, "j", {"name": "main"})
    assert reason(store, job) == "no worker alive: the last heartbeat was 1h00m ago from old"
    lines = {h.host: h for h in why(store, job).layers[0].hosts}
    assert lines["old"].check == "down" and "DOWN (last heartbeat 1h00m ago)" == lines["old"].reason


def test_the_only_fitting_host_is_down(store):
    host(store, "a100", [gpu(0, "GPU-a")], at=NOW - 600, dispatch_doc=dispatch())
    host(store, "cpu", dispatch_doc=dispatch())
    job = submit(store, "j", {"name": "render", "gpus": 1, "gpu_models": ["A100"]})
    assert reason(store, job) == "the only fitting host a100 is DOWN (last heartbeat 10m00s ago)"
    lines = {h.host: h for h in why(store, job).layers[0].hosts}
    assert lines["cpu"].check == "devices" and "no GPU" in lines["cpu"].reason


def test_the_only_fitting_host_is_locked(store):
    host(store, "a100", [gpu(0, "GPU-a")], dispatch_doc=dispatch())
    host(store, "cpu", dispatch_doc=dispatch())
    store.set_host_locked("a100", True)
    job = submit(store, "j", {"name": "render", "gpus": 1})
    assert reason(store, job).startswith("the only fitting host a100 is locked by an admin")
    assert "cuectl host unlock a100" in reason(store, job)


def test_allow_user_excludes_the_jobs_user(store):
    host(store, "n1", dispatch_doc=dispatch(allowed_users=["bob"]))
    job = submit(store, "j", {"name": "main"}, user="ada")
    text = reason(store, job)
    assert text == "the only fitting host n1 runs only the work of bob (worker --allow-user), not ada's"
    assert why(store, job).layers[0].hosts[0].check == "user"


def test_outside_the_hosts_schedule(store):
    schedule = {"text": "Mon-Fri 19:00-08:00", "open": False, "reason": "outside the host's schedule (opens Mon 19:00)"}
    host(store, "n1", dispatch_doc=dispatch(accepting=False, schedule=schedule))
    job = submit(store, "j", {"name": "main"})
    assert reason(store, job) == "the only fitting host n1 is outside the host's schedule (opens Mon 19:00)"


def test_draining_host(store):
    host(store, "n1", dispatch_doc=dispatch(accepting=False))
    job = submit(store, "j", {"name": "main"})
    assert "draining" in reason(store, job)


@pytest.mark.parametrize(
    "state,holder",
    [
        ("frame", None),  # filled in below: the frame the store says runs there
        ("lease", "cuectl run pid 4242 (ada)"),
        ("nimby", "another process: 3.1 GiB used, 45 % busy (NIMBY threshold 1 GiB / 20 %)"),
    ],
)
def test_busy_gpus_name_their_holder(store, state, holder):
    host(store, "n1", [gpu(0, "GPU-a")], dispatch_doc=dispatch())
    job = submit(store, "shots", {"name": "render", "gpus": 1, "range": "1-2"})
    if state == "frame":
        frame = claim(store, job, "n1", ["GPU-a"])
        holder = f"frame {frame} (job shots)"
    host(
        store,
        "n1",
        [gpu(0, "GPU-a")],
        dispatch_doc=dispatch(devices={"GPU-a": {"state": state, "holder": holder, "memory_free_bytes": 0}}),
    )
    text = reason(store, job)
    assert "GPUs busy" in text and f"gpu 0 held by {holder}" in text and text.startswith("on n1: needs 1 GPU"), text
    assert why(store, job).layers[0].hosts[0].check == "busy"


def test_an_older_worker_still_names_the_frame_that_holds_its_gpu(store):
    host(store, "n1", [gpu(0, "GPU-a")])  # no dispatch document at all
    job = submit(store, "shots", {"name": "render", "gpus": 1, "range": "1-2"})
    frame = claim(store, job, "n1", ["GPU-a"])
    assert f"gpu 0 held by frame {frame} (job shots)" in reason(store, job)


def test_an_older_worker_with_free_gpus_gets_no_blame(store):
    host(store, "n1", [gpu(0, "GPU-a")])
    job = submit(store, "j", {"name": "render", "gpus": 1})
    explained = why(store, job)
    assert explained.layers[0].reason is None and explained.layers[0].hosts[0].check == "unknown"


def test_too_little_free_gpu_memory(store):
    devices = {"GPU-a": {"state": "free", "holder": None, "memory_free_bytes": 2 * GIB}}
    host(store, "n1", [gpu(0, "GPU-a")], dispatch_doc=dispatch(devices=devices))
    job = submit(store, "j", {"name": "render", "gpus": 1, "gpu_memory_min": "40G"})
    text = reason(store, job)
    assert "too little free GPU memory" in text and "gpu 0 free memory 2.0 GiB < 40.0 GiB" in text, text
    assert why(store, job).layers[0].hosts[0].check == "memory"


def test_waits_on_an_upstream_layer(store):
    host(store, "n1", dispatch_doc=dispatch())
    job = submit(
        store,
        "j",
        {"name": "sim", "range": "1-3"},
        {"name": "render", "range": "1-3", "depends": [{"layer": "sim", "type": "frame"}]},
    )
    layers = why(store, job).layers
    assert layers[0].reason is None  # sim could run now
    assert layers[1].reason == "3 frames wait on layer sim frame by frame (0/3 done)"
    assert layers[1].depend_reason == layers[1].reason


def test_dead_upstream_frames_are_named(store):
    host(store, "n1", dispatch_doc=dispatch())
    job = submit(store, "j", {"name": "sim", "range": "1-2"}, {"name": "render", "depends": [{"layer": "sim"}]})
    frames, _ = store.list_frames(job=job, layer="sim")
    store.frame_action([frames[0]["id"]], "kill", now=NOW)
    text = reason(store, job, 1)
    assert "layer sim (0/2 done)" in text
    assert f"DEAD frames 0001-sim (#{frames[0]['id']})" in text and f"cuectl frame retry {frames[0]['id']}" in text


def test_eaten_upstream_frames_are_named_with_the_rule_and_the_way_out(store):
    # OpenCue's default (depend.satisfy_only_on_frame_success=true): an eaten frame satisfies
    # no dependency, so "done" counts SUCCEEDED frames only and the eaten ones are named.
    host(store, "n1", dispatch_doc=dispatch())
    job = submit(
        store,
        "j",
        {"name": "sim", "range": "1-2"},
        {"name": "render", "range": "1-2", "depends": [{"layer": "sim", "type": "frame"}]},
    )
    frames, _ = store.list_frames(job=job, layer="sim")
    store.frame_action([frames[0]["id"]], "eat", now=NOW)
    text = reason(store, job, 1)
    assert "layer sim frame by frame (0/2 done)" in text
    assert f"waits on eaten frame(s) of layer sim: 0001-sim (#{frames[0]['id']})" in text
    assert "cuectl admin setting set depend.satisfy_on_eaten true" in text
    assert f"cuectl frame retry {frames[0]['id']}" in text
    store.set_setting("depend.satisfy_on_eaten", "true", now=NOW)
    text = reason(store, job, 1)
    assert text == "1 frame waits on layer sim frame by frame (1/2 done)"


def test_reserved_for_a_higher_priority_job(store):
    reservation = {
        "job_id": 7,
        "job": "big",
        "layer": "train",
        "layer_id": 9999,
        "priority": 100,
        "needs": "4 × NVIDIA device matching 'A100'",
        "free": 2,
        "uuids": ["GPU-a", "GPU-b"],
        "since": NOW - 60,
        "until": NOW + 600,
    }
    devices = {
        "GPU-a": {"state": "reserved", "holder": None, "memory_free_bytes": 80 * GIB},
        "GPU-b": {"state": "reserved", "holder": None, "memory_free_bytes": 80 * GIB},
    }
    host(
        store, "n1", [gpu(0, "GPU-a"), gpu(1, "GPU-b")], dispatch_doc=dispatch(devices=devices, reservation=reservation)
    )
    job = submit(store, "small", {"name": "render", "gpus": 1})
    text = reason(store, job)
    assert text.startswith("on n1: reserved for job big (#7) (needs 4 × NVIDIA"), text
    assert "4 × NVIDIA device matching 'A100'" in text and "2 free" in text
    assert why(store, job).layers[0].hosts[0].check == "reserved"


def test_a_reservation_held_for_this_layer(store):
    job = submit(store, "big", {"name": "train", "gpus": 4}, priority=100)
    lid = layer_id(store, job)
    reservation = {
        "job_id": job,
        "job": "big",
        "layer": "train",
        "layer_id": lid,
        "priority": 100,
        "needs": "4 × NVIDIA device",
        "free": 2,
        "uuids": ["GPU-a", "GPU-b"],
        "since": NOW - 60,
        "until": NOW + 600,
    }
    devices = {
        "GPU-a": {"state": "reserved", "holder": None, "memory_free_bytes": None},
        "GPU-b": {"state": "reserved", "holder": None, "memory_free_bytes": None},
        "GPU-c": {"state": "lease", "holder": "cuectl run pid 4242 (ada)", "memory_free_bytes": None},
        "GPU-d": {"state": "lease", "holder": "cuectl run pid 4243 (ada)", "memory_free_bytes": None},
    }
    host(
        store,
        "n1",
        [gpu(i, u) for i, u in enumerate(["GPU-a", "GPU-b", "GPU-c", "GPU-d"])],
        dispatch_doc=dispatch(devices=devices, reservation=reservation),
    )
    text = reason(store, job)
    assert text.startswith("holding 2 free GPUs on host n1 until 4 are free"), text
    assert "cuectl run pid 4242 (ada)" in text


def test_a_reached_cap_is_said_once_at_layer_level(store):
    host(store, "n1", dispatch_doc=dispatch())
    host(store, "n2", dispatch_doc=dispatch())
    job = submit(store, "j", {"name": "main", "range": "1-3", "max_running": 1})
    claim(store, job, "n1")
    layer = why(store, job).layers[0]
    assert layer.cap is not None and "max_running" in layer.cap
    assert layer.reason == layer.cap
    assert {h.check for h in layer.hosts} == {"cap"}


def test_a_job_cap_names_the_cap(store):
    host(store, "n1", [gpu(0, "GPU-a"), gpu(1, "GPU-b")], dispatch_doc=dispatch())
    job = submit(store, "j", {"name": "main", "range": "1-3", "gpus": 1}, max_gpus=1)
    claim(store, job, "n1", ["GPU-a"])
    text = reason(store, job)
    assert "max_gpus" in text, text


def test_cores_larger_than_any_host(store):
    host(store, "n1", cores=16, dispatch_doc=dispatch())
    host(store, "n2", cores=8, dispatch_doc=dispatch(cores=8.0, cores_free=8.0))
    job = submit(store, "j", {"name": "main", "cores": 64})
    assert reason(store, job) == "needs 64 cores; the largest host has 16 (n1)"
    assert {h.check for h in why(store, job).layers[0].hosts} == {"size"}


def test_memory_larger_than_any_host(store):
    host(store, "n1", memory=64 * GIB, dispatch_doc=dispatch())
    job = submit(store, "j", {"name": "main", "memory": "256G"})
    assert reason(store, job) == "needs 256.0 GiB of memory; the largest host has 64.0 GiB (n1)"


def test_cpu_pool_busy(store):
    host(store, "n1", dispatch_doc=dispatch(cores_free=1.0))
    job = submit(store, "j", {"name": "main", "cores": 4})
    assert reason(store, job) == "on n1: CPU pool busy: cores 4 > 1 free"


def test_gpu_only_and_tags_per_host(store):
    host(store, "gpu", [gpu(0, "GPU-a")], tags=["farm"], dispatch_doc=dispatch(gpu_only=True))
    host(store, "other", dispatch_doc=dispatch())
    job = submit(store, "j", {"name": "main", "tags": ["farm"]})
    lines = {h.host: h for h in why(store, job).layers[0].hosts}
    assert lines["gpu"].check == "gpu_only" and "--gpu-only" in lines["gpu"].reason
    assert lines["other"].check == "tags" and "farm" in lines["other"].reason
    assert reason(store, job) == "every host with its tags runs GPU frames only (worker --gpu-only)"


def test_static_device_mismatch_per_host(store):
    host(store, "v100", [gpu(0, "GPU-v", model="Tesla V100-SXM2-16GB", memory=16 * GIB)], dispatch_doc=dispatch())
    job = submit(store, "j", {"name": "main", "gpus": 1, "gpu_models": ["A100"]})
    assert "no registered host has 1 device matching model 'A100'" in reason(store, job)
    (line,) = why(store, job).layers[0].hosts
    assert line.check == "devices" and "A100" in line.reason


def test_could_run_now_and_paused(store):
    host(
        store,
        "n1",
        [gpu(0, "GPU-a")],
        dispatch_doc=dispatch(devices={"GPU-a": {"state": "free", "holder": None, "memory_free_bytes": 80 * GIB}}),
    )
    job = submit(store, "j", {"name": "main", "gpus": 1})
    explained = why(store, job)
    assert explained.reason is None or "root workers" in explained.reason
    (line,) = explained.layers[0].hosts
    assert line.can_run and line.reason == "could run now (a worker will claim it at its next poll)"
    store.set_job_paused(job, True)
    assert why(store, job).reason == "job is paused (`cuectl job resume`)"


def test_json_shape_and_frame_reasons(store):
    host(store, "n1", dispatch_doc=dispatch(cores_free=0.0))
    job = submit(store, "j", {"name": "a", "range": "1-2"}, {"name": "b", "depends": [{"layer": "a"}]})
    data = why(store, job).to_json()
    assert set(data) == {"job", "at", "pending_reason", "layers", "gpu_events"} and data["gpu_events"] == []
    assert data["job"]["id"] == job and [layer["name"] for layer in data["layers"]] == ["a", "b"]
    a = data["layers"][0]
    assert a["counts"] == {"WAITING": 2} and a["hosts"][0]["host"] == "n1" and a["hosts"][0]["can_run"] is False
    frames, _ = store.list_frames(job=job)
    frame_reasons(store, frames, now=NOW)
    by_layer = {f["layer"]: f["pending_reason"] for f in frames}
    assert "CPU pool busy" in by_layer["a"] and by_layer["b"].startswith("1 frame waits on layer a")


def test_unknown_job(store):
    with pytest.raises(NotFound):
        explain_job(store, 12345, now=NOW)
