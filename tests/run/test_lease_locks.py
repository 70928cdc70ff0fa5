"""Low-level device locks (the worker's API): lock files, records, inheritance, the lock dir."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cuectl.errors import Conflict, LeaseError
from cuectl.gpu import discover
from cuectl.run.lease import (
    break_stale,
    held_uuids,
    list_leases,
    lock_path,
    prepare_lock_dir,
    try_lock,
    try_lock_all,
    update_holder,
)


@pytest.fixture
def devices(gpus4):
    return discover().devices


def wait_until_free(lock_dir: Path, device, timeout: float = 10.0) -> None:
    """For a lock held by a grandchild we cannot waitpid: its stdout closes a few
    microseconds before its lock fd in the kernel's exit path."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lock = try_lock(lock_dir, device, holder="probe")
        if lock is not None:
            lock.release()
            return
        time.sleep(0.005)
    raise AssertionError(f"{device.uuid} still held after {timeout} s")


def test_lock_dir_is_shared_and_sticky_and_lock_files_openable_by_all(tmp_path, devices):
    old = os.umask(0o077)
    try:
        directory = prepare_lock_dir(tmp_path / "a" / "locks")
        lock = try_lock(directory, devices[0], holder="t")
    finally:
        os.umask(old)
    assert lock is not None
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o1777
    assert stat.S_IMODE(os.stat(directory / "queue").st_mode) == 0o1777
    assert stat.S_IMODE(os.stat(lock.path).st_mode) == 0o666
    lock.release()


