"""Issue 13 at the worker: frame logs a root worker cannot be tricked into (links planted by
a group member), log caps from the layer, the flag and the environment, a full disk, and a
hostile job name in a double-quoted shell token (docs/security.md, docs/reliability.md)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from farmlib import cuectl_cmd

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="a root worker and real users need root")
KIB = 1024

WRITE = "import os, sys\nfor i in range(int(sys.argv[1])): os.write(1, b'%08d ' % i + b'.' * 1014 + b'\\n')"


def submit_as(user, farm, spec: dict) -> int:
    path = farm.tmp / f"{spec['name']}-{os.urandom(3).hex()}.json"
    path.write_text(json.dumps(spec))
    path.chmod(0o644)
    res = user.run([*cuectl_cmd(), "--db", str(farm.db), "submit", str(path)], env=farm.env(), cwd=farm.tmp)
    assert res.returncode == 0, res.stderr
    return int(res.stdout)


def job_dir_as_a_root_worker_makes_it(logs: Path, job: int, user) -> Path:
    """``<log root>/<job>``: the log root root's (0711: users pass through, never list), the
    job's directory its user's (0750), as a root worker leaves them after a first frame."""
    from cuectl.run.launch import LOG_DIR_MODE, ROOT_LOG_DIR_MODE

    logs.mkdir(mode=ROOT_LOG_DIR_MODE, exist_ok=True)
    logs.chmod(ROOT_LOG_DIR_MODE)
    path = logs / str(job)
    path.mkdir(mode=LOG_DIR_MODE)
    os.chown(path, user.uid, user.gid)
    return path


@ROOT_ONLY
def test_a_planted_log_symlink_never_gets_root_writing_through_it(shared_farm, os_users):
    """alice links her frame's log, in her own job directory, to a root-owned file; bob tries
    to link the log directory of another of her jobs to a root-owned directory, but the log
    root is root's: he cannot, so a writer of it (root in the harness) plants that link. The
    root worker follows neither (it ran the frame and appended its output to the root file
    before). The logs it does create are owned by the frame's user."""
    alice, bob = os_users("alice", "bob")
    victim_dir = Path(tempfile.mkdtemp(prefix="cuectl-victim-", dir="/tmp"))
    try:
        victim = victim_dir / "root-owned.conf"
        victim.write_text("precious\n")
        marker = shared_farm.tmp / "out" / "ran"  # the sticky out/: alice may write there
        frame_cmd = ["sh", "-c", f"echo FRAME-OUTPUT; touch {marker}"]
        linked = submit_as(
            alice, shared_farm, {"name": "link", "layers": [{"name": "w", "command": frame_cmd, "retries": 0}]}
        )
        moved = submit_as(
            alice, shared_farm, {"name": "dir", "layers": [{"name": "w", "command": frame_cmd, "retries": 0}]}
        )
        logs = shared_farm.tmp / f"{shared_farm.db.name}-logs"  # the store's own log root (config.log_root)
        plant_dir = ["sh", "-c", f"mkdir -p -m 2770 {logs} && ln -s {victim_dir} {logs}/{moved}"]
        res = bob.run(plant_dir)
        assert res.returncode != 0 and "Permission denied" in res.stderr, res
        assert not os.path.lexists(logs / str(moved))
        job_dir_as_a_root_worker_makes_it(logs, linked, alice)
        res = bob.run(plant_dir)
        assert res.returncode != 0 and "Permission denied" in res.stderr, res
        assert not os.path.lexists(logs / str(moved))
        subprocess.run(plant_dir, check=True)
        res = alice.run(["sh", "-c", f"ln -s {victim} {logs}/{linked}/0001-w.1.log"])
        assert res.returncode == 0, res.stderr
        assert shared_farm.run_worker(None).returncode == 0
        assert victim.read_text() == "precious\n"
        assert sorted(p.name for p in victim_dir.iterdir()) == ["root-owned.conf"]
        assert not marker.exists()
        for job, what in ((linked, f"log file {logs}/{linked}/0001-w.1.log"), (moved, f"log directory {logs}/{moved}")):
            (frame,) = shared_farm.frames(job)
            assert frame["state"] == "DEAD" and frame["failure"].startswith(f"{what} is a symbolic link"), frame
        # A job nobody tampered with: its directory and log belong to alice, not root.
        fine = submit_as(alice, shared_farm, {"name": "fine", "layers": [{"name": "w", "command": frame_cmd}]})
        assert shared_farm.run_worker(None).returncode == 0
        (frame,) = shared_farm.frames(fine)
        assert frame["state"] == "SUCCEEDED"
        assert marker.stat().st_uid == alice.uid
        log = Path(json.loads(shared_farm.cuectl("frame", "show", str(frame["id"]), "--json").stdout)["log_path"])
        assert "FRAME-OUTPUT" in log.read_text()
        assert log.stat().st_uid == alice.uid and log.parent.stat().st_uid == alice.uid
        assert stat.S_IMODE(log.stat().st_mode) & 0o007 == 0
    finally:
        subprocess.run(["rm", "-rf", str(victim_dir)])


