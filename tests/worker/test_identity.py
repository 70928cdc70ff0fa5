"""A job's user is proven, never taken from a label (docs/security.md, "Identity").

Root only, with real throwaway users, on a machine several people use as issue 35 sets it
up (the ``shared_farm`` fixture): the store, its directory, logs and receipts are root's
alone, and alice and bob reach the store only through the root ``cuectl serve --socket``
beside it, which acts as the socket's peer. A root worker runs each frame as its submitter
only when the kernel (the owner of the submit receipt) says who that is, and only if the
command is still what that user submitted.

An attack that once needed a member to write the shared file is tried twice: as the
member, who now cannot (the file refuses her, the socket refuses the call), and as root in
the harness, standing for any writer of the store, whose edit the receipt's digest must
still catch at launch (defence in depth). A root worker refuses a store its group can write."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from contextlib import closing
from pathlib import Path

from farmlib import Farm, cuectl_cmd

WHOAMI = ["python3", "-c", "import os; print('whoami', os.getuid(), os.environ['USER'])"]
# What a user gets from SQLite when she may not write the file or its directory.
NO_WRITE = ("attempt to write a readonly database", "unable to open database file")


def submit_as(user, farm, spec: dict, **env: str) -> int:
    path = farm.tmp / f"{spec['name']}-{os.urandom(3).hex()}.json"
    path.write_text(json.dumps(spec))
    path.chmod(0o644)
    res = user.run([*cuectl_cmd(), "--db", str(farm.db), "submit", str(path)], env=farm.env(**env), cwd=farm.tmp)
    assert res.returncode == 0, res.stderr
    return int(res.stdout)


def write_refused(user, farm, sql: str, params: tuple) -> str:
    """Run ``sql`` as ``user`` straight on the store file (python's sqlite3, as the old group
    store let any member do) and return SQLite's refusal; fail if the write went through."""
    prog = (
        f"import sqlite3\n"
        f"try:\n"
        f"    db = sqlite3.connect({str(farm.db)!r})\n"
        f"    n = db.execute({sql!r}, {params!r}).rowcount\n"
        f"    db.commit()\n"
        f"    print('wrote', n)\n"
        f"except sqlite3.Error as exc:\n"
        f"    print('refused:', exc)\n"
    )
    res = user.run([sys.executable, "-c", prog])
    assert res.returncode == 0 and res.stdout.startswith("refused:"), (res.stdout, res.stderr)
    assert any(text in res.stdout for text in NO_WRITE), res.stdout
    return res.stdout


def edit_as_root(farm, sql: str, params: tuple) -> None:
    """The same edit made by a writer of the store (root, here): what the receipt must catch."""
    with closing(sqlite3.connect(farm.db)) as conn:
        assert conn.execute(sql, params).rowcount == 1
        conn.commit()


def receipt_of(farm, job: int) -> str:
    with closing(sqlite3.connect(farm.db)) as conn:
        return conn.execute("SELECT receipt FROM jobs WHERE id = ?", (job,)).fetchone()[0]


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_root_worker_runs_frames_as_the_proven_submitter(shared_farm, os_users):
    (alice,) = os_users("alice")
    job = submit_as(alice, shared_farm, {"name": "as-alice", "layers": [{"name": "w", "command": WHOAMI}]})
    assert shared_farm.job(job)["user"] == alice.name
    assert shared_farm.run_worker(None).returncode == 0
    (frame,) = shared_farm.frames(job)
    assert frame["state"] == "SUCCEEDED"
    log = shared_farm.cuectl("frame", "log", str(frame["id"])).stdout
    assert f"whoami {alice.uid} {alice.name}" in log, log


