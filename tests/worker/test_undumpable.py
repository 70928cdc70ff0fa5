"""A non-root worker's frames run as the worker's own user, and a process may read the
memory of another process of its uid (``/proc/PID/mem``, ``ptrace``) unless Yama forbids it
(``ptrace_scope`` 1 or more) or that process is not "dumpable": a frame read the
PostgreSQL password from ``/proc/$PPID/mem`` (issue 35, item 15). The worker and
`cuectl serve` make themselves undumpable at their start. Real throwaway users; root only,
as the other security tests. The frame's reading succeeds without the fix on a kernel
without Yama or with ``ptrace_scope`` 0 (a parent may always read its child's, not the
reverse, under 1); the ownership of the worker's /proc files tells either way."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from farmlib import cuectl_cmd

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="real throwaway users need root")

V100 = {"model": "Tesla V100-SXM2-16GB", "vendor": "NVIDIA", "memory": "16160MiB"}

# The frame: what it can learn of its parent, the worker (by pid: its parent, checked
# against the pid the test started).
PROBE = r"""
import json, os, sys
ppid = os.getppid()
out = {"ppid": ppid, "uid": os.getuid()}
st = os.stat(f"/proc/{ppid}/status")
out["status_uid"] = st.st_uid
try:
    fd = os.open(f"/proc/{ppid}/mem", os.O_RDONLY)
except OSError as exc:
    out["mem_errno"] = exc.errno
else:
    try:
        with open(f"/proc/{ppid}/maps") as fh:
            start = next(int(line.split("-")[0], 16) for line in fh if line.split()[1].startswith("r"))
        out["mem_read"] = len(os.pread(fd, 4096, start))
    except (OSError, StopIteration) as exc:
        out["mem_errno"] = getattr(exc, "errno", None)
    finally:
        os.close(fd)
with open(sys.argv[1], "w") as fh:
    json.dump(out, fh)
"""


@pytest.fixture
def alices_farm(os_users):
    """alice's own store, lock dir, registry and fake GPU host, in a directory of hers."""
    import osusers

    (alice,) = os_users("alice")
    top = Path(tempfile.mkdtemp(prefix="cuectl-undumpable-", dir="/tmp"))
    state = top / "gpus-state"
    state.mkdir()
    (top / "gpus.yaml").write_text(
        yaml.safe_dump({"host": "undumpable", "state_dir": str(state), "devices": [dict(V100)]})
    )
    (top / "probe.py").write_text(PROBE)
    subprocess.run(["chown", "-R", f"{alice.uid}:{alice.gid}", str(top)], check=True)
    env = dict(os.environ)
    env.pop("CUECTL_USER", None)
    env.update(
        CUECTL_FAKE_GPUS=str(top / "gpus.yaml"),
        CUECTL_LOCK_DIR=str(top / "locks"),
        CUECTL_LOCK_REGISTRY=str(top / "registry"),
        CUECTL_CREATE_LOCK_DIR="1",
        XDG_STATE_HOME=str(top / "state"),
        CUECTL_RUN_CACHE=str(top / "run.cache"),
        CUECTL_DB=str(top / "q.db"),
        USER=alice.name,
        LOGNAME=alice.name,
        HOME="/nonexistent",
    )
    yield alice, top, env, osusers
    shutil.rmtree(top, ignore_errors=True)


def test_a_frame_cannot_read_its_workers_memory(alices_farm) -> None:
    alice, top, env, osusers = alices_farm
    python = osusers.runnable([sys.executable])[0]
    res = alice.run(
        [
            *cuectl_cmd(),
            "submit",
            "--name",
            "peek",
            "--gpus",
            "1",
            "--",
            python,
            str(top / "probe.py"),
            str(top / "out.json"),
        ],
        env=env,
        cwd=top,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    worker = subprocess.Popen(
        osusers.as_user(alice, [*cuectl_cmd(), "worker", "--until-idle", "--poll", "0.05"]),
        env=env,
        cwd=top,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, err = worker.communicate(timeout=120)
    finally:
        if worker.poll() is None:
            worker.kill()
    # The worker ran the frame (its own /proc/self reads still work once it is undumpable).
    assert worker.returncode == 0, err
    out = json.loads((top / "out.json").read_text())
    assert out["uid"] == alice.uid and out["ppid"] == worker.pid, (out, worker.pid)  # setpriv and the script exec
    assert "mem_read" not in out and out.get("mem_errno") in (errno.EACCES, errno.EPERM), out
    assert out["status_uid"] == 0, out  # an undumpable process's /proc files are root's
    frames = json.loads(alice.run([*cuectl_cmd(), "frame", "list", "--json"], env=env, cwd=top).stdout)
    assert [f["state"] for f in frames["frames"]] == ["SUCCEEDED"], frames


def test_serve_is_undumpable(alices_farm) -> None:
    alice, top, env, osusers = alices_farm
    res = alice.run([*cuectl_cmd(), "admin", "migrate"], env=env, cwd=top)  # creates the store
    assert res.returncode == 0, res.stderr
    sock = top / "api.sock"
    serve = subprocess.Popen(
        osusers.as_user(alice, [*cuectl_cmd(), "serve", "--socket", str(sock), "--no-access-log"]),
        env=env,
        cwd=top,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            assert serve.poll() is None and time.monotonic() < deadline, serve.communicate()[1]
            time.sleep(0.05)
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(sock))
        assert os.stat(f"/proc/{serve.pid}/status").st_uid == 0  # alice's process, undumpable: root's files
        with open(f"/proc/{serve.pid}/status") as fh:
            uids = next(line for line in fh if line.startswith("Uid:")).split()[1:]
        assert uids[0] == str(alice.uid)
    finally:
        serve.terminate()
        try:
            serve.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.communicate()