def test_log_limits_from_the_layer_the_submit_flag_the_worker_flag_and_the_environment(farm):
    own = farm.submit(
        {"name": "own", "layers": [{"name": "w", "command": [sys.executable, "-c", WRITE, "200"], "log_limit": "16K"}]}
    )
    flag = int(
        farm.cuectl("submit", "--name", "flag", "--log-limit", "8K", "--", sys.executable, "-c", WRITE, "200").stdout
    )
    default = farm.submit(
        {"name": "default", "layers": [{"name": "w", "command": [sys.executable, "-c", WRITE, "200"]}]}
    )
    assert farm.job(own)["layers"][0]["log_limit_bytes"] == 16 * KIB
    assert farm.job(default)["layers"][0]["log_limit_bytes"] is None
    res = farm.run_worker(None, "--log-limit", "32K")
    assert res.returncode == 0, res.stderr
    env_job = farm.submit({"name": "env", "layers": [{"name": "w", "command": [sys.executable, "-c", WRITE, "200"]}]})
    res = farm.run_worker(None, env={"CUECTL_LOG_LIMIT": "24K"})
    assert res.returncode == 0, res.stderr

    def log_of(job: int) -> bytes:
        (frame,) = farm.frames(job)
        assert frame["state"] == "SUCCEEDED"
        return Path(
            json.loads(farm.cuectl("frame", "show", str(frame["id"]), "--json").stdout)["log_path"]
        ).read_bytes()

    for job, limit in ((own, 16 * KIB), (flag, 8 * KIB), (default, 32 * KIB), (env_job, 24 * KIB)):
        data = log_of(job)
        body = data[: data.rindex(b"=== cuectl: ")]
        assert len(body) <= limit, (job, len(body), limit)
        assert b"00000000 " in data and b"00000199 " in data, job  # first and last line kept
        assert b"reached its limit" in data
    bad = farm.cuectl("worker", "--until-idle", "--log-limit", "1K", check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --log-limit: must be at least 4K")


def test_a_full_disk_fails_the_frame_with_a_reason_and_leaves_the_store_alone(farm, small_log_fs):
    """The frame keeps writing although its writes fail with ENOSPC: the worker stops it,
    says why in its log, and the store records the failure."""
    spam = "import os, time\nwhile True:\n    try: os.write(1, b'x' * 65536)\n    except OSError: time.sleep(0.001)\n"
    job = farm.submit(
        {
            "name": "full",
            "layers": [{"name": "w", "command": [sys.executable, "-c", spam], "retries": 0, "timeout": "30s"}],
        }
    )
    res = farm.run_worker(None, env={"CUECTL_LOG_DIR": str(small_log_fs)}, timeout=60)
    assert res.returncode == 0, res.stderr
    (frame,) = farm.frames(job)
    assert frame["state"] == "DEAD"
    shown = json.loads(farm.cuectl("frame", "show", str(frame["id"]), "--json").stdout)
    log = Path(shown["log_path"]).read_text(errors="replace")
    assert "the log's filesystem is full" in log
    assert "timeout" not in log  # stopped for the disk, not by the 30 s timeout
    assert farm.cuectl("admin", "doctor", "--json", check=False).returncode in (0, 1)
    assert farm.job(job)["state"] == "FINISHED"


def test_a_hostile_job_name_in_a_double_quoted_shell_token_is_text(farm):
    """The reported case: `command: "echo \\"#JOB#\\""` with a job name that closes the quote."""
    name = "x'; touch pwned #"
    job = farm.submit({"name": name, "layers": [{"name": "w", "command": "echo \"#JOB#\"; echo '#JOB#'"}]})
    assert farm.run_worker(None).returncode == 0
    assert not (farm.tmp / "pwned").exists()
    (frame,) = farm.frames(job)
    assert frame["state"] == "SUCCEEDED"
    log = farm.cuectl("frame", "log", str(frame["id"])).stdout
    assert log.count(f"{name}\n") == 2, log
