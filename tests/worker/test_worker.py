"""The worker end to end: real `cuectl worker` processes, real SQLite, fake GPUs."""

from __future__ import annotations

import json
import os
import signal
import time

from farmlib import A100, MI100, RTX4090, V100, alive, intervals_overlap


def uuids_of(event) -> list[str]:
    raw = event["env"]["CUE_GPU_UUIDS"]
    return [u for u in raw.split(",") if u] if raw else []


def layer(name, command, **kw):
    return {"name": name, "command": command, **kw}


def test_placement_by_model_memory_and_vendor(farm):
    fake = farm.host("mixed", [V100, A100, RTX4090])
    job = farm.submit(
        {
            "name": "place",
            "layers": [
                layer("a100", farm.probe(), gpus=1, gpu_models=["A100"]),
                layer("big", farm.probe(), gpus=1, gpu_memory_min="24G"),  # 4090 is the smallest that fits
                layer("v100", farm.probe(), gpus=1, gpu_models=["*V100*"]),
                layer("two", farm.probe(), gpus=2, gpu_memory_min="20G"),
            ],
        }
    )
    res = farm.run_worker(fake)
    assert res.returncode == 0, res.stderr
    devices = {
        d["uuid"]: d
        for d in farm.cuectl("gpu", "list", "--json", fake=fake)
        and __import__("json").loads(farm.cuectl("gpu", "list", "--json", fake=fake).stdout)["devices"]
    }
    by_layer = {e["env"]["CUE_LAYER"]: e for e in farm.starts()}
    model = lambda e: sorted(devices[u]["model"] for u in uuids_of(e))  # noqa: E731
    assert model(by_layer["a100"]) == ["NVIDIA A100-SXM4-80GB"]
    assert model(by_layer["big"]) == ["NVIDIA GeForce RTX 4090"]
    assert model(by_layer["v100"]) == ["Tesla V100-SXM2-16GB"]
    assert model(by_layer["two"]) == ["NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090"]
    e = by_layer["a100"]["env"]
    idx = str(devices[uuids_of(by_layer["a100"])[0]]["index"])
    assert (e["CUDA_VISIBLE_DEVICES"], e["CUE_GPU_CORES"], e["CUE_GPUS"], e["CUDA_DEVICE_ORDER"]) == (
        idx,
        idx,
        "1",
        "PCI_BUS_ID",
    )
    assert e["NVIDIA_VISIBLE_DEVICES"] == uuids_of(by_layer["a100"])[0]
    assert {f["state"] for f in farm.frames(job)} == {"SUCCEEDED"}


def test_unsatisfiable_work_is_explained_and_until_idle_exits(farm):
    fake = farm.host("nv", [V100])
    cpu_only = farm.host("cpu", [])
    job = farm.submit({"name": "amd", "layers": [layer("r", farm.probe(), gpus=1, gpu_vendor="AMD")]})
    res = farm.run_worker(fake, timeout=60)
    assert res.returncode == 0
    assert farm.starts() == []
    reason = farm.job(job)["pending_reason"]
    assert "vendor AMD" in reason and "V100" in reason
    # No CPU fallback: a GPU layer never runs on a host without GPUs either.
    job2 = farm.submit({"name": "gpu", "layers": [layer("r", farm.probe(), gpus=1)]})
    assert farm.run_worker(cpu_only).returncode == 0
    assert farm.starts() == []
    assert {f["state"] for f in farm.frames(job2)} == {"WAITING"}


def test_cpu_frames_on_a_gpu_host_see_no_gpus(farm):
    fake = farm.host("g", [V100, MI100])
    farm.submit({"name": "cpu", "layers": [layer("c", farm.probe())]})
    assert farm.run_worker(fake).returncode == 0
    (start,) = farm.starts()
    env = start["env"]
    assert env["CUDA_VISIBLE_DEVICES"] in ("", "-1") and env["CUE_GPUS"] == "0"
    assert env["NVIDIA_VISIBLE_DEVICES"] in ("void", "none", "")
    assert env["ROCR_VISIBLE_DEVICES"] is not None and env["ROCR_VISIBLE_DEVICES"] not in ("0", "1", "0,1")


def test_gpu_only_worker_leaves_cpu_frames(farm):
    fake = farm.host("g", [V100])
    job = farm.submit({"name": "cpu", "layers": [layer("c", farm.probe())]})
    assert farm.run_worker(fake, "--gpu-only").returncode == 0
    assert {f["state"] for f in farm.frames(job)} == {"WAITING"}


def test_no_two_frames_on_one_device_and_devices_run_in_parallel(farm):
    fake = farm.host("two", [V100, V100])
    job = farm.submit({"name": "many", "layers": [layer("r", farm.probe("--sleep", "0.3"), range="1-8", gpus=1)]})
    assert farm.run_worker(fake).returncode == 0
    events = farm.events()
    assert intervals_overlap(events, uuids_of) == []
    starts = sorted(e["t"] for e in events if e["event"] == "start")
    ends = sorted(e["t"] for e in events if e["event"] == "end")
    assert starts[1] < ends[0], "two devices should run two frames at once"
    assert {f["state"] for f in farm.frames(job)} == {"SUCCEEDED"}
    assert {len(f["gpu_uuids"]) for f in farm.frames(job)} == {1}