def test_a_user_label_is_not_proof(shared_farm, os_users):
    """`CUECTL_USER=root cuectl submit` by alice once ran as uid 0. Through the socket the
    server makes the job hers whatever the label says, and it runs as alice. A job that a
    writer of the store relabels root is not run at all: alice's receipt proves alice."""
    (alice,) = os_users("alice")
    ran = shared_farm.tmp / "out" / "ran-as"  # the sticky out/: alice may write there
    command = ["sh", "-c", f"id -u >> {ran}"]
    job = submit_as(
        alice, shared_farm, {"name": "escalate", "layers": [{"name": "w", "command": command}]}, CUECTL_USER="root"
    )
    assert shared_farm.job(job)["user"] == alice.name
    relabelled = submit_as(alice, shared_farm, {"name": "relabelled", "layers": [{"name": "w", "command": command}]})
    edit_as_root(shared_farm, "UPDATE jobs SET user = 'root' WHERE id = ?", (relabelled,))
    res = shared_farm.run_worker(None)
    assert res.returncode == 0, res.stderr
    assert ran.read_text().split() == [str(alice.uid)]  # hers ran once, as her; never as 0
    assert [f["state"] for f in shared_farm.frames(job)] == ["SUCCEEDED"]
    (frame,) = shared_farm.frames(relabelled)
    assert frame["state"] == "WAITING" and frame["attempts"] == 0
    reason = shared_farm.job(relabelled)["pending_reason"]
    assert "root workers will not run it as root" in reason and f"uid {alice.uid}" in reason, reason
    assert f"not running job {relabelled}" in res.stderr


def test_a_command_changed_in_the_store_after_submit_never_runs(shared_farm, os_users):
    """bob once rewrote alice's command in the shared SQLite file. He cannot write it now;
    and when a writer of the store does, the receipt's digest no longer matches, so nothing
    runs as alice."""
    alice, bob = os_users("alice", "bob")
    marker = shared_farm.tmp / "out" / "bob-was-here"
    job = submit_as(
        alice, shared_farm, {"name": "victim", "layers": [{"name": "w", "command": ["true"], "retries": 0}]}
    )
    hostile = ("UPDATE layers SET command = ? WHERE job_id = ?", (json.dumps(["touch", str(marker)]), job))
    write_refused(bob, shared_farm, *hostile)
    assert shared_farm.job(job)["layers"][0]["command"] == ["true"]
    edit_as_root(shared_farm, *hostile)
    assert shared_farm.run_worker(None).returncode == 0
    assert not marker.exists()
    (frame,) = shared_farm.frames(job)
    assert frame["state"] == "DEAD"
    log = shared_farm.cuectl("frame", "log", str(frame["id"])).stdout
    assert "is not what" in log and alice.name in log, log


def test_a_relabelled_job_pointing_at_someone_elses_receipt_never_runs(shared_farm, os_users):
    """bob once copied alice's receipt name into his own job labelled alice. He cannot write
    the store now; made by a writer of the store, the edit proves nothing: the receipt
    names another job."""
    alice, bob = os_users("alice", "bob")
    marker = shared_farm.tmp / "out" / "stolen"
    theirs = submit_as(alice, shared_farm, {"name": "a", "layers": [{"name": "w", "command": ["true"]}]})
    mine = submit_as(bob, shared_farm, {"name": "b", "layers": [{"name": "w", "command": ["touch", str(marker)]}]})
    hostile = (
        "UPDATE jobs SET user = ?, receipt = ? WHERE id = ?",
        (alice.name, receipt_of(shared_farm, theirs), mine),
    )
    write_refused(bob, shared_farm, *hostile)
    assert shared_farm.job(mine)["user"] == bob.name
    edit_as_root(shared_farm, *hostile)
    assert shared_farm.run_worker(None).returncode == 0
    assert not marker.exists()
    assert [f["state"] for f in shared_farm.frames(mine)] == ["WAITING"]
    assert "another job" in shared_farm.job(mine)["pending_reason"]


def test_a_symlinked_receipt_is_refused(shared_farm, os_users):
    """alice once swapped her receipt for a link in the spool. The spool is root's now, so
    she cannot; a link put there by a writer of the store is still not followed."""
    (alice,) = os_users("alice")
    job = submit_as(alice, shared_farm, {"name": "s", "layers": [{"name": "w", "command": ["true"]}]})
    spool = Path(shared_farm.db).parent / "receipts"
    real = spool / receipt_of(shared_farm, job)
    moved = spool / "moved.json"
    swap = ["sh", "-c", f"mv {real} {moved} && ln -s {moved} {real}"]
    res = alice.run(swap)
    assert res.returncode != 0 and "Permission denied" in res.stderr, res
    assert real.is_file() and not real.is_symlink() and not moved.exists()
    assert real.stat().st_uid == alice.uid  # hers, in root's spool
    subprocess.run(swap, check=True)
    assert shared_farm.run_worker(None).returncode == 0
    assert shared_farm.frames(job)[0]["state"] == "WAITING"
    assert "symbolic link" in shared_farm.job(job)["pending_reason"]


