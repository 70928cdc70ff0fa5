#!/usr/bin/env python3
"""The accounting report at farm scale.

Builds a store with N finished frames (default 100,000: 20 jobs of 8 users on 16 hosts with
three GPU models; about 5 % of the frames failed once and were retried, so there are more
attempts than frames), then prints:
  1. the median wall time of the whole process `cuectl --db DB admin report --by user
     --since 30d` (goal: under 1 s), and of `--by job --format prometheus` beside it;
  2. in-process: the time of `store.usage_summary` (the SQL sums and the waits) and of
     turning them into rows;
  3. for every grouping (no --by, which is --by job, then each --by), the whole process
     `cuectl admin report --since 30d` next to its peer, the `sqlite3` shell (when
     installed) running the same sums as a whole process too: the statements
     `usage_sql.sums_statements` gives (the grouping's sums, and the window's total where
     the groups cannot be added up into it), nothing of cuectl; the ratio (goal: <= 2x)
     and both processes' CPU seconds (user + system), which a busy machine disturbs less
     than wall time;
  4. with --postgres, 1 and 2 again for the same farm in PostgreSQL, and the whole-process
     time of every grouping (no peer there).

The store is built through the real submit path (frames, layers, jobs) and one
executemany of attempt rows in one transaction (the columns the worker writes through
`complete_frame`), so it takes seconds, not the hours a real worker would.

cuectl runs as an installed copy would, its bytecode compiled once and cached (in a
directory of the bench's own, PYTHONPYCACHEPREFIX, even where PYTHONDONTWRITEBYTECODE is
set): otherwise each process would compile every module again and time that instead.

Usage: python bench/bench_report.py [--frames N] [--runs N] [--keep DIR] [--postgres]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
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
GOAL_RATIO = 2.0
# Every --by of `cuectl admin report` (None: no --by, the default, job).
GROUPINGS: tuple[str | None, ...] = (None, *usage_sql.GROUPINGS)


# The environment of the timed processes (main sets the bytecode cache).
ENV: dict[str, str] = dict(os.environ)


def cuectl() -> list[str]:
    exe = Path(sys.executable).with_name("cuectl")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]


ATTEMPT_COLUMNS = (
    "frame_id, attempt, job_id, host, gpu_uuids, outcome, waiting_since, started_at, ended_at, "
    "exit_code, exit_signal, timed_out, max_rss_bytes, cpu_seconds, cores, usage, gpu_util_mean_pct, "
    "gpu_util_max_pct, gpu_memory_peak_bytes, gpu_seconds, gpu_busy_seconds, gpu_models"
)


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
        spec = spec_from_flags(
            name=f"job{j:02d}",
            command=["true"],
            range=f"1-{count}",
            gpus=gpus,
            cores=4,
            user=USERS[j % len(USERS)],
            frame_limit=count,
        )
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
                usage = (
                    {"gpu_util_mean_pct": util, "gpu_seconds": gpu_s, "gpu_busy_seconds": busy, "gpu_models": models}
                    if gpus
                    else None
                )
                rows.append(
                    (
                        frame_id,
                        attempt,
                        job_id,
                        host,
                        json.dumps(uuids),
                        "succeeded" if ok else "failed",
                        waiting,
                        start,
                        end,
                        0 if ok else 1,
                        None,
                        0,
                        2 << 30,
                        wall * 0.9,
                        4.0,
                        json.dumps(usage) if usage else None,
                        util,
                        util,
                        (8 << 30) if gpus else None,
                        gpu_s,
                        busy,
                        json.dumps(models) if gpus else None,
                    )
                )
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


def peer_sql(by: str | None, since: float, until: float) -> str:
    """What the sqlite3 shell runs for ``by``: the same sums cuectl's store runs, with the
    scan hint it picks for a window holding the whole table, the window inlined."""
    statements = usage_sql.sums_statements(by or "job", usage_sql.SQLITE, "NOT INDEXED")
    return "".join(f"{sql};\n" for sql in statements).replace(":since", repr(since)).replace(":until", repr(until))


def sqlite_shell_peer(path: Path, since: float, until: float, runs: int) -> float | None:
    """Median seconds of `sqlite3 DB <sums query>` (the grouped sums for --by user), or None."""
    shell = shutil.which("sqlite3")
    if shell is None:
        return None
    return statistics.median(timed([shell, str(path), peer_sql("user", since, until)], runs))


def timed(cmd: list[str], runs: int, cpu: list[float] | None = None) -> list[float]:
    """Wall seconds of each run of ``cmd``; its CPU seconds (user + system) go to ``cpu``."""
    times = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
        times.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if cpu is not None:
            cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return times


def per_grouping(url: str, runs: int, peer_db: Path | None) -> None:
    """For every grouping: cuectl's whole process, the sqlite3 shell's sums (when
    ``peer_db`` and the shell are there), the ratio and both CPU times; runs alternate."""
    shell = shutil.which("sqlite3") if peer_db is not None else None
    print(f"every grouping, whole process, median of {runs} (CPU = user + system seconds, median):")
    worst = 0.0
    for by in GROUPINGS:
        name = "(no --by)" if by is None else f"--by {by}"
        cmd = [*cuectl(), "--db", url, "admin", "report", "--since", "30d", *([] if by is None else ["--by", by])]
        ours: list[float] = []
        ours_cpu: list[float] = []
        peer: list[float] = []
        peer_cpu: list[float] = []
        for _ in range(runs):  # interleaved, so a burst of load hits both alike
            ours += timed(cmd, 1, ours_cpu)
            if shell is not None and peer_db is not None:
                now = time.time()
                peer += timed([shell, str(peer_db), peer_sql(by, now - 30 * 86400, now)], 1, peer_cpu)
        med = statistics.median(ours)
        line = (
            f"  cuectl admin report {name:<15} {med:.3f} s (CPU {statistics.median(ours_cpu):.3f})"
            f"  [goal < {GOAL_S:g} s: {'ok' if med < GOAL_S else 'OVER'}]"
        )
        if peer:
            ratio = med / statistics.median(peer)
            worst = max(worst, ratio)
            line += (
                f"   peer sqlite3 {statistics.median(peer):.3f} s (CPU {statistics.median(peer_cpu):.3f})"
                f"   {ratio:.2f}x [goal <= {GOAL_RATIO:g}x: {'ok' if ratio <= GOAL_RATIO else 'OVER'}]"
            )
        print(line)
    if worst:
        print(f"  worst ratio over the groupings: {worst:.2f}x")


def measure(url: str, runs: int) -> float:
    """Print the whole-process and in-process figures for the store at ``url``; return the
    median whole-process seconds of ``--by user``."""
    by_user = timed([*cuectl(), "--db", url, "admin", "report", "--by", "user", "--since", "30d"], runs)
    med = statistics.median(by_user)
    verdict = "ok" if med < GOAL_S else "OVER GOAL"
    print(
        f"cuectl admin report --by user --since 30d (whole process, median of {runs}): "
        f"{med:.3f} s  [goal < {GOAL_S:g} s: {verdict}]  runs: {', '.join(f'{t:.3f}' for t in by_user)}"
    )
    prom = timed(
        [*cuectl(), "--db", url, "admin", "report", "--by", "job", "--since", "30d", "--format", "prometheus"], runs
    )
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
    print(
        f"in-process: store.usage_summary --by user {t_sums * 1000:.0f} ms ({total.attempts:,} attempts), "
        f"rows {t_rows * 1000:.1f} ms ({len(rows)} rows); --by gpu-model {t_models * 1000:.0f} ms "
        f"({len(model_groups)} rows)"
    )
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep", type=Path, help="build the SQLite store in this directory and keep it")
    ap.add_argument(
        "--postgres",
        action="store_true",
        help="also build the farm in PostgreSQL (a throwaway server from the installed binaries, "
        "as the tests start one) and measure the report there",
    )
    args = ap.parse_args()

    tmp = tempfile.TemporaryDirectory() if args.keep is None else None
    root = Path(tmp.name) if tmp else args.keep
    root.mkdir(parents=True, exist_ok=True)
    db = root / "report.db"
    db.unlink(missing_ok=True)
    pycache = tempfile.TemporaryDirectory(prefix="bench-report-pycache-")  # outlives the store's directory
    ENV.pop("PYTHONDONTWRITEBYTECODE", None)
    ENV["PYTHONPYCACHEPREFIX"] = pycache.name
    t0 = time.perf_counter()
    attempts = build_store(str(db), args.frames)
    print(
        f"SQLite store: {args.frames:,} finished frames, {attempts:,} attempts, "
        f"built in {time.perf_counter() - t0:.1f} s"
    )
    timed([*cuectl(), "--db", str(db), "admin", "report", "--by", "gpu-model"], 1)  # compiles, caches bytecode
    measure(str(db), args.runs)
    per_grouping(str(db), args.runs, db)
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
        per_grouping(url, args.runs, None)
    pycache.cleanup()


if __name__ == "__main__":
    main()
