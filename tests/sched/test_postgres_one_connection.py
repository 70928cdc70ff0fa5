"""PostgreSQL wake-ups on the store's one connection (issue 19): LISTEN shares the work
connection, a NOTIFY that arrives while that connection runs a transaction or a statement
is kept (not lost, not reported twice), and a lost connection listens again."""

from __future__ import annotations

import select
import time
import uuid
from pathlib import Path

import pytest

from cuectl.sched.spec import spec_from_mapping

pg = pytest.importorskip("cuectl.sched.store.postgres", reason="the postgres extra (psycopg 3) is not installed")
psycopg = pytest.importorskip("psycopg")

NOW = 1_700_000_000.0


def job(name: str = "j") -> object:
    return spec_from_mapping({"name": name, "layers": [{"name": "a", "command": ["true"], "range": "1-2"}]}, user="ada")


def store(url: str, app: str | None = None) -> "pg.PostgresStore":
    if app:
        url = f"{url}?application_name={app}"
    return pg.PostgresStore(url, log_dir=Path("/logs"))


def backends(url: str, app: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = %s", (app,)).fetchone()[0]


def readable(fd: int, timeout: float = 0.0) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


@pytest.fixture
def pair(pg_url):
    """A listening store (``worker``: its socket, the LISTEN's first wake-up consumed) and a
    second store that submits (``user``); both closed afterwards."""
    worker, user = store(pg_url), store(pg_url)
    fd = worker.notify_fileno()
    worker.drain_notifications()
    yield worker, user, fd
    worker.close()
    user.close()


def test_listening_opens_no_second_connection(pg_url):
    app = f"one-{uuid.uuid4().hex[:8]}"
    worker = store(pg_url, app)
    assert worker.notify_fileno() is not None
    assert worker.notify_fileno() == worker._conn.fileno()
    assert backends(pg_url, app) == 1
    assert pg.CONNECTIONS_PER_WORKER == 1
    worker.close()


def test_a_notify_during_a_transaction_is_kept(pg_url):
    worker, user = store(pg_url), store(pg_url)
    worker.notify_fileno()
    assert worker.drain_notifications() is True  # the wake-up LISTEN starts with
    assert worker.drain_notifications() is False

    def busy(conn):
        conn.execute("SELECT 1")
        user.submit(job(), now=NOW)  # commits (and notifies) while our transaction is open
        conn.execute("SELECT 1")
        return None

    worker._call(busy)  # the server delivers the NOTIFY after our COMMIT: psycopg reads it then
    assert worker.wait_for_work(0.0) is True
    assert worker.drain_notifications() is False  # reported once
    worker.close()
    user.close()


def test_a_notify_read_with_a_statements_results_is_kept(pair):
    worker, user, fd = pair
    user.submit(job(), now=NOW)
    deadline = time.monotonic() + 5
    while not readable(fd, 0.05) and time.monotonic() < deadline:
        pass
    worker.list_jobs()  # reads the waiting notification along with its results
    assert not readable(fd)  # nothing left on the socket for select() to see...
    assert worker.drain_notifications() is True  # ...but the store kept it
    assert worker.wait_for_work(0.2) is False


def test_an_idle_listener_wakes_by_select(pair):
    worker, user, fd = pair
    assert not readable(fd, 0.2)
    user.submit(job(), now=NOW)
    assert readable(fd, 5.0)
    assert worker.drain_notifications() is True
    assert worker.drain_notifications() is False


def test_a_cut_connection_listens_again(pair, pg_url):
    worker, user, fd = pair
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (worker._conn.info.backend_pid,))
    assert readable(fd, 5.0)  # the cut itself wakes the worker (the server's goodbye, then EOF)...
    assert worker.wait_for_work(5.0) is True  # ...which should look at the queue
    assert worker.notify_fileno() is not None  # reconnected, and listening again
    worker.drain_notifications()
    user.submit(job(), now=NOW)
    assert worker.wait_for_work(5.0) is True
    # A reconnect inside an ordinary call listens again too.
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (worker._conn.info.backend_pid,))
    time.sleep(0.2)
    assert worker.list_jobs()  # reconnects
    worker.drain_notifications()
    user.submit(job("again"), now=NOW)
    assert worker.wait_for_work(5.0) is True


def test_commands_that_never_listen_do_not_listen(pg_url):
    s = store(pg_url)
    s.list_jobs()
    assert (
        s._call(lambda c: c.execute("SELECT COUNT(*) AS n FROM pg_listening_channels()").fetchone()["n"], tx=False) == 0
    )
    s.notify_fileno()
    assert (
        s._call(lambda c: c.execute("SELECT COUNT(*) AS n FROM pg_listening_channels()").fetchone()["n"], tx=False) == 1
    )
    s.close()
