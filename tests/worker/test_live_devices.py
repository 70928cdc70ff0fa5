"""Live GPU values that are right for every device (issue 41 §2): a real `cuectl worker` on
fake GPUs samples every local device each --sample-interval, frames or not, publishes them
all with their sample times at once, and readers (`cuectl.top.snapshot`: `cuectl top`, the
hosts API, /metrics, /readyz) never show a value older than two intervals as current, never
take a frame's own use for another program's, and see another program on an idle GPU."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from farmlib import V100

from cuectl.errors import CuectlError
from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import FrameResult, HostInfo, open_store
from cuectl.serve.metrics import gpu_stats
from cuectl.top import snapshot

GIB = 1024**3
INTERVAL = 1.0  # the workers' --sample-interval here

# A frame that uses its GPU: it writes its fake device's live values, naming itself as the
# process, and holds them for a while.
USE_GPU = r"""
import json, os, sys, time
state_dir, util, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
path = os.path.join(state_dir, os.environ["CUDA_VISIBLE_DEVICES"] + ".json")
with open(path + ".tmp", "w") as fh:
    json.dump({"utilization_pct": util, "memory_used_bytes": 4 * 2**30,
               "processes": [{"pid": os.getpid(), "memory_used_bytes": 4 * 2**30, "utilization_pct": util}]}, fh)
os.replace(path + ".tmp", path)
time.sleep(seconds)
"""


def _host_doc(db: Path, name: str) -> dict[str, Any]:
    store = open_store(str(db), create=False)
    try:
        return store.get_host(name, now=store.clock(), down_after=60.0)
    finally:
        store.close()


def _snap(db: Path, tmp: Path) -> dict[str, Any]:
    store = open_store(str(db), create=False)
    try:
        return snapshot(store, lock_dir=tmp / "no-locks")
    finally:
        store.close()


def _job(spec_name: str, state_dir: Path, util: int, seconds: float) -> dict[str, Any]:
    return {
        "name": spec_name,
        "layers": [
            {
                "name": "use",
                "gpus": 1,
                "retries": 0,
                "command": [sys.executable, "-c", USE_GPU, str(state_dir), str(util), str(seconds)],
            }
        ],
    }


def test_two_frames_started_apart_both_devices_fresh_the_whole_run(farm):
    """Two frames on two GPUs, started ~0.6 s apart: every published doc has both devices
    (never only the ones sampled by the latest tick), read within one interval of each
    other, and a reader sees both with current values the whole time both run — though
    the heartbeat's own pace (a quarter of --lease-timeout, 10 s here) is much slower."""
    fake = farm.host("two", [V100, V100], state=True)
    state_dir = farm.tmp / "two-state"
    first = farm.submit(_job("first", state_dir, 61, 12.0))  # long enough to overlap on a loaded machine
    worker = farm.start_worker(fake, "--sample-interval", str(INTERVAL), lease="40")
    farm.wait_for(lambda: any(f["state"] == "RUNNING" for f in farm.frames(first)), what="the first frame")
    time.sleep(0.6)
    second = farm.submit(_job("second", state_dir, 37, 9.0))
    # Until the second frame has written its device's values, a sample may read it idle.
    farm.wait_for(
        lambda: 37.0 in [d["utilization_pct"] for d in _snap(farm.db, farm.tmp)["hosts"][0]["devices"]],
        what="the second frame's values",
    )

    docs, snaps = [], []
    while all(f["state"] == "RUNNING" for f in farm.frames(first) + farm.frames(second)):
        doc, snap = _host_doc(farm.db, "two")["live"], _snap(farm.db, farm.tmp)
        # Kept only if both still ran after it was read: a frame that ended between the
        # check above and the reading holds no device in it (a CI run read one so).
        if all(f["state"] == "RUNNING" for f in farm.frames(first) + farm.frames(second)):
            docs.append(doc)
            snaps.append(snap)
        time.sleep(0.2)
    assert len(snaps) >= 3, "both frames ran together for a while"
    uuids = {d["uuid"] for d in _host_doc(farm.db, "two")["gpus"]}
    for doc in docs:
        assert {d["uuid"] for d in doc["devices"]} == uuids, doc
        assert doc["sample_interval_s"] == INTERVAL
        times = [time_of(d["sampled_at"]) for d in doc["devices"]]
        assert max(times) - min(times) <= INTERVAL, doc  # every device read each interval
    # Both frames' values were current in every reading while both ran.
    for snap in snaps:
        devices = snap["hosts"][0]["devices"]
        assert all(d["sample_age_s"] is not None and d["sample_age_s"] <= 2 * INTERVAL for d in devices), devices
        assert sorted(d["utilization_pct"] for d in devices) == [37.0, 61.0], devices
        assert [d["holder"]["kind"] for d in devices] == ["frame", "frame"], devices
    worker.terminate()
    worker.wait(30)


