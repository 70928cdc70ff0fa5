"""Run files are slots rewritten in place: a worker creates and deletes no file per frame in
its state directory (on ext4 a creation after many deletions costs a scan of the freed
inodes), and what a restarted worker reads there is still exactly the running frames."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

from cuectl import config
from cuectl.run.worker import RunFiles, Supervisor
from cuectl.sched.spec import spec_from_flags


def claim(frame_id: int, log_path: str = "/logs/1/0001-a.1.log") -> SimpleNamespace:
    return SimpleNamespace(frame_id=frame_id, attempt=1, log_path=log_path)


def test_slots_are_reused_in_place_and_blanked(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    a = files.write(claim(7, "/logs/1/" + "x" * 200 + ".log"))
    b = files.write(claim(8))
    assert (a.name, b.name) == ("run-0.json", "run-1.json")
    inode = a.stat().st_ino
    files.clear(a)
    assert a.read_text().strip() == ""  # blank: recovery finds no frame in it
    c = files.write(claim(9))  # shorter than the record it replaces: padded, still one JSON value
    assert c == a and a.stat().st_ino == inode
    assert json.loads(a.read_text())["frame_id"] == 9
    assert json.loads(b.read_text())["frame_id"] == 8
    for n in range(50):  # many frames one after another: no new file, no deletion
        files.clear(c)
        c = files.write(claim(100 + n))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-0.json", "run-1.json"]
    assert a.stat().st_ino == inode and json.loads(a.read_text())["frame_id"] == 149


def test_a_slot_left_by_an_earlier_worker_is_rewritten_whole(tmp_path: Path) -> None:
    # A longer record of a worker that never recovered: this process truncates it on first use.
    (tmp_path / "run-0.json").write_text(json.dumps({"frame_id": 1, "attempt": 3, "log_path": "/" + "y" * 500}))
    path = RunFiles(tmp_path).write(claim(2))
    assert json.loads(path.read_text()) == {
        "frame_id": 2,
        "attempt": 1,
        "log_path": "/logs/1/0001-a.1.log",
        "worker_pid": os.getpid(),
    }


def test_a_slot_is_never_written_through_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_text("keep")
    state = tmp_path / "state"
    state.mkdir()
    (state / "run-0.json").symlink_to(target)
    files = RunFiles(state)
    try:
        files.write(claim(1))
    except OSError:
        pass
    else:
        raise AssertionError("wrote a run file through a symbolic link")
    assert target.read_text() == "keep"


def test_a_drained_worker_used_at_most_a_slot_per_cpu_slot_and_removes_them(solo):
    store, worker = solo
    store.submit(
        spec_from_flags(name="ok", command=["true"], range="1-20", user=config.current_user()), now=time.time()
    )
    Supervisor(worker).run()
    assert store.list_jobs()[0]["frame_counts"] == {"SUCCEEDED": 20}
    # Two CPU slots: at most two frames at once, so at most two run files whatever the count
    # (the inode stayed), and the worker deletes them, blank, when it stops.
    assert worker.frames.runfiles_made is not None and worker.frames.runfiles_made._slots in (1, 2)
    assert sorted(worker.opts.state_dir.glob("*.json")) == []
