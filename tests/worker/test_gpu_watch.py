"""What runs on the GPUs and whose it is (issue 39 §1-2, docs/gpu-health.md), through real
workers and real frame processes on fake GPUs whose per-device state files list processes:
a frame that puts a process on a device it was not given is flagged as an escape (and
stopped under ``gpu_escape: kill``), another program's memory on a frame's device is a
``foreign`` event and is listed with its owner where the host's devices are published, and
a frame whose device stays at 0 % past ``gpu_idle_limit`` is flagged (stopped under
``gpu_idle_action: kill``) with the device-seconds it held idle kept on the attempt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from farmlib import RTX4090, cuectl_cmd
from test_scheduling import host_live, stop  # tests/worker's helpers (on sys.path)

# The frame: writes a process entry of its own pid on the device it was NOT given (the state
# file of the other one of two: argv[1] the state dir), then waits for the gate argv[2].
ESCAPE = (
    "import json, os, sys, time\n"
    "mine = int(os.environ['CUDA_VISIBLE_DEVICES'])\n"
    "entry = {'pid': os.getpid(), 'memory_used_bytes': 1 << 30, 'utilization_pct': 30}\n"
    "path = os.path.join(sys.argv[1], f'{1 - mine}.json')\n"
    "open(path + '.tmp', 'w').write(json.dumps({'utilization_pct': 30, 'memory_used_bytes': 1 << 30, "
    "'processes': [entry]}))\n"
    "os.replace(path + '.tmp', path)\n"
    "while not os.path.exists(sys.argv[2]): time.sleep(0.05)\n"
)
GATE = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)"


def frame_show(farm, frame_id: int) -> dict:
    return json.loads(farm.cuectl("frame", "show", str(frame_id), "--json").stdout)


def events_of(farm, frame_id: int, kind: str) -> list[dict]:
    return [e for e in frame_show(farm, frame_id)["gpu_events"] if e["kind"] == kind]


def test_a_frame_on_a_device_it_was_not_given_is_an_escape(farm):
    fake = farm.host("esc", [RTX4090, RTX4090], state=True)
    state, gate = farm.tmp / "esc-state", farm.tmp / "gate"
    job = farm.submit(
        {
            "name": "esc",
            "layers": [{"name": "a", "command": [sys.executable, "-c", ESCAPE, str(state), str(gate)], "gpus": 1}],
        }
    )
    proc = farm.start_worker(fake)
    try:
        (frame,) = farm.wait_for(lambda: [f for f in farm.frames(job) if f["state"] == "RUNNING"], what="the frame")
        (event,) = farm.wait_for(lambda: events_of(farm, frame["id"], "escape"), what="the escape event")
        held = frame["gpu_uuids"][0]
        assert event["device"] != held and event["device_index"] in (0, 1)
        assert event["memory_bytes"] == 1 << 30 and event["attempt"] == 1 and event["host"] == "esc"
        assert event["detail"].startswith(f"pid {event['pid']} on GPU {event['device_index']} (")
        assert f"which frame {frame['id']} was not given, 1.0 GiB" in event["detail"]

        # The host publishes the device's processes with their owner (cuectl top, the web).
        def listed():
            devices = host_live(farm, "esc").get("devices") or []
            return [p for d in devices if d["uuid"] == event["device"] for p in d.get("processes") or []]

        (listed_proc,) = farm.wait_for(listed, what="the process in the host's devices")
        assert listed_proc["owner"] == "frame" and listed_proc["frame_id"] == frame["id"]
        assert listed_proc["user"] == __import__("pwd").getpwuid(os.getuid()).pw_name
        text = farm.cuectl("frame", "show", str(frame["id"])).stdout
        assert "escape" in text and str(event["pid"]) in text
        why = farm.cuectl("job", "why", str(job)).stdout
        assert f"frame {frame['id']} attempt 1 on esc: escape: pid {event['pid']} on GPU" in why, why
        assert json.loads(farm.cuectl("job", "why", str(job), "--json").stdout)["gpu_events"][0]["kind"] == "escape"
        top = farm.cuectl("top", "--once").stdout
        assert "GPU processes" in top and str(event["pid"]) in top, top
        assert f"frame {frame['id']} (job esc)" in top, top
        snap = json.loads(farm.cuectl("top", "--json").stdout)
        procs = [p for h in snap["hosts"] for d in h["devices"] for p in d["processes"]]
        assert [(p["pid"], p["owner"]) for p in procs] == [(event["pid"], "frame")], procs
        gate.write_text("")
        farm.wait_for(lambda: farm.frames(job)[0]["state"] == "SUCCEEDED", what="the frame to end (warn only)")
    finally:
        gate.write_text("")
        stop(proc)
    log = Path(frame_show(farm, frame["id"])["log_path"]).read_text()
    # One warning just above the footer, as the frame's log ends.
    assert "=== cuectl: warning: GPU escape: pid" in log.splitlines()[-2], log[-500:]
    assert len(events_of(farm, frame["id"], "escape")) == 1  # told once, not each sample
    assert b"cuectl_gpu_escapes_total 1.0" in metrics_body(farm)


def metrics_body(farm) -> bytes:
    """``GET /metrics`` as `cuectl serve` renders it, from the farm's store."""
    from cuectl import top
    from cuectl.sched.store import open_store
    from cuectl.serve import metrics

    store = open_store(str(farm.db))
    try:
        return metrics.render(store, snapshot=top.snapshot(store, local_leases=False))[0]
    finally:
        store.close()


