"""A machine several people use, as issue 35 asks for it: one writer (root owns the store),
users through ``cuectl serve --socket`` beside it, a root worker. Root only, with real
throwaway users (the ``shared_farm`` fixture); each attack is what a member of the old
group store could do by writing the file, tried now through the only door she has."""

from __future__ import annotations

import json
import sqlite3
import sys
import textwrap
from pathlib import Path

from farmlib import cuectl_cmd

WHOAMI = ["python3", "-c", "import os; print('whoami', os.getuid())"]


def submit_as(user, farm, spec: dict, **env: str):
    path = farm.tmp / "out" / f"{spec['name']}.json"
    path.write_text(json.dumps(spec))
    path.chmod(0o644)
    return user.run([*cuectl_cmd(), "--db", str(farm.db), "submit", str(path)], env=farm.env(**env), cwd=farm.tmp)


def raw_call(user, farm, code: str):
    """Run ``code`` as ``user`` with ``store``: the socket's RemoteStore, to send what the
    CLI never would (a forged user, forged chunks, a worker's call)."""
    prog = textwrap.dedent(f"""
        import json, sys
        from pathlib import Path
        from cuectl.errors import CuectlError
        from cuectl.sched.store import remote
        from cuectl.sched.model import JobSpec, LayerSpec
        store = remote.connect(Path({str(farm.db) + ".sock"!r}))
        try:
            out = {{"ok": True, "value": repr(eval(compile({code!r}, "<call>", "eval")))}}
        except CuectlError as exc:
            out = {{"ok": False, "error": type(exc).__name__, "message": exc.message}}
        print(json.dumps(out))
    """)
    res = user.run([sys.executable, "-c", prog], env=farm.env(), cwd=farm.tmp)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_users_submit_and_run_as_themselves_through_the_socket(shared_farm, os_users):
    (alice,) = os_users("alice")
    res = submit_as(alice, shared_farm, {"name": "mine", "layers": [{"name": "w", "command": WHOAMI}]})
    assert res.returncode == 0, res.stderr
    job = int(res.stdout)
    listed = alice.run([*cuectl_cmd(), "--db", str(shared_farm.db), "job", "list", "--json"], env=shared_farm.env())
    assert listed.returncode == 0 and [j["user"] for j in json.loads(listed.stdout)["jobs"]] == [alice.name]
    assert shared_farm.run_worker(None).returncode == 0
    (frame,) = shared_farm.frames(job)
    assert frame["state"] == "SUCCEEDED"
    log = alice.run(
        [*cuectl_cmd(), "--db", str(shared_farm.db), "frame", "log", str(frame["id"])], env=shared_farm.env()
    )
    assert log.returncode == 0 and f"whoami {alice.uid}" in log.stdout, log


def test_a_member_cannot_write_the_store_itself(shared_farm, os_users):
    """Items 1, 2, 7: renaming a job to `$(...)`, inserting an admin token, deleting
    receipts all needed write access to the file or its directories. She has none."""
    (alice,) = os_users("alice")
    prog = textwrap.dedent(f"""
        import sqlite3, sys
        try:
            db = sqlite3.connect({str(shared_farm.db)!r})
            db.execute("INSERT INTO tokens(user, role, hash, created_at, created_by) VALUES ('a', 'admin', 'x', 0, 'a')")
            db.commit()
        except sqlite3.Error as exc:
            print("refused:", exc)
    """)
    res = alice.run([sys.executable, "-c", prog], env=shared_farm.env())
    assert res.stdout.startswith("refused:"), (res.stdout, res.stderr)
    with sqlite3.connect(shared_farm.db) as db:
        assert db.execute("SELECT COUNT(*) FROM tokens").fetchone()[0] == 0
    receipts = shared_farm.db.parent / "receipts"
    submit_as(alice, shared_farm, {"name": "r", "layers": [{"name": "w", "command": ["true"]}]})
    (receipt,) = list(receipts.iterdir())
    rm = alice.run(["rm", "-f", str(receipt)])
    assert rm.returncode != 0 and receipt.exists()


def test_a_forged_user_and_forged_frames_are_not_believed(shared_farm, os_users):
    """The socket gets a JobSpec object: its user is the caller's, whatever it says, and its
    frames are expanded again from its range (a client's chunks become no frame rows)."""
    (alice,) = os_users("alice")
    out = raw_call(
        alice,
        shared_farm,
        (
            "store._call('submit', (JobSpec(name='forged', user='root', layers=(LayerSpec(name='w', command=('id',), "
            "range='1-2'),), chunks=(((666,), (667,)),)),), {'now': 1.0})"
        ),
    )
    assert out["ok"], out
    job = shared_farm.job(int(out["value"]))
    assert job["user"] == alice.name
    assert sorted(f["number"] for f in shared_farm.frames(job["id"])) == [1, 2]


def test_a_member_gets_no_worker_or_admin_call(shared_farm, os_users):
    (alice,) = os_users("alice")
    for code, needs in (
        ("store.reap(now=1e12)", "only the store's owner"),
        ("store.claim_frame(1, host='h', worker='w', gpu_uuids=[], now=1.0, lease_s=1.0)", "only the store's owner"),
        ("store.backup(Path('/tmp/stolen.db'))", "only the store's owner"),
        (
            "store.create_token('x', role='admin', label=None, now=1.0)",
            "only an admin may manage API tokens",
        ),  # the store's own words, as on the file
        ("store.set_host_locked('h', True)", "host lock: only an admin may do this"),
    ):
        out = raw_call(alice, shared_farm, code)
        assert not out["ok"] and out["error"] == "NotOwner" and needs in out["message"], (code, out)
    assert not Path("/tmp/stolen.db").exists()


