"""Issue 35 item 1: a command token expands only from values the submitter's proof covers.

Root only, with real throwaway users, on a machine several people use (the ``shared_farm``
fixture: a root-owned store, users through ``cuectl serve --socket``); a root worker runs
alice's frames as alice. On the old group store mallory could write the file and rename
alice's job to shell code that alice's argv command `sh -c 'echo #JOB# > out'` would run
(the token is replaced inside one argv element, with no quoting: no shell string is
involved). Now she cannot write the file; and when a writer of the store (root in the
harness) makes that edit, the receipt's digest (version 2) covers the job's name, so the
frame is refused as not proven. Receipts written before versions (version 1, without the
name) still prove layers whose commands use no `#JOB#` token, and refuse those that do
(docs/security.md)."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from farmlib import cuectl_cmd
from test_identity import edit_as_root, write_refused

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="a root worker and real users need root")


def submit_as(user, farm, spec: dict) -> int:
    path = farm.tmp / f"{spec['name']}-{os.urandom(3).hex()}.json"
    path.write_text(json.dumps(spec))
    path.chmod(0o644)
    res = user.run([*cuectl_cmd(), "--db", str(farm.db), "submit", str(path)], env=farm.env(), cwd=farm.tmp)
    assert res.returncode == 0, res.stderr
    return int(res.stdout)


def frame_log(farm, job: int) -> tuple[str, str]:
    (frame,) = farm.frames(job)
    return frame["state"], farm.cuectl("frame", "log", str(frame["id"])).stdout


@ROOT_ONLY
def test_a_job_renamed_in_the_store_never_reaches_a_shell_through_its_token(shared_farm, os_users):
    alice, mallory = os_users("alice", "mallory")
    pwned = Path(f"/tmp/cuectl-pwned-{os.urandom(4).hex()}")
    out = shared_farm.tmp / "out" / "rendered"  # the sticky out/: alice may write there
    try:
        job = submit_as(
            alice,
            shared_farm,
            {"name": "render", "layers": [{"name": "w", "command": ["sh", "-c", f"echo #JOB# > {out}"], "retries": 0}]},
        )
        hostile = ("UPDATE jobs SET name = ? WHERE id = ?", (f"$(id > {pwned})", job))
        write_refused(mallory, shared_farm, *hostile)
        assert shared_farm.job(job)["name"] == "render"
        edit_as_root(shared_farm, *hostile)
        assert shared_farm.run_worker(None).returncode == 0
        assert not pwned.exists(), pwned.read_text()
        assert not out.exists()
        state, log = frame_log(shared_farm, job)
        assert state == "DEAD"
        assert "is not what" in log and alice.name in log and "job's name" in log, log
        # Untouched, the same command runs as alice, with the name she submitted.
        fine = submit_as(
            alice,
            shared_farm,
            {"name": "render", "layers": [{"name": "w", "command": ["sh", "-c", f"echo #JOB# > {out}"]}]},
        )
        assert shared_farm.run_worker(None).returncode == 0
        assert frame_log(shared_farm, fine)[0] == "SUCCEEDED"
        assert out.read_text() == "render\n" and out.stat().st_uid == alice.uid
    finally:
        pwned.unlink(missing_ok=True)


def _make_receipt_v1(user, farm, job: int) -> None:
    """Rewrite the job's receipt as cuectl wrote it before receipts had versions: no "v",
    digests without the job's name. The spool is root's now: root writes it here and gives
    it to ``user``, as her own submit with an older cuectl left it."""
    from cuectl.sched import identity

    conn = sqlite3.connect(farm.db)
    receipt, owner = conn.execute('SELECT receipt, "user" FROM jobs WHERE id = ?', (job,)).fetchone()
    layers = conn.execute(
        "SELECT name, command, env, range, chunk, cwd FROM layers WHERE job_id = ?", (job,)
    ).fetchall()
    conn.close()
    assert owner == user.name
    command = json.loads(layers[0][1])
    digests = {
        name: identity.layer_digest(
            job_id=job,
            user=owner,
            layer=name,
            command=command if isinstance(command, str) else list(command),
            env=json.loads(env),
            frame_range=rng,
            chunk=chunk,
            cwd=cwd,
            version=1,
        )
        for name, _, env, rng, chunk, cwd in layers
    }
    path = Path(farm.db).parent / identity.SPOOL / receipt
    body = json.dumps({"job": job, "user": owner, "layers": digests})
    os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444)
    try:
        os.fchown(fd, user.uid, user.gid)
        os.write(fd, body.encode())
    finally:
        os.close(fd)
    assert "v" not in json.loads(path.read_text()) and path.stat().st_uid == user.uid


@ROOT_ONLY
def test_a_version_1_receipt_proves_commands_without_the_name_token_only(shared_farm, os_users):
    (alice,) = os_users("alice")
    out = shared_farm.tmp / "out" / "named"  # the sticky out/: alice may write there
    plain = submit_as(
        alice,
        shared_farm,
        {
            "name": "old-plain",
            "layers": [
                {"name": "w", "command": ["sh", "-c", "echo frame #IFRAME# of #LAYER# as $(id -un)"], "retries": 0}
            ],
        },
    )
    named = submit_as(
        alice,
        shared_farm,
        {"name": "old-named", "layers": [{"name": "w", "command": ["sh", "-c", f"echo #JOB# > {out}"], "retries": 0}]},
    )
    for job in (plain, named):
        _make_receipt_v1(alice, shared_farm, job)
    assert shared_farm.run_worker(None).returncode == 0
    state, log = frame_log(shared_farm, plain)
    assert state == "SUCCEEDED" and f"frame 1 of w as {alice.name}" in log, log
    state, log = frame_log(shared_farm, named)
    assert state == "DEAD" and not out.exists()
    assert "older cuectl" in log and "#JOB#" in log and "resubmit" in log, log
