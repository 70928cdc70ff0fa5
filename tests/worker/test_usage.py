"""GPU usage per frame: fake devices' live values (state_dir) through the worker's sampling
into the store, the frame summaries and `frame show`."""

from __future__ import annotations

import json
import sys

from farmlib import V100

from cuectl.gpu.device import DeviceSample, ProcessSample
from cuectl.run.usage import MAX_POINTS, UsageTracker

GIB = 1024**3

# A frame that pretends to use its GPU: it writes the fake device's live values, naming
# itself as the process using 2 GiB, while "someone else" holds 3 more GiB of the card.
BUSY_FRAME = r"""
import json, os, sys, time
state_dir, util, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
idx = os.environ["CUDA_VISIBLE_DEVICES"]
path = os.path.join(state_dir, idx + ".json")
with open(path + ".tmp", "w") as fh:
    json.dump({"utilization_pct": util, "memory_used_bytes": 5 * 2**30,
               "processes": [{"pid": os.getpid(), "memory_used_bytes": 2 * 2**30, "utilization_pct": util}]}, fh)
os.replace(path + ".tmp", path)
time.sleep(seconds)
"""


def test_worker_samples_frames_and_bills_their_own_processes(farm):
    fake = farm.host("gpu", [V100], state=True)
    state_dir = str(farm.tmp / "gpu-state")
    job = farm.submit(
        {
            "name": "busy",
            "layers": [
                {"name": "train", "command": [sys.executable, "-c", BUSY_FRAME, state_dir, "75", "1.2"], "gpus": 1}
            ],
        }
    )
    res = farm.run_worker(fake)
    assert res.returncode == 0, res.stderr
    (frame,) = farm.frames(job)
    assert frame["state"] == "SUCCEEDED"
    # The first sample may see the card before the frame wrote its values (0%): the mean
    # is time-weighted, so it lands between, near 75.
    assert frame["gpu_util_max_pct"] == 75
    assert 40 <= frame["gpu_util_mean_pct"] <= 75
    assert frame["gpu_memory_peak_bytes"] == 2 * GIB, "only the frame's own process is billed"
    assert 1.1 <= frame["gpu_seconds"] <= 5
    shown = json.loads(farm.cuectl("frame", "show", str(frame["id"]), "--json").stdout)
    (points,) = shown["samples"].values()
    assert len(points) >= 3 and max(p[1] for p in points) == 75
    text = farm.cuectl("frame", "show", str(frame["id"])).stdout
    assert "▆" in text and "peak 2.0 GiB" in text  # 75% is the sixth of eight levels
    listing = farm.cuectl("frame", "list", "--job", str(job)).stdout
    assert "2.0 GiB" in listing


def test_cpu_frames_have_no_gpu_usage(farm):
    job = farm.submit({"name": "cpu", "layers": [{"name": "c", "command": farm.probe()}]})
    assert farm.run_worker(None).returncode == 0
    (frame,) = farm.frames(job)
    assert frame["gpu_seconds"] is None and frame["gpu_util_mean_pct"] is None


def _sample(uuid, t, util, mem, pids=()):
    return {
        uuid: DeviceSample(
            uuid=uuid,
            timestamp=t,
            utilization_pct=util,
            memory_used_bytes=mem,
            processes=tuple(ProcessSample(pid=p, memory_used_bytes=mem) for p in pids),
        )
    }


def test_tracker_is_bounded_and_keeps_peaks():
    tracker = UsageTracker(["GPU-a"], started_at=0.0)
    for i in range(10_000):
        util = 100.0 if i == 7777 else 10.0
        tracker.add(_sample("GPU-a", i, util, 1000 + (5000 if i == 4242 else 0)), (), now=float(i + 1))
    summary = tracker.summary(ended_at=10_001.0)
    points = summary["samples"]["GPU-a"]
    assert len(points) <= MAX_POINTS
    assert max(p[1] for p in points) == 100.0 and max(p[2] for p in points) == 6000
    assert summary["gpu_util_max_pct"] == 100.0 and summary["gpu_memory_peak_bytes"] == 6000
    assert 10.0 <= summary["gpu_util_mean_pct"] < 10.1
    assert summary["gpu_seconds"] == 10_001.0


