"""A farm on PostgreSQL: real `cuectl worker` processes with different host names and fake
GPUs against one real server (started by the suite, tests/pgserver.py): frames run exactly
once, spread over hosts, never two on a device; NOTIFY wakes an idle worker at once; a
server restart in the middle of a frame loses nothing."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from farmlib import A100, V100, cuectl_cmd, intervals_overlap

psycopg = pytest.importorskip("psycopg", reason="the postgres extra (psycopg 3) is not installed")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pgserver  # noqa: E402

# pg_farm: tests/worker/conftest.py


def uuids_of(event) -> list[str]:
    raw = event["env"]["CUE_GPU_UUIDS"]
    return [u for u in raw.split(",") if u] if raw else []


def rows(url: str, query: str, params=()) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def test_workers_on_several_hosts_share_one_database(pg_farm):
    farm = pg_farm
    hosts = [farm.host(f"pg{i}", [V100, A100]) for i in range(4)]
    job = farm.submit(
        {"name": "farm", "layers": [{"name": "r", "command": farm.probe("--sleep", "0.4"), "gpus": 1, "range": "1-32"}]}
    )
    procs = [farm.start_worker(h, "--until-idle", "--name", f"node-{i}") for i, h in enumerate(hosts)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    frames = farm.frames(job)
    assert len(frames) == 32 and {f["state"] for f in frames} == {"SUCCEEDED"}
    assert {f["attempts"] for f in frames} == {1}
    starts = farm.starts()
    assert sorted(int(e["env"]["CUE_FRAME_ID"]) for e in starts) == sorted(f["id"] for f in frames), (
        "every frame ran exactly once"
    )
    assert len({f["host"] for f in frames}) >= 3, "work is spread over the hosts"
    assert intervals_overlap(farm.events(), uuids_of) == []
    assert rows(farm.db, "SELECT COUNT(*), COUNT(DISTINCT frame_id) FROM attempts WHERE outcome = 'succeeded'") == [
        (32, 32)
    ]
    names = {h["name"] for h in json.loads(farm.cuectl("host", "list", "--json").stdout)["hosts"]}
    assert {f"node-{i}" for i in range(4)} <= names


def test_notify_wakes_an_idle_worker_at_once(pg_farm):
    from cuectl import config
    from cuectl.sched.spec import spec_from_mapping
    from cuectl.sched.store import open_store

    farm = pg_farm
    worker = farm.start_worker(farm.host("idle", []), "--name", "idle-1", "--poll", "30", lease="60")
    store = open_store(farm.db)
    farm.wait_for(lambda: store.list_hosts(now=time.time(), down_after=60), what="worker registered")
    time.sleep(1.0)  # well into its 30 s sleep
    latencies = []
    for i in range(2):
        spec = spec_from_mapping(
            {"name": f"n{i}", "layers": [{"name": "a", "command": farm.probe()}]}, user=config.current_user()
        )  # a root worker runs frames as their user
        store.submit(spec, now=time.time())
        t0 = time.time()
        start = farm.wait_for(
            lambda: [e for e in farm.starts() if e["env"]["CUE_JOB"] == f"n{i}"], timeout=20, what="frame start"
        )[0]
        latencies.append(start["t"] - t0)
        farm.wait_for(lambda: not store.has_unfinished_work(), what="frame done")
        time.sleep(0.5)  # idle again
    store.close()
    worker.send_signal(signal.SIGTERM)
    worker.communicate(timeout=30)
    # Polling would take up to 30 s; a NOTIFY takes the frame's process start-up time.
    assert max(latencies) < 1.0, latencies


def test_a_running_frame_survives_a_server_restart(pg_farm):
    farm = pg_farm
    job = farm.submit(
        {"name": "restart", "layers": [{"name": "a", "command": farm.probe("--sleep", "2"), "range": "1-2"}]}
    )
    worker = farm.start_worker(None, "--until-idle", "--name", "steady", "--cores", "1", lease="30")
    farm.wait_for(lambda: farm.starts(), what="first frame running")
    farm.server.restart()  # every connection of the worker is cut mid-frame
    out, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err
    frames = farm.frames(job)
    assert [(f["state"], f["attempts"]) for f in frames] == [("SUCCEEDED", 1), ("SUCCEEDED", 1)]
    assert rows(farm.db, "SELECT outcome, COUNT(*) FROM attempts GROUP BY outcome") == [("succeeded", 2)]
    assert len(farm.starts()) == 2


def test_a_worker_started_before_the_server_waits_for_it(pg_farm):
    """A host that boots before the database: the worker waits (one warning per try) and
    works once the server is up, instead of exiting and leaning on a restart policy."""
    farm = pg_farm
    job = farm.submit({"name": "late-db", "layers": [{"name": "a", "command": farm.probe(), "range": "1"}]})
    farm.server.stop_server()
    try:
        worker = farm.start_worker(None, "--max-frames", "1", "--name", "early")
        time.sleep(2.5)
        assert worker.poll() is None, worker.communicate()
    finally:
        farm.server.start_server()
    out, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err
    assert "cannot connect to PostgreSQL" in err and "trying again in 1 s" in err
    assert [f["state"] for f in farm.frames(job)] == ["SUCCEEDED"]


def test_a_batch_worker_does_not_wait_for_an_unreachable_server(farm):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # a port nothing listens on (bound, never listening)
    farm.db = f"postgresql://postgres@127.0.0.1:{closed.getsockname()[1]}/none"
    try:
        res = farm.run_worker(None, timeout=60)
    finally:
        closed.close()
    assert res.returncode == 1
    assert res.stderr.startswith("error: cannot connect to PostgreSQL") and "Traceback" not in res.stderr


def test_frames_cannot_read_the_store_password_from_the_worker(farm):
    """The password came in PGPASSWORD: not in the frame's environment, nor in the worker's
    original environment that /proc/$PPID/environ shows to a frame of the same user."""
    try:
        server = pgserver.shared_server()
    except pgserver.PgUnavailable as exc:
        pytest.skip(f"PostgreSQL tests skipped: {exc}")
    name = server.create_database(owner=pgserver.PASSWORD_ROLE)
    try:
        farm.db = server.url(name, user=pgserver.PASSWORD_ROLE)
        env = {"PGPASSWORD": pgserver.PASSWORD}
        spy = (
            "import os; own = os.environ.get('PGPASSWORD'); "
            "parent = open(f'/proc/{os.getppid()}/environ', 'rb').read(); "
            f"print('own', own, 'parent', {pgserver.PASSWORD.encode()!r} in parent, b'PGPASSWORD' in parent)"
        )
        spec = farm.tmp / "spy.json"
        spec.write_text(json.dumps({"name": "spy", "layers": [{"name": "s", "command": [sys.executable, "-c", spy]}]}))
        res = subprocess.run(
            [*cuectl_cmd(), "--db", farm.db, "submit", str(spec)],
            env=farm.env(**env),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        job = int(res.stdout)
        # A root worker would run nothing here (no proof the shared role is root's): run frames as itself.
        done = farm.run_worker(None, "--run-as-worker-user", env=env)
        assert done.returncode == 0, done.stderr

        def cli(*args: str) -> dict:
            out = subprocess.run(
                [*cuectl_cmd(), "--db", farm.db, *args, "--json"],
                env=farm.env(**env),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode == 0, out.stderr
            return json.loads(out.stdout)

        (frame,) = cli("frame", "list", "--job", str(job))["frames"]
        log = Path(cli("frame", "show", str(frame["id"]))["log_path"]).read_text()
        assert frame["state"] == "SUCCEEDED", log
        assert "own None parent False" in log, log
    finally:
        farm.cleanup()
        server.drop_database(name)


def test_worker_obeys_sigterm_within_2s_while_the_server_stalls(pg_farm):
    """A server that keeps the connection open but never answers (a black-holing proxy)
    must not keep a worker from acting on SIGTERM."""
    import tcpproxy

    farm = pg_farm
    proxy = tcpproxy.StallingProxy(farm.server.port)
    try:
        farm.cuectl("admin", "migrate")
        farm.db = proxy.url(farm.db.rsplit("/", 1)[1])
        host = farm.host("stall", [V100])
        proc = farm.start_worker(host, "--name", "stall", env={"CUECTL_FAKE_GPUS": str(host)})
        farm.wait_for(lambda: "stall" in farm.cuectl("host", "list").stdout, what="worker registered")
        proxy.stall()
        time.sleep(1.5)  # the idle worker is now waiting on the silent server
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - t0
        assert took < 2.0, (took, err)
        assert "did not answer" in err, err
    finally:
        proxy.close()


def test_a_frame_that_ends_while_the_server_is_down_keeps_its_real_end_time(pg_farm):
    farm = pg_farm
    host = farm.host("down", [V100])
    job = farm.submit({"name": "j", "layers": [{"name": "r", "command": farm.probe("--sleep", "1.5"), "gpus": 1}]})
    proc = farm.start_worker(host, "--name", "down", "--until-idle", lease="60")  # outlives the outage
    farm.wait_for(lambda: farm.starts(), what="frame started")
    farm.server.stop_server()
    try:
        time.sleep(5)  # the frame ends after 1.5 s, with nobody to tell
    finally:
        farm.server.start_server()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    (frame,) = farm.frames(job)
    assert frame["state"] == "SUCCEEDED"
    attempt = rows(farm.db, "SELECT ended_at - started_at FROM attempts WHERE frame_id = %s", (frame["id"],))
    assert len(attempt) == 1 and 1.4 < attempt[0][0] < 3.0, attempt  # not the reconnect time
