"""PostgreSQL specifics on a real server (started by the suite, see conftest.py): URLs and
passwords, schema versions and migrations, connection loss, LISTEN/NOTIFY, row locking."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

psycopg = pytest.importorskip("psycopg", reason="the postgres extra (psycopg 3) is not installed")

import pgserver  # noqa: E402
from pgroles import as_role, login_roles  # noqa: E402  (tests/ is on sys.path)

from cuectl.errors import InvalidInput, SchemaTooNew, StoreError  # noqa: E402
from cuectl.sched.dialect import POSTGRES  # noqa: E402
from cuectl.sched.spec import spec_from_mapping  # noqa: E402
from cuectl.sched.store import (  # noqa: E402
    FrameResult,
    open_store,
    schema,  # noqa: E402
)
from cuectl.sched.store import postgres as pg  # noqa: E402

NOW = 1_700_000_000.0


def job(name="j", layers=None, paused=False):
    layers = layers or [{"name": "render", "command": ["true"], "range": "1-3"}]
    return spec_from_mapping({"name": name, "paused": paused, "layers": layers}, user="alice")


def claim_next(store, host="h1", now=NOW):
    for layer in store.runnable_layers():
        c = store.claim_frame(layer.layer_id, host=host, worker=f"{host}-w", gpu_uuids=[], now=now, lease_s=60)
        if c:
            return c
    return None


def sql(url: str, statement: str, params=()):
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else None


def run_cli(*args: str) -> tuple[int, str, str]:
    """The real executable (so nothing is shared with this process)."""
    exe = Path(sys.executable).with_name("cuectl")
    res = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60)
    return res.returncode, res.stdout, res.stderr


# -- URLs and passwords ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "url, expected",
    [
        ("postgresql://bob:hunter2@db:5432/farm", "postgresql://bob:***@db:5432/farm"),
        ("postgres://bob:p%40ss@db/farm?sslmode=require", "postgres://bob:***@db/farm?sslmode=require"),
        ("postgresql://bob:a@b@db/farm", "postgresql://bob:***@db/farm"),  # unencoded @ in the password
        (
            "postgresql://db/farm?user=bob&password=hunter2&sslmode=verify-full",
            "postgresql://db/farm?user=bob&password=***&sslmode=verify-full",
        ),
        ("postgresql://bob@h1:5432,h2:5433/farm", "postgresql://bob@h1:5432,h2:5433/farm"),
        ("postgresql:///farm?host=/run/postgresql", "postgresql:///farm?host=/run/postgresql"),
    ],
)
def test_url_redaction(url, expected):
    assert pg.redact_url(url) == expected


def test_wrong_password_is_an_error_that_never_shows_it(pg_server):
    url = f"postgresql://{pgserver.PASSWORD_ROLE}:WrongHorse99@127.0.0.1:{pg_server.port}/postgres"
    with pytest.raises(StoreError) as err:
        open_store(url)
    text = f"{err.value.message} {err.value.hint}"
    assert "WrongHorse99" not in text and "***" in text
    assert "PGPASSWORD" in err.value.hint and ".pgpass" in err.value.hint
    # The CLI prints the same redacted line, and exits 1 without a traceback.
    code, out, errtext = run_cli("--db", url, "job", "list")
    assert code == 1 and "WrongHorse99" not in out + errtext and "Traceback" not in errtext


def test_password_from_pgpassword_and_pgpass(pg_server, tmp_path, monkeypatch):
    db = pg_server.create_database(owner=pgserver.PASSWORD_ROLE)
    try:
        url = f"postgresql://{pgserver.PASSWORD_ROLE}@127.0.0.1:{pg_server.port}/{db}"
        with pytest.raises(StoreError):  # the role needs a password
            open_store(url)
        monkeypatch.setenv("PGPASSWORD", pgserver.PASSWORD)
        s = open_store(url)
        job_id = s.submit(job(), now=NOW)
        s.close()
        assert "PGPASSWORD" not in os.environ  # taken: children of this process never see it
        monkeypatch.delenv("PGPASSWORD", raising=False)
        pgpass = tmp_path / "pgpass"
        pgpass.write_text(f"127.0.0.1:{pg_server.port}:{db}:{pgserver.PASSWORD_ROLE}:{pgserver.PASSWORD}\n")
        pgpass.chmod(0o600)
        monkeypatch.setenv("PGPASSFILE", str(pgpass))
        s = open_store(url)
        assert s.get_job(job_id)["name"] == "j"
        s.close()
    finally:
        pg_server.drop_database(db)


def test_password_in_the_url_never_reaches_output(pg_server):
    db = pg_server.create_database(owner=pgserver.PASSWORD_ROLE)
    try:
        url = f"postgresql://{pgserver.PASSWORD_ROLE}:{pgserver.PASSWORD}@127.0.0.1:{pg_server.port}/{db}"
        s = open_store(url)
        assert pgserver.PASSWORD not in s.url and "***" in s.url
        s.close()
        for args in (("admin", "doctor", "--json"), ("admin", "migrate"), ("job", "show", "nope")):
            code, out, err = run_cli("--db", url, *args)
            assert pgserver.PASSWORD not in out + err, args
        code, out, _ = run_cli("--db", url, "admin", "doctor", "--json")
        store_check = [c for c in json.loads(out)["checks"] if c["name"] == "store"][0]
        assert store_check["status"] == "ok" and ":***@" in store_check["detail"]
    finally:
        pg_server.drop_database(db)


def test_missing_psycopg_names_the_extra():
    code = (
        "import sys; sys.modules['psycopg'] = None\n"
        "from cuectl.errors import InvalidInput\n"
        "from cuectl.sched.store import open_store\n"
        "try:\n    open_store('postgresql://u:pw@localhost/x')\n"
        "except InvalidInput as exc:\n    print(exc.message, '|', exc.hint)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "postgres extra" in out and "pip install 'cuectl[postgres]'" in out


def test_invalid_url_is_invalid_input():
    with pytest.raises(InvalidInput, match="invalid PostgreSQL URL"):
        open_store("postgresql://bob:pw@db/farm?bogus_option=1")


# -- schema and migrations -------------------------------------------------------------------------
def test_old_schema_migrates_forward_with_its_data(pg_url):
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for statement in schema.statements(0, POSTGRES):
            conn.execute(statement)
        conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
        conn.execute("INSERT INTO jobs(name, \"user\", created_at) VALUES ('old', 'bob', 1.0)")
    s = open_store(pg_url)
    assert s.schema_version() == schema.SCHEMA_VERSION
    assert s.get_job("old")["user"] == "bob"
    assert s.usage_summary(since=0, until=2e9, by="job", with_total=False) == ([], None)
    s.close()


def test_newer_schema_is_refused_untouched(pg_url):
    open_store(pg_url).close()
    sql(pg_url, "UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    before = sql(
        pg_url,
        "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = 'public' ORDER BY 1, 2",
    )
    with pytest.raises(SchemaTooNew, match="schema version 99"):
        open_store(pg_url)
    with pytest.raises(SchemaTooNew):
        open_store(pg_url, migrate=False).migrate()
    assert sql(pg_url, "SELECT value FROM meta") == [("99",)]
    assert (
        sql(
            pg_url,
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = 'public' ORDER BY 1, 2",
        )
        == before
    )


def test_foreign_tables_are_refused(pg_url):
    sql(pg_url, "CREATE TABLE jobs (x integer)")
    with pytest.raises(StoreError, match="not a cuectl store") as err:
        open_store(pg_url)
    assert "search_path" in err.value.hint
    assert sql(pg_url, "SELECT to_regclass('frames') IS NULL") == [(True,)]


def test_a_schema_of_its_own_via_search_path(pg_url):
    sql(pg_url, "CREATE TABLE jobs (x integer)")  # another application's table in public
    sql(pg_url, "CREATE SCHEMA cuectl")
    s = open_store(pg_url + "?options=-csearch_path%3Dcuectl")
    s.submit(job(), now=NOW)
    s.close()
    assert sql(pg_url, "SELECT COUNT(*) FROM cuectl.frames") == [(3,)]


def test_auto_migrate_off_needs_admin_migrate(pg_url, monkeypatch):
    monkeypatch.setenv("CUECTL_AUTO_MIGRATE", "0")
    with pytest.raises(StoreError) as err:
        open_store(pg_url)
    assert "cuectl admin migrate" in err.value.hint
    assert sql(pg_url, "SELECT to_regclass('meta') IS NULL") == [(True,)]  # nothing was created
    code, out, err_text = run_cli("--db", pg_url, "admin", "migrate")
    assert code == 0, err_text
    from cuectl.sched.store.schema import SCHEMA_VERSION

    assert f"0 -> {SCHEMA_VERSION}" in out  # every migration, whichever is the newest
    code, out, _ = run_cli("--db", pg_url, "admin", "migrate", "--json")
    assert json.loads(out) == {
        "store": pg_url,
        "from_version": schema.SCHEMA_VERSION,
        "to_version": schema.SCHEMA_VERSION,
        "migrated": False,
    }
    s = open_store(pg_url)
    assert s.schema_version() == schema.SCHEMA_VERSION
    s.close()


def test_open_stores_keep_working_when_a_newer_version_adds_columns(pg_url):
    s = open_store(pg_url)
    job_id = s.submit(job(), now=NOW)
    for _ in range(8):  # long enough for psycopg to prepare the statements server-side
        s.get_frame(1), s.list_jobs(), s.list_hosts(now=NOW, down_after=60)
    for table in ("frames", "jobs", "hosts"):  # what a future migration may do
        sql(pg_url, f"ALTER TABLE {table} ADD COLUMN future_column TEXT")
    assert s.get_frame(1)["state"] == "WAITING"
    assert [j["id"] for j in s.list_jobs()] == [job_id]
    assert s.list_hosts(now=NOW, down_after=60) == []
    s.close()


def test_workers_starting_together_migrate_once(pg_url):
    errors: list[BaseException] = []

    def opener() -> None:
        try:
            s = open_store(pg_url)
            s.register_host(pg_host("h"), now=NOW)
            s.close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sql(pg_url, "SELECT value FROM meta WHERE key = 'schema_version'") == [(str(schema.SCHEMA_VERSION),)]


def pg_host(name):
    from cuectl.sched.store import HostInfo

    return HostInfo(name=name, cores=4, memory_bytes=1 << 30, gpus=[])


def test_open_without_create_on_an_empty_database(pg_url):
    from cuectl.errors import NotFound

    with pytest.raises(NotFound, match="no cuectl store"):
        open_store(pg_url, create=False)


# -- connection loss --------------------------------------------------------------------------------
def test_methods_reconnect_after_a_server_restart(pg_server, pg_url):
    s = open_store(pg_url)
    listener = open_store(pg_url)
    assert listener.notify_fileno() is not None
    job_id = s.submit(job(), now=NOW)
    first = claim_next(s)
    pg_server.restart()  # every connection is cut
    assert s.get_job(job_id)["frame_counts"] == {"RUNNING": 1, "WAITING": 2}
    assert s.complete_frame(first.frame_id, 1, FrameResult(exit_code=0), now=NOW) == "SUCCEEDED"
    pg_server.restart()
    second = claim_next(s)
    assert second is not None and second.frame_id != first.frame_id
    pg_server.restart()
    assert s.heartbeat("h1", [second.frame_id], now=NOW, lease_s=60) == {second.frame_id: None}
    s.submit(job("after"), now=NOW)
    # The LISTEN connection notices the cut (readable at EOF), reconnects and listens again.
    listener.drain_notifications()
    assert listener.wait_for_work(5.0)
    s.submit(job("wake"), now=NOW)
    assert listener.wait_for_work(5.0)
    s.close()
    listener.close()


def test_unreachable_server_gives_up_after_the_window(pg_server, pg_url):
    s = pg.PostgresStore(pg_url, log_dir=Path("/logs"), reconnect_s=1.0)
    s.submit(job(), now=NOW)
    pg_server.stop_server()
    try:
        t0 = time.monotonic()
        with pytest.raises(StoreError, match="unreachable"):
            s.list_jobs()
        assert time.monotonic() - t0 < 5
        assert s.notify_fileno() is None  # the worker falls back to polling
    finally:
        pg_server.start_server()
    assert [j["name"] for j in s.list_jobs()] == ["j"]  # and recovers once it is back
    s.close()


def test_submit_is_not_repeated_when_commit_outcome_is_unknown(pg_url):
    """A connection cut just before COMMIT: submit says the outcome is unknown at once
    instead of retrying (which could store the job twice)."""
    s = pg.PostgresStore(pg_url, log_dir=Path("/logs"))
    notify = s._notify

    def cut_before_commit(tx):
        notify(tx)  # submit's last statement
        sql(pg_url, "SELECT pg_terminate_backend(%s)", (tx.conn.info.backend_pid,))

    s._notify = cut_before_commit
    t0 = time.monotonic()
    with pytest.raises(StoreError, match="may or may not have been stored"):
        s.submit(job(), now=NOW)
    assert time.monotonic() - t0 < 5, "no retries"
    del s._notify
    assert s.list_jobs() == []  # here the COMMIT never reached the server
    assert s.submit(job(), now=NOW) and len(s.list_jobs()) == 1
    s.close()


# -- notifications ----------------------------------------------------------------------------------
def test_notify_wakes_a_listener_only_when_work_is_queued(pg_url):
    worker, user = open_store(pg_url), open_store(pg_url)
    assert worker.notify_fileno() is not None
    worker.drain_notifications()  # the wake-up sent when LISTEN started
    assert worker.wait_for_work(0.2) is False
    job_id = user.submit(job(paused=True), now=NOW)
    assert worker.wait_for_work(0.3) is False  # a paused job is no work yet
    t0 = time.monotonic()
    user.set_job_paused(job_id, False)
    assert worker.wait_for_work(5.0) is True
    assert time.monotonic() - t0 < 1.0
    c = claim_next(worker)
    assert worker.wait_for_work(0.2) is False  # claiming is no news
    assert user.complete_frame(c.frame_id, 1, FrameResult(exit_code=1), now=NOW) == "WAITING"
    assert worker.wait_for_work(5.0) is True  # a retry is queued work
    worker.close()
    user.close()


def test_completion_that_releases_dependents_notifies(pg_url):
    worker, user = open_store(pg_url), open_store(pg_url)
    user.submit(
        job(
            layers=[
                {"name": "a", "command": ["true"], "range": "1-2"},
                {"name": "b", "command": ["true"], "range": "1", "depends": ["a"]},
            ]
        ),
        now=NOW,
    )
    a1, a2 = claim_next(user), claim_next(user)
    worker.notify_fileno()
    worker.drain_notifications()
    user.complete_frame(a1.frame_id, 1, FrameResult(exit_code=0), now=NOW)
    assert worker.wait_for_work(0.3) is False  # b still waits for a2
    user.complete_frame(a2.frame_id, 1, FrameResult(exit_code=0), now=NOW)
    assert worker.wait_for_work(5.0) is True
    assert claim_next(worker).layer == "b"
    worker.close()
    user.close()


# -- row locking ------------------------------------------------------------------------------------
def test_claims_skip_frames_locked_by_another_claimer(pg_url):
    s = open_store(pg_url)
    s.submit(job(), now=NOW)
    with psycopg.connect(pg_url) as other:  # a claimer stuck half-way through its statement
        first = other.execute(
            "SELECT id FROM frames WHERE state = 'WAITING' ORDER BY id LIMIT 1 FOR UPDATE"
        ).fetchone()[0]
        t0 = time.monotonic()
        c = claim_next(s)
        assert time.monotonic() - t0 < 1.0, "SKIP LOCKED: no waiting on a locked row"
        assert c.frame_id == first + 1
        other.rollback()
    assert claim_next(s).frame_id == first
    s.close()


@pytest.mark.parametrize("rounds", [3])
def test_concurrent_completions_release_the_dependent_layer(pg_url, rounds):
    """Frames of one layer completing at the same moment, each in its own connection: the
    last one in must release the dependent layer and finish the job (per-job locking)."""
    stores = [open_store(pg_url) for _ in range(8)]
    try:
        for r in range(rounds):
            job_id = stores[0].submit(
                job(
                    f"r{r}",
                    layers=[
                        {"name": "a", "command": ["true"], "range": "1-8"},
                        {"name": "b", "command": ["true"], "range": "1-2", "depends": ["a"]},
                        {
                            "name": "c",
                            "command": ["true"],
                            "range": "1-8",
                            "depends": [{"layer": "a", "type": "frame"}],
                        },
                    ],
                ),
                now=NOW,
            )
            claims = [claim_next(stores[0]) for _ in range(8)]
            assert {c.layer for c in claims} == {"a"}
            barrier = threading.Barrier(8)

            def finish(store, claim):
                barrier.wait()
                store.complete_frame(claim.frame_id, 1, FrameResult(exit_code=0), now=NOW)

            threads = [threading.Thread(target=finish, args=(st, c)) for st, c in zip(stores, claims)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            counts = stores[0].get_job(job_id)["frame_counts"]
            assert counts == {"SUCCEEDED": 8, "WAITING": 10}, counts
            while (c := claim_next(stores[0])) is not None:
                stores[1].complete_frame(c.frame_id, 1, FrameResult(exit_code=0), now=NOW)
            assert stores[0].get_job(job_id)["state"] == "FINISHED"
    finally:
        for st in stores:
            st.close()


def test_large_submit_keeps_dispatch_order_and_dependencies(pg_url):
    s = open_store(pg_url)
    job_id = s.submit(
        job(
            layers=[
                {"name": "a", "command": ["true"], "range": "1-20000"},
                {
                    "name": "b",
                    "command": ["true"],
                    "range": "1-20000",
                    "chunk": 3,
                    "depends": [{"layer": "a", "type": "frame"}],
                },
            ]
        ),
        now=NOW,
    )
    rows = sql(
        pg_url,
        "SELECT l.name, f.number, f.state, f.depend_count FROM frames f "
        "JOIN layers l ON l.id = f.layer_id WHERE f.job_id = %s ORDER BY f.id",
        (job_id,),
    )
    assert [r[1] for r in rows[:20000]] == list(range(1, 20001))
    assert [r[1] for r in rows[20000:]] == list(range(1, 20001, 3))
    assert {(r[2], r[3]) for r in rows[20000:-1]} == {("DEPEND", 3)}
    assert rows[-1][1:] == (19999, "DEPEND", 2)  # the last chunk holds 19999-20000
    assert sql(pg_url, "SELECT COUNT(*) FROM frame_deps")[0][0] == 20000
    s.close()


# -- who submitted, and who may change a job ------------------------------------------------------
_role_url = as_role


@pytest.fixture
def roles(pg_url):
    """Per-user roles set up with `cuectl admin pg-roles`, cluster-wide: unique names."""
    with login_roles(pg_url, ("alice", "bob", "worker", "boss")) as names:
        yield names


def test_the_server_records_who_submitted_and_nobody_changes_it(pg_url, roles):
    alice, bob = roles["alice"], roles["bob"]
    a = open_store(_role_url(pg_url, alice))
    job_id = a.submit(
        spec_from_mapping({"name": "j", "layers": [{"name": "l", "command": ["true"]}]}, user=alice), now=NOW
    )
    assert a.get_job(job_id)["submitted_by"] == alice
    a.close()
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="recorded by the server"):
        sql(_role_url(pg_url, alice), "UPDATE jobs SET submitted_by = %s WHERE id = %s", (bob, job_id))
    # A client cannot claim to be someone else: the trigger overrides the value it sends.
    sql(
        _role_url(pg_url, bob),
        "INSERT INTO jobs(name, \"user\", created_at, submitted_by) VALUES ('forged', %s, 1, %s)",
        (alice, alice),
    )
    assert sql(pg_url, "SELECT submitted_by FROM jobs WHERE name = 'forged'") == [(bob,)]


def test_only_the_owner_or_an_admin_changes_a_job(pg_url, roles):
    alice, bob = roles["alice"], roles["bob"]
    a = open_store(_role_url(pg_url, alice))
    job_id = a.submit(
        spec_from_mapping({"name": "j", "layers": [{"name": "l", "command": ["true"], "range": "1-2"}]}, user=alice),
        now=NOW,
    )
    b = open_store(_role_url(pg_url, bob))
    from cuectl.errors import NotOwner

    for change in (
        lambda: b.kill_job(job_id, now=NOW),
        lambda: b.kill_job(job_id, now=NOW, force=True),
        lambda: b.set_job_priority(job_id, 90),
        lambda: b.set_job_paused(job_id, True),
        lambda: b.frame_action([b.list_frames(job=job_id)[0][0]["id"]], "eat", now=NOW),
    ):
        with pytest.raises(NotOwner, match=f"belongs to {alice}"):
            change()
    # Past the client's check, the server's row-level security still changes nothing.
    bob_url = _role_url(pg_url, bob)
    sql(bob_url, "UPDATE frames SET state = 'EATEN' WHERE job_id = %s", (job_id,))
    sql(bob_url, "UPDATE layers SET command = '[\"sh\"]' WHERE job_id = %s", (job_id,))
    sql(bob_url, "DELETE FROM jobs WHERE id = %s", (job_id,))
    job = a.get_job(job_id)
    assert job["frame_counts"] == {"WAITING": 2} and job["layers"][0]["command"] == ["true"]
    # The owner, a worker and an admin may.
    assert a.set_job_priority(job_id, 5)["priority"] == 5
    w = open_store(_role_url(pg_url, roles["worker"]))
    claimed = claim_next(w)
    assert w.complete_frame(claimed.frame_id, 1, FrameResult(exit_code=0), now=NOW) == "SUCCEEDED"
    boss = open_store(_role_url(pg_url, roles["boss"]))
    assert boss.kill_job(job_id, now=NOW)["state"] == "FINISHED"
    for s in (a, b, w, boss):
        s.close()


def test_a_host_whose_clock_is_two_minutes_slow_keeps_its_frames(pg_url, monkeypatch):
    """Leases and heartbeats are on the server's clock (Store.clock), not each host's."""
    import types

    true_time = time.time
    reaper = open_store(pg_url)
    reaper.submit(job(), now=reaper.clock())
    monkeypatch.setattr(
        pg, "time", types.SimpleNamespace(time=lambda: true_time() - 120, monotonic=time.monotonic, sleep=time.sleep)
    )
    slow = open_store(pg_url)
    from cuectl.sched.store import HostInfo

    slow.register_host(HostInfo(name="slow", cores=2, memory_bytes=1 << 30, gpus=[]), now=slow.clock())
    claimed = claim_next(slow, host="slow", now=slow.clock())
    assert abs(slow.clock() - true_time()) < 5  # its own clock says two minutes ago
    slow.heartbeat("slow", [claimed.frame_id], now=slow.clock(), lease_s=60)
    monkeypatch.undo()
    assert reaper.reap(now=reaper.clock()) == []
    (host,) = reaper.list_hosts(now=reaper.clock(), down_after=60)
    assert host["state"] == "UP"
    slow.close()
    reaper.close()


def test_acting_as_a_role_the_login_may_not_use_is_refused(pg_url):
    from cuectl.errors import NotOwner
    from cuectl.sched.store import Actor

    s = open_store(pg_url)
    try:
        with pytest.raises(NotOwner, match="no database role"):
            with s.acting_as(Actor("no_such_role_here", False)):
                s.list_jobs()
        assert s.actor().name != "no_such_role_here" and s.list_jobs() == []
    finally:
        s.close()


def test_an_api_login_acts_as_a_granted_user_under_row_level_security(pg_url, roles):
    """cuectl serve on PostgreSQL: a non-superuser login granted alice's role switches to it
    per change; the trigger records alice, and row-level security judges alice, not the login."""
    from cuectl.errors import NotOwner
    from cuectl.sched.store import Actor

    alice, bob, boss = roles["alice"], roles["bob"], roles["boss"]
    sql(pg_url, f"GRANT {alice} TO {boss}")  # the API's login role (an admin, for the tokens table)
    b = open_store(_role_url(pg_url, bob))
    bobs = b.submit(spec_from_mapping({"name": "b", "layers": [{"name": "l", "command": ["true"]}]}, user=bob), now=NOW)
    b.close()
    api = open_store(_role_url(pg_url, boss))
    try:
        with api.acting_as(Actor(alice, False)):
            assert api.actor() == Actor(alice, False)
            mine = api.submit(
                spec_from_mapping({"name": "a", "layers": [{"name": "l", "command": ["true"]}]}, user=alice), now=NOW
            )
            with pytest.raises(NotOwner, match=f"belongs to {bob}"):
                api.kill_job(bobs, now=NOW)
            # Past the client's check, the server judges alice: bob's job does not change.
            sql_as = api._conn
            sql_as.execute("UPDATE jobs SET priority = 7 WHERE id = %s", (bobs,))
            assert api.set_job_priority(mine, 5)["priority"] == 5
        assert api.get_job(mine)["submitted_by"] == alice and api.get_job(bobs)["priority"] == 0
        assert api.actor() == Actor(boss, True)
        with pytest.raises(NotOwner, match="may not act as"):  # bob's role was never granted to it
            with api.acting_as(Actor(bob, False)):
                pass
    finally:
        api.close()
