#!/usr/bin/env python3
"""Submit and inspect at scale, and CLI start-up, each next to a peer measured in the same run.

Prints:
  1. time to submit a 100,000-frame job through the store, next to a raw sqlite3
     executemany of 100,000 rows into the same frames table (goal: at most 2x);
  2. wall time of `cuectl frame list --job J --state WAITING --json` on that store
     (the whole process; goal: under 0.5 s);
  3. median wall time of `cuectl --version` next to `python -c pass` (goal: under 0.25 s);
  4. whole processes (issue 19): `cuectl submit --range 1-N -- true` into a store that
     exists, next to a `python3` process doing the raw sqlite3 executemany of N rows into
     the same (indexed) frames table; with --postgres, the same against PostgreSQL next to a
     `python3` process doing a raw psycopg COPY of N rows (goal: at most 2x each).

Usage: python bench/bench_submit.py [--frames N] [--runs N] [--postgres] [--pg-url URL]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cuectl.sched.dialect import SQLITE
from cuectl.sched.spec import spec_from_flags
from cuectl.sched.store import open_store
from cuectl.sched.store.schema import statements


def cuectl() -> list[str]:
    exe = Path(sys.executable).with_name("cuectl")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]


def raw_executemany(path: Path, n: int) -> float:
    """The peer: the same schema, one transaction, one executemany of n frame rows."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    for statement in statements(0, SQLITE):
        conn.execute(statement)
    now = time.time()
    rows = [(i + 1, 1, 1, i + 1, str(i + 1), "WAITING", now) for i in range(n)]
    t0 = time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        "INSERT INTO frames(id, job_id, layer_id, number, frames, state, waiting_since) VALUES (?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    conn.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    conn.close()
    return elapsed


def ours(path: Path, n: int) -> tuple[float, int]:
    store = open_store(str(path))
    t0 = time.perf_counter()
    spec = spec_from_flags(name="big", command=["true"], range=f"1-{n}", user="bench", frame_limit=n)
    job_id = store.submit(spec, now=time.time())
    elapsed = time.perf_counter() - t0
    store.close()
    return elapsed, job_id


_RAW_SQLITE = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA synchronous = NORMAL")
n, now = int(sys.argv[2]), time.time()
conn.execute("BEGIN IMMEDIATE")
conn.executemany("INSERT INTO frames(id, job_id, layer_id, number, frames, state, waiting_since) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?)", ((i + 1, 1, 1, i + 1, str(i + 1), "WAITING", now) for i in range(n)))
conn.execute("COMMIT")
"""
_RAW_COPY = """
import sys, time
import psycopg
n, now, base = int(sys.argv[2]), time.time(), 10_000_000
with psycopg.connect(sys.argv[1]) as conn:
    job, layer = conn.execute("SELECT job_id, id FROM layers LIMIT 1").fetchone()
    with conn.cursor().copy("COPY frames(id, job_id, layer_id, number, frames, state, waiting_since) FROM STDIN") as cp:
        for i in range(n):
            cp.write_row((base + i, job, layer, i + 1, str(i + 1), "WAITING", now))
"""


def whole_process_sqlite(tmp: Path, n: int, runs: int) -> tuple[float, float]:
    """Best-of-``runs`` wall time of a `cuectl submit` process and of a raw-executemany
    process, each into a fresh store whose schema already exists (not timed)."""
    mine, raw = [], []
    for i in range(runs):  # alternating: both see the same machine load
        db = tmp / f"whole{i}.db"
        open_store(str(db)).close()
        mine.append(
            timed(
                [*cuectl(), "--db", str(db), "submit", "--name", "big", "--range", f"1-{n}", "--", "true"],
                1,
                dict(os.environ, CUECTL_FRAME_LIMIT=str(max(n, 1))),
            )[0]
        )
        peer = tmp / f"peer{i}.db"
        open_store(str(peer)).close()
        with sqlite3.connect(peer) as conn:  # a job and layer row, as a submit has (the frames' parents)
            conn.execute("INSERT INTO jobs(id, name, \"user\", created_at) VALUES (1, 'big', 'bench', 0)")
            conn.execute(
                "INSERT INTO layers(id, job_id, idx, name, command, range, chunk, gpus, gpu_models, "
                "gpu_memory_min_bytes, cores, memory_bytes, retries, env, tags, depends) VALUES "
                "(1, 1, 0, 'main', '[]', '1', 1, 0, '[]', 0, 1, 0, 0, '{}', '[]', '[]')"
            )
        raw.append(timed([sys.executable, "-c", _RAW_SQLITE, str(peer), str(n)], 1)[0])
    return min(mine), min(raw)


def whole_process_postgres(tmp: Path, n: int, runs: int, pg_url: str | None) -> tuple[float, float]:
    """As ``whole_process_sqlite`` on PostgreSQL; the peer COPYs the rows with psycopg."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_claims import Backends

    backends = Backends(tmp, pg_url)
    mine, raw = [], []
    for _ in range(runs):
        url = backends.postgres()
        open_store(url).close()
        mine.append(
            timed(
                [*cuectl(), "--db", url, "submit", "--name", "big", "--range", f"1-{n}", "--", "true"],
                1,
                dict(os.environ, CUECTL_FRAME_LIMIT=str(max(n, 1))),
            )[0]
        )
        peer = backends.postgres()
        store = open_store(peer)
        store.submit(spec_from_flags(name="parent", command=["true"], user="bench"), now=time.time())
        store.close()
        raw.append(timed([sys.executable, "-c", _RAW_COPY, peer, str(n)], 1)[0])
    return min(mine), min(raw)


