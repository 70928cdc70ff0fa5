"""A job's user is proven, never taken from a label (docs/security.md, "Identity").

Root only, with real throwaway users: alice and bob share a group store; a root worker
runs each frame as its submitter only when the kernel (the owner of the submit receipt)
says who that is, and only if the command is still what that user submitted."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

from farmlib import cuectl_cmd

WHOAMI = ["python3", "-c", "import os; print('whoami', os.getuid(), os.environ['USER'])"]


def submit_as(user, farm, spec: dict, **env: str) -> int:
    path = farm.tmp / f"{spec['name']}.json"
    path.write_text(json.dumps(spec))
    path.chmod(0o644)
    res = user.run([*cuectl_cmd(), "--db", str(farm.db), "submit", str(path)], env=farm.env(**env), cwd=farm.tmp)
    assert res.returncode == 0, res.stderr
    for file in farm.tmp.glob(farm.db.name + "*"):  # a group store: members write it (docs/security.md)
        file.chmod(0o660)
    return int(res.stdout)


def test_root_worker_runs_frames_as_the_proven_submitter(shared_farm, os_users):
    (alice,) = os_users("alice")
    job = submit_as(alice, shared_farm, {"name": "as-alice", "layers": [{"name": "w", "command": WHOAMI}]})
    assert shared_farm.run_worker(None).returncode == 0
    (frame,) = shared_farm.frames(job)
    assert frame["state"] == "SUCCEEDED"
    log = shared_farm.cuectl("frame", "log", str(frame["id"])).stdout
    assert f"whoami {alice.uid} {alice.name}" in log, log


def test_a_user_label_is_not_proof(shared_farm, os_users):
    """`CUECTL_USER=root cuectl submit` by alice must never run as root (it ran as uid 0)."""
    (alice,) = os_users("alice")
    marker = shared_farm.tmp / "ran-as-root"
    job = submit_as(alice, shared_farm, {"name": "escalate", "layers": [
        {"name": "w", "command": ["sh", "-c", f"id -u > {marker}"]}]}, CUECTL_USER="root")
    res = shared_farm.run_worker(None)
    assert res.returncode == 0, res.stderr
    assert not marker.exists()
    (frame,) = shared_farm.frames(job)
    assert frame["state"] == "WAITING" and frame["attempts"] == 0
    reason = shared_farm.job(job)["pending_reason"]
    assert "root workers will not run it as root" in reason and f"uid {alice.uid}" in reason, reason
    assert f"not running job {job}" in res.stderr


def test_a_command_changed_in_the_store_after_submit_never_runs(shared_farm, os_users):
    """bob can write the shared SQLite file: he rewrites alice's command. The receipt's
    digest no longer matches, so nothing runs as alice."""
    alice, bob = os_users("alice", "bob")
    marker = shared_farm.tmp / "bob-was-here"
    job = submit_as(alice, shared_farm, {"name": "victim", "layers": [
        {"name": "w", "command": ["true"], "retries": 0}]})
    edit = (f"import sqlite3; c = sqlite3.connect({str(shared_farm.db)!r}); "
            f"c.execute('UPDATE layers SET command = ? WHERE job_id = ?', ({json.dumps(['touch', str(marker)])!r}, "
            f"{job})); c.commit()")
    res = bob.run([sys.executable, "-c", edit])
    assert res.returncode == 0, res.stderr
    assert shared_farm.run_worker(None).returncode == 0
    assert not marker.exists()
    (frame,) = shared_farm.frames(job)
    assert frame["state"] == "DEAD"
    log = shared_farm.cuectl("frame", "log", str(frame["id"])).stdout
    assert "is not what" in log and alice.name in log, log


def test_a_relabelled_job_pointing_at_someone_elses_receipt_never_runs(shared_farm, os_users):
    """bob copies alice's receipt name into his own job labelled alice: the receipt names
    another job, so it proves nothing."""
    alice, bob = os_users("alice", "bob")
    marker = shared_farm.tmp / "stolen"
    theirs = submit_as(alice, shared_farm, {"name": "a", "layers": [{"name": "w", "command": ["true"]}]})
    mine = submit_as(bob, shared_farm, {"name": "b", "layers": [{"name": "w", "command": ["touch", str(marker)]}]})
    conn = sqlite3.connect(shared_farm.db)
    receipt = conn.execute("SELECT receipt FROM jobs WHERE id = ?", (theirs,)).fetchone()[0]
    conn.execute("UPDATE jobs SET user = ?, receipt = ? WHERE id = ?", (alice.name, receipt, mine))
    conn.commit()
    conn.close()
    assert shared_farm.run_worker(None).returncode == 0
    assert not marker.exists()
    assert "another job" in shared_farm.job(mine)["pending_reason"]


def test_a_symlinked_receipt_is_refused(shared_farm, os_users):
    (alice,) = os_users("alice")
    job = submit_as(alice, shared_farm, {"name": "s", "layers": [{"name": "w", "command": ["true"]}]})
    spool = Path(shared_farm.db).parent / "receipts"
    conn = sqlite3.connect(shared_farm.db)
    (receipt,) = conn.execute("SELECT receipt FROM jobs WHERE id = ?", (job,)).fetchone()
    conn.close()
    real = spool / receipt
    moved = spool / "moved.json"
    res = alice.run(["sh", "-c", f"mv {real} {moved} && ln -s {moved} {real}"])
    assert res.returncode == 0, res.stderr
    assert shared_farm.run_worker(None).returncode == 0
    assert shared_farm.frames(job)[0]["state"] == "WAITING"
    assert "symbolic link" in shared_farm.job(job)["pending_reason"]


def test_only_the_owner_or_an_admin_changes_a_job_unless_forced(shared_farm, os_users):
    """On a shared SQLite store bob could edit the file anyway (its permissions are the real
    boundary, docs/security.md), so the check refuses clearly and --force overrides it."""
    alice, bob = os_users("alice", "bob")
    job = submit_as(alice, shared_farm, {"name": "hers", "layers": [{"name": "w", "command": ["true"],
                                                                      "range": "1-2"}]})
    frame = shared_farm.frames(job)[0]["id"]
    base = [*cuectl_cmd(), "--db", str(shared_farm.db)]
    for args in (["job", "kill", str(job)], ["job", "priority", str(job), "90"], ["job", "pause", str(job)],
                 ["job", "retry", str(job)], ["frame", "eat", str(frame)]):
        res = bob.run([*base, *args], env=shared_farm.env())
        assert res.returncode == 1, (args, res.stderr)
        assert res.stderr.startswith(f"error: job {job} (hers) belongs to {alice.name}, not {bob.name}"), res.stderr
        assert "--force" in res.stderr and "Traceback" not in res.stderr
    assert shared_farm.job(job)["frame_counts"] == {"WAITING": 2} and shared_farm.job(job)["priority"] == 0
    res = alice.run([*base, "job", "priority", str(job), "7"], env=shared_farm.env())
    assert res.returncode == 0, res.stderr
    res = bob.run([*base, "job", "pause", str(job), "--force"], env=shared_farm.env())
    assert res.returncode == 0, res.stderr
    assert shared_farm.job(job)["paused"] is True
    shared_farm.cuectl("job", "kill", str(job))  # root is an admin
    assert shared_farm.job(job)["state"] == "FINISHED"
    # bob's prune removes only his own finished jobs; an admin's removes everyone's.
    his = submit_as(bob, shared_farm, {"name": "his", "layers": [{"name": "w", "command": ["true"]}]})
    shared_farm.cuectl("job", "kill", str(his))
    res = bob.run([*base, "admin", "prune", "--older-than", "0s", "--json"], env=shared_farm.env())
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["jobs"] == [his]
    assert json.loads(shared_farm.cuectl("admin", "prune", "--older-than", "0s", "--json").stdout)["jobs"] == [job]


def test_only_an_admin_manages_api_tokens(shared_farm, os_users):
    (bob,) = os_users("bob")
    shared_farm.cuectl("admin", "migrate")  # root makes the store: bob is a member, not its owner
    submit_as(bob, shared_farm, {"name": "any", "layers": [{"name": "w", "command": ["true"]}]})
    base = [*cuectl_cmd(), "--db", str(shared_farm.db)]
    res = bob.run([*base, "admin", "token", "create", bob.name], env=shared_farm.env())
    assert res.returncode == 1 and "only an admin may manage API tokens" in res.stderr, res.stderr
    created = json.loads(shared_farm.cuectl("admin", "token", "create", bob.name, "--role", "viewer",
                                            "--json").stdout)
    assert created["secret"].startswith("cuectl_") and created["role"] == "viewer"
    listed = shared_farm.cuectl("admin", "token", "list").stdout
    assert bob.name in listed and created["secret"] not in listed
    assert bob.run([*base, "admin", "token", "revoke", str(created["id"])], env=shared_farm.env()).returncode == 1
    shared_farm.cuectl("admin", "token", "revoke", str(created["id"]))
    assert json.loads(shared_farm.cuectl("admin", "token", "list", "--json").stdout)["tokens"][0]["revoked_at"]


def test_a_directory_changed_in_the_store_after_submit_never_runs(shared_farm, os_users):
    """bob points alice's job at a directory he controls, where `python3 train.py` would run
    his train.py as alice. The directory is part of the receipt's digest: nothing runs."""
    alice, bob = os_users("alice", "bob")
    marker = shared_farm.tmp / "bob-ran-as-alice"
    trap = shared_farm.tmp / "bobs-dir"
    trap.mkdir()
    (trap / "train.py").write_text(f"open({str(marker)!r}, 'w').write('pwned')\n")
    trap.chmod(0o755)
    (trap / "train.py").chmod(0o644)
    job = submit_as(alice, shared_farm, {"name": "victim-dir", "cwd": str(shared_farm.tmp), "layers": [
        {"name": "w", "command": ["python3", "train.py"], "retries": 0}]})
    edit = (f"import sqlite3; c = sqlite3.connect({str(shared_farm.db)!r}); "
            f"c.execute('UPDATE layers SET cwd = ? WHERE job_id = ?', ({str(trap)!r}, {job})); c.commit()")
    res = bob.run([sys.executable, "-c", edit])
    assert res.returncode == 0, res.stderr
    assert shared_farm.run_worker(None).returncode == 0
    assert not marker.exists()
    (frame,) = shared_farm.frames(job)
    assert frame["state"] == "DEAD"
    assert "directory" in shared_farm.cuectl("frame", "log", str(frame["id"])).stdout