def test_tracker_integrates_busy_time_per_device():
    tracker = UsageTracker(["a", "b"], started_at=0.0)
    for t in (0.0, 10.0, 20.0):
        samples = {**_sample("a", t, 50.0, 1), **_sample("b", t, 100.0, 2)}
        tracker.add(samples, (), now=t)
    s = tracker.summary(ended_at=20.0)
    assert s["gpu_seconds"] == 40.0
    assert s["gpu_busy_seconds"] == 30.0  # 50% of 20 s + 100% of 20 s
    assert s["gpu_util_mean_pct"] == 75.0


# A frame that reports 75% and 2 GiB of its own, then runs until the test lets it go
# (or 60 s): long enough to be watched, and to outlive a worker killed with SIGKILL.
LONG_FRAME = r"""
import json, os, sys, time
state_dir, release = sys.argv[1], sys.argv[2]
idx = os.environ["CUDA_VISIBLE_DEVICES"]
path = os.path.join(state_dir, idx + ".json")
with open(path + ".tmp", "w") as fh:
    json.dump({"utilization_pct": 75, "memory_used_bytes": 5 * 2**30,
               "processes": [{"pid": os.getpid(), "memory_used_bytes": 2 * 2**30, "utilization_pct": 75}]}, fh)
os.replace(path + ".tmp", path)
deadline = time.time() + 60
while time.time() < deadline and not os.path.exists(release):
    time.sleep(0.05)
"""


def _frame_pid(state_dir):
    return json.loads((state_dir / "0.json").read_text())["processes"][0]["pid"]


def test_running_frames_show_live_usage_and_a_killed_worker_leaves_its_samples(farm):
    import os
    import signal

    from farmlib import alive

    fake = farm.host("gpu", [V100], state=True)
    state_dir = farm.tmp / "gpu-state"
    release = farm.tmp / "release"
    job = farm.submit(
        {
            "name": "live",
            "layers": [
                {
                    "name": "train",
                    "command": [sys.executable, "-c", LONG_FRAME, str(state_dir), str(release)],
                    "gpus": 1,
                    "retries": 0,
                }
            ],
        }
    )
    worker = farm.start_worker(fake)  # samples every 0.2 s (farmlib), lease 2 s

    def live_frame():
        frames = farm.frames(job)
        return frames[0] if frames[0]["state"] == "RUNNING" and frames[0]["gpu_util_pct"] == 75 else None

    frame = farm.wait_for(live_frame, what="the running frame's live GPU values")
    assert frame["gpu_memory_used_bytes"] == 2 * GIB, "only the frame's own process is billed"
    assert frame["gpu_sampled_at"].endswith("Z") and frame["ended_at"] is None
    shown = json.loads(farm.cuectl("frame", "show", str(frame["id"]), "--json").stdout)
    assert shown["gpu_util_pct"] == 75 and shown["state"] == "RUNNING"
    (points,) = shown["samples"].values()
    assert len(points) >= 2 and points[-1][1] == 75
    assert "75% 2.0 GiB" in farm.cuectl("frame", "list", "--job", str(job)).stdout
    assert "so far" in farm.cuectl("frame", "show", str(frame["id"])).stdout

    # The series keeps growing while the frame runs; then the worker dies without a word.
    farm.wait_for(
        lambda: (
            len(
                next(
                    iter(
                        json.loads(farm.cuectl("frame", "show", str(frame["id"]), "--json").stdout)["samples"].values()
                    )
                )
            )
            > len(points) + 2
        ),
        what="more samples",
    )
    frame_pid = _frame_pid(state_dir)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(10)
    try:
        before = json.loads(farm.cuectl("frame", "show", str(frame["id"]), "--json").stdout)
        (kept,) = before["samples"].values()
        assert len(kept) > len(points) + 2 and max(p[1] for p in kept) == 75
        assert before["state"] == "RUNNING"  # until its lease expires
        # Once its lease expires the attempt is reaped as lost (no retries left: DEAD); the
        # samples taken so far stay in the store.
        farm.wait_for(lambda: json.loads(farm.cuectl("admin", "reap", "--json").stdout)["reaped"], what="the reap")
        after = json.loads(farm.cuectl("frame", "show", str(frame["id"]), "--json").stdout)
        assert after["state"] == "DEAD" and after["gpu_util_pct"] is None and after["gpu_sampled_at"] is None
        assert [a["outcome"] for a in after["attempt_history"]] == ["lost"]
        assert after["samples"] == before["samples"]
    finally:
        release.touch()
        if alive(frame_pid):
            os.kill(frame_pid, signal.SIGKILL)