def test_frame_environment_and_tokens(farm):
    fake = farm.host("g", [RTX4090])
    farm.submit(
        {
            "name": "env job",
            "layers": [
                layer(
                    "lay", farm.probe(), range="3-8", chunk=3, gpus=1, cores=2, memory="1G", env={"EXTRA": "#IFRAME#-x"}
                )
            ],
        }
    )
    assert farm.run_worker(fake).returncode == 0
    first = sorted(farm.starts(), key=lambda e: int(e["env"]["CUE_IFRAME"]))[0]["env"]
    assert first["CUE_JOB"] == "env job" and first["CUE_LAYER"] == "lay"
    assert (first["CUE_IFRAME"], first["CUE_FRAME"], first["CUE_RANGE"], first["CUE_CHUNK"]) == (
        "3",
        "0003-lay",
        "3-8",
        "3",
    )
    assert first["CUE_ATTEMPT"] == "1" and first["CUE_THREADS"] == "2" and first["CUE_MEMORY"] == str(1 << 30)
    assert first["CUE_GPU_MEMORY"] == str(24564 * 1024 * 1024)
    assert first["CUE_LOG_PATH"].endswith(".log") and os.path.exists(first["CUE_LOG_PATH"])


def test_retries_then_dead_and_recovering_failures(farm):
    job = farm.submit(
        {
            "name": "fail",
            "layers": [
                layer("bad", farm.probe("--exit", "3"), retries=2, retry_delay=0),  # the back-off: test_scheduling.py
                layer("flaky", farm.probe("--fail-times", "1"), retries=1, retry_delay=0),
            ],
        }
    )
    assert farm.run_worker(None).returncode == 0
    frames = {f["layer"]: f for f in farm.frames(job)}
    assert (frames["bad"]["state"], frames["bad"]["attempts"], frames["bad"]["exit_code"]) == ("DEAD", 3, 3)
    assert (frames["flaky"]["state"], frames["flaky"]["attempts"]) == ("SUCCEEDED", 2)
    assert farm.job(job)["state"] == "FINISHED"


def test_timeout_kills_the_group(farm):
    job = farm.submit({"name": "slow", "layers": [layer("s", farm.probe("--sleep", "30"), timeout="1s", retries=0)]})
    t0 = time.monotonic()
    assert farm.run_worker(None).returncode == 0
    assert time.monotonic() - t0 < 20
    (frame,) = farm.frames(job)
    assert frame["state"] == "DEAD" and frame["exit_code"] == 128 + signal.SIGTERM  # the probe's TERM handler
    (start,) = farm.starts()
    assert not alive(start["pid"])
    assert [e["event"] for e in farm.events()] == ["start", "killed"]
    history = json.loads(farm.cuectl("frame", "show", str(frame["id"]), "--json").stdout)["attempt_history"]
    assert [(a["outcome"], a["timed_out"]) for a in history] == [("timeout", 1)]


def test_kill_retry_eat_running_frames(farm):
    job = farm.submit({"name": "ctl", "layers": [layer("s", farm.probe("--sleep", "60"), range="1-3", cores=1)]})
    proc = farm.start_worker(None, "--cores", "3")
    farm.wait_for(lambda: len(farm.starts()) == 3, what="three frames running")
    ids = {f["number"]: f["id"] for f in farm.frames(job)}
    farm.cuectl("frame", "kill", str(ids[1]))
    farm.cuectl("frame", "eat", str(ids[2]))
    farm.cuectl("frame", "retry", str(ids[3]))

    def states():
        s = {f["number"]: f["state"] for f in farm.frames(job)}
        return s if s[1] == "DEAD" and s[2] == "EATEN" else None

    farm.wait_for(states, timeout=20, what="kill and eat to take effect")
    # The retried frame was killed and started again (attempt 2).
    farm.wait_for(lambda: any(e["env"]["CUE_ATTEMPT"] == "2" for e in farm.starts()), what="retried attempt")
    farm.cuectl("job", "kill", str(job))
    farm.wait_for(lambda: farm.job(job)["state"] == "FINISHED", timeout=20, what="job killed")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert not any(alive(e["pid"]) for e in farm.starts())


def test_dependencies_layer_and_frame_by_frame(farm):
    job = farm.submit(
        {
            "name": "deps",
            "layers": [
                layer("render", farm.probe("--sleep", "0.05"), range="1-4"),
                layer("comp", farm.probe(), range="1-4", depends=[{"layer": "render", "type": "frame"}]),
                layer("final", farm.probe(), range="1", depends=["comp"]),
            ],
        }
    )
    assert farm.run_worker(None, "--cores", "2").returncode == 0
    events = farm.events()
    t = {(e["env"]["CUE_LAYER"], int(e["env"]["CUE_IFRAME"]), e["event"]): e["t"] for e in events}
    for n in range(1, 5):
        assert t[("comp", n, "start")] >= t[("render", n, "end")]
    assert t[("final", 1, "start")] >= max(t[("comp", n, "end")] for n in range(1, 5))
    assert farm.job(job)["state"] == "FINISHED"


