"""What `cuectl worker` writes when its output is a pipe (a service, a log file): every line
starts with an ISO 8601 UTC timestamp, and each lifecycle event has a line (draining,
orphans recovered after a restart, store trouble and recovery); `--until-idle` on a
locked host fails with an `error:` line instead of exiting 0 having run nothing."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from farmlib import V100

STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")

LOCKER = r"""
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("ROLLBACK")
"""


def layer(name, command, **kw):
    return {"name": name, "command": command, **kw}


class Lines:
    """A live worker's stderr, read line by line on a thread (the test waits for a line)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if text in line:
                    return line
            time.sleep(0.05)
        raise AssertionError(f"no line with {text!r} in {self.lines}")

    def all(self, timeout: float = 30.0) -> list[str]:
        self._thread.join(timeout)
        return self.lines


def assert_stamped(lines: list[str]) -> None:
    assert lines, "the worker wrote nothing"
    bad = [ln for ln in lines if not STAMP.match(ln)]
    assert not bad, bad


def test_every_line_has_a_timestamp_and_frames_have_start_and_end_lines(farm):
    fake = farm.host("stamps", [V100])
    farm.submit({"name": "t", "layers": [layer("a", farm.probe(), gpus=1, range="1-2")]})
    res = farm.run_worker(fake)
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    assert_stamped(lines)
    body = [STAMP.sub("", ln) for ln in lines]
    assert body[0].startswith("worker stamps: 0:Tesla V100"), body
    assert sum(b.startswith("start  frame ") for b in body) == 2, body
    assert sum(b.startswith("end    frame ") and "SUCCEEDED" in b for b in body) == 2, body


def test_no_timestamps_when_asked(farm):
    fake = farm.host("plain", [V100])
    res = farm.run_worker(fake, "--no-timestamps")
    assert res.returncode == 0, res.stderr
    assert res.stderr.startswith("worker plain: "), res.stderr


def test_sigterm_mid_frame_logs_draining(farm):
    fake = farm.host("drainer", [V100])
    job = farm.submit({"name": "d", "layers": [layer("s", farm.probe("--sleep", "1.5"), gpus=1, range="1-2")]})
    proc = farm.start_worker(fake)
    out = Lines(proc)
    out.wait_for("start  frame")
    proc.send_signal(signal.SIGTERM)
    line = out.wait_for("draining (SIGTERM)")
    assert "1 running frame(s) finish first" in line, line
    assert proc.wait(60) == 0
    lines = out.all()
    assert_stamped(lines)
    assert any("end    frame" in ln and "SUCCEEDED" in ln for ln in lines), lines
    assert sorted(f["state"] for f in farm.frames(job)) == ["SUCCEEDED", "WAITING"]


def test_restart_after_a_killed_worker_logs_the_orphan_cleanup(farm):
    fake = farm.host("phoenix", [V100])
    job = farm.submit({"name": "o", "layers": [layer("s", farm.probe("--sleep", "5"), gpus=1)]})
    proc = farm.start_worker(fake)
    farm.wait_for(lambda: len(farm.starts()) == 1, what="frame running")
    os.kill(proc.pid, signal.SIGKILL)  # the worker only: its frame lives on as an orphan
    proc.wait(10)
    fid = farm.frames(job)[0]["id"]
    res = farm.run_worker(fake, timeout=90)
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    assert_stamped(lines)
    (recovered,) = [ln for ln in lines if "recovered after a restart" in ln]
    assert "1 run file(s) of a previous worker of phoenix cleaned up" in recovered, recovered
    assert f"requeued frame(s) {fid}" in recovered, recovered


def test_store_trouble_and_recovery_are_logged(farm):
    # SQLite cannot be made unreachable cheaply, but a held write lock makes every claim fail
    # (busy) the same way: the loop rides it out and says when calls get through again.
    farm.submit({"name": "b", "layers": [layer("c", farm.probe("--sleep", "0.3"), range="1-10")]})
    proc = farm.start_worker(None, "--until-idle", "--cores", "1", env={"CUECTL_BUSY_TIMEOUT": "0.2"})
    out = Lines(proc)
    out.wait_for("start  frame")
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(farm.db), "2"], stdout=subprocess.PIPE, text=True)
    assert locker.stdout.readline().strip() == "locked"
    out.wait_for("store unavailable, retrying")
    locker.wait(10)
    back = out.wait_for("store back after")
    assert "failed iteration(s)" in back, back
    assert proc.wait(90) == 0
    assert_stamped(out.all())


def test_until_idle_on_a_locked_host_fails_with_a_message(farm):
    fake = farm.host("locked", [V100])
    farm.submit({"name": "l", "layers": [layer("a", farm.probe(), gpus=1)]})
    assert farm.run_worker(fake, "--max-frames", "1").returncode == 0  # registers the host
    farm.submit({"name": "l2", "layers": [layer("a", farm.probe(), gpus=1)]})
    farm.cuectl("host", "lock", "locked")
    res = farm.run_worker(fake, timeout=60)
    assert res.returncode == 1, res.stderr
    lines = res.stderr.splitlines()
    assert_stamped(lines)
    assert any(
        STAMP.sub("", ln) == "error: host locked is locked: an --until-idle worker would run nothing" for ln in lines
    ), lines
    assert any(STAMP.sub("", ln) == "hint: cuectl host unlock locked" for ln in lines), lines
    assert len(farm.starts()) == 1, "nothing ran on the locked host"


def test_a_run_file_cut_short_by_a_crash_is_ignored_and_its_frame_requeued(farm):
    """The run file is written in place (no temporary file and rename) before its frame's
    process exists: one a crash cut short names no process, so recovery drops it, and the
    store requeues the frame the dead worker had claimed."""
    fake = farm.host("phoenix", [V100])
    job = farm.submit({"name": "t", "layers": [layer("s", farm.probe("--sleep", "0"), gpus=1)]})
    crashed = farm.run_worker(fake, env={"CUECTL_TEST_CRASH_AT": "after_claim"}, timeout=60)
    assert crashed.returncode != 0
    (frame,) = farm.frames(job)
    assert frame["state"] == "RUNNING"
    # Where the worker keeps its run files (run/service.py worker_state_dir): the slot the
    # crashed worker was writing, cut short.
    torn = Path(os.environ["XDG_STATE_HOME"]) / "cuectl" / "worker" / "phoenix" / "run-0.json"
    assert torn.parent.is_dir()
    torn.write_text('{"frame_id": ' + str(frame["id"]) + ', "attem')
    res = farm.run_worker(fake, timeout=90)
    assert res.returncode == 0, res.stderr
    (recovered,) = [ln for ln in res.stderr.splitlines() if "recovered after a restart" in ln]
    assert f"requeued frame(s) {frame['id']}" in recovered, recovered
    assert [f["state"] for f in farm.frames(job)] == ["SUCCEEDED"], torn.read_text() if torn.exists() else None
    # Dropped by recovery; the slot the frame's run then used is left blank.
    assert not torn.exists() or torn.read_text().strip() == "", torn.read_text()
