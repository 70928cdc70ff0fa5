"""More workers than PostgreSQL admits, through PgBouncer in transaction mode.

Real `cuectl worker` processes connect with ``pgbouncer=true`` as a role that PostgreSQL
lets hold 4 connections; ten of them, each keeping its own connection to the pooler,
drain a job through the pooler's 3 server connections: every frame runs exactly once, no
worker meets an error, and the role never holds more than the pool. This is how 100+
workers fit a default ``max_connections = 100`` (docs/postgres.md, "Connections").
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

psycopg = pytest.importorskip("psycopg", reason="the postgres extra (psycopg 3) is not installed")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pgpooler  # noqa: E402

WORKERS, POOL, ROLE_LIMIT, FRAMES = 10, 3, 4, 200


@pytest.fixture
def pooled_farm(farm, pg_server):
    """The farm on a fresh database owned by a role limited to ROLE_LIMIT connections,
    reached through a pooler of POOL server connections."""
    role = f"farm_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT {ROLE_LIMIT}")
    name = pg_server.create_database(owner=role)
    try:
        pooler = pgpooler.start_pooler(pg_server, pool_size=POOL, users=("postgres", role))
    except pgpooler.PoolerUnavailable as exc:
        pytest.skip(f"PgBouncer tests skipped: {exc}")
    farm.db = pooler.url(name, user=role)
    farm.direct = pg_server.url(name, user=role)
    farm.role = role
    farm.worker_flags = ["--run-as-worker-user"]  # jobs labelled with the submitting OS user
    yield farm
    farm.cleanup()  # workers first: they hold connections
    pooler.stop()
    pg_server.drop_database(name)
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute(f"DROP ROLE {role}")


def server_connections(pg_server, role: str) -> int:
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        row = conn.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE usename = %s", (role,)).fetchone()
    return int(row[0]) if row else 0


def test_ten_workers_share_three_server_connections(pooled_farm, pg_server):
    farm = pooled_farm
    # The limit is real: the role cannot hold a connection per worker.
    held = [psycopg.connect(farm.direct) for _ in range(ROLE_LIMIT)]
    with pytest.raises(psycopg.OperationalError, match="too many connections"):
        psycopg.connect(farm.direct)
    for conn in held:
        conn.close()

    job = farm.submit(
        {"name": "pooled", "layers": [{"name": "r", "command": farm.probe("--sleep", "0.02"), "range": f"1-{FRAMES}"}]}
    )
    peak: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak.append(server_connections(pg_server, farm.role))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    hosts = [farm.host(f"pool{i}", []) for i in range(WORKERS)]
    procs = [farm.start_worker(h, "--until-idle", "--name", f"pool-{i}") for i, h in enumerate(hosts)]
    errors = []
    for p in procs:
        _, err = p.communicate(timeout=120)
        if p.returncode != 0 or "error" in err.lower():
            errors.append((p.returncode, err[-2000:]))
    stop.set()
    watcher.join(5)
    assert errors == []
    frames = farm.frames(job)
    assert len(frames) == FRAMES and {f["state"] for f in frames} == {"SUCCEEDED"}
    assert {f["attempts"] for f in frames} == {1}
    starts = sorted(int(e["env"]["CUE_FRAME_ID"]) for e in farm.starts())
    assert starts == sorted(f["id"] for f in frames), "every frame ran exactly once"
    assert len({f["host"] for f in frames}) >= 3, "work is spread over the workers"
    assert peak and max(peak) <= POOL, f"the role held {max(peak)} server connections, the pool is {POOL}"
