"""A store shared by a group (docs/security.md, "File modes"): real users, a setgid
directory, umask 022. Members can all write it; `admin doctor` says what is wrong with
its permissions and how to fix it; a user outside the group gets one clear line."""

from __future__ import annotations

import grp
import json
import os
import shutil
import sqlite3
import stat
import subprocess

from farmlib import cuectl_cmd


def as_user_with_umask(user, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """``argv`` as ``user`` under umask 022 (inherited through setpriv), a common default
    that used to make a group store 0640."""
    old = os.umask(0o022)
    try:
        return user.run(argv, env=env)
    finally:
        os.umask(old)


def test_members_share_a_store_created_under_umask_022(shared_farm, os_users):
    alice, bob = os_users("alice", "bob")
    import osusers

    group = osusers.GROUP
    base = [*cuectl_cmd(), "--db", str(shared_farm.db)]
    env = shared_farm.env()
    res = as_user_with_umask(alice, [*base, "submit", "--name", "hers", "--", "true"], env)
    assert res.returncode == 0, res.stderr
    st = shared_farm.db.stat()
    assert stat.S_IMODE(st.st_mode) == 0o660 and grp.getgrgid(st.st_gid).gr_name == group
    # While a connection is open (WAL mode), -wal and -shm exist: group-writable too.
    conn = sqlite3.connect(shared_farm.db)
    conn.execute("SELECT COUNT(*) FROM jobs").fetchone()
    for suffix in ("-wal", "-shm"):
        side = shared_farm.db.with_name(shared_farm.db.name + suffix)
        assert stat.S_IMODE(side.stat().st_mode) == 0o660, (suffix, oct(side.stat().st_mode))
    res = as_user_with_umask(bob, [*base, "submit", "--name", "his", "--", "true"], env)
    conn.close()
    assert res.returncode == 0, res.stderr  # was "attempt to write a readonly database"
    res = as_user_with_umask(bob, [*base, "job", "list", "--json"], env)
    assert res.returncode == 0, res.stderr
    assert sorted(j["name"] for j in json.loads(res.stdout)["jobs"]) == ["hers", "his"]
    doctor = json.loads(shared_farm.cuectl("admin", "doctor", "--json", check=False).stdout)["checks"]
    perms = next(c for c in doctor if c["name"] == "store permissions")
    assert perms["status"] == "ok" and "group store" in perms["detail"], perms


def test_doctor_explains_a_group_store_members_cannot_write(shared_farm, os_users):
    """A store made before the fix (0640): doctor names the file, the group and the chmod."""
    alice, bob = os_users("alice", "bob")
    base = [*cuectl_cmd(), "--db", str(shared_farm.db)]
    res = as_user_with_umask(alice, [*base, "submit", "--name", "hers", "--", "true"], shared_farm.env())
    assert res.returncode == 0, res.stderr
    shared_farm.db.chmod(0o640)
    res = as_user_with_umask(alice, [*base, "admin", "doctor", "--json"], shared_farm.env())
    assert res.stdout, res.stderr
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    perms = checks["store permissions"]
    assert perms["status"] == "warn", perms
    assert f"chmod g+rw {shared_farm.db}" in perms["detail"] and "readonly database" in perms["detail"], perms
    res = as_user_with_umask(bob, [*base, "submit", "--name", "his", "--", "true"], shared_farm.env())
    assert res.returncode == 1
    assert res.stderr.startswith(f"error: permission denied: {shared_farm.db} (only its owner {alice.name} "
                                 "can write it)"), res.stderr


def test_a_user_outside_the_group_gets_permission_denied_not_an_internal_error(shared_farm, os_users):
    alice, carol = os_users("alice", "carol")
    import osusers

    base = [*cuectl_cmd(), "--db", str(shared_farm.db)]
    res = as_user_with_umask(alice, [*base, "submit", "--name", "hers", "--", "true"], shared_farm.env())
    assert res.returncode == 0, res.stderr
    outsider = [shutil.which("setpriv") or "setpriv", f"--reuid={carol.uid}", f"--regid={carol.gid}",
                "--clear-groups", "--"]
    env = dict(shared_farm.env(), USER=carol.name, LOGNAME=carol.name, HOME="/nonexistent")
    for args in (["job", "list"], ["submit", "--name", "mine", "--", "true"], ["frame", "list", "--json"]):
        res = subprocess.run([*outsider, *osusers.runnable([*base, *args])], env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 1, (args, res)
        first = res.stderr.splitlines()[0]
        assert first == f"error: permission denied: {shared_farm.db} (group {osusers.GROUP} can write it)", first
        assert "internal error" not in res.stderr and "Traceback" not in res.stderr
    assert os.stat(shared_farm.db).st_uid == alice.uid
