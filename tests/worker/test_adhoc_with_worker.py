"""Queued frames and ad-hoc `cuectl run` share one machine's devices without overlap."""

from __future__ import annotations

import subprocess
import sys

from farmlib import PROBE, V100, cuectl_cmd, intervals_overlap


def uuids_of(event) -> list[str]:
    raw = event["env"]["CUE_GPU_UUIDS"]
    return [u for u in raw.split(",") if u] if raw else []


def test_worker_and_cuectl_run_never_share_a_device(farm):
    fake = farm.host("shared", [V100, V100])
    job = farm.submit(
        {
            "name": "queued",
            "layers": [{"name": "r", "command": farm.probe("--sleep", "0.15"), "range": "1-12", "gpus": 1}],
        }
    )
    worker = farm.start_worker(fake, "--until-idle")
    env = farm.env(CUECTL_FAKE_GPUS=str(fake))
    adhoc = [
        subprocess.Popen(
            [
                *cuectl_cmd(),
                "run",
                "--gpus",
                "1",
                "--wait",
                "--timeout",
                "120",
                "--",
                sys.executable,
                PROBE,
                str(farm.ledger),
                "--sleep",
                "0.15",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    for p in adhoc:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    assert worker.wait(180) == 0
    events = farm.events()
    runs = [e for e in events if e["event"] == "start"]
    assert len(runs) == 18
    assert len([e for e in runs if e["env"]["CUE_JOB"] is None]) == 6, "six ad-hoc runs, outside any job"
    assert all(len(uuids_of(e)) == 1 for e in runs)
    assert intervals_overlap(events, uuids_of) == []
    assert {f["state"] for f in farm.frames(job)} == {"SUCCEEDED"}