def time_of(text: str) -> float:
    from cuectl.units import parse_time

    return parse_time(text, now=0.0)


def test_an_idle_gpu_another_program_uses_reads_busy_not_free(farm):
    """No frame at all: the worker still samples both devices; the one a notebook uses (its
    fake state names a process and 6 GiB) reads as held by another program, and /readyz's
    figures count it once, as foreign-busy."""
    fake = farm.host("idle", [V100, V100], state=True)
    (farm.tmp / "idle-state" / "1.json").write_text(
        json.dumps(
            {
                "utilization_pct": 12,
                "memory_used_bytes": 6 * GIB,
                "processes": [{"pid": 424242, "memory_used_bytes": 6 * GIB}],
            }
        )
    )
    worker = farm.start_worker(fake, "--sample-interval", str(INTERVAL), lease="40")

    def published():
        try:
            host = _host_doc(farm.db, "idle")
        except CuectlError:  # no store file yet, or the host not registered yet
            return None
        return host if (host.get("live") or {}).get("devices") else None

    host = farm.wait_for(published, what="the idle host's live values")
    assert {d["uuid"] for d in host["live"]["devices"]} == {d["uuid"] for d in host["gpus"]}
    snap = _snap(farm.db, farm.tmp)
    free, busy = snap["hosts"][0]["devices"]
    assert free["holder"] is None and free["memory_used_bytes"] == 0
    assert busy["holder"]["kind"] == "foreign" and busy["memory_used_bytes"] == 6 * GIB
    assert busy["sampled_at"].endswith("Z") and busy["sample_age_s"] <= 2 * INTERVAL
    assert gpu_stats(snap, active_jobs=0) == {
        "total": 2,
        "leased": 0,
        "foreign_busy": 1,
        "available": 1,
        "unavailable": 0,
        "active_jobs": 0,
    }
    worker.terminate()
    worker.wait(30)


def _three_gpu_host(store, name: str) -> float:
    """Register ``name`` with three V100s (GPU-0..2) as its worker would; the store's now."""
    gpus = [
        {
            "index": i,
            "uuid": f"GPU-{i}",
            "vendor": "NVIDIA",
            "model": "Tesla V100-SXM2-16GB",
            "backend": "fake",
            "memory_total_bytes": 16 * GIB,
        }
        for i in range(3)
    ]
    now = store.clock()
    store.register_host(HostInfo(name=name, cores=8, memory_bytes=64 * GIB, gpus=gpus), now=now)
    return now