def test_only_the_owner_or_an_admin_changes_a_job_forced_or_not(shared_farm, os_users):
    """On the old group store bob could edit the file anyway, so --force let him past the
    check. Through the socket the server is the only writer: bob is refused with one line
    naming the owner, with --force too; alice and root (an admin) are not."""
    alice, bob = os_users("alice", "bob")
    job = submit_as(
        alice, shared_farm, {"name": "hers", "layers": [{"name": "w", "command": ["true"], "range": "1-2"}]}
    )
    frame = shared_farm.frames(job)[0]["id"]
    base = [*cuectl_cmd(), "--db", str(shared_farm.db)]
    for args in (
        ["job", "kill", str(job)],
        ["job", "priority", str(job), "90"],
        ["job", "pause", str(job)],
        ["job", "retry", str(job)],
        ["frame", "eat", str(frame)],
    ):
        for force in ([], ["--force"]):
            res = bob.run([*base, *args, *force], env=shared_farm.env())
            assert res.returncode == 1, (args, force, res.stderr)
            assert error_lines(res.stderr) == [
                f"error: job {job} (hers) belongs to {alice.name}, not {bob.name}: "
                "only its owner or an admin may change it"
            ], (args, force, res.stderr)
            assert "--force" not in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert shared_farm.job(job)["frame_counts"] == {"WAITING": 2} and shared_farm.job(job)["priority"] == 0
    assert shared_farm.job(job)["paused"] is False
    res = alice.run([*base, "job", "priority", str(job), "7"], env=shared_farm.env())
    assert res.returncode == 0, res.stderr
    assert shared_farm.job(job)["priority"] == 7
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
    """Once a member could insert an admin token into the shared file (issue 35 item 2): she
    cannot write it now, and through the socket token calls are an admin's."""
    (bob,) = os_users("bob")
    shared_farm.cuectl("admin", "migrate")  # root makes the store: bob is a user of it, not its owner
    submit_as(bob, shared_farm, {"name": "any", "layers": [{"name": "w", "command": ["true"]}]})
    write_refused(
        bob,
        shared_farm,
        "INSERT INTO tokens(user, role, hash, created_at, created_by) VALUES (?, 'admin', 'x', 0, ?)",
        (bob.name, bob.name),
    )
    base = [*cuectl_cmd(), "--db", str(shared_farm.db)]
    res = bob.run([*base, "admin", "token", "create", bob.name], env=shared_farm.env())
    assert res.returncode == 1 and len(error_lines(res.stderr)) == 1, res.stderr
    assert "admin" in error_lines(res.stderr)[0] and "Traceback" not in res.stderr, res.stderr
    assert json.loads(shared_farm.cuectl("admin", "token", "list", "--json").stdout)["tokens"] == []
    created = json.loads(shared_farm.cuectl("admin", "token", "create", bob.name, "--role", "viewer", "--json").stdout)
    assert created["secret"].startswith("cuectl_") and created["role"] == "viewer"
    listed = shared_farm.cuectl("admin", "token", "list").stdout
    assert bob.name in listed and created["secret"] not in listed
    res = bob.run([*base, "admin", "token", "revoke", str(created["id"])], env=shared_farm.env())
    assert res.returncode == 1 and len(error_lines(res.stderr)) == 1, res.stderr
    assert not json.loads(shared_farm.cuectl("admin", "token", "list", "--json").stdout)["tokens"][0]["revoked_at"]
    shared_farm.cuectl("admin", "token", "revoke", str(created["id"]))
    assert json.loads(shared_farm.cuectl("admin", "token", "list", "--json").stdout)["tokens"][0]["revoked_at"]


