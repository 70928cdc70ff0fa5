"""`gpu leases` never names a dead holder (issue 13, item 4): when the pid in a lock's
record has exited but a child that inherited the lock fd keeps the device, the live child
is named instead."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from cuectl.run.lease import list_leases

HOLDER = textwrap.dedent("""
    import os, subprocess, cuectl
    held = cuectl.lease(gpus=1, label="parent")
    child = subprocess.Popen(["sleep", "1000"], pass_fds=held.fds, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(os.getpid(), child.pid, flush=True)
    os._exit(0)  # the recorded holder dies; the child keeps the lock
""")


def test_a_lease_kept_by_an_inheriting_child_names_the_live_child(gpus4, lock_dir):
    out = subprocess.run([sys.executable, "-c", HOLDER], capture_output=True, text=True, timeout=60, check=True)
    parent, child = (int(x) for x in out.stdout.split())
    try:
        leases = list_leases(lock_dir)
        assert len(leases) == 1
        info = leases[0]
        assert info.pid == child, info
        assert info.pid != parent
        assert "inherited from pid" in (info.holder or "") and info.holder.startswith("parent")
    finally:
        os.kill(child, signal.SIGKILL)
    # Once the child is gone the device is free again.
    deadline = time.monotonic() + 10
    while list_leases(lock_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list_leases(lock_dir) == []
