"""The worker finds its GPUs again (SIGHUP, --rediscover-interval): a device that vanished
or went bad gets no new frames, a frame already running on it is left to finish, `host
show` says which device is gone and since when, and a device that comes back rejoins.
Real workers on fake GPUs whose file the test edits."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import yaml
from farmlib import PROBE, Farm

UUID_T4 = "GPU-aaaaaaaa-0000-4000-8000-000000000001"
UUID_A100 = "GPU-bbbbbbbb-0000-4000-8000-000000000002"
# The T4 is the smaller card: a one-GPU frame goes there first (smallest fit).
T4 = {"model": "Tesla T4", "vendor": "NVIDIA", "memory": "15360MiB", "uuid": UUID_T4}
A100 = {"model": "NVIDIA A100-SXM4-80GB", "vendor": "NVIDIA", "memory": "80GiB", "uuid": UUID_A100}


def rewrite(path: Path, host: str, devices: list[dict[str, Any]]) -> None:
    """Replace the fake GPU file atomically: a periodic re-discovery never reads half of it."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(yaml.safe_dump({"host": host, "devices": devices}))
    os.replace(tmp, path)


def host_doc(farm: Farm, name: str) -> dict[str, Any]:
    res = farm.cuectl("host", "show", name, "--json", check=False)
    return json.loads(res.stdout) if res.returncode == 0 else {}


def gpu_uuids(doc: dict[str, Any]) -> list[str]:
    return [g["uuid"] for g in doc.get("gpus", [])]


def unavailable(doc: dict[str, Any]) -> list[str]:
    return [g["uuid"] for g in (doc.get("live") or {}).get("unavailable", [])]


def held_frame(farm: Farm, flag: Path) -> list[str]:
    """A frame that records its start, then runs until ``flag`` exists."""
    return [
        "sh",
        "-c",
        f'"$1" {PROBE} "$2" && while [ ! -e "$0" ]; do sleep 0.05; done',
        str(flag),
        sys.executable,
        str(farm.ledger),
    ]


def uuids_of(event: dict[str, Any]) -> list[str]:
    raw = event["env"]["CUE_GPU_UUIDS"]
    return [u for u in raw.split(",") if u] if raw else []


def test_sighup_takes_a_vanished_gpu_out_and_leaves_its_running_frame_alone(farm: Farm) -> None:
    fake = farm.host("hup-01", [T4, A100])
    flag = farm.tmp / "release"
    # Submitted first: the store exists before the worker opens it.
    long_job = farm.submit({"name": "long", "layers": [{"name": "hold", "command": held_frame(farm, flag), "gpus": 1}]})
    worker = farm.start_worker(fake, "--rediscover-interval", "0")  # only SIGHUP re-discovers
    try:
        (start,) = farm.wait_for(lambda: farm.starts(), timeout=60, what="the long frame to start")
        assert uuids_of(start) == [UUID_T4]

        rewrite(fake, "hup-01", [A100])  # the T4 fell off the bus
        os.kill(worker.pid, signal.SIGHUP)
        doc = farm.wait_for(
            lambda: (d := host_doc(farm, "hup-01")) and UUID_T4 in unavailable(d) and d,
            timeout=60,
            what="host show to name the vanished GPU",
        )
        assert gpu_uuids(doc) == [UUID_A100]
        shown = farm.cuectl("host", "show", "hup-01").stdout
        assert f"{UUID_T4} (Tesla T4): gone since " in shown
        assert worker.poll() is None, "SIGHUP must not stop the worker"

        # New frames only get the A100, one after another, while the T4's frame runs on.
        job = farm.submit(
            {"name": "after", "layers": [{"name": "r", "command": farm.probe(), "range": "1-3", "gpus": 1}]}
        )
        farm.wait_for(
            lambda: {f["state"] for f in farm.frames(job)} == {"SUCCEEDED"}, timeout=90, what="the new frames to finish"
        )
        later = [e for e in farm.starts() if e["env"]["CUE_JOB"] == "after"]
        assert [uuids_of(e) for e in later] == [[UUID_A100]] * 3
        (held,) = farm.frames(long_job)
        assert held["state"] == "RUNNING" and held["gpu_uuids"] == [UUID_T4]
        assert [e for e in farm.events() if e["event"] == "killed"] == []
    finally:
        flag.touch()
    farm.wait_for(
        lambda: farm.frames(long_job)[0]["state"] == "SUCCEEDED",
        timeout=60,
        what="the frame on the vanished GPU to finish on its own",
    )
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert f"GPU 0 {UUID_T4} (Tesla T4) is gone" in err


def test_periodic_rediscovery_drops_an_unhealthy_gpu_and_takes_it_back(farm: Farm) -> None:
    fake = farm.host("poll-01", [T4, A100])
    farm.cuectl("admin", "migrate")  # the store exists before the worker opens it
    worker = farm.start_worker(fake, "--rediscover-interval", "0.2")
    farm.wait_for(
        lambda: gpu_uuids(host_doc(farm, "poll-01")) == [UUID_T4, UUID_A100], timeout=60, what="the worker to register"
    )

    rewrite(fake, "poll-01", [{**T4, "healthy": False, "error": "GPU has fallen off the bus"}, A100])
    doc = farm.wait_for(
        lambda: (d := host_doc(farm, "poll-01")) and unavailable(d) == [UUID_T4] and d,
        timeout=60,
        what="the unhealthy GPU to be listed as unavailable",
    )
    assert gpu_uuids(doc) == [UUID_A100]
    (gone,) = doc["live"]["unavailable"]
    assert gone["model"] == "Tesla T4" and gone["since"].endswith("Z")

    job = farm.submit({"name": "sick", "layers": [{"name": "r", "command": farm.probe(), "range": "1-2", "gpus": 1}]})
    farm.wait_for(
        lambda: {f["state"] for f in farm.frames(job)} == {"SUCCEEDED"},
        timeout=90,
        what="frames to finish on the healthy GPU",
    )
    assert {u for e in farm.starts() for u in uuids_of(e)} == {UUID_A100}

    rewrite(fake, "poll-01", [T4, A100])
    doc = farm.wait_for(
        lambda: (d := host_doc(farm, "poll-01")) and gpu_uuids(d) == [UUID_T4, UUID_A100] and not unavailable(d) and d,
        timeout=60,
        what="the GPU to come back",
    )
    assert "gone since" not in farm.cuectl("host", "show", "poll-01").stdout
    assert worker.poll() is None