def test_priority_and_interleave_dispatch_order(farm):
    low = farm.submit({"name": "low", "priority": 1, "layers": [layer("r", farm.probe(), range="1-2")]})
    high = farm.submit({"name": "high", "priority": 9, "layers": [layer("r", farm.probe(), range="1-10:5")]})
    assert farm.run_worker(None, "--cores", "1").returncode == 0
    order = [(e["env"]["CUE_JOB"], int(e["env"]["CUE_IFRAME"])) for e in farm.starts()]
    assert order == [("high", n) for n in (1, 6, 3, 5, 7, 9, 2, 4, 8, 10)] + [("low", 1), ("low", 2)]
    assert farm.job(low)["state"] == farm.job(high)["state"] == "FINISHED"


def test_sigterm_drains_running_frames(farm):
    job = farm.submit({"name": "drain", "layers": [layer("s", farm.probe("--sleep", "1.0"), range="1-6")]})
    proc = farm.start_worker(None, "--cores", "2")
    farm.wait_for(lambda: len(farm.starts()) == 2, what="two frames running")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    events = farm.events()
    assert len([e for e in events if e["event"] == "start"]) == 2
    assert len([e for e in events if e["event"] == "end"]) == 2
    states = sorted(f["state"] for f in farm.frames(job))
    assert states == ["SUCCEEDED"] * 2 + ["WAITING"] * 4


def test_second_signal_kills_and_requeues(farm):
    job = farm.submit({"name": "abort", "layers": [layer("s", farm.probe("--sleep", "60"), range="1-2")]})
    proc = farm.start_worker(None, "--cores", "2")
    farm.wait_for(lambda: len(farm.starts()) == 2, what="two frames running")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 130
    assert sorted(f["state"] for f in farm.frames(job)) == ["WAITING", "WAITING"]
    assert not any(alive(e["pid"]) for e in farm.starts())


def test_sigkilled_worker_orphan_keeps_device_then_restart_requeues(farm):
    fake = farm.host("solo", [V100])
    job = farm.submit({"name": "orphan", "layers": [layer("s", farm.probe("--sleep", "5"), gpus=1, range="1-2")]})
    proc = farm.start_worker(fake)
    farm.wait_for(lambda: len(farm.starts()) == 1, what="frame running")
    os.kill(proc.pid, signal.SIGKILL)  # the worker only: its frame lives on in its own group
    proc.wait(10)
    orphan = farm.starts()[0]["pid"]
    assert alive(orphan)
    leases = farm.cuectl("gpu", "leases", "--json", fake=fake).stdout
    assert str(orphan) in leases, "the orphan still holds the device lease"
    # Another host-less worker on the same host name restarts: kills the orphan, requeues.
    res = farm.run_worker(fake, timeout=90)
    assert res.returncode == 0, res.stderr
    assert not alive(orphan)
    frames = farm.frames(job)
    assert {f["state"] for f in frames} == {"SUCCEEDED"}
    assert sum(f["attempts"] for f in frames) == 3  # the orphaned attempt counted
    # Never two frames on the device at once, the orphan included.
    events = farm.events()
    starts = sorted(e["t"] for e in events if e["event"] == "start")
    assert starts[1] >= farm.starts()[0]["t"]


def test_lost_worker_frames_are_reaped_by_another_host(farm):
    h1 = farm.host("h1", [V100])
    h2 = farm.host("h2", [V100])
    job = farm.submit({"name": "lost", "layers": [layer("s", farm.probe("--sleep", "0.5"), gpus=1, range="1-3")]})
    proc = farm.start_worker(h1)
    farm.wait_for(lambda: len(farm.starts()) == 1, what="frame running on h1")
    os.killpg(proc.pid, signal.SIGKILL)  # the whole host dies: worker and frame
    proc.wait(10)
    res = farm.run_worker(h2, timeout=90)
    assert res.returncode == 0, res.stderr
    frames = farm.frames(job)
    assert {f["state"] for f in frames} == {"SUCCEEDED"} and {f["host"] for f in frames} == {"h2"}
    assert farm.cuectl("admin", "reap").returncode == 0


def test_several_workers_share_a_store(farm):
    hosts = [farm.host(f"n{i}", [V100, A100]) for i in range(3)]
    job = farm.submit({"name": "farm", "layers": [layer("r", farm.probe("--sleep", "0.2"), gpus=1, range="1-18")]})
    procs = [farm.start_worker(h, "--until-idle") for h in hosts]
    for p in procs:
        assert p.wait(120) == 0
    frames = farm.frames(job)
    assert {f["state"] for f in frames} == {"SUCCEEDED"} and len(frames) == 18
    assert len({f["host"] for f in frames}) >= 2
    assert intervals_overlap(farm.events(), uuids_of) == []
    hosts_json = farm.cuectl("host", "list", "--json").stdout
    assert all(f'"n{i}"' in hosts_json for i in range(3))
