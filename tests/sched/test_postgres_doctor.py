"""`cuectl admin doctor` on PostgreSQL checks for real: the schema against this cuectl's,
the rows against the rules every transaction keeps, and the connection budget.

A real server (tests/pgserver.py); each test breaks the store with plain SQL — the way a
hand edit, a partial restore (`pg_restore --disable-triggers`) or a foreign tool would —
and doctor must name the problem and the rows. A clean, busy store must pass.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable

import pytest

psycopg = pytest.importorskip("psycopg", reason="the postgres extra (psycopg) is not installed")

from psycopg.conninfo import conninfo_to_dict  # noqa: E402

from cuectl.sched.spec import spec_from_flags  # noqa: E402
from cuectl.sched.store import FrameResult, HostInfo, open_store  # noqa: E402
from cuectl.sched.store.postgres import CONNECTION_HEADROOM, CONNECTIONS_PER_WORKER, _expected_columns  # noqa: E402
from cuectl.sched.store.schema import SCHEMA_VERSION, TABLES  # noqa: E402

NOW = time.time()


def populate(url: str) -> dict[str, int]:
    """A store in use: a 4-frame job with a RUNNING frame on a registered host and a
    finished one, plus a finished job. Returns the ids the tests break."""
    store = open_store(url)
    try:
        job = store.submit(spec_from_flags(name="render", command=["true"], range="1-4", user="u"), now=NOW)
        done = store.submit(spec_from_flags(name="done", command=["true"], range="1", user="u"), now=NOW)
        store.register_host(HostInfo(name="h1", cores=4, memory_bytes=1 << 30, gpus=[]), now=NOW)
        layers = {r.job_id: r.layer_id for r in store.runnable_layers()}
        finished = store.claim_frame(layers[done], host="h1", worker="w", gpu_uuids=[], now=NOW, lease_s=60)
        assert finished is not None
        store.complete_frame(finished.frame_id, finished.attempt, FrameResult(exit_code=0), now=NOW + 1)
        first = store.claim_frame(layers[job], host="h1", worker="w", gpu_uuids=[], now=NOW, lease_s=60)
        assert first is not None
        store.complete_frame(first.frame_id, first.attempt, FrameResult(exit_code=0), now=NOW + 1)
        running = store.claim_frame(layers[job], host="h1", worker="w", gpu_uuids=[], now=NOW, lease_s=3600)
        assert running is not None
        return {
            "job": job,
            "done_job": done,
            "running": running.frame_id,
            "finished": first.frame_id,
            "layer": layers[job],
        }
    finally:
        store.close()


def sql(url: str, *statements: str, replica: bool = False) -> None:
    """Run statements as the tables' owner; ``replica``: with foreign keys and triggers off,
    as a partial restore with --disable-triggers runs."""
    with psycopg.connect(url, autocommit=True) as conn:
        if replica:
            conn.execute("SET session_replication_role = replica")
        for statement in statements:
            conn.execute(statement)  # type: ignore[arg-type]


def doctor(url: str, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any, str]:
    """`cuectl --db URL admin doctor --json ARGS`, in-process through the real error mapping."""
    from cuectl.cli.main import app

    capsys.readouterr()
    try:
        code = app(args=["--db", url, "admin", "doctor", *args], prog_name="cuectl", standalone_mode=False)
    except SystemExit as exc:  # pragma: no cover
        code = exc.code if isinstance(exc.code, int) else 0
    out = capsys.readouterr()
    return code or 0, (json.loads(out.out) if "--json" in args else out.out), out.err


def findings(checks: list[dict[str, str]], name: str = "store integrity") -> list[dict[str, str]]:
    return [c for c in checks if c["name"] == name]


def test_a_clean_busy_store_passes_and_says_what_it_skipped(pg_url, capsys):
    populate(pg_url)
    store = open_store(pg_url)
    try:
        assert store.integrity_problems() == []
    finally:
        store.close()
    code, out, _ = doctor(pg_url, capsys, "--json")
    checks = out["checks"]
    assert code == 0, checks
    (integrity,) = findings(checks)
    assert integrity["status"] == "ok" and "integrity_check" not in integrity["detail"]
    (skipped,) = findings(checks, "store checks skipped")
    assert "pg_amcheck" in skipped["detail"]
    (conns,) = findings(checks, "store connections")
    assert conns["status"] == "ok" and "1 registered host" in conns["detail"]


# (what the test does to the store, words doctor's finding must contain)
Breakage = Callable[[str, dict[str, int]], None]
BREAKAGES: dict[str, tuple[Breakage, tuple[str, ...]]] = {
    "running frame without host": (
        lambda url, ids: sql(url, f"UPDATE frames SET host = NULL WHERE id = {ids['running']}"),
        ("RUNNING frames without a host or lease expiry", "1 (id {running})"),
    ),
    "running frame without lease expiry": (
        lambda url, ids: sql(url, f"UPDATE frames SET lease_expires = NULL WHERE id = {ids['running']}"),
        ("RUNNING frames without a host or lease expiry", "id {running}"),
    ),
    "running frame on an unregistered host": (
        lambda url, ids: sql(url, "DELETE FROM hosts WHERE name = 'h1'"),
        ("RUNNING frames on hosts that are not registered", "id {running}: h1"),
    ),
    "attempt without its frame": (
        lambda url, ids: sql(url, f"DELETE FROM frames WHERE id = {ids['finished']}", replica=True),
        ("attempts whose frame is missing", "frame {finished}"),
    ),
    "frame without its layer": (
        lambda url, ids: sql(url, f"DELETE FROM layers WHERE id = {ids['layer']}", replica=True),
        ("frames whose layer is missing", "layer {layer}"),
    ),
    "frame and layer without their job": (
        lambda url, ids: sql(url, f"DELETE FROM jobs WHERE id = {ids['job']}", replica=True),
        ("frames whose job is missing", "job {job}", "layers whose job is missing"),
    ),
    "finished job with unfinished frames": (
        lambda url, ids: sql(url, f"UPDATE jobs SET state = 'FINISHED' WHERE id = {ids['job']}"),
        ("FINISHED jobs with frames still WAITING, DEPEND or RUNNING", "id {job}"),
    ),
    "missing column": (
        lambda url, ids: sql(url, "ALTER TABLE frames DROP COLUMN gpu_sampled_at"),
        ("table frames lacks column(s) gpu_sampled_at",),
    ),
    "missing table": (lambda url, ids: sql(url, "DROP TABLE samples"), ("table samples is missing",)),
    "submitter trigger disabled": (
        lambda url, ids: sql(url, "ALTER TABLE jobs DISABLE TRIGGER jobs_submitter"),
        ("trigger jobs_submitter is missing or disabled",),
    ),
}


@pytest.mark.parametrize("case", sorted(BREAKAGES))
def test_doctor_names_each_problem(pg_url, capsys, case):
    ids = populate(pg_url)
    breakage, words = BREAKAGES[case]
    breakage(pg_url, ids)
    code, out, _ = doctor(pg_url, capsys, "--json")
    failed = [c["detail"] for c in findings(out["checks"]) if c["status"] == "fail"]
    assert code == 1, out
    for word in words:
        expected = word.format(**ids)
        assert any(expected in detail for detail in failed), (expected, failed)
    code, text, _ = doctor(pg_url, capsys)  # the table for people says it too
    assert code == 1 and "FAIL" in text and words[0] in text


def test_each_problem_is_its_own_finding_with_a_count(pg_url, capsys):
    ids = populate(pg_url)
    store = open_store(pg_url)
    try:
        layer = ids["layer"]
        extra = [store.claim_frame(layer, host="h1", worker="w", gpu_uuids=[], now=NOW, lease_s=60) for _ in range(2)]
    finally:
        store.close()
    sql(
        pg_url,
        "UPDATE frames SET host = NULL WHERE state = 'RUNNING'",
        f"UPDATE jobs SET state = 'FINISHED' WHERE id = {ids['job']}",
    )
    code, out, _ = doctor(pg_url, capsys, "--json")
    failed = [c["detail"] for c in findings(out["checks"])]
    assert code == 1 and len(failed) == 2, failed
    running = sorted([ids["running"], *(c.frame_id for c in extra if c is not None)])
    assert any(
        f.startswith("RUNNING frames without a host or lease expiry")
        and f.endswith(f": 3 (id {running[0]}; id {running[1]}; id {running[2]})")
        for f in failed
    ), failed


def test_a_schema_version_other_than_ours_is_named(pg_url):
    """Opening migrates an old store and refuses a newer one, so the mismatch a running
    doctor can meet is one that happened after it opened the store."""
    populate(pg_url)
    store = open_store(pg_url)
    try:
        sql(pg_url, f"UPDATE meta SET value = '{SCHEMA_VERSION - 1}' WHERE key = 'schema_version'")
        (problem,) = store.integrity_problems()
        assert f"schema version {SCHEMA_VERSION - 1}, this cuectl expects {SCHEMA_VERSION}" in problem
        assert "cuectl admin migrate" in problem
        sql(pg_url, f"UPDATE meta SET value = '{SCHEMA_VERSION + 1}' WHERE key = 'schema_version'")
        (problem,) = store.integrity_problems()
        assert "a newer cuectl migrated it" in problem
    finally:
        store.close()


def test_more_workers_than_the_server_admits_is_a_warning(pg_url, capsys):
    populate(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('max_connections')::int").fetchone()
        assert row is not None
        hosts = row[0] // CONNECTIONS_PER_WORKER + 1
        conn.execute(
            "INSERT INTO hosts (name, cores, memory_bytes, gpus, registered_at, last_heartbeat) "
            "SELECT 'node-' || i, 8, 1073741824, '[]', 0, 0 FROM generate_series(1, %s) i",
            (hosts,),
        )
    code, out, _ = doctor(pg_url, capsys, "--json")
    (conns,) = findings(out["checks"], "store connections")
    assert conns["status"] == "warn", conns
    need = (hosts + 1) * CONNECTIONS_PER_WORKER + CONNECTION_HEADROOM
    assert f"{hosts + 1} registered host(s)" in conns["detail"] and f"= {need}" in conns["detail"]
    assert "max_connections" in conns["detail"]
    assert code == 0  # a warning, not a failure: the store itself is sound


def test_a_database_connection_limit_counts_too(pg_url, capsys):
    populate(pg_url)
    dbname = conninfo_to_dict(pg_url)["dbname"]
    sql(pg_url, f'ALTER DATABASE "{dbname}" CONNECTION LIMIT 5')
    try:
        code, out, _ = doctor(pg_url, capsys, "--json")
    finally:
        sql(pg_url, f'ALTER DATABASE "{dbname}" CONNECTION LIMIT -1')  # the fixture drops it
    (conns,) = findings(out["checks"], "store connections")
    assert conns["status"] == "warn" and "CONNECTION LIMIT" in conns["detail"], conns


def test_expected_columns_are_those_a_fresh_store_has(tmp_path: Path):
    """The schema doctor expects is read from the migration scripts: it must be exactly what
    a fresh store of this version has (SQLite needs no server for this)."""
    path = tmp_path / "fresh.db"
    open_store(str(path)).close()
    conn = sqlite3.connect(path)
    try:
        actual = {t: {r[1] for r in conn.execute(f"PRAGMA table_info({t})")} for t in TABLES}
    finally:
        conn.close()
    assert _expected_columns() == actual
