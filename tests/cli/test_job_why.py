"""``cuectl job why`` end to end (human and --json), and the same causes in ``job show``
and ``frame list``: hosts heartbeat with the dispatch document a worker publishes."""

from __future__ import annotations

import time
from typing import Any

from cuectl.gpu.device import Device
from cuectl.sched.store import HostInfo, open_store

GIB = 1024**3


def gpu(index: int, uuid: str) -> dict[str, Any]:
    return Device(
        index=index,
        uuid=uuid,
        vendor="NVIDIA",
        model="NVIDIA A100-SXM4-80GB",
        backend="fake",
        memory_total_bytes=80 * GIB,
    ).to_json()


def add_host(db, name: str, gpus=(), *, at: float | None = None, **dispatch: Any) -> None:
    now = time.time() if at is None else at
    doc: dict[str, Any] = {
        "at": now,
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
        **dispatch,
    }
    store = open_store(str(db))
    try:
        store.register_host(HostInfo(name=name, cores=16, memory_bytes=64 * GIB, gpus=list(gpus)), now=now)
        store.heartbeat(name, [], now=now, lease_s=60.0, live={"at": now, "devices": [], "dispatch": doc})
    finally:
        store.close()


def submit(cli, *args: str) -> str:
    res = cli("submit", *args)
    assert res.exit_code == 0, res
    return res.stdout.strip()


def test_job_why_names_the_holder_of_a_busy_gpu(cli, db_path):
    job = submit(cli, "--name", "shots", "--range", "1-2", "--gpus", "1", "--", "true")
    holder = "cuectl run pid 4242 (ada)"
    add_host(
        db_path,
        "n1",
        [gpu(0, "GPU-a")],
        devices={"GPU-a": {"state": "lease", "holder": holder, "memory_free_bytes": 70 * GIB}},
    )
    add_host(db_path, "n2", at=time.time() - 900)
    res = cli("job", "why", job)
    assert res.exit_code == 0, res
    lines = res.stdout.splitlines()
    assert lines[0].startswith(f"job {job} shots (user ")
    text = res.stdout
    assert f"layer main (2 waiting): on n1: needs 1 GPU, 0 of 1 fitting free: GPUs busy: gpu 0 held by {holder}" in text
    assert f"    n1: needs 1 GPU, 0 of 1 fitting free: GPUs busy: gpu 0 held by {holder}" in text
    assert "    n2: DOWN (last heartbeat 15m00s ago)" in text

    data = cli("job", "why", job, "--json").json()
    assert data["job"]["id"] == int(job) and data["job"]["name"] == "shots"
    (layer,) = data["layers"]
    assert layer["name"] == "main" and layer["counts"] == {"WAITING": 2}
    hosts = {h["host"]: h for h in layer["hosts"]}
    assert hosts["n1"]["check"] == "busy" and holder in hosts["n1"]["reason"] and hosts["n1"]["can_run"] is False
    assert hosts["n2"]["check"] == "down" and hosts["n2"]["state"] == "DOWN"
    assert holder in data["pending_reason"]

    shown = cli("job", "show", job, "--json").json()
    assert shown["pending_reason"] == data["pending_reason"]
    assert holder in cli("job", "show", job).stdout
    frames = cli("frame", "list", "--job", job, "--json").json()["frames"]
    assert all(holder in f["pending_reason"] for f in frames)


def test_job_show_names_a_schedule_and_allow_user(cli, db_path):
    job = submit(cli, "--name", "night", "--", "true")
    schedule = {"text": "Mon-Fri 19:00-08:00", "open": False, "reason": "outside the host's schedule (opens Mon 19:00)"}
    add_host(db_path, "n1", accepting=False, schedule=schedule)
    reason = cli("job", "show", job, "--json").json()["pending_reason"]
    assert reason == "layer main: the only fitting host n1 is outside the host's schedule (opens Mon 19:00)"
    add_host(db_path, "n1", allowed_users=["somebody-else"])
    reason = cli("job", "show", job, "--json").json()["pending_reason"]
    assert "runs only the work of somebody-else (worker --allow-user)" in reason
    assert "n1" in cli("job", "list").stdout


def test_job_why_for_dependencies_and_could_run(cli, db_path, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: comp\nlayers:\n  - name: a\n    command: ['true']\n    range: 1-2\n"
        "  - name: b\n    command: ['true']\n    range: 1-2\n    depends: [{layer: a}]\n"
    )
    job = submit(cli, str(spec))
    add_host(db_path, "n1")
    res = cli("job", "why", "comp")
    assert res.exit_code == 0, res
    assert "layer a (2 waiting): could run now on n1" in res.stdout
    assert "layer b (2 depend): 2 frames wait on layer a (0/2 done)" in res.stdout
    frames = cli("frame", "list", "--job", job, "--state", "DEPEND").stdout
    assert "wait on layer a" in frames


def test_job_why_unknown_job(cli):
    cli("submit", "--name", "x", "--", "true")
    res = cli("job", "why", "nope")
    assert res.exit_code == 1 and "no job 'nope'" in res.stderr
