"""Pending reasons that are true now (issue 41 §2), on a real SQLite store: a holder the
worker published is checked against the store's RUNNING frames (a frame in its retry
back-off is never "held by" itself); a worker of this version that has not published its
dispatch state yet is not "an older cuectl"; a root worker does not "could run now" a job
it will not run as its user. Hosts heartbeat the ``live["dispatch"]`` document a worker
publishes, as tests/sched/test_why.py does. The worker's side (it publishes a new lease at
once, and its first dispatch pass at once) is tests/worker/test_dispatch_fresh.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from cuectl import __version__
from cuectl.gpu.device import Device
from cuectl.sched.pending import describe_job
from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import FrameResult, HostInfo, open_store
from cuectl.sched.why import explain_job, frame_reasons

GIB = 1024**3
NOW = time.time()


def gpu(index: int, uuid: str) -> dict[str, Any]:
    return Device(
        index=index,
        uuid=uuid,
        vendor="NVIDIA",
        model="NVIDIA A100-SXM4-80GB",
        backend="fake",
        memory_total_bytes=80 * GIB,
    ).to_json()


def dispatch(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "at": NOW,
        "accepting": True,
        "schedule": None,
        "allowed_users": [],
        "gpu_only": False,
        "run_as_submitter": False,
        "cores": 16.0,
        "cores_free": 16.0,
        "memory_bytes": 64 * GIB,
        "memory_free_bytes": 64 * GIB,
        "devices": {},
        "reservation": None,
    }
    doc.update(changes)
    return doc


@pytest.fixture(autouse=True)
def _now() -> None:
    """NOW is each test's own start: describe_job reads the real clock, and a test may run
    minutes after this module was imported (pytest-xdist on a loaded machine), when a
    heartbeat stamped at import reads as a dead worker."""
    global NOW
    NOW = time.time()


@pytest.fixture
def store(tmp_path: Path):
    s = open_store(str(tmp_path / "why.db"))
    yield s
    s.close()


def register(store, name: str, gpus=(), *, version: str | None = __version__) -> None:
    store.register_host(HostInfo(name=name, cores=16, memory_bytes=64 * GIB, gpus=list(gpus), version=version), now=NOW)


def publish(store, name: str, doc: dict[str, Any], devices: list[dict[str, Any]] | None = None) -> None:
    store.heartbeat(name, [], now=NOW, lease_s=60.0, live={"at": NOW, "devices": devices or [], "dispatch": doc})


def submit(store, name: str, *layers: dict[str, Any], user: str = "ada") -> int:
    data = {"name": name, "layers": [{"command": ["true"], **layer} for layer in layers]}
    return store.submit(spec_from_mapping(data, user=user), now=NOW)


def claim(store, job: int, host: str, uuids: list[str]) -> Any:
    layer = store.get_job(job)["layers"][0]["id"]
    claimed = store.claim_frame(layer, host=host, worker=f"{host}:1", gpu_uuids=uuids, now=NOW, lease_s=600.0)
    assert claimed is not None
    return claimed


def test_a_frame_in_retry_back_off_is_not_held_by_itself(store):
    """The worker last published gpu 0 as held by frame F; F failed since and waits out its
    back-off: its reason is the back-off, not "held by frame F", and the GPU is free."""
    register(store, "n1", [gpu(0, "GPU-a")])
    job = submit(store, "j", {"name": "render", "gpus": 1, "retries": 2, "retry_delay": "10m"})
    claimed = claim(store, job, "n1", ["GPU-a"])
    holder = f"frame {claimed.frame_id} (job j)"
    publish(
        store,
        "n1",
        dispatch(
            devices={
                "GPU-a": {
                    "state": "frame",
                    "holder": holder,
                    "frame_id": claimed.frame_id,
                    "memory_free_bytes": 1 * GIB,
                }
            }
        ),
        devices=[{"uuid": "GPU-a", "memory_free_bytes": 1 * GIB, "frame_id": claimed.frame_id}],
    )
    store.complete_frame(
        claimed.frame_id, claimed.attempt, FrameResult(exit_code=1, started_at=NOW, ended_at=NOW), now=NOW
    )
    frames, _ = store.list_frames(job=job)
    (frame,) = frame_reasons(store, frames, now=NOW + 1)
    assert frame["state"] == "WAITING" and frame["pending_reason"].startswith("retry back-off until"), frame
    assert "held by" not in frame["pending_reason"] and "free memory" not in frame["pending_reason"], frame
    (line,) = explain_job(store, job, now=NOW + 1).layers[0].hosts
    assert (line.check, line.reason) == ("ok", "could run now (a worker will claim it at its next poll)")


def test_a_frame_started_since_the_last_heartbeat_holds_its_gpu(store):
    """The other way round: published free, but the store has a RUNNING frame on it now."""
    register(store, "n1", [gpu(0, "GPU-a")])
    publish(store, "n1", dispatch(devices={"GPU-a": {"state": "free", "holder": None, "memory_free_bytes": 80 * GIB}}))
    first = submit(store, "first", {"name": "l", "gpus": 1})
    claimed = claim(store, first, "n1", ["GPU-a"])
    waiting = submit(store, "second", {"name": "l", "gpus": 1})
    text = explain_job(store, waiting, now=NOW).layers[0].reason
    assert (
        text
        == f"on n1: needs 1 GPU, 0 of 1 fitting free: GPUs busy: gpu 0 held by frame {claimed.frame_id} (job first)"
    )


def test_a_worker_of_this_version_not_published_yet_is_not_an_older_cuectl(store):
    register(store, "new", [gpu(0, "GPU-n")])  # registered, first pass not published yet
    register(store, "old", [gpu(0, "GPU-o")], version="0.0.1")  # a worker that never publishes one
    job = submit(store, "j", {"name": "l", "gpus": 1})
    lines = {h.host: h for h in explain_job(store, job, now=NOW).layers[0].hosts}
    assert lines["new"].check == "unknown" and "older cuectl" not in lines["new"].reason
    assert "has not published its dispatch state yet" in lines["new"].reason
    assert lines["old"].check == "unknown" and "an older cuectl" in lines["old"].reason


def test_a_root_worker_does_not_say_could_run_a_job_it_will_not_run(store):
    """Nothing proves the job's user submitted it (no receipt: written into the store
    directly): a root worker's line says it will not run it, not "could run now"; a worker
    that runs frames as itself could."""
    register(store, "root-w")
    publish(store, "root-w", dispatch(run_as_submitter=True))
    job = submit(store, "j", {"name": "l"}, user="ghostuser")
    shown = describe_job(store, job)
    assert shown["pending_reason"].startswith("root workers will not run it as ghostuser: ")
    (line,) = explain_job(store, job, now=NOW).layers[0].hosts
    assert line.check == "proof" and "will not run it as ghostuser" in line.reason, line
    assert "could run now" not in shown["pending_reason"]
    assert (
        "the only fitting host root-w runs frames as their users and will not run it as ghostuser"
        in shown["pending_reason"]
    )
    register(store, "plain")
    publish(store, "plain", dispatch())
    lines = {h.host: h.check for h in explain_job(store, job, now=NOW).layers[0].hosts}
    assert lines == {"root-w": "proof", "plain": "ok"}
