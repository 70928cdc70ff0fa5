"""Frames sharing one GPU by memory budget (issue 39 §5, docs/gpu-health.md), through a
real worker on a fake 32 GiB GPU whose live state the test writes: three 10G shares run
at once while an exclusive frame waits, a fourth share waits, and the share that goes
over its budget is killed; its neighbours run on, and a share counts budget/memory of
the device's time."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from test_scheduling import devices_of, stop  # tests/worker's helpers (on sys.path)

GIB = 1024**3
DEVICE = {"model": "NVIDIA A100-PCIE-32GB", "vendor": "NVIDIA", "memory": "32GiB"}

# A frame: notes its pid and budget under argv[1]/<frame id>, then holds its share until
# the file argv[2] exists; the start and end times go to argv[1]/<frame id>.times.
HOLD = (
    "import os, sys, time\n"
    "d, gate = sys.argv[1], sys.argv[2]\n"
    "me = os.environ['CUE_FRAME_ID']\n"
    "t0 = time.time()\n"
    "open(os.path.join(d, me + '.tmp'), 'w').write(f\"{os.getpid()} {os.environ.get('CUE_GPU_SHARE_BYTES', '-')} "
    "{os.environ['CUE_GPU_MEMORY']}\")\n"
    "os.rename(os.path.join(d, me + '.tmp'), os.path.join(d, me))\n"
    "while not os.path.exists(gate): time.sleep(0.05)\n"
    "open(os.path.join(d, me + '.times'), 'w').write(f'{t0} {time.time()}')\n"
)


def _layer(name: str, marks: Path, gate: Path, **extra) -> dict:
    return {"name": name, "command": [sys.executable, "-c", HOLD, str(marks), str(gate)], "retries": 0, **extra}


def _set_processes(state: Path, processes: dict[int, int]) -> None:
    """The fake device's live state: these pids with this much memory each."""
    doc = {
        "utilization_pct": 50,
        "memory_used_bytes": sum(processes.values()),
        "processes": [{"pid": p, "memory_used_bytes": m, "utilization_pct": 10} for p, m in processes.items()],
    }
    tmp = state / ".0.json.tmp"
    tmp.write_text(json.dumps(doc))
    tmp.replace(state / "0.json")


