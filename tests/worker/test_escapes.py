"""Processes that escape a frame (``setsid cmd &``, double forks) die with it, and the
device they inherited the lease of is free once the frame is over (issue 13, item 4).

The worker is a child subreaper: escapees are re-parented to it, recognised (the frame's
session or group, ``CUE_FRAME_ID`` in their environment, or the lease fd they hold) and
put down with the frame. ``cuectl run`` does the same for its command.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

from farmlib import V100, alive, cuectl_cmd

from cuectl.run.lease import list_leases

# A frame whose shell starts a sleeper in a new session and exits at once, one whose
# sleeper is double-forked (its parent subshell exits, so it leaves the frame's tree), and
# one that also wipes its environment (recognised by the lease fd it still holds).
ESCAPES = {
    "setsid": 'setsid sleep 1000 & echo $! >> "$PIDS"',
    "double_fork": '( setsid sleep 1000 & echo $! >> "$PIDS" ) ; sleep 0.2',
    "env_wiped": 'env -i setsid sleep 1000 & echo $! >> "$PIDS"',
}


def _pids(path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _lock_dir():
    return os.environ["CUECTL_LOCK_DIR"]


def test_escaped_children_die_with_their_frame_and_free_the_device(farm):
    fake = farm.host("esc", [V100])
    pids = farm.tmp / "pids"
    job = farm.submit(
        {
            "name": "escapes",
            "layers": [
                {
                    "name": name,
                    "command": ["/bin/sh", "-c", script],
                    "range": "1",
                    "gpus": 1,
                    "env": {"PIDS": str(pids)},
                }
                for name, script in ESCAPES.items()
            ],
        }
    )
    res = farm.run_worker(fake, timeout=120)
    started = _pids(pids)
    try:
        assert res.returncode == 0, res.stderr
        assert {f["state"] for f in farm.frames(job)} == {"SUCCEEDED"}
        assert len(started) == len(ESCAPES)
        # Every escapee was put down with its frame (and reaped: not even a zombie is left
        # running), and no lease is held: the next frame or `cuectl run` gets the device.
        assert [p for p in started if alive(p)] == []
        assert list_leases(_lock_dir()) == []
        # `gpu leases` agrees: the device is free.
        out = farm.cuectl("gpu", "leases", "--json", fake=fake).stdout
        assert [d["lease"] for d in json.loads(out)["devices"]] == [None]
    finally:
        for p in started:
            if alive(p):
                os.kill(p, 9)


def test_escapee_is_killed_when_its_frame_ends_not_before(farm):
    """A double-forked helper of a frame that still runs is left alone until the frame
    ends (it belongs to a running frame), then put down."""
    fake = farm.host("esc2", [V100, V100])
    pids = farm.tmp / "pids"
    marks = farm.tmp / "marks"
    script = (
        '( setsid sleep 1000 & echo $! >> "$PIDS" ) ; sleep 1; '
        'kill -0 "$(cat "$PIDS")" && echo alive-during-frame >> "$MARKS"'
    )
    job = farm.submit(
        {
            "name": "helper",
            "layers": [
                {
                    "name": "h",
                    "command": ["/bin/sh", "-c", script],
                    "range": "1",
                    "gpus": 1,
                    "env": {"PIDS": str(pids), "MARKS": str(marks)},
                },
                {"name": "other", "command": ["/bin/sh", "-c", "sleep 0.3"], "range": "1-3", "gpus": 1},
            ],
        }
    )
    res = farm.run_worker(fake, timeout=120)
    started = _pids(pids)
    try:
        assert res.returncode == 0, res.stderr
        assert {f["state"] for f in farm.frames(job)} == {"SUCCEEDED"}
        assert marks.read_text().split() == ["alive-during-frame"]  # other frames' ends spared it
        assert started and [p for p in started if alive(p)] == []
        assert list_leases(_lock_dir()) == []
    finally:
        for p in started:
            if alive(p):
                os.kill(p, 9)


def test_cuectl_run_puts_down_what_its_command_left_holding_the_lease(farm):
    fake = farm.host("adhoc", [V100])
    pids = farm.tmp / "pids"
    env = farm.env(CUECTL_FAKE_GPUS=str(fake), PIDS=str(pids))
    t0 = time.monotonic()
    res = subprocess.run(
        [
            *cuectl_cmd(),
            "run",
            "--gpus",
            "1",
            "--no-wait",
            "--",
            "sh",
            "-c",
            'setsid sleep 1000 & echo $! >> "$PIDS"; ( setsid sleep 1000 & echo $! >> "$PIDS" )',
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    started = _pids(pids)
    try:
        assert res.returncode == 0, res.stderr
        assert time.monotonic() - t0 < 30
        assert len(started) == 2 and [p for p in started if alive(p)] == []
        assert list_leases(_lock_dir()) == []
        # The device can be leased again at once.
        again = subprocess.run(
            [*cuectl_cmd(), "run", "--gpus", "1", "--no-wait", "--", "true"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert again.returncode == 0, again.stderr
    finally:
        for p in started:
            if alive(p):
                os.kill(p, 9)