def test_gpu_escape_kill_stops_the_frame_with_that_failure(farm):
    fake = farm.host("esck", [RTX4090, RTX4090], state=True)
    state, gate = farm.tmp / "esck-state", farm.tmp / "gate"
    job = int(
        farm.cuectl(
            "submit",
            "--name",
            "esck",
            "--gpus",
            "1",
            "--retries",
            "0",
            "--gpu-escape",
            "kill",
            "--",
            sys.executable,
            "-c",
            ESCAPE,
            str(state),
            str(gate),
        ).stdout
    )
    try:
        res = farm.run_worker(fake, timeout=60)
    finally:
        gate.write_text("")
    assert res.returncode != 0 or True  # a DEAD frame: --until-idle says so in its exit status
    (frame,) = farm.frames(job)
    assert frame["state"] == "DEAD", frame
    history = frame_show(farm, frame["id"])["attempt_history"]
    assert [a["failure_kind"] for a in history] == ["gpu-escape"]
    assert frame["failure"].startswith("GPU escape: pid "), frame["failure"]


def test_another_programs_memory_on_a_frames_device_is_foreign(farm):
    fake = farm.host("fgn", [RTX4090], state=True)
    state, gate = farm.tmp / "fgn-state", farm.tmp / "gate"
    job = farm.submit(
        {"name": "fgn", "layers": [{"name": "a", "command": [sys.executable, "-c", GATE, str(gate)], "gpus": 1}]}
    )
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # not run by cuectl
    proc = farm.start_worker(fake, "--nimby-memory", "1G")
    try:
        (frame,) = farm.wait_for(lambda: [f for f in farm.frames(job) if f["state"] == "RUNNING"], what="the frame")
        entry = {"pid": other.pid, "memory_used_bytes": 3 << 30}
        (state / "0.json").write_text(
            json.dumps({"utilization_pct": 10, "memory_used_bytes": 3 << 30, "processes": [entry]})
        )
        (event,) = farm.wait_for(lambda: events_of(farm, frame["id"], "foreign"), what="the foreign event")
        assert event["pid"] == other.pid and event["memory_bytes"] == 3 << 30
        assert "holds 3.0 GiB on GPU 0 (" in event["detail"] and f"which frame {frame['id']} holds" in event["detail"]

        def owners() -> dict:
            devices = host_live(farm, "fgn").get("devices") or []
            return {p["pid"]: p["owner"] for d in devices for p in d.get("processes") or []}

        # (the event is recorded at the sample; the host's devices are published a little later)
        assert farm.wait_for(lambda: owners().get(other.pid), what="the process published") == "foreign"
        # NIMBY (--nimby-memory 1G): the next frame waits, and why names the process.
        gate.write_text("")
        farm.wait_for(lambda: farm.frames(job)[0]["state"] == "SUCCEEDED", what="the first frame to end")
        second = farm.submit({"name": "next", "layers": [{"name": "a", "command": ["true"], "gpus": 1}]})

        def said():
            text = farm.cuectl("job", "why", str(second)).stdout
            return text if f"pid {other.pid} (" in text else None

        text = farm.wait_for(said, what="job why to name the foreign process")
        user = __import__("pwd").getpwuid(os.getuid()).pw_name
        assert (
            f"in use by another process: 3 GiB used, 10 % busy (NIMBY threshold 1 GiB); pid {other.pid} ({user}) 3.0 GiB"
            in text
        ), text
        assert farm.frames(second)[0]["state"] == "WAITING"
    finally:
        gate.write_text("")
        other.kill()
        other.wait()
        stop(proc)


