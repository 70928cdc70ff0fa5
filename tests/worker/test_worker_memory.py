"""A long-lived worker keeps no per-frame state once frames end (it drains millions)."""

from __future__ import annotations

import time

from cuectl import config
from cuectl.run.worker import Supervisor
from cuectl.sched.spec import spec_from_flags


def test_no_per_frame_state_is_left_after_frames_end(solo):
    store, worker = solo
    store.submit(spec_from_flags(name="ok", command=["true"], range="1-6", user=config.current_user()), now=time.time())
    store.submit(
        spec_from_flags(name="bad", command=["false"], range="1-2", retries=0, user=config.current_user()),
        now=time.time(),
    )
    Supervisor(worker).run()
    assert store.list_jobs()[0]["frame_counts"] == {"SUCCEEDED": 6}
    # The OOM-counter reading taken at each launch is dropped when the frame ends, whether
    # it succeeded or failed (it was kept forever for every successful frame).
    assert worker.frames.oom_counts == {} and worker.running == {}


def test_host_memory_is_what_psutil_reports():
    """The worker's default --memory comes from sysconf, not psutil (kept out of start-up):
    the same kernel figure."""
    import psutil

    from cuectl.run.service import host_memory_bytes

    assert host_memory_bytes() == psutil.virtual_memory().total