def test_lock_dir_on_a_network_filesystem_is_refused(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\nfiler:/export {tmp_path} nfs4 rw 0 0\n")
    with pytest.raises(LeaseError, match="network filesystem \\(nfs4\\)"):
        prepare_lock_dir(tmp_path / "locks", mounts_file=mounts)
    assert not (tmp_path / "locks").exists()


def test_world_writable_lock_dir_without_sticky_bit_is_refused(tmp_path):
    directory = tmp_path / "open"
    directory.mkdir()
    os.chmod(directory, 0o777)
    with pytest.raises(LeaseError, match="not sticky"):
        prepare_lock_dir(directory)


def test_lock_file_names_are_safe_and_distinct(tmp_path):
    plain = lock_path(tmp_path, "GPU-11111111-0000-0000-0000-000000000001")
    assert plain.name == "GPU-11111111-0000-0000-0000-000000000001.lock"
    odd = [lock_path(tmp_path, u) for u in ("MIG-GPU-abc/1/0", "MIG-GPU-abc_1_0", "../../etc/passwd", ".hidden")]
    assert len({p.name for p in odd}) == 4
    for p in odd:
        assert p.parent == tmp_path and "/" not in p.name and not p.name.startswith(".")


def test_symlinked_lock_file_is_refused(lock_dir, devices, tmp_path):
    prepare_lock_dir(lock_dir)
    target = tmp_path / "victim"
    target.write_text("keep me")
    lock_path(lock_dir, devices[0].uuid).symlink_to(target)
    with pytest.raises(LeaseError, match="symbolic link"):
        try_lock(lock_dir, devices[0], holder="t")
    assert target.read_text() == "keep me"


def test_other_process_holds_then_device_is_free_after_it_exits(lock_dir, devices, spawn):
    holder = spawn(devices=[0], label="other")
    holder.event("acquired")
    assert try_lock(lock_dir, devices[0], holder="me") is None
    assert held_uuids(lock_dir, devices) == {devices[0].uuid}
    holder.close_stdin()
    assert holder.wait() == 0
    lock = try_lock(lock_dir, devices[0], holder="me")
    assert lock is not None
    lock.release()


def test_two_fds_in_one_process_exclude_each_other(lock_dir, devices):
    prepare_lock_dir(lock_dir)
    first = try_lock(lock_dir, devices[0], holder="a")
    assert first is not None
    assert try_lock(lock_dir, devices[0], holder="b") is None  # flock is per open file
    first.release()
    first.release()  # idempotent
    again = try_lock(lock_dir, devices[0], holder="b")
    assert again is not None
    again.release()


def test_try_lock_all_is_all_or_nothing(lock_dir, devices):
    prepare_lock_dir(lock_dir)
    blocker = try_lock(lock_dir, devices[2], holder="blocker")
    assert try_lock_all(lock_dir, devices[:3], holder="all") is None
    assert held_uuids(lock_dir, devices) == {devices[2].uuid}  # 0 and 1 were given back
    blocker.release()
    locks = try_lock_all(lock_dir, devices[:3], holder="all")
    assert locks is not None and [lk.index for lk in locks] == [0, 1, 2]
    for lk in locks:
        lk.release()


def test_record_shape_and_update_holder(lock_dir, devices):
    prepare_lock_dir(lock_dir)
    lock = try_lock(lock_dir, devices[1], holder="frame 41", kind="worker")
    update_holder(lock, pid=os.getppid(), holder="frame 42")
    [info] = list_leases(lock_dir)
    data = info.to_json()
    assert {"uuid", "index", "pid", "holder", "since"} <= set(data)
    assert (data["uuid"], data["index"], data["pid"], data["holder"], data["kind"]) == (
        devices[1].uuid,
        1,
        os.getppid(),
        "frame 42",
        "worker",
    )
    assert data["since"].endswith("Z") and data["since"].startswith(time.strftime("%Y-", time.gmtime()))
    lock.release()
    assert list_leases(lock_dir) == []
    assert lock_path(lock_dir, devices[1].uuid).stat().st_size == 0  # record cleared on release


WORKER = textwrap.dedent("""
    import subprocess, sys
    from cuectl.gpu import discover
    from cuectl.run.lease import prepare_lock_dir, try_lock, update_holder
    from cuectl import config
    lock_dir = prepare_lock_dir(config.lock_dir())
    lock = try_lock(lock_dir, discover().devices[0], holder="frame 42")
    frame = subprocess.Popen([sys.executable, "-c", "import sys; print('frame up', flush=True); sys.stdin.read()"],
                             pass_fds=[lock.share()], start_new_session=True)
    update_holder(lock, pid=frame.pid)
    print("frame", frame.pid, flush=True)
    sys.stdin.read()
""")


def test_frame_keeps_the_device_when_the_worker_is_killed(lock_dir, devices):
    """DESIGN §5: the frame process inherits the lock; the device stays leased until it exits."""
    worker = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    lines = sorted(worker.stdout.readline().split() for _ in range(2))  # frame and worker print in either order
    assert lines[1] == ["frame", "up"]
    frame_pid = int(lines[0][1])
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(10)
    assert try_lock(lock_dir, devices[0], holder="me") is None
    [info] = list_leases(lock_dir)
    assert (info.pid, info.holder, info.kind) == (frame_pid, "frame 42", "worker")
    worker.stdin.close()  # the frame (sharing the pipe) reads EOF and ends
    assert worker.stdout.read() == ""
    wait_until_free(lock_dir, devices[0])
    assert list_leases(lock_dir) == []


def test_break_stale_refuses_a_held_lock_and_clears_a_leftover_record(lock_dir, devices, spawn):
    holder = spawn(devices=[3], label="crashy")
    holder.event("acquired")
    with pytest.raises(Conflict, match=f"pid {holder.pid}"):
        break_stale(lock_dir, devices[3].uuid)
    holder.kill_group(signal.SIGKILL)
    holder.wait()
    path = lock_path(lock_dir, devices[3].uuid)
    assert json.loads(path.read_text())["label"] == "crashy"  # the dead holder's leftover
    assert list_leases(lock_dir) == []  # ...which is never shown: the lock is free
    assert break_stale(lock_dir, devices[3].uuid) is True
    assert path.exists() and path.stat().st_size == 0  # the file stays: see break_stale
    assert break_stale(lock_dir, devices[3].uuid) is False
    assert break_stale(lock_dir, "GPU-never-seen") is False


def test_release_is_immediate_even_if_a_forked_helper_inherited_the_fd(lock_dir, devices):
    prepare_lock_dir(lock_dir)
    lock = try_lock(lock_dir, devices[0], holder="svc")
    read_end, write_end = os.pipe()
    helper = os.fork()  # like a multiprocessing "fork" worker: it inherits every fd
    if helper == 0:
        os.close(write_end)
        os.read(read_end, 1)
        os._exit(0)
    os.close(read_end)
    try:
        lock.release()
        again = try_lock(lock_dir, devices[0], holder="next")
        assert again is not None
        again.release()
    finally:
        os.close(write_end)
        os.waitpid(helper, 0)


def test_a_shared_lock_stays_with_the_child_after_release(lock_dir, devices):
    prepare_lock_dir(lock_dir)
    lock = try_lock(lock_dir, devices[0], holder="frame 7")
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, pass_fds=[lock.fd]
    )  # the worker's way: the raw fd counts as shared
    try:
        lock.release()  # the worker lets go; the frame still holds the device
        assert try_lock(lock_dir, devices[0], holder="other") is None
        assert [i.holder for i in list_leases(lock_dir)] == ["frame 7"]
    finally:
        child.stdin.close()
        child.wait(10)
    again = try_lock(lock_dir, devices[0], holder="other")  # reaped child: free at once
    assert again is not None
    again.release()