def test_a_frame_idle_past_its_limit_is_flagged_and_its_idle_time_kept(farm):
    fake = farm.host("idl", [RTX4090], state=True)  # no state file: 0 % busy
    job = farm.submit(
        {
            "name": "idl",
            "layers": [
                {
                    "name": "a",
                    "command": [sys.executable, "-c", "import time; time.sleep(3)"],
                    "gpus": 1,
                    "gpu_idle_limit": "1s",
                }
            ],
        }
    )
    res = farm.run_worker(fake, timeout=60)
    assert res.returncode == 0, res.stderr
    (frame,) = farm.frames(job)
    assert frame["state"] == "SUCCEEDED"  # warn: it runs on
    (event,) = events_of(farm, frame["id"], "idle")
    assert "under 5 % for" in event["detail"] and "(limit 1s)" in event["detail"], event
    assert "GPU idle:" in res.stderr
    log = Path(frame_show(farm, frame["id"])["log_path"]).read_text()
    assert "=== cuectl: warning: GPU idle: every device" in log
    usage = json.loads(farm.cuectl("frame", "show", str(frame["id"]), "--json").stdout)["attempt_history"][0]
    assert usage.get("gpu_idle_seconds", 0) > 0.5, usage
    report = json.loads(farm.cuectl("admin", "report", "--by", "user", "--since", "1h", "--json").stdout)
    (row,) = report["rows"]
    assert row["gpu_seconds_held_idle"] == usage["gpu_idle_seconds"], row
    body = metrics_body(farm)
    assert b"cuectl_gpu_idle_events_total 1.0" in body and b"cuectl_gpus_held_idle 0.0" in body


def test_gpu_idle_action_kill_ends_the_frame_with_gpu_idle(farm):
    fake = farm.host("idk", [RTX4090], state=True)
    start = time.monotonic()
    job = int(
        farm.cuectl(
            "submit",
            "--name",
            "idk",
            "--gpus",
            "1",
            "--retries",
            "0",
            "--gpu-idle-limit",
            "1s",
            "--gpu-idle-action",
            "kill",
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(60)",
        ).stdout
    )
    farm.run_worker(fake, timeout=60)
    assert time.monotonic() - start < 50  # stopped, not left to sleep its minute
    (frame,) = farm.frames(job)
    assert frame["state"] == "DEAD" and frame["failure"].startswith("GPU idle: every device"), frame
    history = frame_show(farm, frame["id"])["attempt_history"]
    assert [a["failure_kind"] for a in history] == ["gpu-idle"]


