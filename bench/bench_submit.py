#!/usr/bin/env python3
"""Submit and inspect at scale, and CLI start-up, each next to a peer measured in the same run.

Prints:
  1. time to submit a 100,000-frame job through the store, next to a raw sqlite3
     executemany of 100,000 rows into the same frames table (goal: at most 2x);
  2. wall time of `cuectl frame list --job J --state WAITING --json` on that store
     (the whole process; goal: under 0.5 s);
  3. median wall time of `cuectl --version` next to `python -c pass` (goal: under 0.25 s).

Usage: python bench/bench_submit.py [--frames N] [--runs N]
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

from cuectl.sched.spec import spec_from_flags
from cuectl.sched.dialect import SQLITE
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
    conn.executemany("INSERT INTO frames(id, job_id, layer_id, number, frames, state, waiting_since) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
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
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
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


if __name__ == "__main__":
    main()
