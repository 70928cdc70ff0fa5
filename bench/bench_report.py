#!/usr/bin/env python3
"""The accounting report at farm scale.

Builds a store with N finished frames (default 100,000: 20 jobs of 8 users on 16 hosts with
three GPU models; about 5 % of the frames failed once and were retried, so there are more
attempts than frames), then prints:
  1. the median wall time of the whole process `cuectl --db DB admin report --by user
     --since 30d` (goal: under 1 s), and of `--by job --format prometheus` beside it;
  2. in-process: the time of `store.usage_summary` (the SQL sums and the waits) and of
     turning them into rows;
  3. peer: the `sqlite3` shell (when installed) running the same sums query alone, as a
     whole process too: the floor the store's SQL engine sets, with nothing of cuectl;
  4. with --postgres, 1 and 2 again for the same farm in PostgreSQL.

The store is built through the real submit path (frames, layers, jobs) and one
executemany of attempt rows in one transaction (the columns the worker writes through
`complete_frame`), so it takes seconds, not the hours a real worker would.

Usage: python bench/bench_report.py [--frames N] [--runs N] [--keep DIR] [--postgres]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cuectl.report import build_rows, report_row
from cuectl.sched import usage_sql
from cuectl.sched.spec import spec_from_flags
from cuectl.sched.store import open_store

USERS = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]
MODELS = ["NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 4090"]
JOBS = 20
GOAL_S = 1.0


def cuectl() -> list[str]:
    exe = Path(sys.executable).with_name("cuectl")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]


ATTEMPT_COLUMNS = ("frame_id, attempt, job_id, host, gpu_uuids, outcome, waiting_since, started_at, ended_at, "
                   "exit_code, exit_signal, timed_out, max_rss_bytes, cpu_seconds, cores, usage, gpu_util_mean_pct, "
                   "gpu_util_max_pct, gpu_memory_peak_bytes, gpu_seconds, gpu_busy_seconds, gpu_models")


def build_store(url: str, frames: int, *, seed: int = 5) -> int:
    """Submit the jobs, write their attempts, mark everything finished; return the number
    of attempt rows written. Works on either backend (``url`` a path or postgresql://)."""
    rng = random.Random(seed)
    store = open_store(url)
    now = time.time()
    t0 = now - 20 * 86400  # everything ended in the last 20 days, inside --since 30d
    per_job = frames // JOBS
    rows: list[tuple] = []
    frame_updates: list[tuple] = []
    for j in range(JOBS):
        count = per_job + (frames - per_job * JOBS if j == JOBS - 1 else 0)
        gpus = 0 if j % 5 == 4 else 1 + (j % 2)  # every fifth job is CPU-only; others 1-2 GPUs
        spec = spec_from_flags(name=f"job{j:02d}", command=["true"], range=f"1-{count}", gpus=gpus,
                               cores=4, user=USERS[j % len(USERS)], frame_limit=count)
        job_id = store.submit(spec, now=t0)
        ids = sorted(f["id"] for f in store.list_frames(job=job_id, limit=count)[0])
        for frame_id in ids:
            waiting = t0 + rng.uniform(0, 18 * 86400)
            attempts = 2 if rng.random() < 0.05 else 1
            for attempt in range(1, attempts + 1):
                start = waiting + rng.uniform(0, 600)
                wall = rng.uniform(30, 900)
                end = start + wall
                ok = attempt == attempts
                host = f"gpu{rng.randrange(16):02d}"
                uuids = [f"GPU-{host}-{i}" for i in range(gpus)]
                models = [MODELS[(j + i) % len(MODELS)] for i in range(gpus)]
                util = rng.uniform(0, 100) if gpus else None
                gpu_s = wall * gpus if gpus else None
                busy = gpu_s * util / 100 if gpus else None
                usage = {"gpu_util_mean_pct": util, "gpu_seconds": gpu_s, "gpu_busy_seconds": busy,
                         "gpu_models": models} if gpus else None
                rows.append((frame_id, attempt, job_id, host, json.dumps(uuids), "succeeded" if ok else "failed",
                             waiting, start, end, 0 if ok else 1, None, 0, 2 << 30, wall * 0.9, 4.0,
                             json.dumps(usage) if usage else None, util, util, (8 << 30) if gpus else None,
                             gpu_s, busy, json.dumps(models) if gpus else None))
                waiting = end
            frame_updates.append((attempts, end, frame_id))
    insert = f"INSERT INTO attempts({ATTEMPT_COLUMNS}) VALUES ({', '.join(['?'] * 22)})"
    update = "UPDATE frames SET state = 'SUCCEEDED', attempts = ?, ended_at = ? WHERE id = ?"
    finish = "UPDATE jobs SET state = 'FINISHED', finished_at = ?"
    if url.startswith("postgres"):
        def write(conn) -> None:
            with conn.cursor() as cur:
                cur.executemany(insert.replace("?", "%s"), rows)
                cur.executemany(update.replace("?", "%s"), frame_updates)
                cur.execute(finish.replace("?", "%s"), (now,))
            conn.execute("ANALYZE")  # what autovacuum would do after a bulk load

        store._call(write)
    else:
        conn = store.conn
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(insert, rows)
        conn.executemany(update, frame_updates)
        conn.execute(finish, (now,))
        conn.execute("COMMIT")
    store.close()
    return len(rows)


def sqlite_shell_peer(path: Path, since: float, until: float, runs: int) -> float | None:
    """Median seconds of `sqlite3 DB <sums query>` (the grouped sums for --by user), or None."""
    shell = shutil.which("sqlite3")
    if shell is None:
        return None
    base, nkeys = usage_sql._base("user", usage_sql.SQLITE, "NOT INDEXED")
    query = usage_sql._sums_sql(base, nkeys).replace(":since", repr(since)).replace(":until", repr(until))
    return statistics.median(timed([shell, str(path), query], runs))


def timed(cmd: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return times


def measure(url: str, runs: int) -> float:
    """Print the whole-process and in-process figures for the store at ``url``; return the
    median whole-process seconds of ``--by user``."""
    by_user = timed([*cuectl(), "--db", url, "admin", "report", "--by", "user", "--since", "30d"], runs)
    med = statistics.median(by_user)
    verdict = "ok" if med < GOAL_S else "OVER GOAL"
    print(f"cuectl admin report --by user --since 30d (whole process, median of {runs}): "
          f"{med:.3f} s  [goal < {GOAL_S:g} s: {verdict}]  runs: {', '.join(f'{t:.3f}' for t in by_user)}")
    prom = timed([*cuectl(), "--db", url, "admin", "report", "--by", "job", "--since", "30d",
                  "--format", "prometheus"], runs)
    print(f"cuectl admin report --by job --format prometheus (median of {runs}): {statistics.median(prom):.3f} s")
    store = open_store(url)
    now = time.time()
    t0 = time.perf_counter()
    groups, total = store.usage_summary(since=now - 30 * 86400, until=now, by="user")
    t_sums = time.perf_counter() - t0
    t0 = time.perf_counter()
    rows = build_rows(groups, by="user")
    report_row(total, "total")
    t_rows = time.perf_counter() - t0
    t0 = time.perf_counter()
    model_groups, _ = store.usage_summary(since=now - 30 * 86400, until=now, by="gpu-model")
    t_models = time.perf_counter() - t0
    store.close()
    print(f"in-process: store.usage_summary --by user {t_sums * 1000:.0f} ms ({total.attempts:,} attempts), "
          f"rows {t_rows * 1000:.1f} ms ({len(rows)} rows); --by gpu-model {t_models * 1000:.0f} ms "
          f"({len(model_groups)} rows)")
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep", type=Path, help="build the SQLite store in this directory and keep it")
    ap.add_argument("--postgres", action="store_true",
                    help="also build the farm in PostgreSQL (a throwaway server from the installed binaries, "
                         "as the tests start one) and measure the report there")
    args = ap.parse_args()

    tmp = tempfile.TemporaryDirectory() if args.keep is None else None
    root = Path(tmp.name) if tmp else args.keep
    root.mkdir(parents=True, exist_ok=True)
    db = root / "report.db"
    db.unlink(missing_ok=True)
    t0 = time.perf_counter()
    attempts = build_store(str(db), args.frames)
    print(f"SQLite store: {args.frames:,} finished frames, {attempts:,} attempts, "
          f"built in {time.perf_counter() - t0:.1f} s")
    measure(str(db), args.runs)
    startup = timed([*cuectl(), "admin", "--help"], args.runs)
    print(f"  for scale: `cuectl admin --help` (start-up, no store): {statistics.median(startup):.3f} s")
    now = time.time()
    peer = sqlite_shell_peer(db, now - 30 * 86400, now, args.runs)
    if peer is None:
        print("  peer: skipped, no sqlite3 shell installed (apt install sqlite3)")
    else:
        print(f"  peer: sqlite3 shell running the --by user sums query alone (whole process, median): {peer:.3f} s")
    if tmp:
        tmp.cleanup()
    if args.postgres:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        import pgserver

        server = pgserver.shared_server()
        url = server.url(server.create_database())
        t0 = time.perf_counter()
        build_store(url, args.frames)
        print(f"PostgreSQL store (same farm), built in {time.perf_counter() - t0:.1f} s")
        measure(url, args.runs)


if __name__ == "__main__":
    main()
