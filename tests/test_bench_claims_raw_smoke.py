"""bench/bench_claims.py's store-vs-raw comparison (issue 19) still runs: the raw
SKIP LOCKED loop claims every frame of the store's job, and a ratio is printed for each
claimer count, also for the store through PgBouncer (tiny sizes; figures are never
asserted)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("psycopg", reason="the postgres extra (psycopg 3) is not installed")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pgpooler  # noqa: E402
import pgserver  # noqa: E402

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_claims.py"


def test_store_vs_raw_claims_runs():
    try:
        pgserver.shared_server()
    except pgserver.PgUnavailable as exc:
        pytest.skip(f"PostgreSQL tests skipped: {exc}")
    if pgpooler.find_pgbouncer() is None:
        pytest.skip("PgBouncer tests skipped: no pgbouncer binary found (Debian: apt-get install pgbouncer)")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CUECTL_LOCK_DIR", "CUECTL_CREATE_LOCK_DIR", "CUECTL_LOCK_REGISTRY")
    }
    res = subprocess.run(
        [sys.executable, str(BENCH), "--only-raw", "--frames", "40", "--repeat", "1", "--pgbouncer", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [line.split() for line in res.stdout.splitlines() if re.match(r"\s+\d+\s+[\d,]+\s+[\d,]+\s+[\d.]+$", line)]
    assert [r[0] for r in rows] == ["1", "4", "16"], res.stdout
    pooled = [
        line.split()
        for line in res.stdout.split("through PgBouncer", 1)[1].splitlines()
        if re.match(r"\s+\d+\s+[\d,]+\s+[\d,]+\s+[\d,]+\s+[\d.]+$", line)
    ]
    assert [r[0] for r in pooled] == ["1", "4", "16"], res.stdout
