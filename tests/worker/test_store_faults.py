"""Store faults a user can meet, each with the error text they see: a write lock held by
another process, a full disk (file size limit), a corrupt or foreign file, a newer schema."""

from __future__ import annotations

import os
import resource
import sqlite3
import subprocess
import sys
import time

from farmlib import cuectl_cmd

LOCKER = r"""
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("ROLLBACK")
"""


def hold_write_lock(db, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", LOCKER, str(db), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_cli_fails_clearly_while_the_write_lock_is_held(farm):
    farm.submit({"name": "x", "layers": [{"name": "a", "command": ["true"]}]})
    locker = hold_write_lock(farm.db, 3)
    env = farm.env(CUECTL_BUSY_TIMEOUT="0.3")
    res = subprocess.run(
        [*cuectl_cmd(), "--db", str(farm.db), "submit", "--name", "y", "--", "true"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert res.returncode == 1
    assert res.stderr.startswith("error: store ") and "locked by another process (waited 0.3 s)" in res.stderr
    assert "Traceback" not in res.stderr
    # Readers are not blocked by a writer in WAL mode.
    res = subprocess.run(
        [*cuectl_cmd(), "--db", str(farm.db), "job", "list", "--json"], capture_output=True, text=True, env=env
    )
    assert res.returncode == 0 and '"name": "x"' in res.stdout
    locker.wait(10)
    assert farm.cuectl("submit", "--name", "y", "--", "true").returncode == 0


def test_worker_rides_out_a_held_write_lock(farm):
    job = farm.submit(
        {"name": "busy", "layers": [{"name": "a", "command": farm.probe("--sleep", "0.2"), "range": "1-12"}]}
    )
    worker = farm.start_worker(None, "--until-idle", "--cores", "2", env={"CUECTL_BUSY_TIMEOUT": "0.2"})
    farm.wait_for(lambda: len(farm.starts()) >= 2, what="frames running")
    locker = hold_write_lock(farm.db, 2.5)
    locker.wait(10)
    out, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err
    assert "store unavailable, retrying" in err
    conn = sqlite3.connect(farm.db)
    assert conn.execute("SELECT COUNT(*) FROM frames WHERE state = 'SUCCEEDED'").fetchone()[0] == 12
    assert conn.execute("SELECT COUNT(*) FROM attempts WHERE outcome = 'succeeded'").fetchone()[0] == 12
    conn.close()
    assert {f["state"] for f in farm.frames(job)} == {"SUCCEEDED"}


def test_full_disk_gives_a_clear_error_and_no_damage(farm):
    farm.submit({"name": "small", "layers": [{"name": "a", "command": ["true"]}]})
    limit = os.path.getsize(farm.db) + 64 * 1024

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    res = subprocess.run(
        [*cuectl_cmd(), "--db", str(farm.db), "submit", "--name", "big", "--range", "1-60000", "--", "true"],
        capture_output=True,
        text=True,
        env=farm.env(),
        preexec_fn=small_files,
    )
    assert res.returncode == 1, res
    assert res.stderr.startswith("error: store ") and ("write failed" in res.stderr or "disk full" in res.stderr)
    assert "Traceback" not in res.stderr
    conn = sqlite3.connect(farm.db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert [r[0] for r in conn.execute("SELECT name FROM jobs")] == ["small"]
    conn.close()
    assert farm.cuectl("submit", "--name", "after", "--", "true").returncode == 0


def test_corrupt_store_gives_a_clear_error_from_every_command(farm):
    farm.db.write_bytes(b"SQLite format 3\x00" + os.urandom(4096 * 4))
    before = farm.db.read_bytes()
    commands = [
        ["job", "list"],
        ["frame", "list"],
        ["host", "list"],
        ["job", "show", "1"],
        ["submit", "--name", "x", "--", "true"],
        ["worker", "--until-idle"],
        ["admin", "reap"],
    ]
    for args in commands:
        res = farm.cuectl(*args, check=False)
        assert res.returncode == 1, (args, res.stderr)
        assert res.stderr.startswith("error: ") and "cuectl store" in res.stderr, (args, res.stderr)
        assert "Traceback" not in res.stderr
    res = farm.cuectl("admin", "doctor", check=False)
    assert res.returncode == 1 and "FAIL" in res.stdout
    assert farm.db.read_bytes() == before


def test_foreign_database_is_refused(farm):
    conn = sqlite3.connect(farm.db)
    conn.execute("CREATE TABLE invoices (id INTEGER)")
    conn.commit()
    conn.close()
    res = farm.cuectl("job", "list", check=False)
    assert res.returncode == 1 and "is a SQLite database but not a cuectl store" in res.stderr


def test_newer_schema_is_refused_and_left_untouched(farm):
    farm.submit({"name": "x", "layers": [{"name": "a", "command": ["true"]}]})
    conn = sqlite3.connect(farm.db)
    conn.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    time.sleep(0.01)
    before = farm.db.read_bytes()
    res = farm.cuectl("job", "list", check=False)
    assert res.returncode == 1
    assert "schema version 999" in res.stderr and "upgrade cuectl" in res.stderr
    assert farm.db.read_bytes() == before


def test_worker_stops_when_its_store_file_is_deleted(farm):
    """It used to go on writing into the unlinked file while `job list` made a new one."""
    host = farm.host("gone", [])
    farm.submit({"name": "j", "layers": [{"name": "w", "command": ["sleep", "30"]}]})
    proc = farm.start_worker(host)
    farm.wait_for(
        lambda: farm.cuectl("frame", "list", "--state", "RUNNING", "--json").stdout.count('"id"'), what="frame running"
    )
    farm.db.unlink()
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, err
    assert f"error: store {farm.db} was deleted while in use" in err, err
    assert err.count("error:") == 1 and "Traceback" not in err
    assert not farm.db.exists()
    res = farm.cuectl("job", "list", check=False)
    assert res.returncode == 1 and f"no store at {farm.db}" in res.stderr and not farm.db.exists()