def test_stale_values_are_not_current_and_a_left_device_is_not_foreign(tmp_path):
    """The reader's rules, on a real store: values older than two of the worker's
    intervals read null with their age; a busy reading taken while a frame of the worker
    held the device names no stranger once that frame has ended."""
    db = tmp_path / "store.db"
    store = open_store(str(db))
    try:
        now = _three_gpu_host(store, "n1")
        store.submit(
            spec_from_mapping({"name": "j", "layers": [{"name": "l", "command": ["true"], "gpus": 1}]}, user="alice"),
            now=now,
        )
        claimed = store.claim_frame(
            store.runnable_layers()[0].layer_id, host="n1", worker="n1:1", gpu_uuids=["GPU-0"], now=now, lease_s=600.0
        )
        assert claimed is not None
        store.complete_frame(
            claimed.frame_id, claimed.attempt, FrameResult(exit_code=0, started_at=now, ended_at=now + 1), now=now + 1
        )
        busy = {"utilization_pct": 90.0, "memory_used_bytes": 9 * GIB, "memory_free_bytes": 7 * GIB}
        live = {
            "at": now + 1,
            "sample_interval_s": 2.0,
            "devices": [
                {"uuid": "GPU-0", **busy, "sampled_at": now + 0.9, "frame_id": claimed.frame_id},  # it just left
                {"uuid": "GPU-1", **busy, "sampled_at": now + 0.9, "frame_id": None},  # another program
                {"uuid": "GPU-2", **busy, "sampled_at": now - 10.0, "frame_id": None},
            ],
        }  # stale: 11 s > 2 × 2 s
        store.heartbeat("n1", [], now=now + 1, lease_s=600.0, live=live)
        snap = snapshot(store, lock_dir=tmp_path / "no-locks", now=now + 1)
        left, other, stale = snap["hosts"][0]["devices"]
    finally:
        store.close()
    from cuectl.cli.top_cmd import plain_text

    rows = [line.split() for line in plain_text(snap).splitlines() if "Tesla" in line]
    assert "11s" in rows[2] and "ago" in rows[2] and "free" in rows[2], rows  # the age, not a value
    assert "90%" in rows[0] and "90%" in rows[1], rows
    assert left["holder"] is None and left["utilization_pct"] == 90.0
    assert other["holder"]["kind"] == "foreign"
    assert stale["holder"] is None
    assert (stale["utilization_pct"], stale["memory_used_bytes"]) == (None, None)
    assert stale["sample_age_s"] == 11.0 and stale["sampled_at"].endswith("Z")


def test_a_live_document_with_times_no_view_can_print_breaks_no_view(tmp_path):
    """Any member of a shared store's group can write a host's live document: times of
    1e20, NaN or -Infinity (Python's json reads those) and an infinite interval read as
    unknown, and `top`, `host show` and the API's readers go on for every host."""
    import math
    import subprocess

    from farmlib import cuectl_cmd

    db = tmp_path / "store.db"
    store = open_store(str(db))
    try:
        now = _three_gpu_host(store, "h1")
        values = {"utilization_pct": 50.0, "memory_used_bytes": GIB, "memory_free_bytes": 15 * GIB}
        store.heartbeat(
            "h1",
            [],
            now=now,
            lease_s=600.0,
            live={
                "at": 1e20,
                "sample_interval_s": math.inf,
                "devices": [
                    {"uuid": "GPU-0", **values, "sampled_at": 1e20},
                    {"uuid": "GPU-1", **values, "sampled_at": math.nan},
                    {"uuid": "GPU-2", **values, "sampled_at": -math.inf},
                ],
            },
        )
        snap = snapshot(store, lock_dir=tmp_path / "no-locks", now=now)
        assert gpu_stats(snap, active_jobs=0)["total"] == 3  # the metrics' reading of the same
    finally:
        store.close()
    devices = snap["hosts"][0]["devices"]
    assert [(d["sampled_at"], d["utilization_pct"]) for d in devices] == [(None, None)] * 3
    for args in (["top", "--once"], ["top", "--json"], ["host", "show", "h1"], ["host", "list", "--json"]):
        res = subprocess.run([*cuectl_cmd(), "--db", str(db), *args], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and "internal error" not in res.stderr, (args, res.stderr)


def test_a_snapshot_of_the_hosts_alone_has_the_same_hosts_and_no_queue(tmp_path):
    """`snapshot(waiting=False)` (the API's host views, /readyz, /metrics): the hosts and
    their devices as the full snapshot has them, without computing each waiting job's
    pending reason (the most of a full snapshot's work)."""
    store = open_store(str(tmp_path / "store.db"))
    try:
        now = _three_gpu_host(store, "h1")
        store.submit(
            spec_from_mapping({"name": "j", "layers": [{"name": "l", "command": ["true"], "gpus": 9}]}, user="alice"),
            now=now,
        )
        full = snapshot(store, lock_dir=tmp_path / "no-locks", now=now)
        hosts_only = snapshot(store, lock_dir=tmp_path / "no-locks", now=now, waiting=False)
    finally:
        store.close()
    assert full["waiting"] and full["totals"]["waiting_jobs"] == 1
    assert hosts_only["hosts"] == full["hosts"] and hosts_only["frames"] == full["frames"]
    assert hosts_only["waiting"] == [] and hosts_only["totals"]["waiting_jobs"] is None
