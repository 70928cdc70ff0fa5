"""`cuectl admin lease break DEVICE`: clears the record a dead holder left, never a live lease.

The holders are real processes (tests/run/lease_child.py, which takes ``cuectl.lease()``),
killed with SIGKILL so that they cannot release anything themselves.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

CHILD = Path(__file__).resolve().parent.parent / "run" / "lease_child.py"
STEP_TIMEOUT_S = 60  # a bound for one handshake on a loaded machine, never a pacing sleep


@pytest.fixture
def gpus(fake_gpus, monkeypatch) -> list[str]:
    """Two fake V100s through CUECTL_FAKE_GPUS (the holder processes inherit it); their UUIDs."""
    from cuectl.gpu import discover

    path = fake_gpus([{"model": "Tesla V100-SXM2-16GB", "memory": "16160MiB"}] * 2, host="lease-admin")
    monkeypatch.setenv("CUECTL_FAKE_GPUS", str(path))
    return [d.uuid for d in discover("fake", fake_file=path).devices]


@pytest.fixture
def holder():
    """``holder(label)``: a real process holding one device through ``cuectl.lease()``;
    returns (process, the "acquired" event). Killed at the end of the test."""
    procs: list[subprocess.Popen[str]] = []

    def start(label: str, **params: Any) -> tuple[subprocess.Popen[str], dict[str, Any]]:
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), json.dumps({"gpus": 1, "label": label, **params})],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the child prints one line once it holds the lease
        assert line, f"holder ended: {proc.wait(STEP_TIMEOUT_S)} {proc.stderr.read() if proc.stderr else ''}"
        event = json.loads(line)
        assert event["event"] == "acquired", event
        return proc, event

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(STEP_TIMEOUT_S)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def lock_file(uuid: str) -> Path:
    from cuectl.run.lease import lock_path

    return lock_path(Path(os.environ["CUECTL_LOCK_DIR"]), uuid)


def test_break_clears_the_record_a_killed_holder_left(cli, gpus, holder):
    proc, event = holder("doomed")
    (uuid,) = event["uuids"]
    index = gpus.index(uuid)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(STEP_TIMEOUT_S) == -signal.SIGKILL
    assert json.loads(lock_file(uuid).read_text())["pid"] == proc.pid  # the record outlived its holder

    res = cli("admin", "lease", "break", str(index), "--json", db=False)
    assert res.exit_code == 0, res
    out = res.json()
    assert out["uuid"] == uuid and out["index"] == index and out["cleared"] is True
    assert out["record"]["pid"] == proc.pid and out["record"]["holder"] == "doomed"
    assert out["lock_file"] == str(lock_file(uuid)) and lock_file(uuid).exists()  # the file stays
    assert lock_file(uuid).read_bytes() == b""

    again = cli("admin", "lease", "break", uuid, db=False)  # by UUID; nothing left to clear
    assert again.exit_code == 0, again
    assert "no lease record to clear" in again.stdout and again.stderr == ""


def test_break_says_whose_record_it_cleared(cli, gpus, holder):
    proc, event = holder("render-7")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(STEP_TIMEOUT_S)
    res = cli("admin", "lease", "break", event["uuids"][0], db=False)
    assert res.exit_code == 0, res
    assert f"cleared the stale lease record of pid {proc.pid} (render-7" in res.stdout


def test_break_refuses_a_live_holder_which_keeps_its_lease(cli, gpus, holder):
    proc, event = holder("alive")
    (uuid,) = event["uuids"]
    res = cli("admin", "lease", "break", str(gpus.index(uuid)), db=False)
    assert res.exit_code == 1, res
    first, *rest = res.stderr.splitlines()
    assert first.startswith("error: ") and f"pid {proc.pid}" in first and "not stale" in first
    assert all(line.startswith("hint: ") for line in rest) and "Traceback" not in res.stderr
    assert res.stdout == ""

    # Still leased, record intact: another lease of that device is refused, and the holder
    # releases it normally afterwards.
    from cuectl.run.lease import list_leases

    held = {i.uuid: i for i in list_leases(Path(os.environ["CUECTL_LOCK_DIR"]))}
    assert held[uuid].pid == proc.pid and held[uuid].holder == "alive"
    other = cli("run", "--no-wait", "--device", uuid, "--", "true", db=False)
    assert other.exit_code == 1, other
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("release\n")
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline())["event"] == "released"


@pytest.mark.parametrize("device", ["9", "GPU-no-such-device", "", "-1"])
def test_break_of_an_unknown_device_is_bad_input(cli, gpus, device):
    res = cli("admin", "lease", "break", "--", device, db=False)
    assert res.exit_code == 2, res
    assert res.stderr.startswith("error: ") and "Traceback" not in res.stderr


def test_break_of_a_lock_no_device_of_this_host_has(cli, gpus, tmp_path):
    """A lock file of a device discovery no longer lists (shown by `gpu leases` too)."""
    gone = "GPU-0ld0ld00-0000-0000-0000-000000000000"
    path = lock_file(gone)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "uuid": gone,
                "index": 5,
                "pid": 999999999,
                "holder": "frame 3",
                "kind": "worker",
                "since": 1_700_000_000.0,
            }
        )
    )
    res = cli("admin", "lease", "break", gone, "--json", db=False)
    assert res.exit_code == 0, res
    assert res.json()["cleared"] is True and res.json()["index"] == 5
    assert res.json()["record"]["holder"] == "frame 3"
    assert path.read_bytes() == b""
