#!/usr/bin/env python3
"""The worker's GPU sampling overhead with 8 fake devices busy.

Runs the real `cuectl worker` twice over the same job — 8 frames of one fake GPU each
(8 devices whose live utilisation and memory come from a state_dir, DESIGN §7), each
frame sleeping --seconds — once sampling every --interval seconds and once, the peer in
the same run, sampling only at start and end (--sample-interval far beyond the frames).
Prints:
  1. the worker's CPU time per device sample: the difference in the worker's CPU time
     (user + system, from wait4) between the two runs over the difference in samples
     taken (the stored series hold one point per sample below their 120-point cap);
  2. the store rows each run wrote, counted by triggers the bench adds to its store, by
     cause (heartbeats, live values written each sampling tick, completions); and from
     them the rows a frame costs per hour at the defaults (--sample-interval 10 s,
     --lease-timeout 60 s: a heartbeat every 15 s).

Usage: python bench/bench_sampling.py [--interval S] [--seconds S] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEVICES = 8
MAX_POINTS = 120  # cuectl.run.usage.MAX_POINTS
DEFAULT_HEARTBEAT_S = 60.0 / 4  # --lease-timeout 60 s; the worker heartbeats every lease/4
BENCH_LEASE_S = 4.0  # a heartbeat a second here, so a short run sees many


def cuectl() -> list[str]:
    exe = Path(sys.executable).with_name("cuectl")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]


def fake_gpus(root: Path) -> Path:
    """8 busy devices: each state file gives a utilisation and memory in use."""
    state = root / "state"
    state.mkdir(parents=True, exist_ok=True)
    for i in range(DEVICES):
        (state / f"{i}.json").write_text(
            json.dumps({"utilization_pct": 40 + 7 * i, "memory_used_bytes": (4 + i) << 30})
        )
    spec = root / "gpus.yaml"
    devices = "".join(
        '  - model: "NVIDIA A100-SXM4-80GB"\n    vendor: NVIDIA\n    memory: 80GiB\n' for _ in range(DEVICES)
    )
    spec.write_text(f"host: sampler\nstate_dir: {state}\ndevices:\n{devices}")
    return spec


# Row writes by cause. A heartbeat rewrites each running frame's lease (RUNNING stays
# RUNNING) and the host's live device values; claims and completions change a frame's state.
# Every sampling tick after a frame's first writes its latest values (frames_live) and
# upserts its series so far (samples_insert the first time, then samples_update; the
# completion's series is one more samples_update).
_STAYS_RUNNING = "OLD.state = 'RUNNING' AND NEW.state = 'RUNNING'"
_LIVE = "NEW.gpu_sampled_at IS NOT OLD.gpu_sampled_at"
TRIGGERS = {
    "frames_heartbeat": f"AFTER UPDATE ON frames WHEN {_STAYS_RUNNING} AND NOT ({_LIVE})",
    "frames_live": f"AFTER UPDATE ON frames WHEN {_STAYS_RUNNING} AND {_LIVE}",
    "frames_state": f"AFTER UPDATE ON frames WHEN NOT ({_STAYS_RUNNING})",
    "hosts_update": "AFTER UPDATE ON hosts",
    "hosts_insert": "AFTER INSERT ON hosts",
    "attempts_insert": "AFTER INSERT ON attempts",
    "samples_insert": "AFTER INSERT ON samples",
    "samples_update": "AFTER UPDATE ON samples",
}
DEFAULT_INTERVAL_S = 10.0


def add_counters(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE bench_writes(cause TEXT PRIMARY KEY, n INTEGER NOT NULL)")
    for cause, when in TRIGGERS.items():
        conn.execute(
            f"CREATE TRIGGER bench_{cause} {when} BEGIN INSERT INTO bench_writes VALUES ('{cause}', 1) "
            "ON CONFLICT(cause) DO UPDATE SET n = n + 1; END"
        )
    conn.commit()
    conn.close()


def run(root: Path, name: str, interval: float, seconds: float, spec: Path) -> dict:
    """Submit the job to a fresh store, drain it with one worker; the worker's CPU seconds,
    the samples stored and the rows written."""
    db = root / f"{name}.db"
    env = {**os.environ, "CUECTL_FAKE_GPUS": str(spec), "CUECTL_CREATE_LOCK_DIR": "1"}  # its own lock dir
    job = subprocess.run(
        [
            *cuectl(),
            "--db",
            str(db),
            "submit",
            "--name",
            name,
            "--range",
            f"1-{DEVICES}",
            "--gpus",
            "1",
            "--",
            "sleep",
            f"{seconds:g}",
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    assert job.returncode == 0
    add_counters(db)
    cmd = [
        *cuectl(),
        "--db",
        str(db),
        "worker",
        "--until-idle",
        "--quiet",
        "--cores",
        str(DEVICES),
        "--poll",
        "0.05",
        "--lease-timeout",
        f"{BENCH_LEASE_S:g}",
        "--sample-interval",
        f"{interval:g}",
        "--lock-dir",
        str(root / f"{name}-locks"),
    ]
    log = root / f"{name}-worker.log"
    t0 = time.perf_counter()
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)  # rusage of the worker (and the frames it reaped)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"worker failed ({proc.returncode}): {log.read_text()}")
    conn = sqlite3.connect(db)
    writes = dict(conn.execute("SELECT cause, n FROM bench_writes"))
    points = [len(json.loads(p)) for (p,) in conn.execute("SELECT points FROM samples")]
    row_bytes = conn.execute("SELECT AVG(LENGTH(points)) FROM samples").fetchone()[0]
    states = conn.execute("SELECT state, COUNT(*) FROM frames GROUP BY state").fetchall()
    conn.close()
    assert states == [("SUCCEEDED", DEVICES)], states
    return {
        "cpu": usage.ru_utime + usage.ru_stime,
        "wall": wall,
        "points": sum(points),
        "max_points": max(points),
        "writes": writes,
        "row_bytes": row_bytes,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interval", type=float, default=0.25, help="sampling interval of the measured run (s)")
    ap.add_argument("--seconds", type=float, default=12.0, help="how long each frame runs (s)")
    ap.add_argument("--keep", type=Path, help="keep the stores in this directory")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory() if args.keep is None else None
    root = Path(tmp.name) if tmp else args.keep
    root.mkdir(parents=True, exist_ok=True)
    spec = fake_gpus(root)

    sampled = run(root, "sampled", args.interval, args.seconds, spec)
    base = run(root, "baseline", 86400.0, args.seconds, spec)
    extra = sampled["points"] - base["points"]
    if sampled["max_points"] >= MAX_POINTS:
        print(f"note: series reached the {MAX_POINTS}-point cap; shorten --seconds or lengthen --interval")
    per_sample = (sampled["cpu"] - base["cpu"]) / extra if extra > 0 else float("nan")
    print(f"{DEVICES} fake devices busy, {DEVICES} frames of {args.seconds:g} s, one device each")
    print(
        f"  sampled every {args.interval:g} s: worker CPU {sampled['cpu']:.2f} s, {sampled['points']} device "
        f"samples stored, wall {sampled['wall']:.1f} s"
    )
    print(
        f"  peer, start and end only:  worker CPU {base['cpu']:.2f} s, {base['points']} device samples stored, "
        f"wall {base['wall']:.1f} s"
    )
    print(
        f"  CPU per device sample: {per_sample * 1000:.2f} ms  (per 8-device tick: {per_sample * 8000:.1f} ms; "
        f"at the default 10 s interval, {per_sample * DEVICES / 10 * 100:.3f} % of one core)"
    )

    for label, r in (("sampled", sampled), ("peer", base)):
        w = r["writes"]
        print(f"  rows written ({label}): " + ", ".join(f"{k} {w.get(k, 0)}" for k in TRIGGERS))
    w = sampled["writes"]
    heartbeats = w.get("hosts_update", 0)
    lease_rows = w.get("frames_heartbeat", 0)
    # Once per frame: claim and completion (frames_state), attempt, and the completion's
    # series row per device (one device per frame here).
    per_frame = (w.get("frames_state", 0) + w.get("attempts_insert", 0) + DEVICES) / DEVICES
    per_beat = lease_rows / heartbeats if heartbeats else 0.0
    beats_per_hour = 3600 / DEFAULT_HEARTBEAT_S
    hourly = beats_per_hour * (per_beat / DEVICES + 1 / DEVICES)  # its lease row + its share of the host row
    live_rows = w.get("frames_live", 0)
    live_series = w.get("samples_insert", 0) + w.get("samples_update", 0) - DEVICES  # less the completions
    ticks = live_rows / DEVICES  # live writes per frame (one transaction per tick for all frames)
    per_tick = (live_rows + live_series) / live_rows if live_rows else 0.0  # rows per frame per tick
    live_hourly = 3600 / DEFAULT_INTERVAL_S * per_tick
    base_live = base["writes"].get("frames_live", 0)
    print(
        f"  per frame: {per_frame:.1f} rows once (claim, completion, attempt, one sample series per device "
        f"written at the end, ~{sampled['row_bytes']:.0f} bytes, at most {MAX_POINTS} points)"
    )
    print(
        f"  live values: {ticks:.1f} writes per frame sampled every {args.interval:g} s, each "
        f"{per_tick:.1f} rows (the frame row + its one-device series); the peer, whose frames never "
        f"reach a second sample, wrote {base_live}. At the defaults (one tick every "
        f"{DEFAULT_INTERVAL_S:g} s, one transaction for all frames of the worker) a frame-hour adds "
        f"{live_hourly:.0f} rows"
    )
    print(
        f"  per heartbeat: 1 host row + {per_beat:.1f} lease rows for {DEVICES} running frames; at the defaults "
        f"(one every {DEFAULT_HEARTBEAT_S:g} s) a frame-hour writes {per_frame + hourly + live_hourly:.0f} rows "
        f"({hourly:.0f} of them heartbeats, {live_hourly:.0f} live values)"
    )
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
