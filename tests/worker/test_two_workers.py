"""Two workers on one host (issue 13, item 3): never a frame run twice, never one worker
killing the other's frames.

The decision (docs/scheduling.md "One worker per host name"): a second worker with the
same host name on the same machine is refused with one line naming the running one — its
state directory is locked for the first worker's life. Workers with different names on one
machine share its GPUs through the device leases.
"""

from __future__ import annotations

import os
import re
from collections import Counter

from farmlib import V100, intervals_overlap


def uuids_of(event) -> list[str]:
    raw = event["env"]["CUE_GPU_UUIDS"]
    return [u for u in raw.split(",") if u] if raw else []


def _assert_each_frame_ran_once(farm, job, frames: int) -> None:
    events = farm.events()
    starts = [e for e in events if e["event"] == "start"]
    per_frame = Counter(e["env"]["CUE_FRAME_ID"] for e in starts)
    assert len(per_frame) == frames and set(per_frame.values()) == {1}, per_frame
    assert [e for e in events if e["event"] == "killed"] == [], "a worker killed a frame"
    assert intervals_overlap(events, uuids_of) == []
    assert {f["state"] for f in farm.frames(job)} == {"SUCCEEDED"}
    assert {f["attempts"] for f in farm.frames(job)} == {1}


def test_second_worker_with_the_same_name_is_refused_and_touches_nothing(farm):
    fake = farm.host("twin", [V100, V100])
    job = farm.submit(
        {"name": "twins", "layers": [{"name": "r", "command": farm.probe("--sleep", "1.5"), "range": "1-4", "gpus": 1}]}
    )
    first = farm.start_worker(fake, "--until-idle")
    farm.wait_for(lambda: len(farm.starts()) >= 2, what="the first worker's frames to start")
    second = farm.run_worker(fake, timeout=60)
    assert second.returncode == 1
    lines = [line for line in second.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, second.stderr
    assert re.search(
        rf"another cuectl worker \(pid {first.pid}\b.*already running as host 'twin' on this machine", lines[0]
    ), lines[0]
    _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    _assert_each_frame_ran_once(farm, job, 4)


def test_workers_with_different_names_share_the_host_through_leases(farm):
    fake = farm.host("shared", [V100, V100])
    job = farm.submit(
        {"name": "pair", "layers": [{"name": "r", "command": farm.probe("--sleep", "0.3"), "range": "1-10", "gpus": 1}]}
    )
    a = farm.start_worker(fake, "--until-idle", "--name", "shared-a")
    b = farm.start_worker(fake, "--until-idle", "--name", "shared-b")
    for proc in (a, b):
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    _assert_each_frame_ran_once(farm, job, 10)
    hosts = {f["host"] for f in farm.frames(job)}
    assert hosts <= {"shared-a", "shared-b"}


def test_same_name_with_another_state_dir_does_not_requeue_live_frames(farm):
    """A misconfiguration (same --name, another XDG_STATE_HOME): the state lock cannot see
    it, but recovery still leaves frames claimed by a live worker alone."""
    fake = farm.host("twin2", [V100, V100])
    job = farm.submit(
        {"name": "twins", "layers": [{"name": "r", "command": farm.probe("--sleep", "1.5"), "range": "1-2", "gpus": 1}]}
    )
    first = farm.start_worker(fake, "--until-idle")
    farm.wait_for(lambda: len(farm.starts()) >= 2, what="the first worker's frames to start")
    other_state = {"XDG_STATE_HOME": str(farm.tmp / "other-state")}
    second = farm.start_worker(fake, "--until-idle", env=other_state)
    for proc in (first, second):
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    _assert_each_frame_ran_once(farm, job, 2)
    assert os.path.isdir(farm.tmp / "other-state")
