"""A store shared by a group (docs/security.md, "File modes"): real users, a setgid
directory, umask 022. Members can all write it; `admin doctor` says what is wrong with
its permissions and how to fix it; a user outside the group gets one clear line.

Since issue 35 such a store is for a trusted team: its members and a worker that runs as
one of them (not root) share it, each able to write every row. A root worker refuses it
(one writer, or nothing of a client's runs as root): a machine several people use gives
the store to root or a service account and lets users in through `cuectl serve --socket`
(tests/worker/test_shared_socket.py)."""

from __future__ import annotations

import grp
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from farmlib import Farm, cuectl_cmd


@pytest.fixture
def group_farm(os_users):
    """A farm whose store lives in a setgid directory shared by the throwaway users' group
    (as a team's group store would), so its members write it themselves. Root only."""
    path = Path(tempfile.mkdtemp(prefix="cuectl-group-", dir="/tmp"))
    os.chown(path, 0, os_users.group_gid)
    os.chmod(path, 0o2770)
    f = Farm(path)
    yield f
    f.cleanup()
    shutil.rmtree(path, ignore_errors=True)


def as_user_with_umask(user, argv: list[str], env: dict[str, str], **kwargs) -> subprocess.CompletedProcess:
    """``argv`` as ``user`` under umask 022 (inherited through setpriv), a common default
    that used to make a group store 0640."""
    old = os.umask(0o022)
    try:
        return user.run(argv, env=env, **kwargs)
    finally:
        os.umask(old)


def test_members_share_a_store_created_under_umask_022(group_farm, os_users):
    """Members write the group store themselves, and a worker running as one of them (a
    trusted team's own account, not root) runs what any of them submitted, as itself. A
    root worker refuses the store: every member can write every row it would trust."""
    alice, bob = os_users("alice", "bob")
    import osusers

    group = osusers.GROUP
    base = [*cuectl_cmd(), "--db", str(group_farm.db)]
    env = group_farm.env()
    ran = group_farm.tmp / "ran-as"
    command = ["--", "sh", "-c", f"id -u >> {ran}"]
    res = as_user_with_umask(alice, [*base, "submit", "--name", "hers", *command], env, cwd=group_farm.tmp)
    assert res.returncode == 0, res.stderr
    st = group_farm.db.stat()
    assert stat.S_IMODE(st.st_mode) == 0o660 and grp.getgrgid(st.st_gid).gr_name == group
    # While a connection is open (WAL mode), -wal and -shm exist: group-writable too.
    conn = sqlite3.connect(group_farm.db)
    conn.execute("SELECT COUNT(*) FROM jobs").fetchone()
    for suffix in ("-wal", "-shm"):
        side = group_farm.db.with_name(group_farm.db.name + suffix)
        assert stat.S_IMODE(side.stat().st_mode) == 0o660, (suffix, oct(side.stat().st_mode))
    res = as_user_with_umask(bob, [*base, "submit", "--name", "his", *command], env, cwd=group_farm.tmp)
    conn.close()
    assert res.returncode == 0, res.stderr  # was "attempt to write a readonly database"
    res = as_user_with_umask(bob, [*base, "job", "list", "--json"], env)
    assert res.returncode == 0, res.stderr
    assert sorted(j["name"] for j in json.loads(res.stdout)["jobs"]) == ["hers", "his"]
    doctor = json.loads(group_farm.cuectl("admin", "doctor", "--json", check=False).stdout)["checks"]
    perms = next(c for c in doctor if c["name"] == "store permissions")
    assert perms["status"] == "ok" and "group store" in perms["detail"], perms

    refused = group_farm.run_worker(None, timeout=60)
    assert refused.returncode == 2, refused
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert errors == refused.stderr.splitlines()[:1] and len(errors) == 1, refused.stderr
    assert errors[0].startswith(
        f"error: a root worker will not use a store others can write: {group_farm.db} "
        "is mode 660: its group can write it"
    ), errors
    assert "cuectl serve --socket" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    assert not ran.exists()

    own = group_farm.tmp / "alices-worker"  # the team account's own lock dir and state
    own.mkdir()
    os.chown(own, alice.uid, alice.gid)
    own.chmod(0o700)
    worker_env = dict(
        env,
        CUECTL_LOCK_DIR=str(own / "locks"),
        CUECTL_LOCK_REGISTRY=str(own / "registry"),
        CUECTL_CREATE_LOCK_DIR="1",
        XDG_STATE_HOME=str(own / "state"),
        CUECTL_RUN_CACHE=str(own / "run.cache"),
    )
    res = alice.run(
        [*base, "worker", "--until-idle", "--poll", "0.05"], env=worker_env, cwd=group_farm.tmp, timeout=120
    )
    assert res.returncode == 0, res.stderr
    jobs = json.loads(group_farm.cuectl("job", "list", "--json").stdout)["jobs"]
    assert sorted((j["name"], j["user"], j["frame_counts"]) for j in jobs) == [
        ("hers", alice.name, {"SUCCEEDED": 1}),
        ("his", bob.name, {"SUCCEEDED": 1}),
    ], jobs
    assert ran.read_text().split() == [str(alice.uid)] * 2  # both, as the worker's own user


