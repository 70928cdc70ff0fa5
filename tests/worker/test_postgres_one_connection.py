"""A `cuectl worker` on PostgreSQL holds one connection to the server, for its work and its
LISTEN alike (issue 19: a farm of N workers needs N connections, not 2N), and an idle
worker on that one connection still wakes on NOTIFY long before its poll interval."""

from __future__ import annotations

import signal
import time
import uuid

import pytest

psycopg = pytest.importorskip("psycopg", reason="the postgres extra (psycopg 3) is not installed")


@pytest.fixture
def named_farm(pg_farm):
    """``pg_farm`` (tests/worker/conftest.py) whose connections carry a name of their own in
    pg_stat_activity: ``farm.db`` names it, ``farm.plain_db`` is the database without it."""
    pg_farm.plain_db = pg_farm.db
    pg_farm.app = f"cuectl-w-{uuid.uuid4().hex[:8]}"
    pg_farm.db = f"{pg_farm.plain_db}?application_name={pg_farm.app}"
    return pg_farm


def connections(url: str, app: str) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            "SELECT pid, query FROM pg_stat_activity WHERE application_name = %s AND backend_type = 'client backend'",
            (app,),
        ).fetchall()


def test_a_worker_holds_one_connection_and_still_wakes_on_notify(named_farm):
    from cuectl import config
    from cuectl.sched.spec import spec_from_mapping
    from cuectl.sched.store import open_store

    farm = named_farm
    worker = farm.start_worker(farm.host("one", []), "--name", "one-conn", "--poll", "30", lease="60")
    store = open_store(farm.plain_db)
    try:
        farm.wait_for(lambda: store.list_hosts(now=time.time(), down_after=60), what="worker registered")
        time.sleep(1.5)  # idle, in its 30 s sleep
        held = connections(farm.plain_db, farm.app)
        assert len(held) == 1, held
        for i in range(2):
            spec = spec_from_mapping(
                {"name": f"w{i}", "layers": [{"name": "a", "command": farm.probe()}]}, user=config.current_user()
            )
            t0 = time.monotonic()
            store.submit(spec, now=time.time())
            # Polling would take up to 30 s: only the NOTIFY can start it sooner.
            farm.wait_for(
                lambda: [e for e in farm.starts() if e["env"]["CUE_JOB"] == f"w{i}"],
                timeout=25,
                what="frame start before the 30 s poll",
            )
            assert time.monotonic() - t0 < 25
            farm.wait_for(lambda: not store.has_unfinished_work(), what="frame done")
            time.sleep(1.0)  # idle again
            held = connections(farm.plain_db, farm.app)
            assert len(held) == 1, held
    finally:
        store.close()
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=30)
