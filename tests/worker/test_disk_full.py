"""Disk full on a small filesystem that holds both the SQLite store and the frame logs
(issue 35 item 9): a frame that floods its log is stopped and its log cut back so that the
disk is free again; a store that cannot be written while frames run is retried with
back-off (one warning, not one per iteration), the results wait in memory and are written
once space is back; and SIGTERM while the store cannot be written drains and exits within a
bounded time, saying in one line what it could not record, which the next worker's orphan
recovery then requeues.

Real `cuectl worker` processes on a real 4 MiB tmpfs (a loop-mounted ext2 file system where
tmpfs is refused). Mounting needs root, as CI has."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from farmlib import Farm

# Writes 64 KiB chunks as fast as it can and ignores ENOSPC, as a careless renderer would,
# for at most 30 s (a guard: the worker must stop it long before).
FLOOD = (
    "import os, time\n"
    "end = time.monotonic() + 30\n"
    "while time.monotonic() < end:\n"
    "    try: os.write(1, b'x' * 65536)\n"
    "    except OSError: time.sleep(0.001)\n"
)


def _mount_small(where: Path, size_mib: int) -> None:
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0755", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if res.returncode == 0:
        return
    # No tmpfs here: an ext2 file system in a file, loop-mounted (ext2: no journal to fill).
    image = where.with_name(where.name + ".img")
    with open(image, "wb") as fh:
        fh.truncate(size_mib << 20)
    steps = [["mkfs.ext2", "-q", "-F", "-m", "0", str(image)], ["mount", "-o", "loop", str(image), str(where)]]
    for step in steps:
        loop = subprocess.run(step, capture_output=True, text=True)
        if loop.returncode != 0:
            pytest.fail(
                f"cannot mount a small file system here: tmpfs: {res.stderr.strip()}; {step[0]}: {loop.stderr.strip()}"
            )
    os.chmod(where, 0o755)


@pytest.fixture
def small_disk(farm: Farm, tmp_path: Path):
    """A 4 MiB file system holding the farm's store (and so its logs, ``<store>-logs``); the
    frames' ledger and the worker's state stay on the normal disk."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root (CI runs these as root)")
    mount = tmp_path / "small"
    mount.mkdir()
    _mount_small(mount, 4)
    farm.db = mount / "farm.db"
    try:
        yield mount
    finally:
        farm.cleanup()  # workers first: they keep files open there
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(disk: Path) -> Path:
    """Take every free block of ``disk`` with one file (what a user's `cp` would do)."""
    path = disk / "filler"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for chunk in (1 << 16, 4096, 512, 1):
            while True:
                try:
                    os.write(fd, b"\0" * chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
    finally:
        os.close(fd)
    return path


def store_cannot_grow(db: Path) -> None:
    """Empty the store's write-ahead log (a TRUNCATE checkpoint), so that with the disk full
    every write transaction needs blocks it cannot get: otherwise SQLite may reuse the WAL's
    old pages, and whether the store fails would depend on its history."""
    conn = sqlite3.connect(db, timeout=10)
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0
    finally:
        conn.close()


def warnings_about_the_store(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if "warning: store unavailable" in ln]


def ledger(farm: Farm, event: str) -> list[dict]:
    return [e for e in farm.events() if e["event"] == event]


def frame_show(farm: Farm, frame_id: int) -> dict:
    return json.loads(farm.cuectl("frame", "show", str(frame_id), "--json").stdout)


def test_a_log_flood_is_stopped_and_cut_back_so_the_store_and_other_frames_go_on(farm, small_disk):
    """The flood fills the disk before the once-a-second check sees it; the worker stops it,
    and its log stays cut back to 64 KiB after the frame is gone (it used to refill the
    disk in the frame's last instants and stay that size, leaving the store unwritable for
    good). A frame beside it that writes nothing is not stopped for the full disk."""
    flood = farm.submit(
        {"name": "flood", "layers": [{"name": "w", "command": [sys.executable, "-c", FLOOD], "retries": 0}]}
    )
    quiet = farm.submit(
        {"name": "quiet", "layers": [{"name": "q", "command": farm.probe("--sleep", "2"), "retries": 0}]}
    )
    t0 = time.monotonic()
    res = farm.run_worker(None, "--cores", "2", timeout=40)
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stderr
    (f,) = farm.frames(flood)
    shown = frame_show(farm, f["id"])
    assert shown["state"] == "DEAD", shown
    log = Path(shown["log_path"])
    assert log.stat().st_size < 80 * 1024, log.stat().st_size
    text = log.read_text(errors="replace")
    assert "the log's filesystem is full: the frame is being stopped" in text
    assert "stopped by cuectl (disk full)" in text.splitlines()[-1]
    st = os.statvfs(small_disk)
    assert st.f_bavail * st.f_frsize > 2 << 20, "the disk was left full"
    (q,) = farm.frames(quiet)
    assert (q["state"], q["attempts"]) == ("SUCCEEDED", 1), frame_show(farm, q["id"])
    assert len(warnings_about_the_store(res.stderr)) <= 1, res.stderr
    assert took < 20, took
    conn = sqlite3.connect(farm.db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()


def test_the_log_of_a_frame_stopped_for_a_full_disk_stays_cut_while_it_dies_and_after(small_disk):
    """The log cap itself (run/launch.py ``_LogCap``) on the small disk: once it finds the
    disk full and the log growing, it keeps the log at 64 KiB on every later check (the
    frame is being stopped and may write on) and at the end, even if by then the disk has
    room again (a frame that flushes its buffers when told to stop, after something freed
    space): not only when the end finds the disk full."""
    from cuectl.run.launch import _FULL_DISK_LOG, _LogCap

    path = small_disk / "frame.log"
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # the frame's stdout
    cap = _LogCap(os.open(path, os.O_RDWR), 1 << 30)
    try:
        os.write(out, b"=== header ===\n")
        cap.started()
        with contextlib.suppress(OSError):
            while True:  # the frame fills the disk
                os.write(out, b"x" * 65536)
        assert cap.check(time.monotonic() + 2) == "the log's filesystem is full"
        assert os.path.getsize(path) <= _FULL_DISK_LOG
        os.write(out, b"y" * (1 << 20))  # written while it is being stopped
        assert cap.check(time.monotonic() + 2.1) is None
        assert os.path.getsize(path) <= _FULL_DISK_LOG
        os.write(out, b"z" * (1 << 20))  # its last words, on a disk with room again
        st = os.statvfs(small_disk)
        assert st.f_bavail * st.f_frsize > 1 << 20  # (so the end does not find it full)
        cap.finish("=== footer ===")
        text = path.read_bytes()
        assert len(text) < _FULL_DISK_LOG + 1024, len(text)
        assert text.endswith(b"=== footer ===\n") and b"the log's filesystem is full" in text
    finally:
        os.close(out)


def test_results_wait_for_the_store_with_back_off_and_are_written_when_space_returns(farm, small_disk):
    """The disk fills (not through a log) while two frames run; they end meanwhile, one
    with exit 0, one with exit 3 (after the worker's once-a-second look at their logs' free
    space: writing nothing, they are not stopped for a disk that something else filled). The worker says once that the store is unavailable and
    retries with back-off (0.1 s doubling to 5 s), not every iteration; once space is back
    both are recorded as they really ended, on their first attempt."""
    job = farm.submit(
        {
            "name": "j",
            "layers": [
                {"name": "ok", "command": farm.probe("--sleep", "1.5"), "retries": 0},
                {"name": "bad", "command": farm.probe("--sleep", "1.5", "--exit", "3"), "retries": 0},
            ],
        }
    )
    proc = farm.start_worker(None, "--until-idle", "--cores", "2")
    farm.wait_for(lambda: len(ledger(farm, "start")) == 2, what="both frames running")
    store_cannot_grow(farm.db)
    filler = fill(small_disk)
    farm.wait_for(lambda: len(ledger(farm, "end")) == 2, what="both frames ended")
    time.sleep(4.0)  # an outage of several seconds: before, ~20 failed iterations a second
    filler.unlink()
    freed = time.monotonic()
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert time.monotonic() - freed < 8, "the store was not tried again within the back-off cap"
    warned = warnings_about_the_store(err)
    assert len(warned) == 1, err
    assert "disk full" in warned[0], warned
    (back,) = [ln for ln in err.splitlines() if "store back after" in ln]
    tries = int(re.search(r"\((\d+) failed iteration", back)[1])
    assert 2 <= tries <= 10, back  # 0.1+0.2+0.4+0.8+1.6+3.2: about 7 tries in a 4-6 s outage
    states = {f["layer"]: (f["state"], f["attempts"], f["exit_code"]) for f in farm.frames(job)}
    assert states == {"ok": ("SUCCEEDED", 1, 0), "bad": ("DEAD", 1, 3)}, states


def _worker_stopped_without_store(
    farm: Farm, disk: Path, *, running: bool
) -> tuple[subprocess.Popen, str, float, float]:
    """Start a (service) worker, fill the disk once its frame(s) run, let the short one end
    (its result cannot be recorded), SIGTERM; the worker, its stderr, how long it took to
    exit and when (wall clock) it was signalled."""
    layers = [{"name": "short", "command": farm.probe("--sleep", "0.3")}]
    if running:
        # 30 s on its first attempt only: after the requeue it ends at once.
        cmd = (
            f'if [ "$CUE_ATTEMPT" = 1 ]; then exec {sys.executable} {farm.probe()[1]} {farm.ledger} --sleep 30; '
            f"else exec {sys.executable} {farm.probe()[1]} {farm.ledger}; fi"
        )
        layers.append({"name": "long", "command": ["sh", "-c", cmd]})
    farm.submit({"name": "j", "layers": layers})
    proc = farm.start_worker(None, "--cores", "2", lease="2")
    farm.wait_for(lambda: len(ledger(farm, "start")) == len(layers), what="frames running")
    store_cannot_grow(farm.db)
    fill(disk)
    farm.wait_for(lambda: ledger(farm, "end"), what="the short frame ended")
    time.sleep(0.5)  # its report has been tried (and failed)
    t0, signalled = time.monotonic(), time.time()
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"the worker did not exit within 20 s of SIGTERM: {err}") from None
    return proc, err, time.monotonic() - t0, signalled


def _next_worker_requeues_and_runs(farm: Farm, disk: Path, err: str) -> None:
    (disk / "filler").unlink()
    res = farm.run_worker(None, "--cores", "2", timeout=60)
    assert res.returncode == 0, res.stderr
    (recovered,) = [ln for ln in res.stderr.splitlines() if "recovered after a restart" in ln]
    frames = json.loads(farm.cuectl("frame", "list", "--json").stdout)["frames"]
    assert "requeued frame(s) " + ", ".join(str(f["id"]) for f in frames) in recovered, (recovered, frames)
    assert {(f["state"], f["attempts"]) for f in frames} == {("SUCCEEDED", 2)}, frames
    for f in frames:
        first = frame_show(farm, f["id"])["attempt_history"][0]
        assert first["outcome"] == "orphaned", first


def test_sigterm_with_only_unrecorded_results_exits_instead_of_draining_for_ever(farm, small_disk):
    """The issue's case: "draining … 0 running frame(s)" and the worker never exited, its
    results waiting for a store that could not be written. It now waits one lease for the
    store (2 s here), then exits 1 with one line naming what it could not record; the next
    worker's recovery requeues that frame (its claimer is gone), and it runs again."""
    proc, err, took, _ = _worker_stopped_without_store(farm, small_disk, running=False)
    assert proc.returncode == 1, err
    drain = next(ln for ln in err.splitlines() if "draining (SIGTERM)" in ln)
    assert "0 running frame(s)" in drain and "1 result(s) wait for the store" in drain, drain
    last = err.strip().splitlines()[-1]
    assert "error: stopping with the store unavailable" in last and "disk full" in last, err
    assert "result(s) of frame(s) 1 not recorded" in last and "requeues them" in last, last
    assert 1.5 < took < 8, took
    assert len(warnings_about_the_store(err)) == 1, err
    _next_worker_requeues_and_runs(farm, small_disk, err)


def test_sigterm_while_the_store_is_full_stops_running_frames_past_the_drain_deadline(farm, small_disk):
    """A frame still running when SIGTERM comes and the store cannot be written: it may
    finish for one lease; past that it is stopped, and the worker exits 1 within a bounded
    time, naming both the unrecorded result and the stopped frame."""
    proc, err, took, signalled = _worker_stopped_without_store(farm, small_disk, running=True)
    assert proc.returncode == 1, err
    assert "1 running frame(s) finish first" in next(ln for ln in err.splitlines() if "draining (SIGTERM)" in ln)
    last = err.strip().splitlines()[-1]
    assert "result(s) of frame(s) 1 not recorded" in last and "running frame(s) 2 stopped" in last, last
    assert 1.5 < took < 10, took
    (killed,) = ledger(farm, "killed")
    assert killed["env"]["CUE_LAYER"] == "long"
    assert killed["t"] > signalled + 1.5, "stopped before the drain deadline (for the full disk?)"
    _next_worker_requeues_and_runs(farm, small_disk, err)


def test_disk_helpers_fill_and_free(small_disk):
    """The fixture's file system really is small and ``fill`` really fills it."""
    st = os.statvfs(small_disk)
    assert st.f_blocks * st.f_frsize <= 5 << 20
    filler = fill(small_disk)
    st = os.statvfs(small_disk)
    assert st.f_bavail * st.f_frsize < 4096
    filler.unlink()