def test_another_users_job_is_refused_with_one_line(shared_farm, os_users):
    alice, bob = os_users("alice", "bob")
    job = int(
        submit_as(
            alice, shared_farm, {"name": "hers", "paused": True, "layers": [{"name": "w", "command": ["true"]}]}
        ).stdout
    )
    res = bob.run([*cuectl_cmd(), "--db", str(shared_farm.db), "job", "kill", str(job)], env=shared_farm.env())
    assert res.returncode == 1 and res.stderr.startswith(f"error: job {job} (hers) belongs to {alice.name}"), res
    assert "Traceback" not in res.stderr
    assert shared_farm.job(job)["state"] == "PENDING"
    # --force passed a non-owner on a store every member could write anyway; through the
    # socket the server is the only writer, and its check holds.
    forced = bob.run(
        [*cuectl_cmd(), "--db", str(shared_farm.db), "job", "kill", "--force", str(job)], env=shared_farm.env()
    )
    assert forced.returncode == 1 and f"belongs to {alice.name}" in forced.stderr, forced
    assert "--force" not in forced.stderr
    assert shared_farm.job(job)["state"] == "PENDING"
    mine = alice.run([*cuectl_cmd(), "--db", str(shared_farm.db), "job", "kill", str(job)], env=shared_farm.env())
    assert mine.returncode == 0, mine.stderr


def test_a_service_account_vouches_for_its_users_only_when_named(tmp_path, os_users):
    """The store belongs to a system account (not root) running the socket: the receipts it
    writes for alice prove alice's jobs to a root worker told that account
    (CUECTL_SERVICE_USER), and to no other worker; nobody else's receipts speak for others."""
    import os
    import subprocess
    import tempfile
    import time

    import osusers
    from farmlib import Farm

    svc, alice = os_users("svc", "alice")
    base = Path(tempfile.mkdtemp(prefix="cuectl-svc-", dir="/tmp"))
    os.chmod(base, 0o755)
    home = base / "store"
    home.mkdir()
    os.chown(home, svc.uid, svc.gid)
    out = base / "out"
    out.mkdir()
    os.chmod(out, 0o1777)
    farm = Farm(home)
    farm.ledger = out / "ledger.jsonl"
    made = svc.run(
        [*cuectl_cmd(), "--db", str(farm.db), "submit", "--name", "warm", "--paused", "--", "true"], env=farm.env()
    )  # svc makes its store
    assert made.returncode == 0, made.stderr
    sock = Path(f"{farm.db}.sock")
    server = subprocess.Popen(
        osusers.as_user(svc, [*cuectl_cmd(), "--db", str(farm.db), "serve", "--socket", str(sock), "--no-access-log"]),
        env={**farm.env(), "USER": svc.name, "HOME": "/nonexistent"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not sock.exists() or not os.stat(sock).st_mode & 0o002:
            assert server.poll() is None and time.monotonic() < deadline, server.stderr.read() if server.stderr else ""
            time.sleep(0.05)
        marker = out / "ran"
        spec = out / "hers.json"
        spec.write_text(
            json.dumps({"name": "hers", "layers": [{"name": "w", "command": ["sh", "-c", f"id -u >> {marker}"]}]})
        )
        spec.chmod(0o644)
        res = alice.run([*cuectl_cmd(), "--db", str(farm.db), "submit", str(spec)], env=farm.env(), cwd=out)
        assert res.returncode == 0, res.stderr
        job = int(res.stdout)
        # Not named: the receipt is svc's, not alice's, so nothing proves the job is hers.
        assert farm.run_worker(None).returncode == 0
        assert not marker.exists()
        assert f"belongs to uid {svc.uid}, not to {alice.name}" in farm.job(job)["pending_reason"]
        # Named: svc's word is proof, and the frame runs as alice.
        farm_env = {"CUECTL_SERVICE_USER": svc.name}
        assert farm.run_worker(None, env=farm_env).returncode == 0
        assert marker.read_text().split() == [str(alice.uid)]
    finally:
        server.terminate()
        server.wait(10)
        farm.cleanup()
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def test_another_users_secrets_stay_hers(shared_farm, os_users):
    """`job show --show-secrets` shows a job's credentials to its owner (and admins), not to
    every user of the machine, as the readable group file once did."""
    alice, bob = os_users("alice", "bob")
    res = submit_as(
        alice,
        shared_farm,
        {
            "name": "keys",
            "paused": True,
            "layers": [
                {"name": "w", "command": ["true"], "env": {"API_TOKEN": "s3cr3t-value", "DB": "postgresql://u:pw@h/d"}}
            ],
        },
    )
    job = res.stdout.strip()

    def shown(user):
        out = user.run(
            [*cuectl_cmd(), "--db", str(shared_farm.db), "job", "show", job, "--show-secrets", "--json"],
            env=shared_farm.env(),
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["layers"][0]["env"]

    assert shown(alice)["API_TOKEN"] == "s3cr3t-value" and shown(alice)["DB"] == "postgresql://u:pw@h/d"
    theirs = shown(bob)
    assert theirs["API_TOKEN"] == "***" and "pw" not in theirs["DB"], theirs


def test_doctor_for_a_user_skips_what_only_admins_may_check(shared_farm, os_users):
    (alice,) = os_users("alice")
    res = alice.run([*cuectl_cmd(), "--db", str(shared_farm.db), "admin", "doctor", "--json"], env=shared_farm.env())
    checks = {c["name"]: c for c in json.loads(res.stdout)["checks"]}
    assert checks["store"]["status"] == "ok" and checks["store integrity"]["status"] == "ok", checks
    assert "skipped" in checks["store integrity"]["detail"]
