"""PostgreSQL through PgBouncer in transaction mode (``pgbouncer=true`` in the URL).

Consecutive transactions of one client may run on different server connections, so the
store keeps nothing in a session: no prepared statements, no session settings, no LISTEN,
no SET ROLE, and a report reads on one connection. The store contract tests run through a
real pooler too (tests/sched/conftest.py, the "pgbouncer" backend); these check what is
particular to it. A real PgBouncer (tests/pgpooler.py) in front of a real server.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

psycopg = pytest.importorskip("psycopg", reason="the postgres extra (psycopg) is not installed")

import pgpooler  # noqa: E402  (tests/ is on sys.path)
from psycopg.conninfo import conninfo_to_dict  # noqa: E402

from cuectl.errors import InvalidInput, NotOwner  # noqa: E402
from cuectl.sched.spec import spec_from_flags  # noqa: E402
from cuectl.sched.store import Actor, FrameResult, HostInfo, open_store  # noqa: E402
from cuectl.sched.store.postgres import split_pooler  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib: the helpers beside this file
from test_usage_sql import WINDOW, load, random_farm  # noqa: E402

NOW = time.time()


def dbname_of(url: str) -> str:
    return str(conninfo_to_dict(split_pooler(url)[0])["dbname"])


@pytest.mark.parametrize(
    "url, libpq_url, pooled",
    [
        ("postgresql://u@h/db", "postgresql://u@h/db", False),
        ("postgresql://u@h/db?pgbouncer=true", "postgresql://u@h/db", True),
        (
            "postgresql://u@h/db?sslmode=require&pgbouncer=1&connect_timeout=5",
            "postgresql://u@h/db?sslmode=require&connect_timeout=5",
            True,
        ),
        ("postgresql://u@h/db?pgbouncer=off&sslmode=disable", "postgresql://u@h/db?sslmode=disable", False),
        ("postgresql://u@h/db?pgbouncer=TRUE", "postgresql://u@h/db", True),
        ("postgres://u@h/db?pgbouncer=yes#x", "postgres://u@h/db#x", True),
        ("postgresql://u@h/db?application_name=pgbouncer", "postgresql://u@h/db?application_name=pgbouncer", False),
    ],
)
def test_the_pgbouncer_parameter_is_ours_and_libpq_never_sees_it(url, libpq_url, pooled):
    assert split_pooler(url) == (libpq_url, pooled)


def test_a_bad_pgbouncer_value_is_one_error_line_and_exit_2(tmp_path):
    # Nothing listens on port 1 of 127.0.0.1: had the URL reached libpq, the error would
    # be a refused connection, not this one.
    env = {**os.environ, "CUECTL_DB": "postgresql://u@127.0.0.1:1/db?pgbouncer=maybe", "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "cuectl", "job", "list"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert lines[0] == "error: pgbouncer='maybe' in the PostgreSQL URL: expected true or false", done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    with pytest.raises(InvalidInput):
        open_store("postgresql://u@127.0.0.1:1/db?pgbouncer=2")


def work_through_the_pool(url: str, clients: int, frames_each: int) -> list[str]:
    """``clients`` stores on threads, each submitting, claiming and completing its own
    frames, many times the same statements; returns the errors they met."""
    errors: list[str] = []

    def client(n: int) -> None:
        try:
            store = open_store(url)
            try:
                store.register_host(HostInfo(name=f"h{n}", cores=4, memory_bytes=1 << 30, gpus=[]), now=NOW)
                job = store.submit(
                    spec_from_flags(name=f"j{n}", command=["true"], range=f"1-{frames_each}", user="u"), now=NOW
                )
                (layer,) = [r.layer_id for r in store.runnable_layers() if r.job_id == job]
                for _ in range(frames_each):
                    claim = store.claim_frame(layer, host=f"h{n}", worker=f"w{n}", gpu_uuids=[], now=NOW, lease_s=60)
                    assert claim is not None
                    store.complete_frame(claim.frame_id, claim.attempt, FrameResult(exit_code=0), now=NOW + 1)
            finally:
                store.close()
        except Exception as exc:  # collected: the assertion names every client's error
            errors.append(f"client {n}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return errors


def test_clients_share_few_server_connections_without_prepared_statements(pg_server, pooled_url):
    # Six clients over the pooler's two server connections: psycopg's automatic preparing
    # (a statement's sixth run) would name statements on one server connection and run
    # them on another ("prepared statement _pg3_0 does not exist").
    open_store(pooled_url).close()
    errors = work_through_the_pool(pooled_url, clients=6, frames_each=15)
    assert errors == []
    with psycopg.connect(pg_server.url(dbname_of(pooled_url)), autocommit=True) as conn:
        row = conn.execute("SELECT COUNT(*) FROM frames WHERE state = 'SUCCEEDED'").fetchone()
    assert row is not None and row[0] == 6 * 15


def test_acting_for_another_user_is_refused_and_changes_nothing(pooled_url):
    store = open_store(pooled_url)
    try:
        job = store.submit(spec_from_flags(name="mine", command=["true"], range="1", user="u"), now=NOW)
        with pytest.raises(NotOwner, match="transaction pooler"):
            with store.acting_as(Actor("someone", False)):
                store.set_job_paused(job, True)
        assert store.get_job(job)["paused"] is False
        assert store.actor().name != "someone"
    finally:
        store.close()


def test_workers_poll_behind_a_pooler(pooled_url, pg_url):
    pooled, direct = open_store(pooled_url), open_store(pg_url)
    try:
        assert pooled.notify_fileno() is None  # a LISTEN would last one transaction
        assert direct.notify_fileno() is not None
    finally:
        pooled.close()
        direct.close()


def test_a_report_reads_on_one_connection_through_a_pool_of_one(pg_server):
    # With one server connection, a second reader would wait for the connection the first
    # one's transaction holds: for query_wait_timeout, then fail.
    pooler = pgpooler.start_pooler(pg_server, pool_size=1)
    name = pg_server.create_database()
    try:
        store = open_store(pooler.url(name))
        try:
            load(store, random_farm(random.Random(5), 20))
            started = time.monotonic()
            for by in (None, "user", "host", "gpu-model"):
                groups, total = store.usage_summary(**WINDOW, by=by)
                assert total is not None and total.attempts > 0
                assert groups or by is None
            assert time.monotonic() - started < 15  # far below the pooler's 20 s wait
        finally:
            store.close()
    finally:
        pooler.stop()
        pg_server.drop_database(name)


def doctor_connections(url: str) -> dict[str, str]:
    env = {**os.environ, "CUECTL_DB": url}
    done = subprocess.run(
        [sys.executable, "-m", "cuectl", "admin", "doctor", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done
    (check,) = [c for c in json.loads(done.stdout)["checks"] if c["name"] == "store connections"]
    return check


def test_doctor_counts_no_connection_per_worker_and_wants_the_role_timeouts(pg_server, pooled_url):
    # 200 registered hosts would need 400+ connections of their own; behind the pooler
    # they share its pool, but the timeouts a session no longer sets must be the role's.
    dbname = dbname_of(pooled_url)
    open_store(pooled_url).close()
    with psycopg.connect(pg_server.url(dbname), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO hosts (name, cores, memory_bytes, gpus, registered_at, last_heartbeat) "
            "SELECT 'node-' || i, 8, 1073741824, '[]', 0, 0 FROM generate_series(1, 200) i"
        )
    check = doctor_connections(pooled_url)
    assert check["status"] == "warn", check
    assert "through a transaction pooler" in check["detail"] and "200 registered host(s)" in check["detail"]
    assert "lock_timeout and statement_timeout not set" in check["detail"]
    with psycopg.connect(pg_server.url(dbname), autocommit=True) as conn:
        conn.execute(f"ALTER ROLE postgres IN DATABASE \"{dbname}\" SET lock_timeout = '5s'")
        conn.execute(f"ALTER ROLE postgres IN DATABASE \"{dbname}\" SET statement_timeout = '60s'")
        # Settings apply to new server connections: end the pooler's old ones.
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (dbname,),
        )
    check = doctor_connections(pooled_url)
    assert check["status"] == "ok", check
    assert "lock_timeout 5s" in check["detail"] and "statement_timeout 1min" in check["detail"]


def test_serve_refuses_a_pooled_store(pooled_url, tmp_path):
    open_store(pooled_url).close()
    env = {**os.environ, "CUECTL_DB": pooled_url, "HOME": str(tmp_path)}
    with socket.socket() as probe:  # a free port: had serve started, it would listen there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = subprocess.run(
        [sys.executable, "-m", "cuectl", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done
    assert done.stderr.startswith("error: cuectl serve cannot use a store URL with pgbouncer=true"), done.stderr
    assert "Traceback" not in done.stderr


def test_a_password_from_pgpassword_goes_with_a_pooled_url(pooled_url, tmp_path):
    # PGPASSWORD is the documented way to keep the password out of the URL; the store then
    # checks whether the URL has one, which libpq's parser refused to read for pgbouncer=.
    open_store(pooled_url).close()
    env = {**os.environ, "CUECTL_DB": pooled_url, "PGPASSWORD": "unused-by-trust", "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "cuectl", "job", "list", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["jobs"] == []