def test_doctor_explains_a_group_store_members_cannot_write(group_farm, os_users):
    """A store made before the fix (0640): doctor names the file, the group and the chmod."""
    alice, bob = os_users("alice", "bob")
    base = [*cuectl_cmd(), "--db", str(group_farm.db)]
    res = as_user_with_umask(alice, [*base, "submit", "--name", "hers", "--", "true"], group_farm.env())
    assert res.returncode == 0, res.stderr
    group_farm.db.chmod(0o640)
    res = as_user_with_umask(alice, [*base, "admin", "doctor", "--json"], group_farm.env())
    assert res.stdout, res.stderr
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    perms = checks["store permissions"]
    assert perms["status"] == "warn", perms
    assert f"chmod g+rw {group_farm.db}" in perms["detail"] and "readonly database" in perms["detail"], perms
    # ...and says that a root worker will not use a store its group can write.
    writers = checks["store writers"]
    assert writers["status"] == "warn" and "a root worker will refuse it" in writers["detail"], writers
    assert "its group can write it" in writers["detail"] and "cuectl serve --socket" in writers["detail"], writers
    res = as_user_with_umask(bob, [*base, "submit", "--name", "his", "--", "true"], group_farm.env())
    assert res.returncode == 1
    assert res.stderr.startswith(
        f"error: permission denied: {group_farm.db} (only its owner {alice.name} can write it)"
    ), res.stderr


def test_a_user_outside_the_group_gets_permission_denied_not_an_internal_error(group_farm, os_users):
    alice, carol = os_users("alice", "carol")
    import osusers

    base = [*cuectl_cmd(), "--db", str(group_farm.db)]
    res = as_user_with_umask(alice, [*base, "submit", "--name", "hers", "--", "true"], group_farm.env())
    assert res.returncode == 0, res.stderr
    outsider = [
        shutil.which("setpriv") or "setpriv",
        f"--reuid={carol.uid}",
        f"--regid={carol.gid}",
        "--clear-groups",
        "--",
    ]
    env = dict(group_farm.env(), USER=carol.name, LOGNAME=carol.name, HOME="/nonexistent")
    for args in (["job", "list"], ["submit", "--name", "mine", "--", "true"], ["frame", "list", "--json"]):
        res = subprocess.run(
            [*outsider, *osusers.runnable([*base, *args])], env=env, capture_output=True, text=True, timeout=60
        )
        assert res.returncode == 1, (args, res)
        first = res.stderr.splitlines()[0]
        assert first == f"error: permission denied: {group_farm.db} (group {osusers.GROUP} can write it)", first
        assert "internal error" not in res.stderr and "Traceback" not in res.stderr
    assert os.stat(group_farm.db).st_uid == alice.uid
