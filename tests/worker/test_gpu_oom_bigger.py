"""A GPU out-of-memory retried on a bigger GPU (issue 39 §6), through real workers on fake
GPUs: the frame runs out of memory on the 24 GB device (the worker's best fit) and its
retry runs on the 80 GB one; with only small devices it is DEAD after one attempt, its
retries unburnt; without ``retry_on_gpu_oom`` nothing changes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from farmlib import A100, RTX4090, V100
from test_scheduling import devices_of, stop  # tests/worker's helpers (on sys.path)

# The frame: runs out of memory (as PyTorch says it) on any device but the one named in
# argv[2], appending the devices of each attempt to argv[1].
OOM = (
    "import os, sys; uuids = os.environ['CUE_GPU_UUIDS']; "
    "open(sys.argv[1], 'a').write(uuids + '\\n'); "
    "big = uuids == sys.argv[2]; "
    "print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 30.00 GiB', file=sys.stderr) "
    "if not big else None; sys.exit(0 if big else 1)"
)
# Holds a device until the file argv[1] exists.
GATE = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)"


def oom_layer(runs: Path, big_uuid: str, **extra) -> dict:
    return {
        "name": "train",
        "command": [sys.executable, "-c", OOM, str(runs), big_uuid],
        "gpus": 1,
        "retries": 3,
        "retry_delay": 0,
        **extra,
    }


def test_retried_on_the_bigger_device_and_job_why_says_so(farm):
    fake = farm.host("oom-mixed", [RTX4090, A100])
    uuids = devices_of(farm, fake)
    small, big = uuids[0], uuids[1]
    gate, runs = farm.tmp / "gate", farm.tmp / "runs.txt"
    # The 80 GB device is held first (a frame that needs 40 GB), so the frame that runs out
    # of memory on the 24 GB one has to wait for it: `job why` says what for.
    holder = farm.submit(
        {
            "name": "holder",
            "priority": 10,
            "layers": [
                {
                    "name": "h",
                    "command": [sys.executable, "-c", GATE, str(gate)],
                    "gpus": 1,
                    "gpu_memory_min": "40G",
                }
            ],
        }
    )
    proc = farm.start_worker(fake)
    try:
        farm.wait_for(lambda: farm.frames(holder)[0]["state"] == "RUNNING", what="the holder on the 80 GB device")
        job = farm.submit({"name": "grows", "layers": [oom_layer(runs, big, retry_on_gpu_oom="bigger")]})
        farm.wait_for(
            lambda: (f := farm.frames(job)[0])["state"] == "WAITING" and f["attempts"] == 1,
            what="the first attempt out of memory",
        )
        (frame,) = farm.frames(job)
        assert frame["gpu_oom_bytes"] == 24564 * 1024**2
        assert frame["failure"].startswith("GPU out of memory: torch.OutOfMemoryError")
        assert frame["pending_reason"].startswith(
            "ran out of GPU memory on 24.0 GiB: waits for a GPU bigger than 24.0 GiB"
        ), frame["pending_reason"]
        why = json.loads(farm.cuectl("job", "why", str(job), "--json").stdout)
        (layer,) = why["layers"]
        lines = {line["host"]: line for line in layer["hosts"]}
        assert lines["oom-mixed"]["check"] == "busy", lines  # only the 80 GB device is considered
        assert "gpu 1 held by frame" in lines["oom-mixed"]["reason"], lines
        text = farm.cuectl("job", "why", str(job)).stdout
        assert "needs 1 GPU, 0 of 1 fitting free" in text, text
        gate.write_text("")
        farm.wait_for(lambda: farm.frames(job)[0]["state"] == "SUCCEEDED", what="the retry on the 80 GB device")
    finally:
        gate.write_text("")
        stop(proc)
    assert runs.read_text().split() == [small, big]
    history = json.loads(farm.cuectl("frame", "show", str(frame["id"]), "--json").stdout)["attempt_history"]
    assert [(a["failure_kind"], a["gpu_uuids"]) for a in history] == [("gpu-oom", [small]), (None, [big])]


def test_dead_after_one_attempt_when_no_bigger_device_exists(farm):
    fake = farm.host("oom-small", [RTX4090])
    (small,) = devices_of(farm, fake).values()
    runs = farm.tmp / "runs.txt"
    # Submitted with the flag (the console script's fast path reads it too).
    flags = ("--gpus", "1", "--retries", "3", "--retry-delay", "0", "--retry-on-gpu-oom", "bigger")
    job = int(farm.cuectl("submit", "--name", "grows", *flags, "--", *oom_layer(runs, "none")["command"]).stdout)
    assert farm.job(job)["layers"][0]["retry_on_gpu_oom"] == "bigger"
    assert "\t3, bigger GPU on OOM\t" in farm.cuectl("job", "show", str(job)).stdout
    res = farm.run_worker(fake, timeout=60)
    assert res.returncode == 0, res.stderr
    (frame,) = farm.frames(job)
    assert (frame["state"], frame["attempts"]) == ("DEAD", 1)  # its 3 retries unburnt
    assert frame["failure"].startswith(
        "gpu-oom: no GPU bigger than 24.0 GiB (retry_on_gpu_oom: bigger); GPU out of memory: torch.OutOfMemoryError"
    ), frame["failure"]
    assert runs.read_text().split() == [small]


def test_each_retry_climbs_to_a_bigger_device_until_none_is_left(farm):
    fake = farm.host("oom-ladder", [V100, RTX4090])
    uuids = devices_of(farm, fake)
    runs = farm.tmp / "runs.txt"
    job = farm.submit({"name": "grows", "layers": [oom_layer(runs, "none", retry_on_gpu_oom="bigger")]})
    res = farm.run_worker(fake, timeout=60)
    assert res.returncode == 0, res.stderr
    (frame,) = farm.frames(job)
    assert (frame["state"], frame["attempts"]) == ("DEAD", 2)
    assert frame["failure"].startswith("gpu-oom: no GPU bigger than 24.0 GiB"), frame["failure"]
    assert runs.read_text().split() == [uuids[0], uuids[1]]  # the 16 GB V100, then the 24 GB card


def test_without_the_key_the_retry_takes_any_fitting_device(farm):
    fake = farm.host("oom-same", [RTX4090, A100])
    uuids = devices_of(farm, fake)
    runs = farm.tmp / "runs.txt"
    job = farm.submit({"name": "same", "layers": [oom_layer(runs, uuids[1], retries=1)]})
    res = farm.run_worker(fake, timeout=60)
    assert res.returncode == 0, res.stderr
    (frame,) = farm.frames(job)
    assert (frame["state"], frame["attempts"], frame["gpu_oom_bytes"]) == ("DEAD", 2, None)
    assert runs.read_text().split() == [uuids[0], uuids[0]]  # the best fit each time, as before