def test_a_directory_changed_in_the_store_after_submit_never_runs(shared_farm, os_users):
    """bob once pointed alice's job at a directory he controls, where `python3 train.py`
    would run his train.py as alice. He cannot write the store now; a writer of the store
    who does is caught: the directory is part of the receipt's digest, nothing runs."""
    alice, bob = os_users("alice", "bob")
    marker = shared_farm.tmp / "out" / "bob-ran-as-alice"
    trap = shared_farm.tmp / "bobs-dir"
    trap.mkdir()
    (trap / "train.py").write_text(f"open({str(marker)!r}, 'w').write('pwned')\n")
    (trap / "train.py").chmod(0o644)
    os.chown(trap / "train.py", bob.uid, bob.gid)
    os.chown(trap, bob.uid, bob.gid)
    trap.chmod(0o755)
    job = submit_as(
        alice,
        shared_farm,
        {
            "name": "victim-dir",
            "cwd": str(shared_farm.tmp),
            "layers": [{"name": "w", "command": ["python3", "train.py"], "retries": 0}],
        },
    )
    hostile = ("UPDATE layers SET cwd = ? WHERE job_id = ?", (str(trap), job))
    write_refused(bob, shared_farm, *hostile)
    assert shared_farm.job(job)["layers"][0]["cwd"] == str(shared_farm.tmp)
    edit_as_root(shared_farm, *hostile)
    assert shared_farm.run_worker(None).returncode == 0
    assert not marker.exists()
    (frame,) = shared_farm.frames(job)
    assert frame["state"] == "DEAD"
    assert "directory" in shared_farm.cuectl("frame", "log", str(frame["id"])).stdout


def test_a_root_worker_refuses_a_store_its_group_can_write(os_users):
    """The old set-up: a setgid directory and a 0660 store that the group's members write
    (alice submits straight into the file). A root worker there would run whatever any
    member wrote as whomever it names: it exits 2 with one error line saying how to set up
    the shared mode, and runs nothing. Once only root can write it (chmod g-w of the files
    and directories), the same worker starts and runs alice's job as alice. (bob is in the
    group too: a group of one is its owner's own, which a root worker accepts.)"""
    alice, _bob = os_users("alice", "bob")
    top = Path(tempfile.mkdtemp(prefix="cuectl-group-", dir="/tmp"))
    farm = None
    try:
        top.chmod(0o755)
        home = top / "store"
        home.mkdir()
        os.chown(home, 0, os_users.group_gid)
        home.chmod(0o2770)
        out = top / "out"
        out.mkdir()
        out.chmod(0o1777)
        farm = Farm(home)
        farm.ledger = out / "ledger.jsonl"
        ran = out / "ran-as"
        res = alice.run(
            [*cuectl_cmd(), "--db", str(farm.db), "submit", "--name", "g", "--", "sh", "-c", f"id -u >> {ran}"],
            env=farm.env(),
            cwd=out,
        )
        assert res.returncode == 0, res.stderr  # a member writes the group store herself
        job = int(res.stdout)
        assert (farm.db.stat().st_mode & 0o777) == 0o660 and farm.db.stat().st_gid == os_users.group_gid

        refused = farm.run_worker(None, timeout=60)
        assert refused.returncode == 2, refused
        assert error_lines(refused.stderr) == refused.stderr.splitlines()[:1], refused.stderr
        (line,) = error_lines(refused.stderr)
        assert line.startswith(
            f"error: a root worker will not use a store others can write: {farm.db} is mode 660: its group can write it"
        ), line
        assert "cuectl serve --socket" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
        assert not ran.exists()
        (frame,) = farm.frames(job)
        assert frame["state"] == "WAITING" and frame["attempts"] == 0
        assert json.loads(farm.cuectl("host", "list", "--json").stdout)["hosts"] == []
        # Told to run every frame as itself, a root worker would run the members' rows as
        # root: refused the same (it once skipped the check, and ran alice's `id -u` as 0).
        as_root = farm.run_worker(None, "--run-as-worker-user", timeout=60)
        assert as_root.returncode == 2 and "a root worker will not use a store others can write" in as_root.stderr
        assert not ran.exists()

        for path in [home, *home.rglob("*")]:
            if not path.is_symlink():
                path.chmod(path.stat().st_mode & ~0o020 & 0o7777)
        res = farm.run_worker(None, timeout=60)
        assert res.returncode == 0, res.stderr
        assert [f["state"] for f in farm.frames(job)] == ["SUCCEEDED"]
        assert ran.read_text().split() == [str(alice.uid)]
    finally:
        if farm is not None:
            farm.cleanup()
        shutil.rmtree(top, ignore_errors=True)