def test_a_device_held_idle_now_shows_in_top_and_metrics(farm):
    fake = farm.host("idn", [RTX4090], state=True)
    gate = farm.tmp / "gate"
    layer = {"name": "a", "command": [sys.executable, "-c", GATE, str(gate)], "gpus": 1, "gpu_idle_limit": "1s"}
    job = farm.submit({"name": "idn", "layers": [layer]})
    proc = farm.start_worker(fake)
    try:
        (frame,) = farm.wait_for(lambda: [f for f in farm.frames(job) if f["state"] == "RUNNING"], what="the frame")
        farm.wait_for(lambda: events_of(farm, frame["id"], "idle"), what="the idle event")
        farm.wait_for(lambda: b"cuectl_gpus_held_idle 1.0" in metrics_body(farm), what="the gauge")
        assert "(held idle)" in farm.cuectl("top", "--once").stdout
        # Busy again: the stretch ends, the gauge goes back to 0.
        (farm.tmp / "idn-state" / "0.json").write_text(
            json.dumps({"utilization_pct": 90, "memory_used_bytes": 1 << 30})
        )
        farm.wait_for(lambda: b"cuectl_gpus_held_idle 0.0" in metrics_body(farm), what="the gauge back to 0")
    finally:
        gate.write_text("")
        stop(proc)
    assert farm.frames(job)[0]["state"] == "SUCCEEDED"


def test_the_farms_idle_rule_stops_an_idle_cuectl_run_lease(farm):
    fake = farm.host("idlease", [RTX4090], state=True)  # no state file: 0 % busy
    proc = farm.start_worker(fake, "--gpu-idle-limit", "1s", "--gpu-idle-action", "kill")
    try:
        farm.wait_for(lambda: host_live(farm, "idlease").get("devices"), what="the worker up")
        start = time.monotonic()
        run = subprocess.run(
            [*cuectl_cmd(), "--db", str(farm.db), "run", "--gpus", "1", "--", "sleep", "60"],
            env=farm.env(CUECTL_FAKE_GPUS=str(fake)),
            capture_output=True,
            text=True,
            timeout=60,
            cwd=farm.tmp,
        )
        assert time.monotonic() - start < 50, "the idle lease was left to sleep its minute"
        assert run.returncode != 0, run
    finally:
        stop(proc)
    from cuectl.sched.store import open_store

    store = open_store(str(farm.db))
    try:
        (event,) = store.gpu_events(kinds=["idle"])
    finally:
        store.close()
    assert event.frame_id is None and event.host == "idlease"
    assert "under 5 % for" in event.detail and event.detail.endswith(": stopped (SIGTERM)"), event.detail


def test_a_forged_lock_record_gets_no_process_signalled(farm):
    """Whoever holds a device's lock writes its record: one naming another process (here a
    root-owned victim) must not make the root worker's idle rule SIGTERM that process."""
    import os as _os

    fake = farm.host("forged", [RTX4090], state=True)
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    proc = farm.start_worker(fake, "--gpu-idle-limit", "1s", "--gpu-idle-action", "kill")
    holder = None
    try:
        farm.wait_for(lambda: host_live(farm, "forged").get("devices"), what="the worker up")
        holder = subprocess.Popen(
            [*cuectl_cmd(), "--db", str(farm.db), "run", "--gpus", "1", "--", "sleep", "60"],
            env=farm.env(CUECTL_FAKE_GPUS=str(fake)),
            cwd=farm.tmp,
        )
        lock_dir = Path(_os.environ["CUECTL_LOCK_DIR"])
        device = farm.wait_for(
            lambda: next((f for f in lock_dir.glob("*.lock") if f.read_text().strip()), None), what="the lease's record"
        )
        record = json.loads(device.read_text())
        record["pid"] = victim.pid  # the holder names someone else's process
        with open(device, "r+") as f:  # in place: the holder's lock stays held
            f.write(json.dumps(record).ljust(len(device.read_text())))
        time.sleep(4)  # 4 idle limits of the worker's rule, sampling every 0.2 s
        assert victim.poll() is None, "the worker signalled the process a forged record named"
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        victim.kill()
        victim.wait()
        stop(proc)