def timed(cmd: list[str], runs: int, env: dict[str, str] | None = None) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--postgres", action="store_true", help="also the whole-process submit against PostgreSQL")
    ap.add_argument("--pg-url", help="an existing PostgreSQL database instead of a throwaway server")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        # The timed processes compile cuectl once, into a cache of the bench's own, even where
        # PYTHONDONTWRITEBYTECODE is set (this machine's shells set it): an installed copy has
        # its bytecode, and recompiling in every process would be timed as cuectl's start-up.
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        os.environ["PYTHONPYCACHEPREFIX"] = str(tmpdir / "pycache")
        raw = min(raw_executemany(tmpdir / f"raw{i}.db", args.frames) for i in range(args.runs))
        mine_runs = [ours(tmpdir / f"ours{i}.db", args.frames) for i in range(args.runs)]
        mine = min(t for t, _ in mine_runs)
        print(f"submit {args.frames:,} frames (best of {args.runs}, includes range expansion and validation)")
        print(f"  cuectl store.submit        {mine * 1000:8.1f} ms")
        print(f"  raw sqlite3 executemany    {raw * 1000:8.1f} ms")
        print(f"  ratio                      {mine / raw:8.2f} x   (goal <= 2x)")

        db = tmpdir / "ours0.db"
        job_id = mine_runs[0][1]
        cmd = [*cuectl(), "--db", str(db), "frame", "list", "--job", str(job_id), "--state", "WAITING", "--json"]
        t = timed(cmd, args.runs)
        print(f"frame list --job J --state WAITING --json on a {args.frames:,}-frame job (default --limit 1000)")
        print(f"  median {statistics.median(t) * 1000:.1f} ms, best {min(t) * 1000:.1f} ms   (goal < 500 ms)")

        env = dict(os.environ)
        runs = max(args.runs * 4, 20)
        version = timed([*cuectl(), "--version"], runs, env)
        bare = timed([sys.executable, "-c", "pass"], runs, env)
        print(f"start-up, median of {runs}")
        print(f"  cuectl --version           {statistics.median(version) * 1000:8.1f} ms   (goal < 250 ms)")
        print(f"  python -c pass             {statistics.median(bare) * 1000:8.1f} ms")
        helptimes = timed([*cuectl(), "--help"], max(5, args.runs), env)
        print(f"  cuectl --help              {statistics.median(helptimes) * 1000:8.1f} ms")

        mine, raw = whole_process_sqlite(tmpdir, args.frames, args.runs)
        print(f"whole processes, submit {args.frames:,} frames (best of {args.runs}, alternating)")
        print(
            f"  SQLite: cuectl submit {mine * 1000:8.1f} ms, python3 raw executemany {raw * 1000:8.1f} ms, "
            f"ratio {mine / raw:5.2f} x   (goal <= 2x)"
        )
        if args.postgres or args.pg_url:
            mine, raw = whole_process_postgres(tmpdir, args.frames, args.runs, args.pg_url)
            print(
                f"  PostgreSQL: cuectl submit {mine * 1000:8.1f} ms, python3 raw COPY {raw * 1000:8.1f} ms, "
                f"ratio {mine / raw:5.2f} x   (goal <= 2x)"
            )


if __name__ == "__main__":
    main()