def test_three_shares_run_at_once_an_exclusive_frame_and_a_fourth_share_wait_and_one_over_budget_is_killed(farm):
    fake = farm.host("share-32", [DEVICE], state=True)
    state = farm.tmp / "share-32-state"
    (uuid,) = devices_of(farm, fake).values()
    marks, gate = farm.tmp / "marks", farm.tmp / "gate"
    marks.mkdir()
    shares = farm.submit(
        {
            "name": "shares",
            "layers": [_layer("s", marks, gate, gpu_share="10G", range="1-4")],
        }
    )
    proc = farm.start_worker(fake)
    try:
        farm.wait_for(lambda: len([f for f in farm.frames(shares) if f["state"] == "RUNNING"]) == 3, what="3 shares")
        # An exclusive frame of a higher priority comes: it waits for the whole device.
        whole = farm.submit({"name": "whole", "priority": 90, "layers": [_layer("w", marks, gate, gpus=1)]})
        frames = {f["id"]: f for f in farm.frames(shares)}
        running = sorted(i for i, f in frames.items() if f["state"] == "RUNNING")
        farm.wait_for(lambda: all((marks / str(i)).exists() for i in running), what="the shares' notes")
        notes = {i: (marks / str(i)).read_text().split() for i in running}
        assert {(b, m) for _, b, m in notes.values()} == {(str(10 * GIB), str(10 * GIB))}
        leases = json.loads(farm.cuectl("gpu", "leases", "--json", fake=fake).stdout)
        (device,) = leases["devices"]
        assert sorted(s["holder"] for s in device["shares"]) == [f"frame {i}" for i in running]
        assert [s["share_bytes"] for s in device["shares"]] == [10 * GIB] * 3
        # The third share uses 12 GiB of its 10: two samples later it is killed.
        pids = {i: int(n[0]) for i, n in notes.items()}
        hog = running[2]
        _set_processes(state, {pids[running[0]]: 4 * GIB, pids[running[1]]: 4 * GIB, pids[hog]: 12 * GIB})
        farm.wait_for(lambda: farm.frames(shares)[running.index(hog)]["state"] == "DEAD", what="the hog killed")
        _set_processes(state, {pids[running[0]]: 4 * GIB, pids[running[1]]: 4 * GIB})
        # Its share went with it: the fourth share runs beside the two; the exclusive frame still waits.
        farm.wait_for(lambda: [f["state"] for f in farm.frames(shares)].count("RUNNING") == 3, what="the fourth share")
        assert farm.frames(whole)[0]["state"] == "WAITING"
        gate.write_text("")
        farm.wait_for(lambda: farm.frames(whole)[0]["state"] == "SUCCEEDED", what="the exclusive frame")
    finally:
        gate.write_text("")
        stop(proc)
    states = {f["id"]: f["state"] for f in farm.frames(shares)}
    assert sorted(states.values()) == ["DEAD", "SUCCEEDED", "SUCCEEDED", "SUCCEEDED"]
    shown = json.loads(farm.cuectl("frame", "show", str(hog), "--json").stdout)
    (attempt,) = shown["attempt_history"]
    assert attempt["failure_kind"] == "gpu-over-budget"
    assert "12.0 GiB on GPU 0 (budget 10.0 GiB) for 2 samples" in shown["failure"]
    assert [(e.kind, e.device_uuid, e.pid, e.memory_bytes) for e in _events(farm, hog)] == [
        ("over-budget", uuid, pids[hog], 12 * GIB)
    ]
    # The exclusive frame started only once every share had ended.
    times = {int(p.name.split(".")[0]): [float(x) for x in p.read_text().split()] for p in marks.glob("*.times")}
    (whole_id,) = [f["id"] for f in farm.frames(whole)]
    assert times[whole_id][0] >= max(end for i, (_, end) in times.items() if i != whole_id)
    # A share counts 10/32 of the device's time; the exclusive frame all of it.
    for frame_id, part in [(running[0], 10 / 32), (whole_id, 1.0)]:
        (a,) = json.loads(farm.cuectl("frame", "show", str(frame_id), "--json").stdout)["attempt_history"]
        wall = _epoch(a["ended_at"]) - _epoch(a["started_at"])
        assert abs(a["gpu_seconds"] - wall * part) <= 0.03 + 0.02 * wall, (a, part)


def _events(farm, frame_id: int) -> list:
    """The GPU events the worker recorded for the frame, from the store."""
    from cuectl.sched.store import open_store

    store = open_store(str(farm.db), create=False)
    try:
        return store.gpu_events(frame_id=frame_id)
    finally:
        store.close()


def _epoch(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_an_over_budget_share_under_warn_runs_on_with_an_event_and_a_note(farm):
    fake = farm.host("share-warn", [DEVICE], state=True)
    state = farm.tmp / "share-warn-state"
    marks, gate = farm.tmp / "marks", farm.tmp / "gate"
    marks.mkdir()
    job = farm.submit(
        {"name": "warned", "layers": [_layer("s", marks, gate, gpu_share="8G", gpu_share_enforce="warn")]}
    )
    proc = farm.start_worker(fake)
    try:
        (frame,) = farm.wait_for(lambda: [f for f in farm.frames(job) if f["state"] == "RUNNING"], what="the share")
        farm.wait_for(lambda: (marks / str(frame["id"])).exists(), what="its note")
        pid = int((marks / str(frame["id"])).read_text().split()[0])
        _set_processes(state, {pid: 9 * GIB})
        farm.wait_for(lambda: _events(farm, frame["id"]), what="the over-budget event")
        gate.write_text("")
        farm.wait_for(lambda: farm.frames(job)[0]["state"] == "SUCCEEDED", what="the share to finish")
    finally:
        gate.write_text("")
        stop(proc)
    assert [(e.kind, e.memory_bytes) for e in _events(farm, frame["id"])] == [("over-budget", 9 * GIB)]
    log = farm.cuectl("frame", "log", str(frame["id"])).stdout
    assert "warning: GPU share over budget: 9.0 GiB on GPU 0 (budget 8.0 GiB)" in log
